"""Softmax / LogSoftmax / Hardmax against the ONNX reference evaluator, both the
pre-13 flatten-to-2D and the single-axis semantics."""

from __future__ import annotations

import numpy as np
import pytest

from tests.oracle import check_node

RNG = np.random.default_rng(1)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1])
def test_softmax_family(op, opset, axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    if op == "Hardmax":
        x[0, 0, :2] = 5.0  # a tie: the first index wins
    attrs = {} if axis is None else {"axis": axis}
    # the reference evaluator applies the opset-13 single-axis rule to every
    # version; onnxruntime implements the old flatten-to-2D one
    check_node(op, {"x": x}, opset=opset, peer="ort" if opset < 13 else "reference", **attrs)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_large_numbers(op):
    x = np.array([[0, 1, 2, 3], [10000, 10001, 10002, 10003]], dtype=np.float32)
    check_node(op, {"x": x}, opset=13)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_float16(op):
    x = RNG.standard_normal((3, 17)).astype(np.float16)
    check_node(op, {"x": x}, opset=13, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("shape,axis", [((2, 1000, 1, 1), 1), ((3, 5, 1), 1), ((4, 7, 1, 1), -3),
                                        ((1, 1, 6), 1), ((2, 3, 1, 2), 1)])
def test_softmax_over_an_axis_followed_by_unit_dims(op, shape, axis):
    # (N, C, 1, 1) classifier heads take the last-axis row pass; (2, 3, 1, 2) does not
    x = RNG.standard_normal(shape).astype(np.float32)
    check_node(op, {"x": x}, opset=13, peer="ort", axis=axis)
