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

__all__ = ["HAVE_NUMBA", "softmax_rows_f32", "rows_range", "PARTNER_MIN_ELEMENTS", "USE_PARTNERS"]

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
            m = row[0]
            nans = 0
            for j in range(t_n):
                v = row[j]
                m = max(m, v)
                nans += 1 if v != v else 0
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
    if mask.dtype != np.float32 or mask.ndim > s.ndim:
        return False
    shape = (1,) * (s.ndim - mask.ndim) + mask.shape
    j = s.ndim - 1  # the mask is ones, then s's trailing dims from axis j on
    while j > 0 and shape[j - 1] == s.shape[j - 1]:
        j -= 1
    if shape[-1] == t and all(d == 1 for d in shape[:j]) and mask.flags.c_contiguous:
        m2 = mask.reshape(-1, t)  # a view: rows repeat every m2.shape[0]
    else:
        try:
            full = np.broadcast_to(mask, s.shape)
        except ValueError:  # enlarges s, or does not broadcast
            return False
        m2 = np.ascontiguousarray(full).reshape(rows, t)
    _run(s2, np.float32(scale), m2, m2.shape[0], True, threads)
    return True
