"""Attention, RotaryEmbedding, LinearAttention and FlexAttention against the
ONNX reference evaluator."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.oracle import assert_close, check_model, check_node, make_node_model, run_actorrt

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def attn_inputs(b=2, hq=4, hkv=2, sq=3, skv=5, d=8, dv=8, past=0, packed=False,
                mask=None, nonpad=None, dtype=np.float32):
    total = past + skv
    q, k, v = rand(b, hq, sq, d, dtype=dtype), rand(b, hkv, skv, d, dtype=dtype), \
        rand(b, hkv, skv, dv, dtype=dtype)
    if packed:
        q = q.transpose(0, 2, 1, 3).reshape(b, sq, hq * d)
        k = k.transpose(0, 2, 1, 3).reshape(b, skv, hkv * d)
        v = v.transpose(0, 2, 1, 3).reshape(b, skv, hkv * dv)
    ins = {"Q": q, "K": k, "V": v, "attn_mask": None, "past_key": None, "past_value": None,
           "nonpad_kv_seqlen": None}
    if mask == "bool":
        m = RNG.random((sq, total)) > 0.3
        m[:, 0] = True
        ins["attn_mask"] = m
    elif mask == "float":
        ins["attn_mask"] = rand(b, 1, sq, total, dtype=dtype)
    elif mask == "short":  # shorter than total: padded with -inf
        ins["attn_mask"] = rand(sq, total - 1, dtype=dtype)
    if past:
        ins["past_key"] = rand(b, hkv, past, d, dtype=dtype)
        ins["past_value"] = rand(b, hkv, past, dv, dtype=dtype)
    if nonpad is not None:
        ins["nonpad_kv_seqlen"] = np.array(nonpad, dtype=np.int64)
    while ins and list(ins.values())[-1] is None:
        ins.popitem()
    return ins


def outputs(past=False, qk=False):
    outs = ["Y"]
    if past or qk:
        outs += ["present_key", "present_value"] if past else ["", ""]
    if qk:
        outs.append("qk")
    return outs


CASES = [
    dict(),
    dict(hkv=4),
    dict(hkv=1, packed=True),
    dict(packed=True, dv=6),
    dict(mask="bool"),
    dict(mask="float"),
    dict(mask="short", past=4),
    dict(past=6, mask="float"),
    dict(past=6, sq=1, skv=1),
]


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items())
                         or "plain")
def test_attention_matches_reference(case, causal):
    ins = attn_inputs(**case)
    attrs = {"is_causal": causal}
    if case.get("packed"):
        attrs.update(q_num_heads=ins["Q"].shape[-1] // 8, kv_num_heads=ins["K"].shape[-1] // 8)
    check_node("Attention", ins, outputs(past=bool(case.get("past"))), opset=23, **attrs)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_matmul_output_modes(mode):
    ins = attn_inputs(mask="float", past=3)
    attrs = {"qk_matmul_output_mode": mode, "scale": 0.3}
    if mode != 0:  # mode 0 = raw QK per the spec; the reference softcaps it
        attrs["softcap"] = 1.5
    check_node("Attention", ins, outputs(past=True, qk=True), opset=23, **attrs)


def test_attention_softmax_precision_double():
    ins = attn_inputs(mask="bool")
    check_node("Attention", ins, outputs(qk=True), opset=23, softmax_precision=11,
               qk_matmul_output_mode=3, is_causal=1)


@pytest.mark.parametrize("nonpad", [[5, 2], [1, 3]])
def test_attention_nonpad_external_cache(nonpad):
    ins = attn_inputs(sq=1, skv=6, nonpad=nonpad)
    check_node("Attention", ins, ["Y"], opset=24, is_causal=1)


@pytest.mark.parametrize("left,right,causal", [(2, -1, 1), (1, 2, 0), (-1, 0, 0)])
def test_attention_sliding_window(left, right, causal):
    ins = attn_inputs(sq=4, skv=2, past=5)
    check_node("Attention", ins, outputs(past=True), opset=25, is_causal=causal,
               left_window_size=left, right_window_size=right)


def test_attention_fully_masked_row_is_zero():
    ins = attn_inputs(mask="bool")
    ins["attn_mask"][1, :] = False
    got = check_node("Attention", ins, outputs(qk=True), opset=23, qk_matmul_output_mode=3)
    assert not np.isnan(got[0]).any()
    np.testing.assert_array_equal(got[0][:, :, 1], 0)


@pytest.mark.parametrize("dtype,rtol", [(np.float16, 2e-3), (ml_dtypes.bfloat16, 2e-2)])
def test_attention_low_precision(dtype, rtol):
    ins = attn_inputs(past=4, mask="float", dtype=dtype)
    model = make_node_model("Attention", ins, outputs(past=True), opset=23, is_causal=1)
    feeds = {k: v for k, v in ins.items() if v is not None}
    got = run_actorrt(model, feeds)
    f32 = {k: (v.astype(np.float32) if v.dtype == dtype else v) for k, v in feeds.items()}
    ref = check_model(make_node_model("Attention", {k: (v.astype(np.float32) if v is not None
                                                          and v.dtype == dtype else v)
                                                      for k, v in ins.items()},
                                      outputs(past=True), opset=23, is_causal=1), f32)
    assert got[0].dtype == dtype and got[1].dtype == dtype
    assert_close([g.astype(np.float32) for g in got], ref, rtol=rtol, atol=rtol)


def test_attention_decode_loop_matches_full_prefill():
    """Feeding tokens one at a time through past/present equals one causal pass."""
    b, hq, hkv, s, d = 1, 4, 2, 6, 8
    q, k, v = rand(b, hq, s, d), rand(b, hkv, s, d), rand(b, hkv, s, d)
    model = make_node_model("Attention", {"Q": q[:, :, :1], "K": k[:, :, :1], "V": v[:, :, :1],
                                          "attn_mask": None, "past_key": k[:, :, :0],
                                          "past_value": v[:, :, :0]},
                            ["Y", "present_key", "present_value"], opset=23, is_causal=1)
    for vi in model.graph.input:
        if vi.name.startswith("past"):
            vi.type.tensor_type.shape.dim[2].dim_param = "past"
    full = check_node("Attention", {"Q": q, "K": k, "V": v}, ["Y"], opset=23, is_causal=1)[0]
    pk, pv = k[:, :, :0], v[:, :, :0]
    for t in range(s):
        y, pk, pv = run_actorrt(model, {"Q": q[:, :, t:t + 1], "K": k[:, :, t:t + 1],
                                        "V": v[:, :, t:t + 1], "past_key": pk,
                                        "past_value": pv})
        np.testing.assert_allclose(y[:, :, 0], full[:, :, t], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(pk, k)


# --------------------------------------------------------------- RotaryEmbedding

@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot", [0, 4])
@pytest.mark.parametrize("packed,pos", [(False, True), (True, True), (False, False)])
def test_rotary_embedding(interleaved, rot, packed, pos):
    b, h, s, d = 2, 3, 5, 8
    half = (rot or d) // 2
    x = rand(b, s, h * d) if packed else rand(b, h, s, d)
    if pos:
        ins = {"input": x, "cos_cache": rand(16, half), "sin_cache": rand(16, half),
               "position_ids": RNG.integers(0, 16, (b, s)).astype(np.int64)}
    else:
        ins = {"input": x, "cos_cache": rand(b, s, half), "sin_cache": rand(b, s, half)}
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot}
    if packed:
        attrs["num_heads"] = h
    check_node("RotaryEmbedding", ins, ["y"], opset=23, **attrs)


# --------------------------------------------------------------- LinearAttention

@pytest.mark.parametrize("rule,decay_heads,beta_heads", [
    ("linear", None, None), ("gated", True, None), ("gated", False, None),
    ("delta", None, True), ("gated_delta", True, True), ("gated_delta", False, False)])
@pytest.mark.parametrize("hq,hkv,past", [(4, 4, False), (4, 2, True), (4, 1, True)])
def test_linear_attention(rule, decay_heads, beta_heads, hq, hkv, past):
    b, t, dk, dv = 2, 4, 8, 6
    k = rand(b, t, hkv, dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    ins = {"query": rand(b, t, hq * dk), "key": k.reshape(b, t, hkv * dk),
           "value": rand(b, t, hkv * dv),
           "past_state": rand(b, hkv, dk, dv) * 0.1 if past else None, "decay": None,
           "beta": None}
    if decay_heads is not None:
        ins["decay"] = -np.abs(rand(b, t, hkv if decay_heads else hkv * dk))
    if beta_heads is not None:
        ins["beta"] = 1 / (1 + np.exp(-rand(b, t, hkv if beta_heads else 1)))
    while list(ins.values())[-1] is None:
        ins.popitem()
    check_node("LinearAttention", ins, ["out", "state"], opset=27, update_rule=rule,
               q_num_heads=hq, kv_num_heads=hkv)


# ----------------------------------------------------------------- FlexAttention

def _flex_model(q, k, v, **attrs):
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain="ai.onnx.preview",
                            **attrs)
    vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
           for n, a in (("Q", q), ("K", k), ("V", v))]
    graph = helper.make_graph([node], "flex", vis,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26),
                                                   helper.make_opsetid("ai.onnx.preview", 1)])


def _mul_graph(name, factor):
    c = helper.make_tensor("c", TensorProto.FLOAT, [], [factor])
    return helper.make_graph(
        [helper.make_node("Mul", ["s", "c"], ["o"])], name,
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)], [c])


@pytest.mark.parametrize("attrs", [{}, {"scale": 0.2},
                                   {"score_mod": _mul_graph("sm", 0.5)},
                                   {"prob_mod": _mul_graph("pm", 2.0)}],
                         ids=["plain", "scale", "score_mod", "prob_mod"])
def test_flex_attention(attrs):
    q, k, v = rand(2, 4, 3, 8), rand(2, 2, 5, 8), rand(2, 2, 5, 6)
    check_model(_flex_model(q, k, v, **attrs), {"Q": q, "K": k, "V": v})
