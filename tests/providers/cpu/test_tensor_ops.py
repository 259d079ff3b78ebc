"""Tensor creation / shape kernels against the ONNX reference evaluator, plus
the zero-copy guarantees of the view kernels."""

import ml_dtypes
import numpy as np
import pytest
from onnx import helper, TensorProto

from actorrt.providers import NodeSpec
from actorrt.providers.cpu.registry import CPU_KERNELS
from tests.oracle import check_model, check_node, make_node_model

rng = np.random.default_rng(0)
I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731


def direct(op, *inputs, opset=21, n_out=1, **attrs):
    """Run a kernel directly (no session) to inspect views / errors."""
    cls = CPU_KERNELS.lookup("", op, opset)
    node = NodeSpec(name="n", op_type=op, domain="", opset=opset, attrs=attrs,
                    inputs=tuple(f"i{k}" for k in range(len(inputs))),
                    outputs=tuple(f"o{k}" for k in range(n_out)))
    return cls(node).compile()(*inputs)


# ------------------------------------------------------------------ views

@pytest.mark.parametrize("op,inputs,attrs", [
    ("Reshape", (I64(4, -1),), {}),
    ("Flatten", (), {"axis": 2}),
    ("Transpose", (), {"perm": [2, 0, 1]}),
    ("Slice", (I64(0, 1), I64(2, 10), I64(0, 2), I64(1, 2)), {}),
    ("Expand", (I64(2, 2, 3, 4),), {}),
    ("Identity", (), {}),
    ("Unsqueeze", (I64(0, -1),), {}),
])
def test_view_kernels_do_not_copy(op, inputs, attrs):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    y = direct(op, x, *inputs, **attrs)
    assert np.shares_memory(x, y)
    assert CPU_KERNELS.lookup("", op, 21).view_outputs


def test_squeeze_is_a_view():
    x = rng.standard_normal((2, 1, 4)).astype(np.float32)
    assert np.shares_memory(x, direct("Squeeze", x, I64(1)))


def test_slice_negative_step_is_a_view():
    x = np.arange(10, dtype=np.float32)
    y = direct("Slice", x, I64(-1), I64(-100), I64(0), I64(-2))
    assert np.shares_memory(x, y)
    np.testing.assert_array_equal(y, x[::-2])


# ----------------------------------------------------------- reshape & co.

@pytest.mark.parametrize("shape,allowzero", [((0, -1), 0), ((3, 0, 2), 1), ((-1,), 0)])
def test_reshape(shape, allowzero):
    x = rng.standard_normal((3, 4)).astype(np.float32) if not allowzero else \
        np.zeros((2, 0, 3), np.float32)
    check_node("Reshape", {"x": x, "s": np.array(shape, np.int64)}, allowzero=allowzero)


def test_reshape_opset1_attr():
    # the reference evaluator has no Reshape-1; the attribute form equals numpy's
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(direct("Reshape", x, opset=1, shape=[0, 2, -1]),
                                  x.reshape(3, 2, 2))


@pytest.mark.parametrize("axis", [0, 1, -1, 3])
def test_flatten(axis):
    check_node("Flatten", {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)}, axis=axis)


def test_squeeze_unsqueeze_old_and_new():
    x = rng.standard_normal((1, 3, 1)).astype(np.float32)
    check_node("Squeeze", {"x": x}, opset=11, axes=[0, -1])
    check_node("Squeeze", {"x": x}, opset=13)
    check_node("Unsqueeze", {"x": x}, opset=11, axes=[1, -1])
    check_node("Unsqueeze", {"x": x, "a": I64(4, 0)}, opset=13)


def test_squeeze_non_one_dim_raises():
    with pytest.raises(ValueError, match="not 1"):
        direct("Squeeze", np.zeros((2, 3)), I64(0))


