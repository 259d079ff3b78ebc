"""IEEE half-precision (float16) KV rows for the numba kernels.

numba has no float16 type on the CPU, so a float16 KV pool reaches the
kernels as its ``uint16`` bit patterns (:func:`kernel_view`) and every
read or write of a pool row goes through :func:`kv_get` / :func:`kv_put`,
which numba specialises on the row's dtype: a float32 row is read and
written as it is (the same code and bits as before), a uint16 row is
converted with :func:`f16_to_f32` / :func:`f32_to_f16`.

The conversions are LLVM's ``fpext half`` / ``fptrunc half``: on a CPU with
F16C (every AVX2 machine) LLVM lowers them to ``vcvtph2ps`` /
``vcvtps2ph`` (round to nearest even, subnormals, infinities and NaNs as
IEEE 754 says), vectorised in the kernels' inner loops; without F16C it
calls the compiler runtime's ``__extendhfsf2`` / ``__truncsfhf2`` (the
same results, slower). They equal numpy's ``astype`` bit for bit
(``tests/providers/cpu/llm/test_paged_half.py``: all 65,536 half patterns to
float32, and float32 ties, subnormals, overflow, infinities and NaNs to
half; a NaN stays a NaN of the same sign, its payload as the hardware
quiets it).
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

from typing import Any

import numpy as np

from . import _contrib_numba as _nb

__all__ = ["HAVE_HALF", "kernel_view", "KV_DTYPES"]

#: the KV pool element types the paged kernels read and write
KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))

HAVE_HALF = _nb.HAVE_NUMBA


def kernel_view(pool: Any) -> np.ndarray:
    """``pool`` as the kernels take it: a float16 array as its uint16 bit
    patterns (same memory), a float32 one as it is."""
    if pool.dtype == np.float16:
        return pool.view(np.uint16)
    return pool


if HAVE_HALF:
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic, overload

    @intrinsic
    def f16_to_f32(typingctx, h):
        """float32 of the half whose bits are ``h`` (uint16)."""
        if h != types.uint16:
            return None
        sig = types.float32(types.uint16)

        def codegen(context, builder, sig, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
        return sig, codegen

    @intrinsic
    def f32_to_f16(typingctx, x):
        """The bits (uint16) of float32 ``x`` rounded to half, to nearest even."""
        if x != types.float32:
            return None
        sig = types.uint16(types.float32)

        def codegen(context, builder, sig, args):
            return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
        return sig, codegen

    def kv_get(row, e):
        """float32 value ``e`` of a KV row (float32, or uint16 half bits).
        Compiled code gets the specialisation below; from Python, numpy's
        conversion (the same bits)."""
        if row.dtype == np.uint16:
            return np.float32(row[e:e + 1].view(np.float16)[0])
        return np.float32(row[e])

    def kv_put(row, e, v):
        """Store float32 ``v`` as value ``e`` of a KV row (rounded to half,
        to nearest even, on a uint16 row). Compiled code gets the
        specialisation below; from Python, numpy's conversion."""
        if row.dtype == np.uint16:
            row[e:e + 1] = np.array([v], np.float32).astype(np.float16).view(np.uint16)
        else:
            row[e] = v

    @overload(kv_get, inline="always")
    def _kv_get(row, e):
        if isinstance(row, types.Array) and row.dtype == types.uint16:
            return lambda row, e: f16_to_f32(row[e])
        if isinstance(row, types.Array) and row.dtype == types.float32:
            return lambda row, e: row[e]
        return None

    @overload(kv_put, inline="always")
    def _kv_put(row, e, v):
        if isinstance(row, types.Array) and row.dtype == types.uint16:
            def put_half(row, e, v):
                row[e] = f32_to_f16(np.float32(v))
            return put_half
        if isinstance(row, types.Array) and row.dtype == types.float32:
            def put(row, e, v):
                row[e] = v
            return put
        return None

    @njit(nogil=True, cache=True)
    def to_f32(bits, out):  # pragma: no cover - compiled
        """out[i] = float32 of half bits[i] (1-D arrays of one length)."""
        for i in range(bits.shape[0]):
            out[i] = f16_to_f32(bits[i])

    @njit(nogil=True, cache=True)
    def to_f16(x, out):  # pragma: no cover - compiled
        """out[i] = half bits of float32 x[i] (1-D arrays of one length)."""
        for i in range(x.shape[0]):
            out[i] = f32_to_f16(x[i])
