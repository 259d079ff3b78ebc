"""Compiled (numba) decode attention: ``softmax(q @ k * scale + mask) @ v``
for a few query rows (a decode step: 1 to :data:`MAX_ROWS`) in one call.

numpy spends a decode step's attention in Python and small-array overhead:
two batched matmuls, the softmax pass and their temporaries cost ~20 µs for
4 heads x 65 keys where the arithmetic is ~2 µs. :func:`attend` does, per
(batch, head) and query row, the scores (dot products with every key), the
scaled, masked softmax (the row pass of :mod:`._softmax_numba`, same
numerics: a NaN row or a row whose maximum is not finite gets numpy's
values) and the probability-weighted sum of the values, in one compiled
call over the operands as they are (no copies: a key that is a transposed
view is read in its own order; C-contiguous operands vectorize).

Used by :func:`.attention.ScaledDotAttention`; without numba
:data:`HAVE_NUMBA` is False and :func:`attend` returns None (the caller keeps
its numpy path; :data:`COMPILED` switches this path off for the tests).
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

__all__ = ["HAVE_NUMBA", "COMPILED", "MAX_ROWS", "attend"]

#: the compiled path runs (tests switch it off to check the numpy one)
COMPILED = True
#: at most this many query rows take the compiled path (more: the batched
#: GEMMs of the caller, which reuse each key across rows, are faster)
MAX_ROWS = 4

try:
    from numba import njit
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

if HAVE_NUMBA:
    from ._softmax_numba import rows_range as _softmax_rows

    # reassociated sums (vectorized dot products); no 'nnan' / 'ninf'
    _FLAGS = {"nsz", "arcp", "contract", "reassoc"}

    @njit(fastmath=_FLAGS, nogil=True, cache=True, error_model="numpy")
    def _attend(q, k, v, mask, scale64, masked, kt, out):  # pragma: no cover - compiled
        # q (B, H, S, D); k (B, H, D, T) or, with kt, (B, H, T, D); v (B, H, T, Dv);
        # mask (MB, MH, MS, MT), each 1 or the full size; out (B, H, S, Dv)
        nb, nh, sq, d = q.shape
        scale = np.float32(scale64)
        t_n = v.shape[2]
        dv = v.shape[3]
        mb, mh, ms = mask.shape[0], mask.shape[1], mask.shape[2]
        s = np.empty((sq, t_n), np.float32)  # the scores of one (batch, head)
        for b in range(nb):
            for h in range(nh):
                kb = k[b, h]
                vb = v[b, h]
                for i in range(sq):
                    qi = q[b, h, i]
                    row = s[i]
                    if kt:  # keys (T, D): one dot product per key
                        for j in range(t_n):
                            kj = kb[j]
                            acc = np.float32(0.0)
                            for c in range(d):
                                acc += qi[c] * kj[c]
                            row[j] = acc * scale
                    else:  # keys (D, T): rows of k scaled by q, summed
                        for j in range(t_n):
                            row[j] = np.float32(0.0)
                        for c in range(d):
                            qc = qi[c]
                            kc = kb[c]
                            for j in range(t_n):
                                row[j] += qc * kc[j]
                        for j in range(t_n):
                            row[j] = row[j] * scale
                    if masked:
                        mr = mask[b if mb > 1 else 0, h if mh > 1 else 0, i if ms > 1 else 0]
                        if mask.shape[3] == 1:
                            for j in range(t_n):
                                row[j] += mr[0]
                        else:
                            for j in range(t_n):
                                row[j] += mr[j]
                # scaled and masked above: the shared row pass normalizes
                _softmax_rows(s, np.float32(1.0), s, 1, False, 0, sq)
                for i in range(sq):
                    o = out[b, h, i]
                    for c in range(dv):
                        o[c] = np.float32(0.0)
                    for j in range(t_n):
                        p = s[i, j]
                        vj = vb[j]
                        for c in range(dv):
                            o[c] += p * vj[c]

_NONE4 = np.zeros((1, 1, 1, 1), np.float32)
_F32 = np.dtype(np.float32)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
           scale: float, transpose_k: bool = False) -> np.ndarray | None:
    """``softmax(q @ k * scale + mask) @ v`` in one compiled call.

    Args:
        q: float32 ``(B, H, S, D)``, ``S <= MAX_ROWS``, any strides.
        k: float32 ``(B, H, D, T)`` (``transpose_k``: ``(B, H, T, D)``), any strides.
        v: float32 ``(B, H, T, Dv)``, any strides.
        mask: float32 additive mask broadcasting against ``(B, H, S, T)``
            (rank <= 4), or None.
        scale: multiplies the scores before the mask.
        transpose_k: read ``k`` as ``(B, H, T, D)``.

    Returns:
        float32 ``(B, H, S, Dv)`` (C-contiguous, new), or None when numba is
        missing, the path is off, or the operands do not qualify (other
        dtypes or ranks, batch/head axes that differ, more rows, an empty
        operand, a mask that does not broadcast): the caller runs numpy.
    """
    if not (HAVE_NUMBA and COMPILED):
        return None
    # dtype identity: native float32 (any other byte order takes numpy's path)
    if q.dtype is not _F32 or k.dtype is not _F32 or v.dtype is not _F32 or q.ndim != 4 or \
            k.ndim != 4 or v.ndim != 4:
        return None
    nb, nh, sq, d = q.shape
    ks = k.shape
    t_n, kd = (ks[2], ks[3]) if transpose_k else (ks[3], ks[2])
    if sq > MAX_ROWS or kd != d or ks[:2] != (nb, nh) or v.shape[:3] != (nb, nh, t_n) or \
            not q.size or not t_n:
        return None
    if not transpose_k and k.strides[2] == 4 and k.strides[3] != 4:
        # a transposed view of (B, H, T, D) keys: read them that way (unit stride)
        k, transpose_k = k.swapaxes(2, 3), True
    if mask is None:
        m, masked = _NONE4, False
    else:
        if mask.dtype is not _F32 or mask.ndim > 4:
            return None
        m = mask if mask.ndim == 4 else mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        ms = m.shape
        if (ms[3] != 1 and ms[3] != t_n) or (ms[0] != 1 and ms[0] != nb) or \
                (ms[1] != 1 and ms[1] != nh) or (ms[2] != 1 and ms[2] != sq):
            return None
        masked = True
    out = np.empty((nb, nh, sq, v.shape[3]), np.float32)
    if out.size:
        _attend(q, k, v, m, float(scale), masked, bool(transpose_k), out)
    return out