def test_concat_split():
    a, b = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    check_node("Concat", {"a": a, "b": b}, axis=-1)
    x = rng.standard_normal((7, 2)).astype(np.float32)
    check_node("Split", {"x": x}, ("y0", "y1", "y2"), opset=18, num_outputs=3)
    check_node("Split", {"x": x, "s": I64(2, 0, 5)}, ("y0", "y1", "y2"), opset=13)
    check_node("Split", {"x": x}, ("y0", "y1"), opset=11, split=[3, 4])
    check_node("Split", {"x": np.arange(6, dtype=np.float32)}, ("y0", "y1"), opset=11)
    x3 = rng.standard_normal((2, 5, 11)).astype(np.float32)
    check_node("Split", {"x": x3, "s": I64(4, 0, 7)}, ("y0", "y1", "y2"), opset=13, axis=-1)
    check_node("Split", {"x": x3}, ("y0", "y1"), opset=18, axis=1, num_outputs=2)
    check_node("Split", {"x": x3.transpose(2, 0, 1)}, ("y0", "y1", "y2"), opset=18, axis=0,
               num_outputs=3)


def test_split_pieces_cached_per_shape_and_sizes():
    # the cached index tuples of one (shape, sizes) must not leak to another
    x = rng.standard_normal((3, 10)).astype(np.float32)
    for sizes in ((2, 3, 5), (5, 3, 2), (2, 3, 5)):
        got = direct("Split", x, I64(*sizes), opset=13, n_out=3, axis=1)
        want = np.split(x, np.cumsum(sizes)[:-1], axis=1)
        assert all(g.base is not None and np.array_equal(g, w) for g, w in zip(got, want))
    y = rng.standard_normal((4, 10)).astype(np.float32)  # same sizes, another shape
    got = direct("Split", y, I64(2, 3, 5), opset=13, n_out=3, axis=1)
    assert [g.shape for g in got] == [(4, 2), (4, 3), (4, 5)]
    for _ in range(2):  # a bad split raises every time (never cached)
        with pytest.raises(ValueError, match="add up"):
            direct("Split", x, I64(2, 3, 4), opset=13, n_out=3, axis=1)


def test_transpose_and_concat_bad_axes_raise():
    x = np.zeros((2, 3, 4), np.float32)
    for perm in ([0, 1], [0, 1, 1], [0, 1, 3], [0, 1, -1]):
        with pytest.raises(ValueError, match="not a permutation"):
            direct("Transpose", x, perm=perm)
    assert direct("Transpose", x, perm=[2, 0, 1]).shape == (4, 2, 3)
    with pytest.raises(ValueError, match="out of range"):
        direct("Concat", x, x, opset=13, axis=3)
    assert direct("Concat", x, x, opset=13, axis=-3).shape == (4, 3, 4)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ((1, 0), (1000, 2), (0, 1), (1, 1)),
    ((-1,), (-1000,), (1,), (-1,)),
    ((20,), (-20,), (0,), (-3,)),
    ((-2, 5), (2**63 - 1, -(2**63)), (-1, 0), (1, -2)),
])
def test_slice(starts, ends, axes, steps):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    check_node("Slice", {"x": x, "s": np.array(starts, np.int64), "e": np.array(ends, np.int64),
                         "a": np.array(axes, np.int64), "t": np.array(steps, np.int64)})


def test_slice_negative_step_clamps_start_to_zero():
    # start -7 on a dim of 5 clamps to 0 and end -8 to -1: one element (spec, ORT);
    # the reference evaluator's plain numpy slicing returns none, so ORT is the peer
    x = rng.standard_normal((5, 7)).astype(np.float32)
    check_node("Slice", {"x": x, "s": I64(-7, 8), "e": I64(-8, -3), "a": I64(0, 1),
                         "t": I64(-2, -3)}, peer="ort")


def test_slice_opset1():
    x = rng.standard_normal((6, 5)).astype(np.float32)
    check_node("Slice", {"x": x}, opset=1, starts=[1, -3], ends=[4, 100], axes=[0, 1])


def test_expand_transpose_tile():
    x = rng.standard_normal((3, 1)).astype(np.float32)
    check_node("Expand", {"x": x, "s": I64(2, 1, 4)})
    check_node("Transpose", {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})
    check_node("Tile", {"x": x, "r": I64(2, 3)})


