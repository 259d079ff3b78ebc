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

__all__ = ["HAVE_NUMBA", "COMPILED", "scaled_masked_softmax", "PARALLEL_MIN_ELEMENTS"]

#: the compiled path runs (tests switch it off to check the numpy one)
COMPILED = True
#: from this many score elements (and two rows) the rows are split over the kernel threads
PARALLEL_MIN_ELEMENTS = 1 << 16

try:
    from numba import njit, prange
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

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
    if mask is None:
        m4, has = _NO_MASK, False
    else:
        if mask.dtype != np.float32 or mask.ndim > s.ndim:
            return False
        try:
            if np.broadcast_shapes(s.shape, mask.shape) != s.shape:
                return False
        except ValueError:
            return False
        m4, has = _lead4(np.broadcast_to(mask, s.shape)), True
    rows = s.size // s.shape[-1]
    sc = np.float32(scale)
    if rows >= 2 and s.size >= PARALLEL_MIN_ELEMENTS:
        with _LAUNCH:
            _parallel(s4, m4, sc, has)
    else:
        _serial(s4, m4, sc, has)
    return True
