"""Optional numba fast paths of the com.microsoft contrib kernels (MatMulNBits).

The GEMV kernels read the packed 4-bit (or 8-bit) blocks of B directly, one
output column per parallel iteration, so a decode step streams the quantized
weight (~bits/8 bytes per weight) instead of a float32 copy (4 bytes per
weight). Without numba, :data:`HAVE_NUMBA` is False and callers use numpy.

Shapes (all C-contiguous):
    ``b8``: (N, n_blocks, block_size) uint8 (one quantized value per byte).
    ``scales`` / ``zps``: (N, n_blocks) float32 (zero points as floats).
    ``a``: (M, n_blocks, block_size) float32; ``asum``: (M, n_blocks) float32.
    ``out``: (M, N) float32.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["HAVE_NUMBA", "gemv_q8", "dequant_q8", "num_threads",
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

    def _gemv_q8_body(a, asum, b8, scales, zps, out):  # pragma: no cover - compiled
        # flat rows: contiguous 1-D inner loops vectorize (u8 -> f32 FMA)
        m_rows = a.shape[0]
        n_cols = b8.shape[0]
        nb = b8.shape[1]
        bs = b8.shape[2]
        bflat = b8.reshape(n_cols, nb * bs)
        aflat = a.reshape(m_rows, nb * bs)
        for n in prange(n_cols):
            brow = bflat[n]
            for m in range(m_rows):
                am = aflat[m]
                acc = np.float32(0.0)
                for blk in range(nb):
                    s = np.float32(0.0)
                    base = blk * bs
                    for j in range(bs):
                        s += np.float32(brow[base + j]) * am[base + j]
                    acc += scales[n, blk] * (s - zps[n, blk] * asum[m, blk])
                out[m, n] = acc

    _gemv_q8 = _jit(_gemv_q8_body)
    # small matrices: waking the thread team costs more than it saves
    _gemv_q8_serial = njit(fastmath=True, nogil=True, cache=True)(_gemv_q8_body)

    # serial: it runs between BLAS calls, whose threads an OpenMP team would fight
    @njit(fastmath=True, nogil=True, cache=True)
    def _dequant_q8(b8, scales, zps, n0, w):  # pragma: no cover - compiled
        nb = b8.shape[1]
        bs = b8.shape[2]
        for i in range(w.shape[0]):
            n = n0 + i
            for blk in range(nb):
                s = scales[n, blk]
                z = zps[n, blk]
                base = blk * bs
                for j in range(bs):
                    w[i, base + j] = (np.float32(b8[n, blk, j]) - z) * s


#: below this many weights a GEMV runs on one thread (no team wake-up)
PARALLEL_MIN_WEIGHTS = 1 << 20


def gemv_q8(a, asum, b8, scales, zps, out) -> None:
    """out[m, n] = sum over blocks of scale * (q . a - zp * sum(a)), one byte per q."""
    if b8.size < PARALLEL_MIN_WEIGHTS:
        _gemv_q8_serial(a, asum, b8, scales, zps, out)
        return
    with _LOCK:
        _gemv_q8(a, asum, b8, scales, zps, out)


def dequant_q8(b8, scales, zps, n0, w) -> None:
    """w[i, k] = (q[n0 + i, k] - zp) * scale: float32 rows of B for a GEMM tile."""
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
    b8 = np.zeros((2, 1, 16), np.uint8)
    sc = np.ones((2, 1), f32)
    zp = np.zeros((2, 1), f32)
    out = np.zeros((1, 2), f32)
    a1, s1 = np.zeros((1, 1, 16), f32), np.zeros((1, 1), f32)
    _gemv_q8(a1, s1, b8, sc, zp, out)
    _gemv_q8_serial(a1, s1, b8, sc, zp, out)
    dequant_q8(b8, sc, zp, 0, np.zeros((2, 16), f32))
    _WARM = True