def test_shape_size():
    x = np.zeros((2, 3, 4, 5), np.float16)
    check_node("Shape", {"x": x}, start=-3, end=-1)
    check_node("Shape", {"x": x}, start=10)
    check_node("Size", {"x": x})


# --------------------------------------------------------------- generators

def test_constant_attributes():
    for attrs in ({"value_float": 2.5}, {"value_ints": [1, 2, 3]}, {"value_int": 7},
                  {"value_floats": [1.0, 2.0]},
                  {"value": helper.make_tensor("t", TensorProto.FLOAT16, [2], [1.0, 2.0])}):
        check_model(make_node_model("Constant", {}, ["y"], **attrs), {})
    y = direct("Constant", value_strings=["a", "bc"])
    assert y.dtype == object and y.tolist() == ["a", "bc"]
    assert direct("Constant", value_string="s").shape == ()


def test_constant_sparse_densified():
    class Sparse:
        values = np.array([5.0, 6.0], np.float32)
        indices = np.array([1, 4], np.int64)
        dims = [2, 3]
    y = direct("Constant", sparse_value=Sparse())
    np.testing.assert_array_equal(y, [[0, 5, 0], [0, 6, 0]])


def test_constant_of_shape_range_eyelike():
    check_node("ConstantOfShape", {"s": I64(2, 3)},
               value=helper.make_tensor("v", TensorProto.INT32, [1], [4]))
    check_node("ConstantOfShape", {"s": I64(0)})
    check_node("Range", {"a": np.array(10, np.int32), "b": np.array(1, np.int32),
                         "c": np.array(-3, np.int32)})
    check_node("Range", {"a": np.array(0.5, np.float32), "b": np.array(3.3, np.float32),
                         "c": np.array(0.4, np.float32)})
    check_node("EyeLike", {"x": np.zeros((3, 5), np.int32)}, k=-1)
    check_node("EyeLike", {"x": np.zeros((4, 2), np.int32)}, dtype=TensorProto.DOUBLE, k=1)


# ------------------------------------------------------------------------ Pad

@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes(mode):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    check_node("Pad", {"x": x, "p": I64(1, 2, 2, 0)}, mode=mode)


def test_pad_axes_and_value():
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    check_node("Pad", {"x": x, "p": I64(1, 1, 2, 0), "v": np.array(9.0, np.float32),
                       "a": I64(-1, 0)}, opset=18)
    check_node("Pad", {"x": x}, opset=2, pads=[0, 1, 0, 0, 0, 2], value=3.0)


def test_pad_negative_crops():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = direct("Pad", x, I64(-1, 1, 0, -2))
    np.testing.assert_array_equal(y, np.pad(x[1:, :2], ((0, 0), (1, 0))))


# --------------------------------------------------- Trilu, ReverseSequence

@pytest.mark.parametrize("upper,k", [(1, 0), (0, -1), (1, 2), (0, 5)])
def test_trilu(upper, k):
    x = rng.integers(0, 9, (2, 3, 4)).astype(np.int64)
    check_node("Trilu", {"x": x, "k": np.array(k, np.int64)}, upper=upper)


def test_reverse_sequence():
    x = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    check_node("ReverseSequence", {"x": x, "l": I64(4, 1, 2)}, batch_axis=1, time_axis=0)
    check_node("ReverseSequence", {"x": x.transpose(1, 0, 2).copy(), "l": I64(0, 4, 3)},
               batch_axis=0, time_axis=1)


# --------------------------------------------------------- CumSum, CumProd

@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
def test_cumulative(op, exclusive, reverse):
    x = rng.integers(1, 4, (3, 4)).astype(np.int32)
    opset = 26 if op == "CumProd" else 21
    check_node(op, {"x": x, "a": np.array(-1, np.int64)}, opset=opset, exclusive=exclusive,
               reverse=reverse)


def test_bfloat16_passthrough_dtypes():
    x = np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
    assert direct("Transpose", x).dtype == ml_dtypes.bfloat16
    assert direct("Pad", x, I64(0, 1, 0, 1)).dtype == ml_dtypes.bfloat16
    assert direct("Tile", x, I64(2, 1)).dtype == ml_dtypes.bfloat16
