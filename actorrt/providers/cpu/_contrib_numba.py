"""Optional numba fast paths of the com.microsoft contrib kernels (MatMulNBits).

The GEMV kernels read the packed 4-bit (or 8-bit) blocks of B directly, one
output column per parallel iteration, so a decode step streams the quantized
weight (~bits/8 bytes per weight) instead of a float32 copy (4 bytes per
weight). Without numba, :data:`HAVE_NUMBA` is False and callers use numpy.

Shapes (all C-contiguous):
    ``b4``: (N, n_blocks, block_size // 2) uint8, low nibble = even k.
    ``b8``: (N, n_blocks, block_size) uint8 (one quantized value per byte).
    ``scales`` / ``zps``: (N, n_blocks) float32 (zero points as floats).
    ``a2``: (M, n_blocks, 2, block_size // 2) float32: A with each block split
        into its even and odd elements (so both nibbles meet contiguous A).
    ``a``: (M, n_blocks, block_size) float32; ``asum``: (M, n_blocks) float32.
    ``out``: (M, N) float32.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["HAVE_NUMBA", "gemv_q4", "gemv_q8", "dequant_q4", "dequant_q8", "num_threads",
           "set_num_threads", "warm_up"]

try:  # numba is optional (the ``genai`` extra)
    import numba
    from numba import njit, prange
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

# The workqueue threading layer aborts on concurrent parallel launches from
# several Python threads; one launch at a time also avoids oversubscribing cores.
_LOCK = threading.Lock()
_WARM = False

if HAVE_NUMBA:
    _jit = njit(parallel=True, fastmath=True, nogil=True, cache=True)

    @_jit
    def _gemv_q4(a2, asum, b4, scales, zps, out):  # pragma: no cover - compiled
        m_rows = a2.shape[0]
        n_cols = b4.shape[0]
        nb = b4.shape[1]
        half = b4.shape[2]
        for n in prange(n_cols):
            for m in range(m_rows):
                acc = np.float32(0.0)
                for blk in range(nb):
                    s = np.float32(0.0)
                    for j in range(half):
                        v = b4[n, blk, j]
                        s += (np.float32(v & 15) * a2[m, blk, 0, j]
                              + np.float32(v >> 4) * a2[m, blk, 1, j])
                    acc += scales[n, blk] * (s - zps[n, blk] * asum[m, blk])
                out[m, n] = acc

    @_jit
    def _gemv_q8(a, asum, b8, scales, zps, out):  # pragma: no cover - compiled
        m_rows = a.shape[0]
        n_cols = b8.shape[0]
        nb = b8.shape[1]
        bs = b8.shape[2]
        for n in prange(n_cols):
            for m in range(m_rows):
                acc = np.float32(0.0)
                for blk in range(nb):
                    s = np.float32(0.0)
                    for j in range(bs):
                        s += np.float32(b8[n, blk, j]) * a[m, blk, j]
                    acc += scales[n, blk] * (s - zps[n, blk] * asum[m, blk])
                out[m, n] = acc

    @_jit
    def _dequant_q4(b4, scales, zps, n0, w):  # pragma: no cover - compiled
        nb = b4.shape[1]
        half = b4.shape[2]
        for i in prange(w.shape[0]):
            n = n0 + i
            for blk in range(nb):
                s = scales[n, blk]
                z = zps[n, blk]
                base = blk * 2 * half
                for j in range(half):
                    v = b4[n, blk, j]
                    w[i, base + 2 * j] = (np.float32(v & 15) - z) * s
                    w[i, base + 2 * j + 1] = (np.float32(v >> 4) - z) * s

    @_jit
    def _dequant_q8(b8, scales, zps, n0, w):  # pragma: no cover - compiled
        nb = b8.shape[1]
        bs = b8.shape[2]
        for i in prange(w.shape[0]):
            n = n0 + i
            for blk in range(nb):
                s = scales[n, blk]
                z = zps[n, blk]
                base = blk * bs
                for j in range(bs):
                    w[i, base + j] = (np.float32(b8[n, blk, j]) - z) * s


def gemv_q4(a2, asum, b4, scales, zps, out) -> None:
    """out[m, n] = sum over blocks of scale * (q . a - zp * sum(a)), 4-bit B."""
    with _LOCK:
        _gemv_q4(a2, asum, b4, scales, zps, out)


def gemv_q8(a, asum, b8, scales, zps, out) -> None:
    """Like :func:`gemv_q4` for one byte per quantized value."""
    with _LOCK:
        _gemv_q8(a, asum, b8, scales, zps, out)


def dequant_q4(b4, scales, zps, n0, w) -> None:
    """w[i, k] = (q[n0 + i, k] - zp) * scale: float32 rows of B for a GEMM tile."""
    with _LOCK:
        _dequant_q4(b4, scales, zps, n0, w)


def dequant_q8(b8, scales, zps, n0, w) -> None:
    """Like :func:`dequant_q4` for one byte per quantized value."""
    with _LOCK:
        _dequant_q8(b8, scales, zps, n0, w)


def num_threads() -> int:
    """Threads numba's parallel loops use (1 without numba)."""
    return numba.get_num_threads() if HAVE_NUMBA else 1


def set_num_threads(n: int) -> None:
    """Set numba's thread count (benchmarks; no-op without numba)."""
    if HAVE_NUMBA:
        numba.set_num_threads(n)


def warm_up() -> None:
    """Compile (or load from the on-disk cache) every kernel once, so the first
    decode step does not pay the JIT."""
    global _WARM
    if _WARM or not HAVE_NUMBA:
        return
    f32 = np.float32
    b4 = np.zeros((2, 1, 8), np.uint8)
    b8 = np.zeros((2, 1, 16), np.uint8)
    sc = np.ones((2, 1), f32)
    zp = np.zeros((2, 1), f32)
    out = np.zeros((1, 2), f32)
    gemv_q4(np.zeros((1, 1, 2, 8), f32), np.zeros((1, 1), f32), b4, sc, zp, out)
    gemv_q8(np.zeros((1, 1, 16), f32), np.zeros((1, 1), f32), b8, sc, zp, out)
    dequant_q4(b4, sc, zp, 0, np.zeros((2, 16), f32))
    dequant_q8(b8, sc, zp, 0, np.zeros((2, 16), f32))
    _WARM = True
