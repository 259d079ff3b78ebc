"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against the ONNX
reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

from tests.oracle import check_node

RNG = np.random.default_rng(3)


def _case(shape, weighted: bool, ignore: int | None):
    n, c = shape[0], shape[1]
    x = RNG.standard_normal(shape).astype(np.float32)
    t = RNG.integers(0, c, (n,) + shape[2:]).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    inputs = {"x": x, "t": t}
    if weighted:
        inputs["w"] = RNG.uniform(0.2, 1.0, c).astype(np.float32)
    attrs = {} if ignore is None else {"ignore_index": ignore}
    return inputs, attrs


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 2, 2)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 1, -5])
def test_nll_loss(reduction, shape, weighted, ignore):
    inputs, attrs = _case(shape, weighted, ignore)
    check_node("NegativeLogLikelihoodLoss", inputs, opset=22, reduction=reduction, **attrs)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2, 2)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 2])
@pytest.mark.parametrize("outputs", [("loss",), ("loss", "log_prob")])
def test_softmax_cross_entropy(reduction, shape, weighted, ignore, outputs):
    inputs, attrs = _case(shape, weighted, ignore)
    check_node("SoftmaxCrossEntropyLoss", inputs, outputs, opset=13, reduction=reduction,
               **attrs)


def test_nll_loss_float16():
    inputs, _ = _case((3, 4, 5), True, None)
    inputs = {"x": inputs["x"].astype(np.float16), "t": inputs["t"],
              "w": inputs["w"].astype(np.float16)}
    check_node("NegativeLogLikelihoodLoss", inputs, opset=13, rtol=2e-3, atol=2e-3)
