"""com.microsoft FusedMatMul against onnxruntime's own FusedMatMul kernel
(every combination of ``transA`` / ``transB`` / ``transBatchA`` /
``transBatchB``, ``alpha``, broadcasting ranks, 1-D operands, constant and
fed ``B``, the compiled GEMM on and off), and models saved by onnxruntime's
own graph optimizer (which writes FusedMatMul, BiasGelu, Gelu and
SkipLayerNormalization) against onnxruntime running them."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from tests.oracle import run_actorrt, run_onnxruntime_unoptimized
from actorrt.providers.cpu import _sgemm_numba as sg

RNG = np.random.default_rng(33)


def _perm(rank: int, trans_batch: int, trans: int) -> list[int]:
    p = list(range(rank))
    if trans_batch and rank > 2:
        p = list(range(1, rank - 1)) + [0, rank - 1]
    if trans and rank >= 2:
        p[-1], p[-2] = p[-2], p[-1]
    return p


def _stored(shape_seen: tuple, trans_batch: int, trans: int) -> tuple:
    """The stored shape whose FusedMatMul view has shape ``shape_seen``."""
    p = _perm(len(shape_seen), trans_batch, trans)
    inv = np.argsort(p)
    return tuple(shape_seen[i] for i in inv)


def _model(attrs, a_shape, b_shape=None, b_const=None, dtype=TP.FLOAT):
    inputs = [helper.make_tensor_value_info("a", dtype, list(a_shape))]
    inits = []
    if b_const is None:
        inputs.append(helper.make_tensor_value_info("b", dtype, list(b_shape)))
    else:
        inits.append(numpy_helper.from_array(b_const, "b"))
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", **attrs)
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", dtype, None)],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()


def _ort(model, feeds):
    return run_onnxruntime_unoptimized(model, feeds)[0]


def _ours(model, feeds):
    return run_actorrt(model, feeds)[0]


@pytest.mark.parametrize("ta,tb,tba,tbb", list(itertools.product((0, 1), repeat=4)))
def test_every_transpose_combination_equals_onnxruntime(ta, tb, tba, tbb):
    seen_a, seen_b = (4, 5, 3, 6), (4, 5, 6, 7)  # batch (4, 5), M 3, K 6, N 7
    a = RNG.standard_normal(_stored(seen_a, tba, ta)).astype(np.float32)
    b = RNG.standard_normal(_stored(seen_b, tbb, tb)).astype(np.float32)
    attrs = dict(alpha=0.125, transA=ta, transB=tb, transBatchA=tba, transBatchB=tbb)
    model = _model(attrs, a.shape, b.shape)
    want = _ort(model, {"a": a, "b": b})
    assert want.shape == (4, 5, 3, 7)
    np.testing.assert_allclose(_ours(model, {"a": a, "b": b}), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("a_shape,b_shape,attrs", [
    ((2, 9, 33), (33, 17), {}),                       # rank 3 x rank 2: broadcast
    ((2, 9, 33), (17, 33), {"transB": 1, "alpha": 0.5}),
    ((33, 9), (17, 33), {"transA": 1, "transB": 1}),
    ((9, 2, 33), (2, 33, 17), {"transBatchA": 1, "alpha": -2.0}),
    ((9, 2, 33), (17, 2, 33), {"transBatchA": 1, "transBatchB": 1, "transB": 1}),
    ((1, 64), (64, 40), {"alpha": 3.0}),               # one row
    ((5, 1, 6, 8), (3, 8, 4), {}),                     # batch broadcast both ways
    ((8,), (8, 5), {"alpha": 0.25}),                   # 1-D A: promoted, squeezed
    ((3, 8), (8,), {}),                                # 1-D B
])
@pytest.mark.parametrize("const", [False, True])
def test_shapes_and_constant_b_equal_onnxruntime(a_shape, b_shape, attrs, const, compiled,
                                                  monkeypatch):
    monkeypatch.setattr(sg, "ENABLED", compiled)
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    model = _model(attrs, a.shape, b.shape, b_const=b if const else None)
    feeds = {"a": a} if const else {"a": a, "b": b}
    want = _ort(model, feeds)
    np.testing.assert_allclose(_ours(model, feeds), want, rtol=1e-5, atol=1e-5)


def test_float16_equals_onnxruntime():
    a = RNG.standard_normal((3, 4, 16)).astype(np.float16)
    b = RNG.standard_normal((3, 12, 16)).astype(np.float16)
    model = _model({"transB": 1, "alpha": 0.5}, a.shape, b.shape, dtype=TP.FLOAT16)
    want = _ort(model, {"a": a, "b": b})
    got = _ours(model, {"a": a, "b": b})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                               rtol=2e-3, atol=2e-3)


def test_float64_equals_numpy():
    a = RNG.standard_normal((2, 6, 5))
    b = RNG.standard_normal((2, 7, 6))  # transA and transB: (2, 5, 6) @ (2, 6, 7)
    model = _model({"transA": 1, "transB": 1, "alpha": 0.3}, a.shape, b.shape, dtype=TP.DOUBLE)
    alpha = float(np.float32(0.3))  # ONNX float attributes are float32
    want = alpha * np.matmul(a.transpose(0, 2, 1), b.transpose(0, 2, 1))
    np.testing.assert_allclose(_ours(model, {"a": a, "b": b}), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("a_shape,b_shape,attrs", [
    ((3, 4), (5, 6), {}),                                   # K mismatch
    ((2, 3, 4), (4, 6), {"transBatchA": 1}),                # ranks differ
    ((3, 4), (4, 6), {"transBatchB": 1}),                   # rank 2
])
def test_refused_shapes_are_typed_errors_as_onnxruntime_refuses_them(a_shape, b_shape, attrs):
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    model = _model(attrs, a.shape, b.shape)
    with pytest.raises(Exception):
        _ort(model, {"a": a, "b": b})
    with pytest.raises(actorrt.ActorRTError, match="FusedMatMul"):
        _ours(model, {"a": a, "b": b})


# -------------------------------------------------- models onnxruntime saved

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))


@pytest.mark.parametrize("name", ["encoder", "decode"])
def test_models_saved_by_onnxruntimes_optimizer_equal_onnxruntime(name, tmp_path):
    import bench_models
    model, feeds = bench_models.build(name)[:2]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    path = tmp_path / f"{name}_ort_extended.onnx"
    so.optimized_model_filepath = str(path)
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    saved = onnx.load(str(path))
    ops = {n.op_type for n in saved.graph.node if n.domain == "com.microsoft"}
    assert "FusedMatMul" in ops  # the case is one where onnxruntime fused
    want = _ort(str(path), feeds)
    with actorrt.InferenceSession(str(path)) as s:
        got = s.run(None, feeds)[0]
        ops = [st.node.op_type for st in s.session.plan.steps]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    # our optimizer still finds every layer's attention in onnxruntime's fused
    # form (FusedMatMul), past the contrib ops onnx's shape inference stops
    # at, and the decoder's MatMul + BiasGelu epilogues
    assert ops.count("ScaledDotAttention") == 4 and "FusedMatMul" not in ops, ops
    if name == "decode":
        assert "MatMulEpilogue" in ops and "BiasGelu" not in ops, ops
