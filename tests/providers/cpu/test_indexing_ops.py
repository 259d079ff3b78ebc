"""Gather / scatter / selection kernels against the ONNX reference evaluator
(and onnxruntime where the reference is loose)."""

import numpy as np
import pytest

from actorrt.providers import KernelSizedOutput
from tests.oracle import check_node
from tests.providers.cpu.test_tensor_ops import direct

rng = np.random.default_rng(1)
I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731


def test_gather_negative_and_axis():
    x = rng.standard_normal((4, 5)).astype(np.float32)
    check_node("Gather", {"x": x, "i": np.array([[0, -1], [3, -4]], np.int64)}, axis=0)
    check_node("Gather", {"x": x, "i": np.array(-2, np.int32)}, axis=1)


def test_gather_out_of_range_raises():
    with pytest.raises(IndexError, match="out of range"):
        direct("Gather", np.zeros((3, 2)), I64(3))
    with pytest.raises(IndexError, match=r"value -4 is out of range .*\[-3, 2\]"):
        direct("Gather", np.zeros((3, 2)), I64(0, -4))  # below -dim: not wrapped twice
    with pytest.raises(IndexError, match="value 2 is out of range"):
        direct("Gather", np.zeros((3, 2)), np.array([[1, 2]], np.int32), axis=1)


def test_gather_unsigned_and_scalar_indices():
    x = rng.standard_normal((4, 5)).astype(np.float32)
    check_node("Gather", {"x": x, "i": np.array([3, 0, 3], np.uint32)}, axis=0)
    check_node("Gather", {"x": x[0], "i": np.array(-1, np.int64)}, axis=0)  # a 0-d result


def test_gather_elements():
    x = rng.standard_normal((3, 4)).astype(np.float32)
    check_node("GatherElements", {"x": x, "i": np.array([[0, -1, 2], [1, 0, -3], [2, 2, 2]],
                                                        np.int64)}, axis=1)
    # indices smaller than data off the axis: numpy-based reference refuses, ORT agrees
    check_node("GatherElements", {"x": x, "i": np.array([[2, 0], [-1, 1]], np.int64)}, axis=0,
               peer="ort")


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd(batch_dims):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    i = np.array([[[1, -1]], [[0, 2]]], np.int64)
    check_node("GatherND", {"x": x, "i": i}, batch_dims=batch_dims)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(reduction):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    i = np.array([[1, -1], [0, 2], [1, 1]], np.int64)
    u = rng.standard_normal((3, 2)).astype(np.float32)
    check_node("ScatterElements", {"x": x, "i": i, "u": u}, axis=1, reduction=reduction)


def test_scatter_deprecated():
    x = np.zeros((3, 3), np.float32)
    check_node("Scatter", {"x": x, "i": np.array([[1, 0, 2]], np.int64),
                           "u": np.ones((1, 3), np.float32)}, opset=10, peer="ort")


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    x = rng.standard_normal((4, 3)).astype(np.float32)
    i = np.array([[1], [3]], np.int64)
    u = rng.standard_normal((2, 3)).astype(np.float32)
    check_node("ScatterND", {"x": x, "i": i, "u": u}, reduction=reduction)


def test_scatter_does_not_touch_input():
    x = np.zeros((3,), np.float32)
    direct("ScatterND", x, np.array([[1]], np.int64), np.ones(1, np.float32))
    assert not x.any()


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_onehot(axis):
    i = np.array([[0, -1, 5], [2, 9, -7]], np.int64)
    check_node("OneHot", {"i": i, "d": np.array(6, np.int64),
                          "v": np.array([2, 7], np.int32)}, axis=axis)


def test_nonzero_compress_sized():
    x = np.array([[0, 1, 0], [3, 0, 4]], np.int32)
    out = direct("NonZero", x)
    assert isinstance(out, KernelSizedOutput) and out.shape == (2, 3)
    check_node("NonZero", {"x": x})
    c = np.array([True, False, True], bool)
    check_node("Compress", {"x": x, "c": c}, axis=1)
    check_node("Compress", {"x": x, "c": np.array([False, True, True, False], bool)})


@pytest.mark.parametrize("sorted_,axis", [(1, None), (0, None), (1, 0), (0, 1), (1, -1)])
def test_unique(sorted_, axis):
    x = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 0], [1, 0, 0]], np.float32)
    attrs = {"sorted": sorted_} | ({} if axis is None else {"axis": axis})
    # the reference evaluator mishandles sorted=0 on 2-D input; ORT is the peer there
    check_node("Unique", {"x": x}, ("y", "idx", "inv", "cnt"), peer="ort" if not sorted_
               else "reference", **attrs)


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_ties_stable(largest):
    x = np.array([[3, 1, 3, 2, 1, 3], [0, 0, 0, 0, 0, 0]], np.float32)
    check_node("TopK", {"x": x, "k": I64(4)}, ("v", "i"), largest=largest, peer="ort")


def test_topk_axis0_uint64_and_opset1():
    x = rng.integers(0, 5, (6, 3)).astype(np.uint64)
    check_node("TopK", {"x": x, "k": I64(3)}, ("v", "i"), axis=0)
    y = rng.standard_normal((2, 5)).astype(np.float32)
    check_node("TopK", {"x": y}, ("v", "i"), opset=1, k=2)


@pytest.mark.parametrize("mode,axis", [("linear", -2), ("circular", 1)])
def test_tensor_scatter(mode, axis):
    past = rng.standard_normal((2, 5, 3)).astype(np.float32)
    upd = rng.standard_normal((2, 2, 3)).astype(np.float32)
    check_node("TensorScatter", {"p": past, "u": upd, "w": I64(3, 4 if mode == "circular" else 1)},
               opset=24, mode=mode, axis=axis)
