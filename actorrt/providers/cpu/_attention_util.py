"""Shared pieces of the attention kernels: compute dtypes, masked softmax, the
additive attention bias (causal / sliding window / padding / user mask) and
grouped-query matmuls that never materialise repeated K/V heads."""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = [
    "compute_dtype", "onnx_float_dtype", "softmax_", "gqa_scores", "gqa_apply",
    "attention_bias", "split_heads", "merge_heads",
]

_LOW_PRECISION = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))

#: ONNX TensorProto float element types accepted by ``softmax_precision``.
_ONNX_FLOATS = {1: np.dtype(np.float32), 10: np.dtype(np.float16),
                11: np.dtype(np.float64), 16: np.dtype(ml_dtypes.bfloat16)}


def compute_dtype(dt: np.dtype) -> np.dtype:
    """float32 for 16-bit floats (numpy has no fast half matmul), else ``dt``."""
    dt = np.dtype(dt)
    return np.dtype(np.float32) if dt in _LOW_PRECISION else dt


def onnx_float_dtype(code: int) -> np.dtype:
    """numpy dtype of an ONNX float element type (``softmax_precision``).

    Raises:
        ValueError: ``code`` is not FLOAT, FLOAT16, DOUBLE or BFLOAT16.
    """
    try:
        return _ONNX_FLOATS[int(code)]
    except KeyError:
        raise ValueError(f"softmax_precision {code} is not a float type "
                         f"(expected one of {sorted(_ONNX_FLOATS)})") from None


def softmax_(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in place on ``x`` (which the caller owns).
    A row that is entirely ``-inf`` becomes all zeros instead of NaN."""
    m = np.max(x, axis=-1, keepdims=True)
    m[np.isneginf(m)] = 0
    np.subtract(x, m, out=x)
    np.exp(x, out=x)
    s = np.sum(x, axis=-1, keepdims=True)
    s[s == 0] = 1
    np.divide(x, s, out=x)
    return x


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(batch, seq, heads * size) -> (batch, heads, seq, size) view.

    Raises:
        ValueError: the hidden size is not a multiple of ``num_heads``.
    """
    b, s, hidden = x.shape
    if num_heads <= 0 or hidden % num_heads:
        raise ValueError(f"hidden size {hidden} is not divisible by {num_heads} heads")
    return x.reshape(b, s, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(batch, heads, seq, size) -> (batch, seq, heads * size)."""
    b, h, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def gqa_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``q @ k^T`` with K/V heads shared by groups of query heads.

    Args:
        q: (batch, q_heads, q_len, head_size).
        k: (batch, kv_heads, kv_len, head_size); ``q_heads % kv_heads == 0``;
            query head ``h`` reads K head ``h // (q_heads // kv_heads)``.

    Returns:
        (batch, q_heads, q_len, kv_len) scores in the dtype of ``q``.

    Raises:
        ValueError: head counts are not compatible.
    """
    b, hq, sq, d = q.shape
    hkv = k.shape[1]
    if hkv <= 0 or hq % hkv:
        raise ValueError(f"q_num_heads ({hq}) must be a multiple of kv_num_heads ({hkv})")
    g = hq // hkv
    kt = np.swapaxes(k, -1, -2)
    if g == 1:
        return np.matmul(q, kt)
    # (b, hkv, g*sq, d) @ (b, hkv, d, skv): one batched GEMM per KV head.
    s = np.matmul(q.reshape(b, hkv, g * sq, d), kt)
    return s.reshape(b, hq, sq, k.shape[2])


def gqa_apply(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``p @ v`` with grouped K/V heads (see :func:`gqa_scores`).

    Args:
        p: (batch, q_heads, q_len, kv_len) probabilities.
        v: (batch, kv_heads, kv_len, v_head_size).

    Returns:
        (batch, q_heads, q_len, v_head_size).
    """
    b, hq, sq, skv = p.shape
    hkv = v.shape[1]
    g = hq // hkv
    if g == 1:
        return np.matmul(p, v)
    out = np.matmul(p.reshape(b, hkv, g * sq, skv), v)
    return out.reshape(b, hq, sq, v.shape[-1])


def _pad_mask(mask: np.ndarray, kv_len: int) -> np.ndarray:
    """Pad (with "not attended") or cut the last axis of ``mask`` to ``kv_len``."""
    n = mask.shape[-1]
    if n == kv_len:
        return mask
    if n > kv_len:
        return mask[..., :kv_len]
    fill = False if mask.dtype == np.bool_ else -np.inf
    pad = np.full(mask.shape[:-1] + (kv_len - n,), fill, dtype=mask.dtype)
    return np.concatenate([mask, pad], axis=-1)


def attention_bias(*, q_len: int, kv_len: int, dtype: np.dtype, attn_mask: np.ndarray | None,
                   is_causal: bool, offset: int | np.ndarray, nonpad: np.ndarray | None,
                   left_window: int = -1, right_window: int = -1) -> np.ndarray | None:
    """Additive attention bias broadcastable to (batch, heads, q_len, kv_len).

    Args:
        q_len / kv_len: query and (total) key lengths.
        dtype: float dtype of the bias.
        attn_mask: bool (True = attend) or additive mask, right-aligned broadcastable
            to (batch, heads, q_len, kv_len); a shorter last axis is padded with
            "not attended".
        is_causal: query ``i`` attends key ``j`` iff ``j <= i + offset``.
        offset: keys preceding the query block: an int, or (batch,) int array.
        nonpad: (batch,) count of valid keys per batch, or None.
        left_window / right_window: sliding window bounds (-1 = unbounded) around
            the absolute query position ``offset + i``.

    Returns:
        The bias (0 where attended, ``-inf`` where not, plus a float mask), or
        ``None`` when nothing is masked.
    """
    allowed = None  # bool, broadcastable to (b, 1, q, kv)
    windowed = left_window >= 0 or right_window >= 0
    if is_causal or windowed:
        i = np.arange(q_len).reshape(q_len, 1)
        j = np.arange(kv_len).reshape(1, kv_len)
        pos = i + (np.reshape(offset, (-1, 1, 1, 1)) if np.ndim(offset) else int(offset))
        diff = pos - j  # (q, kv) or (b, 1, q, kv)
        if is_causal:
            allowed = diff >= 0
        if left_window >= 0:
            a = diff <= left_window
            allowed = a if allowed is None else allowed & a
        if right_window >= 0:
            a = -diff <= right_window
            allowed = a if allowed is None else allowed & a
    if nonpad is not None:
        a = (np.arange(kv_len) < np.reshape(nonpad, (-1, 1))).reshape(-1, 1, 1, kv_len)
        allowed = a if allowed is None else allowed & a
    float_mask = None
    if attn_mask is not None:
        m = _pad_mask(attn_mask, kv_len)
        if m.dtype == np.bool_:
            allowed = m if allowed is None else allowed & m
        else:
            float_mask = m.astype(dtype, copy=False)
    if allowed is None and float_mask is None:
        return None
    if allowed is None:
        return float_mask
    zero = np.zeros((), dtype) if float_mask is None else float_mask
    return np.where(allowed, zero, np.array(-np.inf, dtype))
