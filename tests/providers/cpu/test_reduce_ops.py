"""Reductions and arg-reductions against the ONNX reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

from tests.oracle import check_node

RNG = np.random.default_rng(0)

# op -> opset where axes became an input
_REDUCE_OPS = {
    "ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18, "ReduceProd": 18,
    "ReduceL1": 18, "ReduceL2": 18, "ReduceLogSum": 18, "ReduceLogSumExp": 18,
    "ReduceSumSquare": 18,
}


def _data(op: str, shape, dtype=np.float32) -> np.ndarray:
    x = RNG.uniform(0.5, 2.0, shape) if op == "ReduceLogSum" else RNG.standard_normal(shape)
    return x.astype(dtype)


@pytest.mark.parametrize("op", sorted(_REDUCE_OPS))
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [None, [1], [0, -1]])
def test_reduce_axes_attribute(op, keepdims, axes):
    x = _data(op, (3, 4, 5))
    attrs = {"keepdims": keepdims}
    if axes is not None:
        attrs["axes"] = axes
    check_node(op, {"x": x}, opset=_REDUCE_OPS[op] - 2, **attrs)


@pytest.mark.parametrize("op", sorted(_REDUCE_OPS))
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [None, [2], [-3, 1]])
def test_reduce_axes_input(op, keepdims, axes):
    x = _data(op, (2, 3, 4))
    inputs = {"x": x}
    if axes is not None:
        inputs["axes"] = np.array(axes, dtype=np.int64)
    check_node(op, inputs, opset=max(_REDUCE_OPS[op], 20 if op in ("ReduceMax", "ReduceMin")
                                     else 18), keepdims=keepdims)


@pytest.mark.parametrize("op", sorted(_REDUCE_OPS))
def test_reduce_noop_with_empty_axes(op):
    x = _data(op, (2, 3))
    check_node(op, {"x": x, "axes": np.array([], dtype=np.int64)}, opset=18,
               noop_with_empty_axes=1)


@pytest.mark.parametrize("op", sorted(_REDUCE_OPS))
def test_reduce_empty_set(op):
    x = np.zeros((2, 0, 4), dtype=np.float32)
    check_node(op, {"x": x, "axes": np.array([1], dtype=np.int64)}, opset=18, keepdims=1)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2"])
def test_reduce_float16(op):
    x = _data(op, (4, 33), np.float16)
    check_node(op, {"x": x, "axes": np.array([1], dtype=np.int64)}, opset=18, rtol=2e-3,
               atol=2e-3)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
def test_reduce_int(op):
    x = RNG.integers(-5, 5, (3, 4)).astype(np.int32)
    check_node(op, {"x": x, "axes": np.array([0], dtype=np.int64)}, opset=18, keepdims=0)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_bool(op):
    x = RNG.integers(0, 2, (3, 4)).astype(bool)
    check_node(op, {"x": x, "axes": np.array([1], dtype=np.int64)}, opset=20)


def test_reduce_log_sum_exp_large_values():
    # the reference evaluator gives NaN for the all -inf row; onnxruntime -inf
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf]], dtype=np.float32)
    check_node("ReduceLogSumExp", {"x": x, "axes": np.array([1], dtype=np.int64)}, opset=18,
               peer="ort")


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_reductions(op, axis, keepdims, last):
    x = RNG.integers(0, 3, (3, 4, 2)).astype(np.float32)  # many ties
    check_node(op, {"x": x}, opset=13, axis=axis, keepdims=keepdims, select_last_index=last)


def test_argmax_opset1_default_axis():
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    check_node("ArgMax", {"x": x}, opset=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("shape,axes", [((4, 512, 2, 2), [2, 3]), ((2, 7, 9, 5), [-1, -2]),
                                        ((3, 5, 11), [2]), ((2, 3, 4, 5), [1, 2, 3]),
                                        ((2, 3, 4, 5), [1, 3])])
def test_reduce_mean_trailing_axes(shape, axes, keepdims, dtype):
    """ReduceMean over trailing axes (the ones-vector product) and over
    others (``np.mean``): the reference evaluator's values, float tolerance."""
    check_node("ReduceMean", {"x": _data("ReduceMean", shape, dtype),
                              "axes": np.array(axes, dtype=np.int64)}, opset=18,
               keepdims=keepdims)


def test_reduce_mean_dot_path_and_fallback():
    """The ones-vector product takes trailing axes of C-contiguous floats only,
    and equals ``np.mean`` within float32 rounding."""
    from actorrt.providers.cpu import reduce as red

    x = _data("ReduceMean", (4, 64, 7, 7))
    y = red._mean_dot(x, (2, 3), True)
    assert y is not None and y.shape == (4, 64, 1, 1) and y.dtype == np.float32
    np.testing.assert_allclose(y, x.astype(np.float64).mean(axis=(2, 3), keepdims=True),
                               rtol=1e-5, atol=1e-6)
    assert red._mean_dot(x, (1, 3), True) is None              # not trailing
    assert red._mean_dot(x, (0, 1, 2, 3), False) is None       # nothing kept
    assert red._mean_dot(x.transpose(0, 1, 3, 2), (2, 3), True) is None  # not C-contiguous
    assert red._mean_dot(x.astype(np.float16), (2, 3), True) is None
