"""Shape subgraphs cached per input signature (``optimizer.shapes`` ->
``ai.actorrt:ShapeSubgraph``): the PyTorch exports in tests/data and a built
Shape-Gather-Concat-Reshape chain, two input signatures alternating, against
onnxruntime and against our own plan with the pass off (level 1); the cache
answers repeated signatures, holds copies (a consumer writing into its input
cannot change it), and a group read before it could run is left alone."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import shape_cache

DATA = Path(__file__).resolve().parents[1] / "data"
RNG = np.random.default_rng(21)


def _ops(sess):
    return collections.Counter(st.node.op_type for st in sess.session.plan.steps)


def _bert_feeds(batch, seq):
    ids = RNG.integers(0, 100, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _gpt_feeds(batch, seq, past):
    feeds = {"input_ids": RNG.integers(0, 100, (batch, seq)).astype(np.int64)}
    for n in ("past_key.0", "past_value.0", "past_key.1", "past_value.1"):
        feeds[n] = RNG.standard_normal((batch, 4, past, 16)).astype(np.float32)
    return feeds


@pytest.mark.parametrize("name,feeds", [
    ("bertish", [_bert_feeds(2, 12), _bert_feeds(1, 7)]),
    ("gpt2ish", [_gpt_feeds(1, 3, 1), _gpt_feeds(2, 1, 5)]),
])
def test_exported_models_two_signatures_alternating(name, feeds):
    model = onnx.load(str(DATA / f"{name}.onnx"))
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with actorrt.InferenceSession(model) as cached, \
            actorrt.InferenceSession(model, actorrt.SessionOptions(graph_optimization_level=1)) as plain:
        assert _ops(cached)["ShapeSubgraph"] >= 1 and _ops(cached)["Shape"] == 0
        assert "ShapeSubgraph" not in _ops(plain)
        fused = [f for f in cached.session.plan.fusions if "/shapes" in f[0]]
        assert fused and all(len(members) >= 2 for _, members in fused)
        for f in feeds + feeds + feeds:  # A B A B A B: hits after the first two
            got = cached.run(None, f)
            uncached = plain.run(None, f)
            want = ref.run(None, f)
            for g, u, w in zip(got, uncached, want):
                assert g.shape == w.shape
                np.testing.assert_allclose(g, u, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _reshape_chain_model():
    """y = Reshape(x, concat(shape(x)[0], -1)) + Reshape(x2, [shape(x)[0]*2, -1]).sum..."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["tgt"], axis=0),
        helper.make_node("Reshape", ["x", "tgt"], ["flat"]),
        helper.make_node("Mul", ["b1", "two"], ["b2"]),
        helper.make_node("Concat", ["b2", "minus1"], ["tgt2"], axis=0),
        helper.make_node("Reshape", ["flat", "tgt2"], ["half"]),
        helper.make_node("Relu", ["half"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes0"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array([2], np.int64), "two")]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", "c", 4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_built_chain_caches_per_signature_and_returns_copies(monkeypatch):
    model = _reshape_chain_model()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    calls = []
    real = shape_cache.ShapeSubgraph.evaluate
    monkeypatch.setattr(shape_cache.ShapeSubgraph, "evaluate",
                        lambda self, *t: (calls.append(tuple(x.shape for x in t)), real(self, *t))[1])
    xs = [RNG.standard_normal((3, 2, 4)).astype(np.float32), RNG.standard_normal((6, 5, 4)).astype(np.float32)]
    with actorrt.InferenceSession(model) as s:
        assert _ops(s)["ShapeSubgraph"] == 1 and _ops(s)["Reshape"] == 2
        step = next(st for st in s.session.plan.steps if st.node.op_type == "ShapeSubgraph")
        for x in xs + xs + xs:
            got = s.run(None, {"x": x})[0]
            np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-6)
        assert calls == [((3, 2, 4),), ((6, 5, 4),)]  # evaluated once per signature
        first = step.kernel.run(xs[0])
        first[0][...] = 999  # a consumer writing into its input
        again = step.kernel.run(xs[0])
        assert all(np.array_equal(a, b) for a, b in zip(again, step.kernel.evaluate(xs[0])))


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(shape_cache, "CACHE_SIZE", 3)
    model = _reshape_chain_model()
    with actorrt.InferenceSession(model) as s:
        step = next(st for st in s.session.plan.steps if st.node.op_type == "ShapeSubgraph")
        for n in range(1, 8):
            x = np.zeros((n, 2, 4), np.float32)
            assert s.run(None, {"x": x})[0].shape == (2 * n, 4)
        assert len(step.kernel._cache) == 3


def test_group_needing_a_late_tensor_is_left_alone():
    """Shape of an intermediate whose producer runs after the first reader
    of another value of the same group: no fusion, same results."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["tgt"], axis=0),
        helper.make_node("Reshape", ["x", "tgt"], ["flat"]),      # reads tgt: the group must run before
        helper.make_node("Relu", ["flat"], ["r"]),
        helper.make_node("Shape", ["r"], ["s2"]),                 # ... but r comes after
        helper.make_node("Slice", ["s2", "st", "en"], ["c"]),
        helper.make_node("Concat", ["b1", "c"], ["tgt2"], axis=0),
        helper.make_node("Reshape", ["r", "tgt2"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes0"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array([1], np.int64), "st"),
             numpy_helper.from_array(np.array([2], np.int64), "en")]
    g = helper.make_graph(nodes, "late", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 2, 4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with actorrt.InferenceSession(model) as s:
        assert "ShapeSubgraph" not in _ops(s)
        for n in (3, 5, 3):
            x = RNG.standard_normal((n, 2, 4)).astype(np.float32)
            np.testing.assert_allclose(s.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
