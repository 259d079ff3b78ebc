"""com.microsoft Attention and MultiHeadAttention: the BERT / GPT-2 / T5
style attention that onnxruntime's transformer optimizer writes
(onnxruntime semantics); :class:`MultiHeadAttention` documents its own
input formats.

Spec: onnxruntime ContribOperators, com.microsoft Attention and
MultiHeadAttention (opset 1).

``input (B, S, Din) @ weights (Din, Dq + Dk + Dv) + bias`` gives Q, K, V,
split into ``num_heads`` heads; K and V follow an optional ``past (2, B, H,
P, Dh)``; ``present = stack(K, V)`` ``(2, B, H, P + S, Dh)``. Scores ``Q K^T
* scale`` (default ``1 / sqrt(Dq / H)``) get, as onnxruntime adds them,
``mask_filter_value`` (default -10000) at every masked key, then
``attention_bias``; future keys (``unidirectional``) take no part; softmax
over keys; ``output = P V`` merged back to ``(B, S, Dv)``.

``mask_index`` (int32) in the formats onnxruntime's CPU kernel takes: key
lengths ``(B,)`` (right padding), end and start positions ``(2B,)`` (left
padding), a 0/1 mask ``(B, T)`` or ``(B, S, T)``. Refused at compile with a
typed Unsupported error: ``do_rotary``, ``past_present_share_buffer``, the
``(3B + 2)`` mask index; at run (as onnxruntime's CPU kernel refuses it) the
4-D Megatron mask.
float16 / bfloat16 compute in float32 and round back, as onnxruntime's CPU
kernel does.
"""

from __future__ import annotations

import math

import numpy as np

from .._contract import Kernel, NodeSpec, require
from ._reduce_util import LOW_PRECISION_FLOATS
from .registry import cpu_kernel

MS = "com.microsoft"


def _key_mask(mask_index: np.ndarray, b: int, s: int, t: int, past: int) -> np.ndarray:
    """Boolean ``(B, 1 | S, T)``: True where the key is masked."""
    m = np.asarray(mask_index)
    pos = np.arange(t)
    if m.ndim == 1 and m.shape[0] == b:  # key lengths (right padding)
        return (pos[None, :] >= m[:, None])[:, None, :]
    if m.ndim == 1 and m.shape[0] == 2 * b:  # exclusive ends, then inclusive starts
        end, start = m[:b], m[b:]
        return ((pos[None, :] >= end[:, None]) | (pos[None, :] < start[:, None]))[:, None, :]
    if m.ndim == 2 and m.shape == (b, t):
        return (m == 0)[:, None, :]
    if m.ndim == 3 and m.shape == (b, s, t):
        return m == 0
    if m.ndim == 4:
        raise ValueError("Attention: a 4-D (Megatron) mask_index is not supported on the CPU "
                         "(nor by onnxruntime's CPU kernel)")
    raise ValueError(f"Attention: mask_index of shape {m.shape} fits none of (B,) = ({b},), "
                     f"(2B,), (B, T) = ({b}, {t}) or (B, S, T) = ({b}, {s}, {t})")


