"""Compiled (numba) scaled, masked softmax over the last axis of float32
attention scores, in place, in one kernel call: ``s = softmax(s * scale +
mask)``. numpy needs five passes and two reductions for it
(``ScaledDotAttention``'s scale, mask add, max, exp, sum, divide); here each
row is read three times from cache and written in place, the sum accumulated
in float64.

Loaded lazily by :mod:`.attention`; without numba :data:`HAVE_NUMBA` is
False and the numpy path runs (both tested against onnxruntime;
``COMPILED`` switches this path off).
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["HAVE_NUMBA", "COMPILED", "scaled_masked_softmax", "small_attention",
           "PARALLEL_MIN_ELEMENTS", "SMALL_ATTENTION_MACS"]

#: the compiled path runs (tests switch it off to check the numpy one)
COMPILED = True
#: from this many score elements (and two rows) the rows are split over the kernel threads
PARALLEL_MIN_ELEMENTS = 1 << 16

try:
    from numba import njit, prange
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

#: :func:`small_attention` takes products of at most this many multiply-adds
#: (a decode step's 4 heads x 65 positions x 128 is 33K); above, BLAS wins
SMALL_ATTENTION_MACS = 1 << 16

#: one parallel launch at a time (numba's workqueue layer aborts otherwise)
_LAUNCH = threading.Lock()
_NO_MASK = np.zeros((1, 1, 1, 1), np.float32)

if HAVE_NUMBA:
    @njit(nogil=True, cache=True, inline="always")
    def _row(s, mask, scale, has_mask, idx):  # pragma: no cover - compiled
        _, nh, ns, nt = s.shape
        b = idx // (nh * ns)
        h = (idx // ns) % nh
        i = idx % ns
        mx = -np.inf
        for j in range(nt):
            v = s[b, h, i, j] * scale
            if has_mask:
                v += mask[b, h, i, j]
            s[b, h, i, j] = v
            if v > mx:
                mx = v
        tot = 0.0
        for j in range(nt):
            e = np.exp(s[b, h, i, j] - mx)
            s[b, h, i, j] = e
            tot += e
        inv = np.float32(1.0 / tot)
        for j in range(nt):
            s[b, h, i, j] *= inv

    @njit(nogil=True, cache=True)
    def _serial(s, mask, scale, has_mask):  # pragma: no cover - compiled
        b, h, n, _ = s.shape
        for idx in range(b * h * n):
            _row(s, mask, scale, has_mask, idx)

    @njit(nogil=True, cache=True, parallel=True)
    def _parallel(s, mask, scale, has_mask):  # pragma: no cover - compiled
        b, h, n, _ = s.shape
        for idx in prange(b * h * n):
            _row(s, mask, scale, has_mask, idx)


    @njit(nogil=True, cache=True)
    def _attend(q, k, v, mask, scale, has_mask, out, p):  # pragma: no cover - compiled
        nb, nh, ns, nd = q.shape
        nt = k.shape[3]
        ndv = v.shape[3]
        for b in range(nb):
            for h in range(nh):
                for i in range(ns):
                    mx = -np.inf
                    for j in range(nt):
                        acc = np.float32(0.0)
                        for d in range(nd):
                            acc += q[b, h, i, d] * k[b, h, d, j]
                        acc *= scale
                        if has_mask:
                            acc += mask[b, h, i, j]
                        p[j] = acc
                        if acc > mx:
                            mx = acc
                    tot = 0.0
                    for j in range(nt):
                        e = np.exp(p[j] - mx)
                        p[j] = e
                        tot += e
                    inv = np.float32(1.0 / tot)
                    for c in range(ndv):
                        out[b, h, i, c] = 0.0
                    for j in range(nt):
                        w = p[j] * inv
                        for c in range(ndv):
                            out[b, h, i, c] += w * v[b, h, j, c]


def _lead4(a: np.ndarray) -> np.ndarray:
    """``a`` with size-1 axes in front up to rank 4 (a view)."""
    return a[(None,) * (4 - a.ndim)] if a.ndim < 4 else a


def scaled_masked_softmax(s: np.ndarray, scale: float, mask: np.ndarray | None) -> bool:
    """``s[...] = softmax(s * scale + mask)`` over the last axis, in place.

    Args:
        s: float32 scores ``(..., S, T)``, rank 2-4, writable (a fresh
            product).
        scale: multiplies the scores before the mask is added.
        mask: float32 additive mask broadcasting to ``s``'s shape, or None.

    Returns:
        False (``s`` untouched) when numba is missing, the path is off or the
        operands do not qualify (other dtypes, rank, a mask that would
        enlarge ``s``); the caller runs its numpy path then.
    """
    if not (HAVE_NUMBA and COMPILED) or s.dtype != np.float32 or not 2 <= s.ndim <= 4 \
            or not s.flags.writeable or s.size == 0:
        return False
    s4 = _lead4(s)
    m = _mask4(mask, s.shape)
    if m is None:
        return False
    m4, has = m
    rows = s.size // s.shape[-1]
    sc = np.float32(scale)
    if rows >= 2 and s.size >= PARALLEL_MIN_ELEMENTS:
        with _LAUNCH:
            _parallel(s4, m4, sc, has)
    else:
        _serial(s4, m4, sc, has)
    return True


def _mask4(mask: np.ndarray | None, shape: tuple):
    """``(mask 4-D view, has_mask)``, or None when it does not qualify."""
    if mask is None:
        return _NO_MASK, False
    if mask.dtype != np.float32 or mask.ndim > len(shape):
        return None
    try:
        if np.broadcast_shapes(shape, mask.shape) != shape:
            return None
    except ValueError:
        return None
    return _lead4(np.broadcast_to(mask, shape)), True


def small_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                    scale: float) -> np.ndarray | None:
    """``softmax(q @ k * scale + mask) @ v`` in one compiled call, for small
    products (a decode step: a few query rows): float32 ``q (B, H, S, D)``,
    ``k (B, H, D, T)`` (any strides, e.g. a transposed key cache), ``v (B, H,
    T, Dv)``, ranks 2-4 with the same leading dims; ``mask`` float32
    broadcasting to ``(B, H, S, T)``.

    Returns:
        the float32 output ``(B, H, S, Dv)`` (of ``q``'s rank), or None when
        numba is missing, the path is off, the product is over
        :data:`SMALL_ATTENTION_MACS` or the operands do not qualify.
    """
    if not (HAVE_NUMBA and COMPILED) or not (q.dtype == k.dtype == v.dtype == np.float32):
        return None
    r = q.ndim
    if not 2 <= r <= 4 or k.ndim != r or v.ndim != r or q.shape[:-2] != k.shape[:-2] or \
            q.shape[:-2] != v.shape[:-2] or q.shape[-1] != k.shape[-2] or \
            k.shape[-1] != v.shape[-2]:
        return None
    ns, nt, dv = q.shape[-2], k.shape[-1], v.shape[-1]
    heads = q.size // (ns * q.shape[-1]) if q.size else 0
    if heads == 0 or nt == 0 or heads * ns * nt * (q.shape[-1] + dv) > SMALL_ATTENTION_MACS:
        return None
    m = _mask4(mask, q.shape[:-1] + (nt,))
    if m is None:
        return None
    out = np.empty(q.shape[:-1] + (dv,), np.float32)
    _attend(_lead4(q), _lead4(k), _lead4(v), m[0], np.float32(scale), m[1], _lead4(out),
            np.empty(nt, np.float32))
    return out
