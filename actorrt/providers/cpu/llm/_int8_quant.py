"""Per-32-value int8 quantization of the activations for the int8
MatMulNBits kernels (:mod:`._contrib_int8`): symmetric block scales
``max|a| / 127`` and round-half-even values, as onnxruntime's CompInt8
rounds, bit for bit.

* :func:`quantize_rows`: (M, n_blocks * 32) float32 -> (xq, sx, xsum);
* ``_quantize_rows`` / ``_quantize_into`` / ``_act_buffers`` /
  ``_quantized``: the compiled forms the fused decoder stack's quantize
  stages and the dispatch in :mod:`._contrib_int8` call (buffers
  ``(xq, sx, xsum, sx_t, xs_t)``; ``sx_t`` / ``xs_t`` are (M // 8, nb, 8)
  transposed copies of the scales and sums).
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from ._int8_tiles import BLOCK, HAVE_INT8_DOT

if HAVE_INT8_DOT:
    from numba import njit

    # Rounding must be onnxruntime's bit for bit: float32 scale = max|a| / 127,
    # inv = 1 / scale, q = rint(a * inv), each correctly rounded. numba may
    # compile this function with a fastmath caller's flags (seen: max|a| / 127
    # became a multiply by 1/127, one ulp off, flipping ties), so each step is
    # taken in float64 and rounded once to float32: exact whatever the flags
    # (float64 holds the float32 product exactly, and a quotient rounded
    # twice, 53 then 24 bits, is the correctly rounded float32 quotient).
    # NaN and infinity are found from the exponent bits (integer tests: a
    # fastmath build would fold float tests for them away).
    @njit(nogil=True, cache=True)
    def _quantize_rows(a, xq, sx, xsum):  # pragma: no cover - compiled
        # a (M, nb*32) float32 -> xq (M, nb*32) int8 (even values, then odd, per
        # block), sx / xsum (M, nb). A block holding NaN or infinity gets scale
        # NaN (its products are NaN, as in float32); a block whose max|a| is so
        # small that 1/scale overflows float32 is rounded in float64.
        nb = sx.shape[1]
        tiny = np.float32(np.finfo(np.float32).tiny)
        bits = a.view(np.uint32)
        for m in range(a.shape[0]):
            row = a[m]
            rbits = bits[m]
            for b in range(nb):
                base = b * 32
                amax = np.float32(0.0)
                finite = True
                for j in range(32):
                    if rbits[base + j] & 0x7F800000 == 0x7F800000:  # NaN or inf
                        finite = False
                    else:
                        amax = max(amax, abs(row[base + j]))
                scale = np.float32(np.float64(amax) / 127.0)
                total = 0
                if not finite:
                    for j in range(32):
                        xq[m, base + j] = 0
                    sx[m, b] = np.float32(np.nan)
                    xsum[m, b] = np.float32(np.nan)
                    continue
                if scale >= tiny:
                    inv = np.float64(np.float32(1.0 / np.float64(scale)))
                    for j in range(16):
                        q0 = min(max(np.rint(np.float32(row[base + 2 * j] * inv)), -127.0),
                                 127.0)
                        q1 = min(max(np.rint(np.float32(row[base + 2 * j + 1] * inv)), -127.0),
                                 127.0)
                        xq[m, base + j] = np.int8(q0)
                        xq[m, base + 16 + j] = np.int8(q1)
                        total += np.int32(q0) + np.int32(q1)
                else:  # zero or subnormal scale
                    inv64 = 127.0 / np.float64(amax) if amax > 0 else 0.0
                    for j in range(16):
                        q0 = min(max(np.rint(np.float64(row[base + 2 * j]) * inv64), -127.0), 127.0)
                        q1 = min(max(np.rint(np.float64(row[base + 2 * j + 1]) * inv64), -127.0),
                                 127.0)
                        xq[m, base + j] = np.int8(q0)
                        xq[m, base + 16 + j] = np.int8(q1)
                        total += np.int32(q0) + np.int32(q1)
                sx[m, b] = scale
                xsum[m, b] = scale * np.float32(total)

    @njit(nogil=True, cache=True)
    def _quantize_into(a, xq, sx, xsum, sx_t, xs_t, r0, r1):  # pragma: no cover - compiled
        # rows r0..r1 of _quantize_rows, then the (M // 8, nb, 8) transposed
        # copies of the scales and sums of the eight-row groups wholly inside
        # r0..r1 (no kernel reads them since the tiles replaced the eight-row
        # kernel; the stage program's ROW_CHUNK-row chunks leave them unset)
        _quantize_rows(a[r0:r1], xq[r0:r1], sx[r0:r1], xsum[r0:r1])
        for g in range((r0 + 7) // 8, min(r1 // 8, sx_t.shape[0])):
            for b in range(sx_t.shape[1]):
                for r in range(8):
                    sx_t[g, b, r] = sx[g * 8 + r, b]
                    xs_t[g, b, r] = xsum[g * 8 + r, b]

    @njit(nogil=True, cache=True)
    def _act_buffers(m, kp):  # pragma: no cover - compiled
        # (xq, sx, xsum, sx_t, xs_t) for m rows of kp (a multiple of 32) values
        nb = kp // 32
        return (np.empty((m, kp), np.int8), np.empty((m, nb), np.float32),
                np.empty((m, nb), np.float32), np.empty((m // 8, nb, 8), np.float32),
                np.empty((m // 8, nb, 8), np.float32))

    @njit(nogil=True, cache=True)
    def _quantized(a):  # pragma: no cover - compiled
        xq, sx, xsum, sx_t, xs_t = _act_buffers(a.shape[0], a.shape[1])
        _quantize_into(a, xq, sx, xsum, sx_t, xs_t, 0, a.shape[0])
        return xq, sx, xsum, sx_t, xs_t


def quantize_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize A for the int8 kernels.

    Args:
        a: (M, n_blocks * 32) float32, C-contiguous (zero-padded past K).

    Returns:
        ``(xq, sx, xsum)``: (M, n_blocks * 32) int8 (per block even values, then
        odd), (M, n_blocks) float32 scales ``max|a| / 127`` and ``sx * sum(xq)``.
    """
    m, kp = a.shape
    nb = kp // BLOCK
    xq = np.empty((m, kp), np.int8)
    sx = np.empty((m, nb), np.float32)
    xsum = np.empty((m, nb), np.float32)
    _quantize_rows(a, xq, sx, xsum)
    return xq, sx, xsum
