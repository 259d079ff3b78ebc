"""Compiled (numba) erf GELU in one pass over float32 data: ``y = 0.5 * x * (1 +
erf(x / sqrt(2)))`` with the float32 erf approximation of :mod:`.math`
(:data:`.math.ERF32_RATIONAL`, relative error < 5e-7), in place; serial for
small arrays, split over the intra-op threads for large ones; with a bias
row added first in the same pass (:func:`bias_gelu_inplace_f32`, the
MatMul + bias + Gelu epilogue). Loaded lazily by
:func:`._epilogue.gelu_inplace` / :func:`._epilogue.bias_gelu_inplace`; without numba
:data:`HAVE_NUMBA` is False and the numpy path runs.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from .math import ERF32_RATIONAL

__all__ = ["HAVE_NUMBA", "gelu_inplace_f32", "bias_gelu_inplace_f32", "PARALLEL_MIN_ELEMENTS"]

#: from this many elements the pass is split over the intra-op threads
#: (``_threads.current()``) as one serial compiled call per block on the
#: help-first chunk loop (:func:`._parallel.run_chunks`); below, one serial
#: call. (numba's own parallel region waited milliseconds for a descheduled
#: pool thread on the loaded 2-core machine: ~15 ms for 131,072 values.)
PARALLEL_MIN_ELEMENTS = 1 << 16

try:
    from numba import njit
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

_P = tuple(float(c) for c in ERF32_RATIONAL[0])
_Q = tuple(float(c) for c in ERF32_RATIONAL[1])
assert len(_P) == 7 and len(_Q) == 5
P0, P1, P2, P3, P4, P5, P6 = (np.float32(c) for c in _P)
Q0, Q1, Q2, Q3, Q4 = (np.float32(c) for c in _Q)

if HAVE_NUMBA:
    # the coefficients are compile-time constants, the Horner chains unrolled,
    # the loop runs from 0 over a view and division has numpy's error model:
    # so it vectorizes (AVX2: 0.23 ms for 131,072 values against 1.8 ms for
    # the previous scalar loop over coefficient arrays and an index range)
    @njit(nogil=True, cache=True, fastmath=True, inline="always", error_model="numpy")
    def _gelu(v):  # pragma: no cover - compiled
        # one value's GELU (inlined at numba's IR level into the loops below)
        u = v * np.float32(0.7071067811865476)
        u = min(max(u, np.float32(-4.0)), np.float32(4.0))
        u2 = u * u
        pp = ((((((P0 * u2 + P1) * u2 + P2) * u2 + P3) * u2 + P4) * u2 + P5) * u2 + P6)
        qq = ((((Q0 * u2 + Q1) * u2 + Q2) * u2 + Q3) * u2 + Q4)
        return np.float32(0.5) * v * (np.float32(1.0) + u * pp / qq)

    @njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
    def _gelu_range(x):  # pragma: no cover - compiled
        for i in range(x.size):
            x[i] = _gelu(x[i])


    @njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
    def _bias_gelu_rows(y, bias):  # pragma: no cover - compiled
        # y (R, N) <- gelu(y + bias) row by row, bias (N,): the bias add and
        # the GELU in one pass (MatMulEpilogue's epilogue)
        for r in range(y.shape[0]):
            row = y[r]
            for i in range(row.shape[0]):
                row[i] = _gelu(row[i] + bias[i])


def bias_gelu_inplace_f32(y: np.ndarray, bias: np.ndarray) -> bool:
    """``y = gelu(y + bias)`` in place in one pass, for C-contiguous writeable
    float32 ``y`` ``(..., N)`` and float32 ``bias`` ``(N,)`` (row blocks over
    the intra-op threads from :data:`PARALLEL_MIN_ELEMENTS`); False
    (untouched) when numba is missing or an operand does not qualify."""
    if not HAVE_NUMBA or y.dtype != np.float32 or not y.flags.c_contiguous or \
            not y.flags.writeable or y.ndim < 1 or y.size == 0 or bias.dtype != np.float32 or \
            bias.ndim != 1 or bias.shape[0] != y.shape[-1]:
        return False
    n = y.shape[-1]
    y2 = y.reshape(-1, n)
    b = np.ascontiguousarray(bias)
    threads = 1
    if y.size >= PARALLEL_MIN_ELEMENTS and y2.shape[0] > 1:
        from . import _threads
        threads = _threads.current()
    if threads <= 1:
        _bias_gelu_rows(y2, b)
        return True
    from . import _parallel
    rows = y2.shape[0]
    size = -(-rows // threads)

    def chunk(i: int) -> None:
        _bias_gelu_rows(y2[i * size:(i + 1) * size], b)
    _parallel.run_chunks(chunk, -(-rows // size), threads)
    return True


def gelu_inplace_f32(y: np.ndarray) -> bool:
    """Apply the GELU to C-contiguous float32 ``y`` in place (split over the
    intra-op threads from :data:`PARALLEL_MIN_ELEMENTS`); False (untouched)
    when numba is missing or ``y`` does not qualify (another dtype, not
    contiguous, read-only)."""
    if not HAVE_NUMBA or y.dtype != np.float32 or not y.flags.c_contiguous or \
            not y.flags.writeable:
        return False
    flat = y.reshape(-1)
    n = flat.size
    threads = 1
    if n >= PARALLEL_MIN_ELEMENTS:
        from . import _threads
        threads = _threads.current()
    if threads <= 1:
        _gelu_range(flat)
        return True
    from . import _parallel
    size = -(-n // threads)
    size = -(-size // 64) * 64

    def chunk(i: int) -> None:
        _gelu_range(flat[i * size:(i + 1) * size])
    _parallel.run_chunks(chunk, -(-n // size), threads)
    return True
