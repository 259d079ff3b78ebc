"""Identity and inference Dropout elimination (basic level,
:func:`actorrt.optimizer.transformer.eliminate_identities`): the nodes go, the outputs
equal onnxruntime's on the unoptimized model; a Dropout in training mode, one whose
mask is read, and one whose output is a graph output stay."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt

RNG = np.random.default_rng(5)


def _model(nodes, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "i", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info(o, TP.BOOL if o == "nm" else TP.FLOAT,
                                                         None) for o in outputs],
                          list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _ops(model, feeds, level="ORT_ENABLE_BASIC"):
    opts = actorrt.SessionOptions(graph_optimization_level=level)
    with actorrt.InferenceSession(model, opts) as s:
        return s.run(None, feeds), [st.node.op_type for st in s.session.plan.steps]


def _want(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("opset", [10, 13, 17])
def test_dropout_and_identity_go(opset):
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Dropout", ["a"], ["b"]),
             helper.make_node("Identity", ["b"], ["c"]),
             helper.make_node("Neg", ["c"], ["y"])]
    model = _model(nodes, ["y"], opset=opset)
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    got, ops = _ops(model, {"x": x})
    assert ops == ["Relu", "Neg"]
    np.testing.assert_array_equal(got[0], _want(model, {"x": x})[0])
    _, ops0 = _ops(model, {"x": x}, level="ORT_DISABLE_ALL")
    assert "Dropout" in ops0


def test_dropouts_that_stay():
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    # a graph output
    model = _model([helper.make_node("Relu", ["x"], ["a"]),
                    helper.make_node("Dropout", ["a"], ["y"])], ["y"])
    got, ops = _ops(model, {"x": x})
    assert "Dropout" in ops or "Identity" in ops
    np.testing.assert_array_equal(got[0], np.maximum(x, 0))
    # its mask read
    model = _model([helper.make_node("Dropout", ["x"], ["a", "m"]),
                    helper.make_node("Neg", ["a"], ["y"]),
                    helper.make_node("Not", ["m"], ["nm"])], ["y", "nm"])
    got, ops = _ops(model, {"x": x})
    assert "Dropout" in ops
    assert got[1].all() == False  # noqa: E712 - inference masks are all True
    # training mode on (a constant True): not an identity
    model = _model([helper.make_node("Dropout", ["x", "r", "t"], ["a"]),
                    helper.make_node("Neg", ["a"], ["y"])], ["y"],
                   [numpy_helper.from_array(np.float32(0.5), "r"),
                    numpy_helper.from_array(np.bool_(True), "t")])
    _, ops = _ops(model, {"x": x})
    assert "Dropout" in ops
