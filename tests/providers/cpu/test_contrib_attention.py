"""com.microsoft Attention (BERT / GPT-2 style, what onnxruntime's transformer
optimizer writes) against onnxruntime's own kernel: every mask_index format,
unidirectional, past / present, attention_bias, qkv_hidden_sizes, a custom
scale and mask_filter_value, float16; and the refused configurations."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from tests.oracle import run_actorrt, run_onnxruntime_unoptimized

RNG = np.random.default_rng(77)
B, S, D, H = 2, 5, 24, 3


def _model(inputs, attrs, n_out=1, inits=(), dtype=TP.FLOAT):
    """inputs: list of (name or "", value info) in the op's input order."""
    names = [n for n, _ in inputs]
    while names and not names[-1]:
        names.pop()
    vis = [vi for n, vi in inputs if n and vi is not None]
    outs = ["y", "present"][:n_out]
    node = helper.make_node("Attention", names, outs, domain="com.microsoft", **attrs)
    g = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(o, dtype, None)
                                            for o in outs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()


_ort = run_onnxruntime_unoptimized
_ours = run_actorrt


def _vi(name, arr, dt=TP.FLOAT):
    return helper.make_tensor_value_info(name, dt, list(arr.shape))


def _case(mask=None, past_len=0, bias=True, attention_bias=False, widths=None, attrs=None,
          const_weights=True, s=S):
    dq, dk, dv = widths or (D, D, D)
    x = RNG.standard_normal((B, s, D)).astype(np.float32)
    w = (RNG.standard_normal((D, dq + dk + dv)) / np.sqrt(D)).astype(np.float32)
    bb = RNG.standard_normal(dq + dk + dv).astype(np.float32) * 0.1
    feeds, inits, ins = {"x": x}, [], [("x", _vi("x", x))]
    if const_weights:
        inits.append(numpy_helper.from_array(w, "w"))
        ins.append(("w", None))
    else:
        feeds["w"] = w
        ins.append(("w", _vi("w", w)))
    if bias:
        inits.append(numpy_helper.from_array(bb, "b"))
        ins.append(("b", None))
    else:
        ins.append(("", None))
    if mask is not None:
        feeds["m"] = mask
        ins.append(("m", _vi("m", mask, TP.INT32)))
    else:
        ins.append(("", None))
    n_out = 1
    if past_len is not None and past_len > 0 or (attrs or {}).get("_present"):
        past = RNG.standard_normal((2, B, H, past_len, dq // H)).astype(np.float32)
        feeds["past"] = past
        ins.append(("past", _vi("past", past)))
        n_out = 2
    else:
        ins.append(("", None))
    if attention_bias:
        t = (past_len or 0) + s
        ab = RNG.standard_normal((1, H, s, t)).astype(np.float32)
        feeds["ab"] = ab
        ins.append(("ab", _vi("ab", ab)))
    at = {"num_heads": H}
    at.update({k: v for k, v in (attrs or {}).items() if not k.startswith("_")})
    if widths:
        at["qkv_hidden_sizes"] = list(widths)
    return _model(ins, at, n_out, inits), feeds


def _compare(model, feeds, rtol=1e-4, atol=1e-5):
    want = _ort(model, feeds)
    got = _ours(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


lengths = np.array([5, 3], np.int32)
MASKS = {
    "none": None,
    "key lengths (B,)": lengths,
    "end and start (2B,)": np.array([5, 4, 0, 1], np.int32),
    "raw (B, T)": (RNG.random((B, S)) > 0.3).astype(np.int32),
    "raw (B, S, T)": (RNG.random((B, S, S)) > 0.3).astype(np.int32),
}


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("mask", MASKS, ids=list(MASKS))
def test_masks_equal_onnxruntime(mask, unidirectional):
    model, feeds = _case(MASKS[mask], attrs={"unidirectional": unidirectional})
    _compare(model, feeds)


@pytest.mark.parametrize("mask", [None, "raw"])
def test_past_and_present_equal_onnxruntime(mask):
    p = 4
    m = None if mask is None else (RNG.random((B, p + S)) > 0.2).astype(np.int32)
    model, feeds = _case(m, past_len=p, attrs={"unidirectional": 1})
    _compare(model, feeds)


def test_one_token_decode_with_past_equals_onnxruntime():
    model, feeds = _case(None, past_len=6, attrs={"unidirectional": 1}, s=1)
    _compare(model, feeds)


def test_attention_bias_scale_filter_and_no_bias_equal_onnxruntime():
    model, feeds = _case(lengths, bias=False, attention_bias=True,
                         attrs={"scale": 0.3, "mask_filter_value": -500.0},
                         const_weights=False)
    _compare(model, feeds)


def test_qkv_hidden_sizes_equal_onnxruntime():
    model, feeds = _case(MASKS["raw (B, T)"], widths=(24, 24, 12))
    _compare(model, feeds)


def test_float16_equals_onnxruntime():
    x = RNG.standard_normal((B, S, D)).astype(np.float16)
    w = (RNG.standard_normal((D, 3 * D)) / np.sqrt(D)).astype(np.float16)
    b = (RNG.standard_normal(3 * D) * 0.1).astype(np.float16)
    model = _model([("x", _vi("x", x, TP.FLOAT16)), ("w", None), ("b", None)], {"num_heads": H},
                   1, [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
                   dtype=TP.FLOAT16)
    want = _ort(model, {"x": x})[0]
    got = _ours(model, {"x": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                               rtol=5e-3, atol=5e-3)


def test_refused_configurations_are_typed():
    model, feeds = _case(None, attrs={"do_rotary": 1})
    with pytest.raises(actorrt.UnsupportedOperatorError, match="do_rotary"):
        _ours(model, feeds)
    for bad in (np.zeros(7, np.int32),  # no listed mask format for B = 2
                np.ones((B, 1, 8, 8), np.int32)):  # 4-D: onnxruntime's CPU kernel refuses it
        model, feeds = _case(bad)
        with pytest.raises(Exception):
            _ort(model, feeds)
        with pytest.raises(actorrt.ActorRTError, match="mask_index"):
            _ours(model, feeds)


# ------------------------------------------------- EmbedLayerNormalization

def _embed_model(ins, outs, feeds, inits, **attrs):
    node = helper.make_node("EmbedLayerNormalization", ins, outs, domain="com.microsoft",
                            **attrs)
    vis = [helper.make_tensor_value_info(k, TP.INT32, list(v.shape)) for k, v in feeds.items()]
    g = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(
        o, TP.INT32 if o == "mi" else TP.FLOAT, None) for o in outs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()


@pytest.mark.parametrize("variant", ["all inputs", "no segment, position_ids (1, S)",
                                     "position_ids (B, S)", "no mask"])
def test_embed_layer_normalization_equals_onnxruntime(variant):
    v, d, b, s = 30, 16, 2, 5
    inits = [numpy_helper.from_array(RNG.standard_normal((v, d)).astype(np.float32), "we"),
             numpy_helper.from_array(RNG.standard_normal((12, d)).astype(np.float32), "pe"),
             numpy_helper.from_array(RNG.standard_normal((2, d)).astype(np.float32), "se"),
             numpy_helper.from_array(RNG.standard_normal(d).astype(np.float32), "g"),
             numpy_helper.from_array(RNG.standard_normal(d).astype(np.float32), "bt")]
    feeds = {"ids": RNG.integers(0, v, (b, s)).astype(np.int32)}
    ins = ["ids", "seg", "we", "pe", "se", "g", "bt", "mask"]
    feeds["seg"] = RNG.integers(0, 2, (b, s)).astype(np.int32)
    feeds["mask"] = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0]], np.int32)
    if variant == "no segment, position_ids (1, S)":
        ins = ["ids", "", "we", "pe", "", "g", "bt", "mask", "pid"]
        del feeds["seg"]
        feeds["pid"] = np.array([[3, 2, 1, 0, 4]], np.int32)
    elif variant == "position_ids (B, S)":
        ins = ins + ["pid"]
        feeds["pid"] = RNG.integers(0, 12, (b, s)).astype(np.int32)
    elif variant == "no mask":
        ins = ins[:7]
        del feeds["mask"]
    model = _embed_model(ins, ["y", "mi", "es"], feeds, inits, epsilon=1e-5)
    _compare(model, feeds)


def test_embed_layer_normalization_out_of_range_id_is_a_typed_error():
    inits = [numpy_helper.from_array(np.ones((4, 8), np.float32), n) for n in ("we", "pe")] + \
        [numpy_helper.from_array(np.ones(8, np.float32), n) for n in ("g", "bt")]
    feeds = {"ids": np.array([[0, 9]], np.int32)}
    model = _embed_model(["ids", "", "we", "pe", "", "g", "bt"], ["y"], feeds, inits)
    with pytest.raises(actorrt.ActorRTError, match="input_ids"):
        _ours(model, feeds)


# ------------------------------------------------------ MultiHeadAttention

def _mha_model(feeds, names, attrs, n_out, dtype=TP.FLOAT):
    """names: the op's input names in order ("" for absent ones)."""
    while names and not names[-1]:
        names = names[:-1]
    vis = [helper.make_tensor_value_info(n, TP.INT32 if feeds[n].dtype == np.int32 else dtype,
                                         list(feeds[n].shape)) for n in names if n]
    outs = ["y", "present_k", "present_v"][:n_out]
    node = helper.make_node("MultiHeadAttention", names, outs, domain="com.microsoft",
                            num_heads=H, **attrs)
    g = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(o, dtype, None)
                                            for o in outs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


DH = D // H
L = 7
MHA_CASES = {
    "self, bias": (lambda: {"q": _f(B, S, D), "k": _f(B, S, D), "v": _f(B, S, D),
                            "bias": _f(3 * D)}, ["q", "k", "v", "bias"], {}),
    "cross, lengths mask": (lambda: {"q": _f(B, S, D), "k": _f(B, L, D), "v": _f(B, L, D),
                                     "m": np.array([7, 4], np.int32)},
                            ["q", "k", "v", "", "m"], {}),
    "cross, raw mask, scale": (lambda: {"q": _f(B, S, D), "k": _f(B, L, D), "v": _f(B, L, D),
                                        "m": (RNG.random((B, L)) > 0.3).astype(np.int32)},
                               ["q", "k", "v", "", "m"], {"scale": 0.2}),
    "split heads K/V": (lambda: {"q": _f(B, S, D), "k": _f(B, H, L, DH), "v": _f(B, H, L, DH)},
                        ["q", "k", "v"], {}),
    "self, past, causal, 3-D mask, attention bias": (
        lambda: {"q": _f(B, S, D), "k": _f(B, S, D), "v": _f(B, S, D),
                 "m": (RNG.random((B, S, 4 + S)) > 0.2).astype(np.int32),
                 "ab": _f(1, H, S, 4 + S), "pk": _f(B, H, 4, DH), "pv": _f(B, H, 4, DH)},
        ["q", "k", "v", "", "m", "ab", "pk", "pv"], {"unidirectional": 1}),
}


@pytest.mark.parametrize("case", MHA_CASES, ids=list(MHA_CASES))
def test_multi_head_attention_equals_onnxruntime(case):
    make, names, attrs = MHA_CASES[case]
    feeds = make()
    n_out = 3 if "pk" in feeds or case.startswith("self") else 1
    model = _mha_model(feeds, names, attrs, n_out)
    _compare(model, {n: feeds[n] for n in names if n})


def test_multi_head_attention_float16_equals_onnxruntime():
    feeds = {n: _f(B, S, D).astype(np.float16) for n in ("q", "k", "v")}
    model = _mha_model(feeds, ["q", "k", "v"], {}, 1, dtype=TP.FLOAT16)
    want = _ort(model, feeds)[0]
    got = _ours(model, feeds)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                               rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("packed", ["KV", "QKV"])
def test_multi_head_attention_packed_equals_onnxruntime_on_the_unpacked_inputs(packed):
    # onnxruntime's CPU kernel does not take packed inputs (its CUDA kernel
    # does): the reference is onnxruntime on the same tensors unpacked
    bias = _f(3 * D)
    if packed == "KV":
        q, kv = _f(B, S, D), _f(B, L, H, 2, DH)
        feeds, names = {"q": q, "k": kv, "bias": bias}, ["q", "k", "", "bias"]
        ref = {"q": q, "k": kv[:, :, :, 0].reshape(B, L, D),
               "v": kv[:, :, :, 1].reshape(B, L, D), "bias": bias}
    else:
        qkv = _f(B, S, H, 3, DH)
        feeds, names = {"q": qkv, "bias": bias}, ["q", "", "", "bias"]
        ref = {n: qkv[:, :, :, i].reshape(B, S, D) for i, n in enumerate("qkv")}
        ref["bias"] = bias
    want = _ort(_mha_model(ref, ["q", "k", "v", "bias"], {}, 1), ref)[0]
    got = _ours(_mha_model(feeds, names, {}, 1), {n: feeds[n] for n in names if n})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
