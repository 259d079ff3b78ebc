"""Compiled (numba) float32 softmax over the last axis in one pass per row,
with an optional scale and additive mask applied first (the attention scores'
``softmax(scale * s + mask)``): numpy needs six to seven passes over the
scores (scale, mask, max, subtract, exp, sum, divide) and its float32 ``exp``
is ~2.4 ns a value here (65,536 values 155 us); the compiled row pass keeps
the row in L1 and its exp is a polynomial that vectorizes
(:func:`._numba_math.expf`).

Used by :mod:`.attention` (``ScaledDotAttention``) and :mod:`.softmax`
(ONNX Softmax, float32, the reduced axis last). Without numba
:data:`HAVE_NUMBA` is False and the callers keep their numpy code; a caller
whose operands do not qualify (another dtype, a read-only or non-contiguous
array) gets False from :func:`softmax_rows_f32` and uses numpy too.

Numerics: the exp has relative error ~1e-7 (Cephes' expf polynomial);
the row sum is reassociated (vectorized). Differences after the max
below -87.3 (e^-87.3 ~ 1e-38, far under float32's precision relative to the
row's largest term 1) give exactly 0, so ``-inf`` mask entries do too. A row
holding a NaN, or whose maximum is not finite (a ``+inf``, an all ``-inf``
masked row), is recomputed with libm's ``exp`` in numpy's order of
operations, so such rows give numpy's values (NaN rows stay NaN).
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import math

import numpy as np

__all__ = ["HAVE_NUMBA", "softmax_rows_f32", "mask_rows", "rows_range", "PARTNER_MIN_ELEMENTS",
           "USE_PARTNERS"]

#: with more than one intra-op thread the rows split over the compiled
#: partner threads (:mod:`._partner`) from this many values
PARTNER_MIN_ELEMENTS = 1 << 14
#: split through the compiled partners where they exist (False: one thread)
USE_PARTNERS = True

try:
    from numba import njit
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

# no 'nnan' / 'ninf': the NaN / inf checks below must survive the optimizer
_FLAGS = {"nsz", "arcp", "contract", "reassoc"}

if HAVE_NUMBA:
    from ._numba_math import expf  # float32 e^x, no libm call (inlined: this file's flags)

    @njit(nogil=True, cache=True, error_model="numpy")
    def _exact_row(row):  # pragma: no cover - compiled
        # numpy's _softmax on one row: max (NaN propagates), exp(x - m), / sum
        m = row[0]
        for j in range(row.shape[0]):
            v = row[j]
            if v != v or v > m:
                m = v
                if v != v:
                    break
        s = np.float32(0.0)
        for j in range(row.shape[0]):
            e = np.float32(math.exp(row[j] - m))
            row[j] = e
            s += e
        for j in range(row.shape[0]):
            row[j] = row[j] / s

    @njit(fastmath=_FLAGS, nogil=True, cache=True, error_model="numpy", inline="always")
    def _row_max(row):  # pragma: no cover - compiled
        # the row's maximum (a NaN in row[0] stays; other NaNs are skipped: the
        # caller counts them) over eight independent chains: one chain waits
        # a max latency per value and does not vectorize (1.5-2x the row pass)
        t_n = row.shape[0]
        n8 = t_n // 8 * 8
        m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = row[0]
        for j in range(0, n8, 8):
            a0, a1, a2, a3 = row[j], row[j + 1], row[j + 2], row[j + 3]
            a4, a5, a6, a7 = row[j + 4], row[j + 5], row[j + 6], row[j + 7]
            m0 = a0 if a0 > m0 else m0
            m1 = a1 if a1 > m1 else m1
            m2 = a2 if a2 > m2 else m2
            m3 = a3 if a3 > m3 else m3
            m4 = a4 if a4 > m4 else m4
            m5 = a5 if a5 > m5 else m5
            m6 = a6 if a6 > m6 else m6
            m7 = a7 if a7 > m7 else m7
        m0 = m1 if m1 > m0 else m0
        m2 = m3 if m3 > m2 else m2
        m4 = m5 if m5 > m4 else m4
        m6 = m7 if m7 > m6 else m6
        m0 = m2 if m2 > m0 else m0
        m4 = m6 if m6 > m4 else m4
        m = m4 if m4 > m0 else m0
        for j in range(n8, t_n):
            m = row[j] if row[j] > m else m
        return m

    @njit(fastmath=_FLAGS, nogil=True, cache=True, error_model="numpy")
    def rows_range(s, scale, mask, mrows, masked, r0, r1):  # pragma: no cover - compiled
        """Rows ``r0 .. r1 - 1`` of ``s`` (R, T) C-contiguous float32, in
        place: row r adds mask row r % mrows of the C-contiguous (mrows, T)
        float32 mask when ``masked``, times float32 ``scale`` first."""
        t_n = s.shape[1]
        for r in range(r0, r1):
            row = s[r]
            if masked:
                mr = mask[r % mrows]
                for j in range(t_n):
                    row[j] = row[j] * scale + mr[j]
            elif scale != np.float32(1.0):
                for j in range(t_n):
                    row[j] = row[j] * scale
            m = _row_max(row)
            nans = 0
            for j in range(t_n):
                nans += 1 if row[j] != row[j] else 0
            if nans or not math.isfinite(m):
                _exact_row(row)
                continue
            acc = np.float32(0.0)
            for j in range(t_n):
                d = row[j] - m
                # -inf entries (masked out) give exactly 0, as numpy's exp
                e = expf(d) if d > np.float32(-87.33654) else np.float32(0.0)
                row[j] = e
                acc += e
            inv = np.float32(1.0) / acc
            for j in range(t_n):
                row[j] = row[j] * inv

    @njit(nogil=True, cache=True)
    def _rows(s, scale, mask, mrows, masked):  # pragma: no cover - compiled
        # every row of s (rows_range)
        rows_range(s, scale, mask, mrows, masked, 0, s.shape[0])

_ZERO = np.zeros((1, 1), np.float32)


def _run(s2: np.ndarray, scale, m2: np.ndarray, mrows: int, masked: bool, threads: int) -> None:
    rows = s2.shape[0]
    if threads > 1 and USE_PARTNERS and rows >= 2 and s2.size >= PARTNER_MIN_ELEMENTS:
        from . import _partner
        team = _partner.team(threads)
        if team is not None:  # row ranges over the compiled partner threads
            _partner.softmax_rows(team, s2, scale, m2, mrows, masked, min(rows, 2 * threads))
            return
    _rows(s2, scale, m2, mrows, masked)


def softmax_rows_f32(s: np.ndarray, scale: float = 1.0, mask: np.ndarray | None = None,
                     threads: int = 1) -> bool:
    """``s = softmax(s * scale + mask)`` over the last axis, in place.

    ``s``: C-contiguous, writeable float32 of any rank >= 1 (rows: every axis
    but the last). ``mask``: float32 broadcasting against ``s`` (numpy rules,
    not enlarging it) or None. ``threads``: intra-op threads; with more than
    one and at least :data:`PARTNER_MIN_ELEMENTS` values the rows split over
    the compiled partner threads (:mod:`._partner`; the same bits as one
    thread). Returns False, ``s`` untouched, when numba is missing or an
    operand does not qualify (then the caller runs numpy)."""
    if not HAVE_NUMBA or s.dtype != np.float32 or not s.flags.c_contiguous or \
            not s.flags.writeable or s.ndim < 1 or s.size == 0:
        return False
    t = s.shape[-1]
    rows = s.size // t
    s2 = s.reshape(rows, t)
    if mask is None:
        _run(s2, np.float32(scale), _ZERO, 1, False, threads)
        return True
    m2 = mask_rows(s.shape, mask)
    if m2 is None:
        return False
    _run(s2, np.float32(scale), m2, m2.shape[0], True, threads)
    return True


def mask_rows(shape: tuple[int, ...], mask: np.ndarray) -> np.ndarray | None:
    """An additive ``mask`` for scores of ``shape`` (rows: every axis but the
    last, in C order) as C-contiguous float32 rows ``(mrows, T)``: score row
    ``r`` adds row ``r % mrows`` (a view of ``mask`` where its leading axes
    are ones and its trailing ones equal the scores', else one broadcast
    copy of every row). None when ``mask`` is not float32, has a higher rank
    than the scores, enlarges them or does not broadcast."""
    if mask.dtype != np.float32 or mask.ndim > len(shape) or not shape:
        return None
    t = shape[-1]
    mshape = (1,) * (len(shape) - mask.ndim) + mask.shape
    j = len(shape) - 1  # the mask is ones, then the scores' trailing dims from axis j on
    while j > 0 and mshape[j - 1] == shape[j - 1]:
        j -= 1
    if mshape[-1] == t and all(d == 1 for d in mshape[:j]) and mask.flags.c_contiguous:
        return mask.reshape(-1, t)  # a view: rows repeat every m2.shape[0]
    try:
        full = np.broadcast_to(mask, shape)
    except ValueError:  # enlarges the scores, or does not broadcast
        return None
    rows = math.prod(shape[:-1])
    return np.ascontiguousarray(full).reshape(rows, t)
