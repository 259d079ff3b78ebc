"""Compiled (numba) float32 math shared by the CPU provider's kernels: functions
inlined into the numba loops that call them (``inline="always"``: numba inlines
them at its IR level, so the caller's fastmath flags apply), written without
libm calls so those loops vectorize.

* :func:`f32_from_bits` — the float32 whose bit pattern is an int32;
* :func:`expf` — float32 ``e^x`` (Cephes' expf polynomial, relative error
  ~1e-7), used by the softmax pass (:mod:`._softmax_numba`) and the LLM
  attention / SiLU kernels (:mod:`.llm._contrib_numba` and its users).

Without numba :data:`HAVE_NUMBA` is False and nothing else is defined.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

__all__ = ["HAVE_NUMBA", "f32_from_bits", "expf"]

try:
    from numba import njit
    from numba import types as _types
    from numba.extending import intrinsic as _intrinsic
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

if HAVE_NUMBA:
    @_intrinsic
    def f32_from_bits(typingctx, bits):
        """The float32 whose bit pattern is the int32 ``bits``."""
        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], context.get_value_type(_types.float32))
        return _types.float32(_types.int32), codegen

    @njit(fastmath=True, nogil=True, cache=True, inline="always", error_model="numpy")
    def expf(x):  # pragma: no cover - compiled
        """float32 ``e^x`` with no libm call (loops calling it vectorize):
        ``2^n * e^r`` with ``n = round(x / ln 2)``, ``|r| <= ln(2) / 2``, ``e^r``
        by Cephes' expf polynomial (relative error ~1e-7); ``x`` clamped to
        ``[-87.3, 88.4]``, where ``2^n`` is a normal float32 (below: ~1e-38
        instead of 0 or a subnormal; above: 2.4e38 instead of inf)."""
        x = min(max(x, np.float32(-87.33654)), np.float32(88.37626))
        n = np.floor(x * np.float32(1.44269504) + np.float32(0.5))
        r = x - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
        p = np.float32(1.9875691500e-4)
        p = p * r + np.float32(1.3981999507e-3)
        p = p * r + np.float32(8.3334519073e-3)
        p = p * r + np.float32(4.1665795894e-2)
        p = p * r + np.float32(1.6666665459e-1)
        p = p * r + np.float32(5.0000001201e-1)
        p = p * r * r + r + np.float32(1.0)
        return p * f32_from_bits((np.int32(n) + np.int32(127)) << 23)
