"""Attention kernels: scaled dot-product attention with KV cache and grouped
query heads, rotary position embeddings, FlexAttention and linear attention.

Spec: ONNX Attention (opsets 23, 24, 25), RotaryEmbedding (23), LinearAttention
(27), ai.onnx.preview FlexAttention (1).

All matmuls are batched over (batch, kv_heads); grouped query heads are folded
into the matmul's row dimension, so K/V heads are never repeated in memory.
float16 / bfloat16 inputs are computed in float32 and rounded once at the end.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from .._contract import Kernel, NodeSpec, require
from ._attention_util import (attention_bias, compute_dtype, gqa_apply, gqa_scores,
                              merge_heads, onnx_float_dtype, softmax_, split_heads)
from actorrt._lazy import lazy_module
from .registry import cpu_kernel

_attn_nb = lazy_module(f"{__package__}._attention_numba", globals(), "_attn_nb")

__all__ = ["Attention", "RotaryEmbedding", "FlexAttention", "LinearAttention"]


# ================================================================== Attention

def _check_attention(node: NodeSpec) -> None:
    mode = node.attr("qk_matmul_output_mode", 0)
    require(mode in (0, 1, 2, 3), "qk_matmul_output_mode must be 0..3, got %s", mode)
    sp = node.attr("softmax_precision")
    require(sp is None or sp in (1, 10, 11, 16),
            "softmax_precision %s is not FLOAT, FLOAT16, DOUBLE or BFLOAT16", sp)
    for w in ("left_window_size", "right_window_size"):
        require(node.attr(w, -1) >= -1, "%s must be -1 or nonnegative", w)
    require(node.has_input(4) == node.has_input(5),
            "past_key and past_value must be given together")


@cpu_kernel("Attention", since=(23, 24, 25))
class Attention(Kernel):
    """ONNX Attention (opsets 23-25): softmax(scale * Q K^T + bias) V.

    Inputs Q (batch, q_heads, q_len, head) / K, V (batch, kv_heads, kv_len, head)
    or the 3-D packed (batch, seq, heads * head) forms with ``q_num_heads`` and
    ``kv_num_heads``; optional attn_mask, past_key/past_value (concatenated in
    front of K/V into present_key/present_value) and nonpad_kv_seqlen (24+).
    Outputs Y, present_key, present_value, qk_matmul_output.
    """

    multi_output = True

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        _check_attention(node)

    @classmethod
    def estimate_flops(cls, node: NodeSpec) -> float:
        q, k = node.input_type(0), node.input_type(1)
        if q is None or k is None or q.static_shape is None or k.static_shape is None:
            return super().estimate_flops(node)
        qs, ks = q.static_shape, k.static_shape
        if len(qs) == 4:
            return 4.0 * qs[0] * qs[1] * qs[2] * qs[3] * ks[2]
        return 4.0 * qs[0] * qs[1] * qs[2] * ks[1]

    def compile(self) -> Callable:
        node = self.node
        a = node.attrs
        cfg = dict(
            scale=a.get("scale"), is_causal=bool(a.get("is_causal", 0)),
            q_heads=a.get("q_num_heads"), kv_heads=a.get("kv_num_heads"),
            softcap=float(a.get("softcap", 0.0)), mode=int(a.get("qk_matmul_output_mode", 0)),
            softmax_dtype=(onnx_float_dtype(a["softmax_precision"])
                           if a.get("softmax_precision") is not None else None),
            left=int(a.get("left_window_size", -1)), right=int(a.get("right_window_size", -1)),
            want_qk=len(node.outputs) > 3 and node.outputs[3] != "",
            want_present=any(len(node.outputs) > i and node.outputs[i] != "" for i in (1, 2)),
        )

        def run(Q, K, V, attn_mask=None, past_key=None, past_value=None,
                nonpad_kv_seqlen=None):
            return _attention(Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, **cfg)

        return run

    def run(self, *inputs):
        return self.compile()(*inputs)


def _attention(Q, K, V, attn_mask, past_key, past_value, nonpad, *, scale, is_causal, q_heads,
               kv_heads, softcap, mode, softmax_dtype, left, right, want_qk, want_present):
    if Q.ndim != K.ndim or Q.ndim != V.ndim or Q.ndim not in (3, 4):
        raise ValueError(f"Q, K, V must all be 3-D or all 4-D, got ranks "
                         f"{Q.ndim}, {K.ndim}, {V.ndim}")
    packed = Q.ndim == 3
    if packed:
        if not q_heads or not kv_heads:
            raise ValueError("3-D Q/K/V need the q_num_heads and kv_num_heads attributes")
        Q, K, V = split_heads(Q, q_heads), split_heads(K, kv_heads), split_heads(V, kv_heads)
    if (past_key is None) != (past_value is None):
        raise ValueError("past_key and past_value must be given together")
    if past_key is not None and nonpad is not None:
        raise ValueError("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    out_dtype = Q.dtype
    ct = compute_dtype(Q.dtype)
    head = Q.shape[-1]

    # KV cache: present = concat(past, new) along the sequence axis
    if past_key is not None:
        past_len = past_key.shape[2]
        present_k = np.concatenate((past_key, K.astype(past_key.dtype, copy=False)), axis=2)
        present_v = np.concatenate((past_value, V.astype(past_value.dtype, copy=False)), axis=2)
        Kc, Vc = present_k, present_v
    else:
        past_len = 0
        present_k = present_v = None
        Kc, Vc = K, V
        if want_present:
            present_k, present_v = np.array(K, copy=True), np.array(V, copy=True)

    q_len, kv_len = Q.shape[2], Kc.shape[2]
    if nonpad is not None:
        nonpad = np.asarray(nonpad, dtype=np.int64).reshape(-1)
        offset = nonpad - q_len
        if not want_qk:
            # keys past every batch's valid length never get any weight: skip them
            used = int(min(max(int(nonpad.max(initial=0)), 1), kv_len))
            if used < kv_len:
                Kc, Vc, kv_len = Kc[:, :, :used], Vc[:, :, :used], used
    else:
        offset = past_len

    s = float(scale) if scale is not None else 1.0 / math.sqrt(head)
    q = Q.astype(ct, copy=False) * ct.type(s)
    scores = gqa_scores(q, Kc.astype(ct, copy=False))  # (b, hq, q_len, kv_len), ours
    qk_out = None
    if want_qk and mode == 0:
        qk_out = scores.copy()
    if softcap > 0:
        np.divide(scores, ct.type(softcap), out=scores)
        np.tanh(scores, out=scores)
        np.multiply(scores, ct.type(softcap), out=scores)
    if want_qk and mode == 1:
        qk_out = scores.copy()

    bias = attention_bias(q_len=q_len, kv_len=kv_len, dtype=ct, attn_mask=attn_mask,
                          is_causal=is_causal, offset=offset, nonpad=nonpad,
                          left_window=left, right_window=right)
    if bias is not None:
        if bias.ndim > 4:
            raise ValueError(f"attn_mask of rank {attn_mask.ndim} does not broadcast to "
                             f"(batch, heads, q_len, kv_len)")
        scores = _add_bias(scores, bias)
    if want_qk and mode == 2:
        qk_out = scores.copy()

    if softmax_dtype is not None and softmax_dtype != ct:
        probs = _softmax_in(scores, softmax_dtype)
    else:
        probs = softmax_(scores)
    if bias is not None:
        dead = np.isneginf(np.max(bias, axis=-1, keepdims=True))
        if dead.any():
            probs = np.where(dead, probs.dtype.type(0), probs)
    if want_qk and mode == 3:
        qk_out = probs
    if probs.dtype != ct:
        probs = probs.astype(ct)

    y = gqa_apply(probs, Vc.astype(ct, copy=False))
    if packed:
        y = merge_heads(y)
    y = y.astype(out_dtype, copy=False)
    if qk_out is not None:
        qk_out = qk_out.astype(out_dtype, copy=False)
    return y, present_k, present_v, qk_out


def _add_bias(scores: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``scores + bias``, in place when the bias does not enlarge the shape."""
    full = np.broadcast_shapes(scores.shape, bias.shape)
    if full == scores.shape:
        np.add(scores, bias, out=scores)
        return scores
    return scores + bias