@cpu_kernel("Attention", domain=MS)
class ContribAttention(Kernel):
    """com.microsoft Attention (see the module docstring). Inputs ``input``,
    ``weights``, ``bias``?, ``mask_index``?, ``past``?, ``attention_bias``?,
    ``past_sequence_length``?; outputs ``output (B, S, Dv)``, ``present``?
    ``(2, B, H, P + S, Dh)``.

    Raises (at run, as :class:`~actorrt.KernelError` naming the node): a
    ``weights`` width that does not split into the hidden sizes, hidden sizes
    that do not divide by ``num_heads``, a ``past`` with another head width
    or batch, a mask of no listed shape."""

    multi_output = True

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        require(int(node.attr("num_heads", 0)) > 0, "Attention: num_heads must be positive")
        require(not node.attr("do_rotary", 0), "Attention: do_rotary=1 is not supported")
        require(not node.attr("past_present_share_buffer", 0),
                "Attention: past_present_share_buffer=1 is not supported")
        t = node.input_type(3) if node.has_input(3) else None
        if t is not None and t.shape is not None and len(t.shape) == 1 and \
                isinstance(t.shape[0], int):
            b = node.input_type(0).shape[0] if node.input_type(0) is not None and \
                node.input_type(0).shape else None
            require(not (isinstance(b, int) and t.shape[0] == 3 * b + 2),
                    "Attention: the (3 * batch + 2) mask_index format is not supported")

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        a = node.attr
        self.heads = int(a("num_heads"))
        self.unidirectional = bool(a("unidirectional", 0))
        self.filter = np.float32(a("mask_filter_value", -10000.0))
        sizes = a("qkv_hidden_sizes")
        self.sizes = tuple(int(v) for v in sizes) if sizes else None
        scale = a("scale")
        self.scale = float(scale) if scale else None

    def run(self, x, weights, bias=None, mask_index=None, past=None, attention_bias=None,
            past_sequence_length=None):
        out_dtype = x.dtype
        if x.dtype in LOW_PRECISION_FLOATS:
            x, weights = x.astype(np.float32), weights.astype(np.float32)
            bias = None if bias is None else bias.astype(np.float32)
            past = None if past is None else past.astype(np.float32)
            attention_bias = None if attention_bias is None else attention_bias.astype(np.float32)
        if x.ndim != 3 or weights.ndim != 2 or weights.shape[0] != x.shape[2]:
            raise ValueError(f"Attention: input {x.shape} and weights {weights.shape} must be "
                             f"(B, S, D) and (D, Dq + Dk + Dv)")
        h = self.heads
        dq, dk, dv = self.sizes or (weights.shape[1] // 3,) * 3
        if dq + dk + dv != weights.shape[1] or dq != dk or dq % h or dv % h:
            raise ValueError(f"Attention: weights width {weights.shape[1]} does not split into "
                             f"hidden sizes {(dq, dk, dv)} divisible by num_heads {h}")
        b, s, _ = x.shape
        qkv = x @ weights
        if bias is not None:
            qkv += bias
        dh, dvh = dq // h, dv // h
        q = qkv[..., :dq].reshape(b, s, h, dh).transpose(0, 2, 1, 3)
        k = qkv[..., dq:dq + dk].reshape(b, s, h, dh).transpose(0, 2, 1, 3)
        v = qkv[..., dq + dk:].reshape(b, s, h, dvh).transpose(0, 2, 1, 3)
        p = 0
        if past is not None:
            if past.ndim != 5 or past.shape[0] != 2 or past.shape[1] != b or \
                    past.shape[2] != h or past.shape[4] != dh or dh != dvh:
                raise ValueError(f"Attention: past {past.shape} must be (2, {b}, {h}, P, {dh})")
            p = past.shape[3]
            k = np.concatenate([past[0], k], axis=2)
            v = np.concatenate([past[1], v], axis=2)
        y = attend(q, k, v, mask_index, attention_bias, past=p, scale=self.scale,
                   unidirectional=self.unidirectional, mask_filter_value=self.filter)
        present = np.stack([k, v]).astype(out_dtype) if dh == dvh else None
        return y.astype(out_dtype), present


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask_index, attention_bias, *,
           past: int, scale: float | None, unidirectional: bool,
           mask_filter_value: float) -> np.ndarray:
    """The attention both contrib ops share: float32 ``q (B, H, S, Dh)``, ``k
    (B, H, T, Dh)``, ``v (B, H, T, Dv)`` with ``T = past + S`` for self
    attention; scores scaled (default ``1 / sqrt(Dh)``), ``mask_filter_value``
    at keys ``mask_index`` masks (:func:`_key_mask` formats), future keys
    dropped when ``unidirectional``, ``attention_bias`` added; softmax; the
    result merged to ``(B, S, H * Dv)``."""
    b, h, s, dh = q.shape
    t = k.shape[2]
    scale = scale if scale is not None else 1.0 / math.sqrt(dh)
    scores = np.matmul(q, k.transpose(0, 1, 3, 2))
    scores *= np.float32(scale)
    if mask_index is not None or unidirectional:
        additive = np.zeros((b, 1, s, t), np.float32)
        if mask_index is not None:
            additive += np.where(_key_mask(mask_index, b, s, t, past)[:, None],
                                 np.float32(mask_filter_value), np.float32(0))
        if unidirectional:  # future keys take no part at all (as onnxruntime's kernel)
            future = np.arange(t)[None, :] > (past + np.arange(s))[:, None]
            additive += np.where(future, np.float32(-np.inf), np.float32(0))
        scores += additive
    if attention_bias is not None:
        scores += attention_bias
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return np.matmul(scores, v).transpose(0, 2, 1, 3).reshape(b, s, h * v.shape[3])


