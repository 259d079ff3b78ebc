"""com.microsoft Attention: the BERT / GPT-2 multi-head attention that
onnxruntime's transformer optimizer writes (onnxruntime semantics).

Spec: onnxruntime ContribOperators, com.microsoft Attention (opset 1).

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
        t = p + s
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(dh)
        scores = np.matmul(q, k.transpose(0, 1, 3, 2))
        scores *= np.float32(scale)
        additive = np.zeros((b, 1, s, t), np.float32)
        if mask_index is not None:
            additive += np.where(_key_mask(mask_index, b, s, t, p)[:, None], self.filter,
                                 np.float32(0))
        if self.unidirectional:  # future keys take no part at all (onnxruntime 1.2x)
            future = np.arange(t)[None, :] > (p + np.arange(s))[:, None]
            additive += np.where(future, np.float32(-np.inf), np.float32(0))
        scores += additive
        if attention_bias is not None:
            scores += attention_bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        y = np.matmul(scores, v).transpose(0, 2, 1, 3).reshape(b, s, dv).astype(out_dtype)
        present = np.stack([k, v]).astype(out_dtype) if dh == dvh else None
        return y, present
