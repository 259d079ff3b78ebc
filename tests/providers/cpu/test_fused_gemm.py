"""com.microsoft FusedGemm with onnxruntime's parameter attributes
(``activation_alpha`` / ``activation_beta``) against onnxruntime's own
FusedGemm kernel, and the optimizer's ``activation_params`` form against the
unfused graph in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _sgemm_numba as sg

RNG = np.random.default_rng(21)


def _model(nodes, k, inits):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TP.FLOAT, ["m", k])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def _ours(model, feeds):
    with actorrt.InferenceSession(model) as s:
        return s.run(None, feeds)[0]


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("act,attrs", [
    ("LeakyRelu", {"activation_alpha": 0.3}),
    ("HardSigmoid", {"activation_alpha": 0.1, "activation_beta": 0.6}),
    ("HardSigmoid", {"activation_alpha": 0.35, "activation_beta": 0.4}),
    ("Sigmoid", {}),
    ("Relu", {}),
])
def test_fused_gemm_parameters_equal_onnxruntime(act, attrs, compiled, monkeypatch):
    monkeypatch.setattr(sg, "ENABLED", compiled)
    m, k, n = 7, 33, 19
    a = (RNG.standard_normal((m, k)) * 2).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    c = RNG.standard_normal(n).astype(np.float32)
    node = helper.make_node("FusedGemm", ["a", "w", "c"], ["y"], domain="com.microsoft",
                            activation=act, **attrs)
    model = _model([node], k, [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")])
    want = _ort(model, {"a": a})
    got = _ours(model, {"a": a})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if attrs:  # the case is one where the parameters change the answer
        assert (want < 0).any() if act == "LeakyRelu" else ((want > 0) & (want < 1)).any()


@pytest.mark.parametrize("act,attrs", [("LeakyRelu", {"alpha": 0.25}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4})])
def test_optimizer_fused_gemm_equals_unfused_onnxruntime(act, attrs):
    m, k, n = 5, 24, 17
    a = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    c = RNG.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["a", "w", "c"], ["p"]), helper.make_node(act, ["p"], ["y"], **attrs)]
    model = _model(nodes, k, [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")])
    np.testing.assert_allclose(_ours(model, {"a": a}), _ort(model, {"a": a}), rtol=1e-5, atol=1e-5)