@cpu_kernel("MultiHeadAttention", domain=MS)
class MultiHeadAttention(Kernel):
    """com.microsoft MultiHeadAttention (self / cross attention, projection
    bias included; onnxruntime semantics). ``query`` ``(B, S, D)`` with
    ``key`` / ``value`` ``(B, L, D)`` / ``(B, L, Dv)``, or ``key`` / ``value``
    already split into heads ``(B, H, L, Dh)`` (cross attention), or packed
    KV ``key (B, L, H, 2, Dh)``, or packed QKV ``query (B, S, H, 3, Dh)``.
    ``bias`` ``(D + D + Dv)`` is added to Q, K and V (to Q only when K and V
    come split into heads); ``past_key`` / ``past_value`` ``(B, H, P, Dh)``
    precede K and V; ``key_padding_mask`` int32 ``(B,)`` key lengths, ``(B,
    T)`` or ``(B, S, T)`` 0/1; ``attention_bias`` ``(B | 1, H | 1, S, T)``.
    Outputs ``output (B, S, Dv)``, ``present_key`` / ``present_value`` ``(B,
    H, T, Dh)``. float16 / bfloat16 compute in float32.

    Refused at compile (typed Unsupported): the ``qk`` output,
    ``past_sequence_length`` (shared buffers), ``cache_indirection``."""

    multi_output = True

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        require(int(node.attr("num_heads", 0)) > 0,
                "MultiHeadAttention: num_heads must be positive")
        require(len(node.outputs) < 4 or not node.outputs[3],
                "MultiHeadAttention: the qk output is not supported")
        require(not node.has_input(8), "MultiHeadAttention: past_sequence_length (shared "
                "past/present buffers) is not supported")
        require(not node.has_input(9), "MultiHeadAttention: cache_indirection is not supported")

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        a = node.attr
        self.heads = int(a("num_heads"))
        self.unidirectional = bool(a("unidirectional", 0))
        self.filter = float(np.float32(a("mask_filter_value", -10000.0)))
        scale = a("scale")
        self.scale = float(scale) if scale else None

    def run(self, query, key=None, value=None, bias=None, key_padding_mask=None,
            attention_bias=None, past_key=None, past_value=None, *_):
        out_dtype = query.dtype
        f32 = (lambda x: None if x is None else x.astype(np.float32)) \
            if query.dtype in LOW_PRECISION_FLOATS else (lambda x: x)
        query, key, value, bias = f32(query), f32(key), f32(value), f32(bias)
        attention_bias, past_key, past_value = f32(attention_bias), f32(past_key), f32(past_value)
        h = self.heads
        b, s = query.shape[:2]
        if query.ndim == 5:  # packed QKV (B, S, H, 3, Dh)
            if query.shape[2] != h or query.shape[3] != 3:
                raise ValueError(f"MultiHeadAttention: packed QKV {query.shape} must be "
                                 f"(B, S, {h}, 3, Dh)")
            dh = query.shape[4]
            qkv = query
            if bias is not None:
                qkv = qkv + bias.reshape(3, h, dh).transpose(1, 0, 2)
            q, k, v = (qkv[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
        elif query.ndim == 3:
            dq = query.shape[2]
            if dq % h:
                raise ValueError(f"MultiHeadAttention: query width {dq} is not a multiple of "
                                 f"num_heads {h}")
            dh = dq // h
            q = query if bias is None else query + bias[:dq]
            q = q.reshape(b, s, h, dh).transpose(0, 2, 1, 3)
            if key is None:
                raise ValueError("MultiHeadAttention: key is required unless query is packed QKV")
            if key.ndim == 5:  # packed KV (B, L, H, 2, Dh)
                if key.shape[2] != h or key.shape[3] != 2 or key.shape[4] != dh:
                    raise ValueError(f"MultiHeadAttention: packed KV {key.shape} must be "
                                     f"(B, L, {h}, 2, {dh})")
                kv = key
                if bias is not None:
                    kv = kv + bias[dq:].reshape(2, h, dh).transpose(1, 0, 2)
                k, v = (kv[:, :, :, i].transpose(0, 2, 1, 3) for i in range(2))
            elif key.ndim == 4:  # already split into heads (cross attention)
                if value is None or key.shape[1] != h or value.shape[1] != h:
                    raise ValueError(f"MultiHeadAttention: key {key.shape} / value split into "
                                     f"heads must both be (B, {h}, L, Dh)")
                k, v = key, value
            elif key.ndim == 3:
                if value is None or value.ndim != 3 or value.shape[2] % h:
                    raise ValueError("MultiHeadAttention: value (B, L, Dv) must come with a "
                                     "3-D key, Dv a multiple of num_heads")
                dk, dv = key.shape[2], value.shape[2]
                if dk != dq:
                    raise ValueError(f"MultiHeadAttention: key width {dk} != query width {dq}")
                if bias is not None:
                    key, value = key + bias[dq:dq + dk], value + bias[dq + dk:dq + dk + dv]
                k = key.reshape(b, key.shape[1], h, dh).transpose(0, 2, 1, 3)
                v = value.reshape(b, value.shape[1], h, dv // h).transpose(0, 2, 1, 3)
            else:
                raise ValueError(f"MultiHeadAttention: key of rank {key.ndim} is not supported")
        else:
            raise ValueError(f"MultiHeadAttention: query {query.shape} must be (B, S, D) or "
                             f"packed (B, S, H, 3, Dh)")
        p = 0
        if past_key is not None or past_value is not None:
            if past_key is None or past_value is None:
                raise ValueError("MultiHeadAttention: past_key and past_value go together")
            p = past_key.shape[2]
            k = np.concatenate([past_key, k], axis=2)
            v = np.concatenate([past_value, v], axis=2)
        y = attend(q, k, v, key_padding_mask, attention_bias, past=p, scale=self.scale,
                   unidirectional=self.unidirectional, mask_filter_value=self.filter)
        return (y.astype(out_dtype), np.ascontiguousarray(k).astype(out_dtype),
                np.ascontiguousarray(v).astype(out_dtype))
