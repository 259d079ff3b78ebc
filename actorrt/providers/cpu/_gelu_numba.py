"""Compiled (numba) erf GELU in one pass over float32 data: ``y = 0.5 * x * (1 +
erf(x / sqrt(2)))`` with the float32 erf approximation of :mod:`.math`
(:data:`.math.ERF32_RATIONAL`, relative error < 5e-7), in place; serial for
small arrays, parallel over chunks for large ones. Loaded lazily by
:func:`._epilogue.gelu_inplace`; without numba
:data:`HAVE_NUMBA` is False and the numpy path runs.
"""

from __future__ import annotations

import threading

import numpy as np

from .math import ERF32_RATIONAL

__all__ = ["HAVE_NUMBA", "gelu_inplace_f32", "PARALLEL_MIN_ELEMENTS"]

#: from this many elements the pass is split over the kernel threads; below,
#: one serial compiled pass (a parallel launch cost more than it saved there:
#: ~4 ms for 4,096 values on the loaded 2-core machine, where a thread of the
#: region waits to be scheduled; numpy's ~20 passes cost ~120 µs for 1,024)
PARALLEL_MIN_ELEMENTS = 1 << 16

try:
    from numba import njit, prange
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

#: one parallel launch at a time (numba's workqueue layer aborts otherwise)
_LAUNCH = threading.Lock()
_P = np.array(ERF32_RATIONAL[0], np.float32)
_Q = np.array(ERF32_RATIONAL[1], np.float32)

if HAVE_NUMBA:
    @njit(nogil=True, cache=True, fastmath=True, inline="always")
    def _gelu_range(x, p, q, lo, hi):  # pragma: no cover - compiled
        for i in range(lo, hi):
            v = x[i]
            u = v * np.float32(0.7071067811865476)
            u = min(max(u, np.float32(-4.0)), np.float32(4.0))
            u2 = u * u
            pp = p[0]
            for k in range(1, p.size):
                pp = pp * u2 + p[k]
            qq = q[0]
            for k in range(1, q.size):
                qq = qq * u2 + q[k]
            e = u * pp / qq
            x[i] = np.float32(0.5) * v * (np.float32(1.0) + e)

    @njit(parallel=True, nogil=True, cache=True, fastmath=True)
    def _gelu(x, p, q, chunk):  # pragma: no cover - compiled
        n = x.size
        nchunks = (n + chunk - 1) // chunk
        for ci in prange(nchunks):
            lo = ci * chunk
            _gelu_range(x, p, q, lo, min(n, lo + chunk))

    @njit(nogil=True, cache=True, fastmath=True)
    def _gelu_serial(x, p, q):  # pragma: no cover - compiled
        _gelu_range(x, p, q, 0, x.size)


def gelu_inplace_f32(y: np.ndarray) -> bool:
    """Apply the GELU to C-contiguous float32 ``y`` in place (parallel from
    :data:`PARALLEL_MIN_ELEMENTS`); False (untouched) when numba is missing
    or ``y`` does not qualify (another dtype, not contiguous, read-only)."""
    if not HAVE_NUMBA or y.dtype != np.float32 or not y.flags.c_contiguous or \
            not y.flags.writeable:
        return False
    if y.size < PARALLEL_MIN_ELEMENTS:
        _gelu_serial(y.reshape(-1), _P, _Q)
        return True
    with _LAUNCH:
        _gelu(y.reshape(-1), _P, _Q, 16384)
    return True
