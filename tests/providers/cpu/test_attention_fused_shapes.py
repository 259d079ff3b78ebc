"""ScaledDotAttention (the optimizer's MatMul-scale-mask-Softmax-MatMul
fusion) against onnxruntime on the unfused graph: one query row (a decode
step; up to four rows take one compiled call, tested with it and without)
and many, odd sizes, masks of every broadcast shape, a transposed (strided)
key as GPT-2 exports it; at 1 thread, and at 2 split by heads on
the chunk loop or pass by pass over the compiled partner threads.

(A compiled scale-mask-softmax pass was measured 1.5-1.7x slower than
numpy's vectorized exp on 64K scores and was not kept.)"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt

RNG = np.random.default_rng(5)


def _attention_model(qs, ks, vs, mask_shape, scale_op, k_perm):
    nodes, ins = [], [helper.make_tensor_value_info("q", TP.FLOAT, list(qs)),
                      helper.make_tensor_value_info("k", TP.FLOAT, list(ks)),
                      helper.make_tensor_value_info("v", TP.FLOAT, list(vs))]
    kk = "k"
    if k_perm is not None:
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=list(k_perm)))
        kk = "kt"
    nodes.append(helper.make_node("MatMul", ["q", kk], ["s0"]))
    cur = "s0"
    inits = [numpy_helper.from_array(np.float32(math.sqrt(qs[-1]) if scale_op == "Div" else 0.3), "sc")]
    if scale_op:
        nodes.append(helper.make_node(scale_op, [cur, "sc"], ["s1"]))
        cur = "s1"
    if mask_shape is not None:
        ins.append(helper.make_tensor_value_info("mask", TP.FLOAT, list(mask_shape)))
        nodes.append(helper.make_node("Add", [cur, "mask"], ["s2"]))
        cur = "s2"
    nodes += [helper.make_node("Softmax", [cur], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    g = helper.make_graph(nodes, "att", ins, [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("b,h,s,t,d,mask,scale_op", [
    (1, 4, 1, 65, 64, (1, 1, 1, 65), "Div"),      # a decode step
    (1, 4, 64, 64, 64, (1, 1, 64, 64), "Div"),    # a causal prefill
    (2, 3, 5, 7, 9, (2, 1, 1, 7), "Mul"),
    (1, 2, 3, 1, 5, None, None),
    (2, 2, 128, 129, 16, (1, 1, 1, 129), "Div"),
    (1, 1, 2, 3, 1, (3,), "Mul"),
    (3, 2, 4, 6, 8, (3, 2, 4, 6), None),
    (1, 3, 4, 67, 33, (1, 1, 4, 67), "Div"),      # 4 rows (speculative decode), causal
    (2, 5, 2, 257, 7, (1, 5, 1, 257), "Mul"),     # a past crossing 256, per-head mask
    (1, 2, 1, 1, 3, (1,), "Div"),                 # one key, a scalar-like mask
    (2, 1, 3, 9, 4, (2, 1, 3, 1), "Mul"),         # a mask broadcast along the keys
])
@pytest.mark.parametrize("strided_k", [False, True])
@pytest.mark.parametrize("threads,split", [(1, ""), (2, "chunks"), (2, "partners"),
                                           (2, "passes")])
@pytest.mark.parametrize("compiled_decode", [True, False])
def test_attention_equals_onnxruntime(b, h, s, t, d, mask, scale_op, strided_k, threads, split,
                                      compiled_decode, monkeypatch):
    from actorrt.providers.cpu import _attention_numba, _attention_split, _partner
    from actorrt.providers.cpu import _sgemm_numba as sg, attention as cpu_attention
    if not compiled_decode:  # the numpy / batched-GEMM path for few rows too
        monkeypatch.setattr(_attention_numba, "COMPILED", False)
    elif not _attention_numba.HAVE_NUMBA:
        pytest.skip("no numba here")
    partners = split in ("partners", "passes") and _partner.AVAILABLE and sg.ENABLED
    if split in ("partners", "passes") and not partners:
        pytest.skip("no compiled partner threads here")
    # "partners": each entry's passes on one thread, the entries split
    # (_attention_split); "passes": each of the three passes split
    monkeypatch.setattr(cpu_attention, "ENTRIES_SPLIT", split == "partners")
    if threads == 2:  # every product split (by heads, or each pass over the partners)
        from actorrt.providers.cpu import _matmul_split
        from actorrt.providers.cpu import _parallel, _softmax_numba
        monkeypatch.setattr(_matmul_split, "PARALLEL_MIN_FLOPS", 0)
        monkeypatch.setattr(sg, "USE_PARTNERS", partners)
        monkeypatch.setattr(sg, "PARTNER_MIN_FLOPS", 0)
        monkeypatch.setattr(_softmax_numba, "PARTNER_MIN_ELEMENTS", 0)
        real, seen = _parallel.run_chunks, []
        monkeypatch.setattr(_parallel, "run_chunks", lambda fn, n, th: (seen.append(n), real(fn, n, th)))
        real_b, real_s, seen_p = _partner.bmm_entries, _partner.softmax_rows, []
        monkeypatch.setattr(_partner, "bmm_entries", lambda *a: (seen_p.append("bmm"), real_b(*a))[1])
        monkeypatch.setattr(_partner, "softmax_rows",
                            lambda *a: (seen_p.append("softmax"), real_s(*a))[1])
        real_i = _partner.run_items
        monkeypatch.setattr(_partner, "run_items", lambda t, fn, *a: (
            seen_p.append("entries" if fn == _attention_split._ADDR else fn), real_i(t, fn, *a))[1])
    q = RNG.standard_normal((b, h, s, d)).astype(np.float32)
    v = RNG.standard_normal((b, h, t, d + 1)).astype(np.float32)
    if strided_k:  # keys as (b, h, t, d), transposed by the graph as GPT-2 exports do
        k = RNG.standard_normal((b, h, t, d)).astype(np.float32)
        perm = (0, 1, 3, 2)
    else:
        k = RNG.standard_normal((b, h, d, t)).astype(np.float32)
        perm = None
    feeds = {"q": q, "k": k, "v": v}
    if mask is not None:
        m = np.where(RNG.random(mask) < 0.3, -1e4, 0).astype(np.float32)
        m += RNG.standard_normal(mask).astype(np.float32) * 0.1
        feeds["mask"] = m
    model = _attention_model(q.shape, k.shape, v.shape, mask, scale_op, perm)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=threads)) as sess:
        got = sess.run(None, feeds)[0]
        assert "ScaledDotAttention" in [st.node.op_type for st in sess.session.plan.steps]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if threads == 2 and b * h > 1:
        if compiled_decode and s <= _attention_numba.MAX_ROWS:  # one compiled call, no split
            assert not seen and not seen_p
        elif partners and s >= sg.BMM_MIN_ROWS and split == "partners":
            assert seen_p == ["entries"] and not seen  # one hand-off
        elif partners and s >= sg.BMM_MIN_ROWS:  # the three passes over the partners
            assert seen_p == ["bmm", "softmax", "bmm"] and not seen
        else:
            assert seen and not seen_p