def _softmax_in(scores: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Softmax computed at ``dtype`` precision (ONNX ``softmax_precision``);
    16-bit types are emulated by rounding the input and result."""
    cd = compute_dtype(dtype)
    x = scores.astype(dtype).astype(cd)
    p = softmax_(x)
    return p.astype(dtype).astype(cd) if cd != dtype else p


# ============================================================ RotaryEmbedding

@cpu_kernel("ScaledDotAttention", domain="ai.actorrt")
def ScaledDotAttention(q, k, v, mask=None, *, scale=1.0, transpose_k=0):
    """``softmax(q @ k * scale + mask) @ v`` over the last axis (engine op
    from the graph optimizer's MatMul-scale-[Add]-Softmax-MatMul fusion):
    float32 ``q (..., S, D)``, ``k (..., D, T)`` (already transposed; with
    ``transpose_k=1`` ``k (..., T, D)``, as onnxruntime's FusedMatMul with
    ``transB=1`` reads it, taken as a transposed view),
    ``v (..., T, Dv)``, additive ``mask`` broadcasting against ``(..., S, T)``.
    The scores are scaled, masked and normalized in place. At more than one
    intra-op thread, with the compiled partner threads (:mod:`._partner`)
    and float32 operands of one batch shape, each of the three passes (the
    two batched products, the softmax rows) splits over the caller and its
    partners (batch entries, rows; no Python hand-off); otherwise products
    of at least ``_matmul_split.PARALLEL_MIN_FLOPS`` run as blocks of the
    largest batch axis (heads), each block's whole attention on one thread
    with one-thread BLAS. Rank-4 float32 operands with at most
    ``_attention_numba.MAX_ROWS`` query rows (a decode step) take one
    compiled call instead (:func:`._attention_numba.attend`, one thread)."""
    if q.ndim == 4 and q.shape[2] <= _attn_nb.MAX_ROWS:
        # a decode step: scores, softmax and the sum of values in one compiled call
        y = _attn_nb.attend(q, k, v, mask, scale, bool(transpose_k))
        if y is not None:
            return y
    from . import _matmul_split, _threads
    if transpose_k:
        if k.ndim < 2:
            raise ValueError(f"ScaledDotAttention: transpose_k needs k of rank >= 2, got {k.shape}")
        k = k.swapaxes(-1, -2)
    threads = _threads.current()
    if threads <= 1 or q.ndim < 3 or k.ndim < 2 or v.ndim < 2 or \
            (mask is not None and mask.ndim > max(q.ndim, k.ndim, v.ndim)):
        return _sdpa(q, k, v, mask, scale)
    sq, d, t, dv = q.shape[-2], q.shape[-1], k.shape[-1], v.shape[-1]
    if _partner_split(q, k, v):
        y = _entries_split(q, k, v, mask, scale, threads)
        if y is not None:
            return y
        with _threads.serial_blas():
            return _sdpa(q, k, v, mask, scale, threads=threads)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                                mask.shape[:-2] if mask is not None and mask.ndim > 2 else ())
    count = int(np.prod(batch)) if batch else 1
    if count < 2 or 2 * count * sq * t * (d + dv) < _matmul_split.PARALLEL_MIN_FLOPS:
        with _threads.serial_blas():
            return _sdpa(q, k, v, mask, scale)
    nd = len(batch) + 2
    ops = [x.reshape((1,) * (nd - x.ndim) + x.shape) for x in (q, k, v)]
    if mask is not None:
        ops.append(mask.reshape((1,) * (nd - mask.ndim) + mask.shape) if mask.ndim >= 2
                   else mask.reshape((1,) * (nd - 1) + mask.shape))
    else:
        ops.append(None)
    out = np.empty(batch + (sq, dv), dtype=np.result_type(q, v))

    def block(qb, kb, vb, mb, *, out):
        _sdpa(qb, kb, vb, mb, scale, out=out)
    with _threads.serial_blas():
        _matmul_split.run_batched(block, ops, out, threads)
    return out


def _partner_split(q, k, v) -> bool:
    """Whether :func:`_sdpa` splits its passes over the compiled partner
    threads: float32 operands of one batch shape (several entries) whose
    products the compiled batched GEMM takes (:func:`._sgemm_numba.bmm`)."""
    if q.dtype != np.float32 or k.dtype != np.float32 or v.dtype != np.float32 or \
            not (q.ndim == k.ndim == v.ndim >= 3) or \
            not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) or q.size == 0 or k.size == 0:
        return False
    from . import _matmul_split
    sg = _matmul_split._sgemm()
    if sg is None or not sg.USE_PARTNERS or q.shape[-2] < sg.BMM_MIN_ROWS or \
            math.prod(q.shape[:-2]) < 2:
        return False
    from . import _partner
    return _partner.AVAILABLE


def _entries_split(q, k, v, mask, scale, threads):
    """:func:`_sdpa`'s result with each batch entry's three passes on one
    thread, the entries over the caller and its partners
    (:func:`._attention_split.attend_entries`, one hand-off); None where
    that does not apply (then the passes split one by one)."""
    from . import _attention_split, _softmax_numba
    if not ENTRIES_SPLIT or not _softmax_numba.HAVE_NUMBA:
        return None
    m2 = None
    if mask is not None:
        m2 = _softmax_numba.mask_rows(q.shape[:-1] + k.shape[-1:], mask)
        if m2 is None:
            return None
    return _attention_split.attend_entries(q, k, v, m2, 0 if m2 is None else m2.shape[0],
                                           scale, threads)


#: multi-row attention at more than one thread: each entry's passes on one
#: thread, entries split (:func:`_entries_split`); False: each pass split
ENTRIES_SPLIT = True


def _bmm(a, b, out=None, threads=1):
    """``np.matmul(a, b, out=out)``; float32 batches of equal batch shape by
    the compiled GEMM (:func:`._sgemm_numba.bmm`, split over ``threads``)
    where it applies."""
    from ._matmul_split import batched_f32
    y = batched_f32(a, b, out, threads)
    return y if y is not None else np.matmul(a, b, out=out)


def _sdpa(q, k, v, mask, scale, out=None, threads=1):
    from . import _softmax_numba  # numba loads on first use, not at import
    s = _bmm(q, k, threads=threads)
    if s.dtype == np.float32 and (mask is None or mask.dtype == np.float32) and \
            _softmax_numba.softmax_rows_f32(s, scale, mask, threads):
        # scaled, masked, normalized in one compiled pass
        return _bmm(s, v, out=out, threads=threads)
    if scale != 1.0:
        s *= s.dtype.type(scale)
    if mask is not None:
        if np.broadcast_shapes(s.shape, mask.shape) == s.shape and mask.dtype == s.dtype:
            s += mask
        else:
            s = s + mask
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return np.matmul(s, v, out=out)


@cpu_kernel("RotaryEmbedding", since=23)
def RotaryEmbedding(input, cos_cache, sin_cache, position_ids=None, *, interleaved=0,
                    num_heads=0, rotary_embedding_dim=0):
    """ONNX RotaryEmbedding-23. ``input`` (batch, heads, seq, head) or
    (batch, seq, heads * head) with ``num_heads``; caches (max_pos, rot/2) indexed
    by ``position_ids`` (batch, seq), or (batch, seq, rot/2) without them."""
    x = input
    if x.ndim == 4:
        xs = x.transpose(0, 2, 1, 3)  # (b, s, h, d) view
    elif x.ndim == 3:
        if not num_heads:
            raise ValueError("3-D input needs the num_heads attribute")
        b, s, hidden = x.shape
        if hidden % num_heads:
            raise ValueError(f"hidden size {hidden} is not divisible by num_heads {num_heads}")
        xs = x.reshape(b, s, num_heads, hidden // num_heads)
    else:
        raise ValueError(f"input must be 3-D or 4-D, got shape {x.shape}")
    head = xs.shape[-1]
    rot = int(rotary_embedding_dim) or head
    half = rot // 2
    if position_ids is not None:
        cos, sin = cos_cache[position_ids], sin_cache[position_ids]
    else:
        cos, sin = cos_cache, sin_cache
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise ValueError(f"cos/sin cache last dim {cos.shape[-1]} does not match "
                         f"rotary_embedding_dim/2 = {half}")
    cos = cos.astype(x.dtype, copy=False)[:, :, None, :]  # (b, s, 1, half)
    sin = sin.astype(x.dtype, copy=False)[:, :, None, :]
    if interleaved:
        x1, x2 = xs[..., 0:rot:2], xs[..., 1:rot:2]
    else:
        x1, x2 = xs[..., :half], xs[..., half:rot]
    out = np.empty(xs.shape, dtype=x.dtype)
    if interleaved:
        out[..., 0:rot:2] = cos * x1 - sin * x2
        out[..., 1:rot:2] = sin * x1 + cos * x2
    else:
        out[..., :half] = cos * x1 - sin * x2
        out[..., half:rot] = sin * x1 + cos * x2
    out[..., rot:] = xs[..., rot:]
    if x.ndim == 4:
        return np.ascontiguousarray(out.transpose(0, 2, 1, 3))
    return out.reshape(x.shape)


# ============================================================== FlexAttention

@cpu_kernel("FlexAttention", since=1, domain="ai.onnx.preview")
class FlexAttention(Kernel):
    """ai.onnx.preview FlexAttention-1: softmax(score_mod(scale * Q K^T)) with an
    optional prob_mod subgraph, then @ V. Rank-4 (batch, heads, seq, head) inputs;
    query head ``h`` reads K/V head ``h // (q_heads / kv_heads)``."""

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        sp = node.attr("softmax_precision")
        require(sp is None or sp in (1, 10, 11, 16),
                "softmax_precision %s is not FLOAT, FLOAT16, DOUBLE or BFLOAT16", sp)
        mods = [node.attr(n) for n in ("score_mod", "prob_mod") if node.attr(n) is not None]
        require(not mods or node.compile_subgraph is not None,
                "score_mod/prob_mod subgraphs need a plan that compiles subgraphs")

    def compile(self) -> Callable:
        node = self.node
        mods = {}
        for name in ("score_mod", "prob_mod"):
            g = node.attr(name)
            mods[name] = node.compile_subgraph(g) if g is not None else None
        scale = node.attr("scale")
        sp = node.attr("softmax_precision")
        sp_dtype = onnx_float_dtype(sp) if sp is not None else None

        def run(Q, K, V, outer=None):
            return _flex_attention(Q, K, V, scale, sp_dtype, mods["score_mod"],
                                   mods["prob_mod"], outer)

        return run

    def run(self, *inputs, outer=None):
        return self.compile()(*inputs, outer=outer)


def _call_mod(runner: Any, x: np.ndarray, outer: dict | None, dtype: np.dtype) -> np.ndarray:
    out = runner([x], outer or {})
    if len(out) != 1:
        raise ValueError(f"a FlexAttention modifier subgraph must have 1 output, got {len(out)}")
    y = np.asarray(out[0])
    if y.shape != x.shape:
        raise ValueError(f"modifier subgraph changed the shape {x.shape} -> {y.shape}")
    return y.astype(dtype, copy=False)


def _flex_attention(Q, K, V, scale, sp_dtype, score_mod, prob_mod, outer):
    if Q.ndim != 4 or K.ndim != 4 or V.ndim != 4:
        raise ValueError(f"FlexAttention needs rank-4 inputs, got Q {Q.shape}, K {K.shape}, "
                         f"V {V.shape}")
    if K.shape[-1] != Q.shape[-1] or K.shape[:3] != V.shape[:3]:
        raise ValueError(f"incompatible shapes Q {Q.shape}, K {K.shape}, V {V.shape}")
    # softmax dtype: explicit, else float32 below double, else the input dtype
    if sp_dtype is None:
        sp_dtype = np.dtype(np.float64) if Q.dtype == np.float64 else np.dtype(np.float32)
    ct = compute_dtype(sp_dtype)
    s = float(scale) if scale is not None else 1.0 / math.sqrt(Q.shape[-1])
    work = np.promote_types(compute_dtype(Q.dtype), ct)
    scores = gqa_scores(Q.astype(work, copy=False) * work.type(s), K.astype(work, copy=False))
    if sp_dtype != work:
        scores = scores.astype(sp_dtype)
    if score_mod is not None:
        scores = np.array(_call_mod(score_mod, scores, outer, sp_dtype), copy=True)
    probs = softmax_(scores.astype(ct))
    if sp_dtype != ct:
        probs = probs.astype(sp_dtype)
    if prob_mod is not None:
        probs = _call_mod(prob_mod, probs, outer, sp_dtype)
    y = gqa_apply(probs.astype(ct, copy=False), V.astype(ct, copy=False))
    return y.astype(V.dtype, copy=False)


# ============================================================ LinearAttention

_RULES = ("linear", "gated", "delta", "gated_delta")


@cpu_kernel("LinearAttention", since=27, multi_output=True)
def LinearAttention(query, key, value, past_state=None, decay=None, beta=None, *,
                    chunk_size=64, kv_num_heads=None, q_num_heads=None, scale=0.0,
                    update_rule="gated_delta"):
    """ONNX LinearAttention-27: recurrent (gated / delta-rule) linear attention.

    query (B, T, Hq * dk), key (B, T, Hkv * dk), value (B, T, Hkv * dv), past_state
    (B, Hkv, dk, dv); decay (B, T, Hkv * dk) or (B, T, Hkv) in log space; beta
    (B, T, Hkv) or (B, T, 1). Returns output (B, T, Hq * dv) and present_state.
    The state is carried in float32; loops over time steps only.
    """
    if update_rule not in _RULES:
        raise ValueError(f"update_rule {update_rule!r} is not one of {_RULES}")
    if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads:
        raise ValueError(f"q_num_heads ({q_num_heads}) must be a positive multiple of "
                         f"kv_num_heads ({kv_num_heads})")
    gated = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    if gated != (decay is not None):
        raise ValueError(f"update_rule {update_rule!r} {'needs' if gated else 'forbids'} "
                         f"the decay input")
    if delta != (beta is not None):
        raise ValueError(f"update_rule {update_rule!r} {'needs' if delta else 'forbids'} "
                         f"the beta input")
    f32 = np.float32
    b, t, _ = query.shape
    hq, hkv = int(q_num_heads), int(kv_num_heads)
    g = hq // hkv
    q = split_heads(query, hq).astype(f32)  # (b, hq, t, dk)
    k = split_heads(key, hkv).astype(f32)
    v = split_heads(value, hkv).astype(f32)
    dk, dv = q.shape[-1], v.shape[-1]
    if k.shape[-1] != dk:
        raise ValueError(f"key head size {k.shape[-1]} differs from query head size {dk}")
    if gated:
        if decay.shape[-1] == hkv:
            gate = np.exp(decay.astype(f32)).reshape(b, t, hkv, 1, 1)
        elif decay.shape[-1] == hkv * dk:
            gate = np.exp(decay.astype(f32)).reshape(b, t, hkv, dk, 1)
        else:
            raise ValueError(f"decay last dim {decay.shape[-1]} must be kv_num_heads ({hkv}) "
                             f"or kv_num_heads*d_k ({hkv * dk})")
    if delta:
        if beta.shape[-1] not in (hkv, 1):
            raise ValueError(f"beta last dim {beta.shape[-1]} must be kv_num_heads or 1")
        bt = beta.astype(f32).reshape(b, t, beta.shape[-1], 1)
    if past_state is not None:
        if past_state.shape != (b, hkv, dk, dv):
            raise ValueError(f"past_state shape {past_state.shape} is not {(b, hkv, dk, dv)}")
        state_dtype = past_state.dtype
        state = past_state.astype(f32)  # a copy we own
    else:
        state_dtype = query.dtype
        state = np.zeros((b, hkv, dk, dv), dtype=f32)
    sc = f32(scale) if scale else f32(1.0 / math.sqrt(dk))
    qg = (q * sc).reshape(b, hkv, g, t, dk)
    out = np.empty((b, hkv, g, t, dv), dtype=f32)
    for i in range(t):
        k_t, v_t = k[:, :, i, :], v[:, :, i, :]
        if gated:
            state *= gate[:, i]
        if delta:
            retrieved = np.matmul(k_t[:, :, None, :], state)[:, :, 0, :]  # (b, hkv, dv)
            v_t = bt[:, i] * (v_t - retrieved)
        state += k_t[:, :, :, None] * v_t[:, :, None, :]
        out[:, :, :, i, :] = np.matmul(qg[:, :, :, i, :], state)
    y = out.reshape(b, hq, t, dv).transpose(0, 2, 1, 3).reshape(b, t, hq * dv)
    return y.astype(query.dtype), state.astype(state_dtype)
