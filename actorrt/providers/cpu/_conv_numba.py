"""Compiled (numba) pieces of the 2-D convolution paths of :func:`._conv_util.conv_core`.

Loaded lazily, on the first 2-D convolution (non-LLM models that never convolve
never import numba through here). Without numba :data:`HAVE_NUMBA` is False and
``conv_core`` keeps its numpy paths.

* :func:`num_threads` -- the calling thread's numba thread count.
* :func:`im2col2d` -- the patch matrix ``cols (N, C, KH, KW, OH, OW)`` of an
  unpadded ``x (N, C, H, W)``, zeros where a tap falls in the padding; parallel
  over the ``N * C`` planes.
* :func:`depthwise2d` -- ``y (N, C*mult, OH, OW)`` of a grouped convolution with
  one input channel per group, directly (no patch matrix); parallel over planes.

Both take float32 or float64 C-contiguous arrays and strides / dilations /
leading pads as ints. Each has a serial driver over a range of planes and a
numba-parallel one over one per-plane body; :func:`run_planes` runs small
work serially and splits large work into plane ranges on the intra-op
threads (:mod:`._parallel`).
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import threading

import numpy as np

__all__ = ["HAVE_NUMBA", "LAUNCH", "span", "im2col2d", "depthwise2d", "num_threads",
           "parallel_for", "run_planes", "PARALLEL_MIN_WORK", "USE_NUMBA_POOL"]

try:
    from numba import njit, prange
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

#: numba's workqueue threading layer aborts on parallel launches from two
#: Python threads at once (segments may run concurrently): one at a time (the
#: compiled pooling of :mod:`._pool_numba` takes it too)
LAUNCH = _LAUNCH = threading.Lock()

if HAVE_NUMBA:
    @njit(nogil=True, cache=True, inline="always")
    def _span(ow, sw, off, w):  # pragma: no cover - compiled
        """Output columns ``[lo, hi)`` whose input column ``ox * sw + off`` is in ``[0, w)``."""
        lo = 0
        if off < 0:
            lo = (-off + sw - 1) // sw
        hi = ow
        if (ow - 1) * sw + off >= w:
            hi = (w - 1 - off) // sw + 1 if w - 1 - off >= 0 else 0
        if hi < lo:
            hi = lo
        return lo, hi

    #: public name of :func:`_span` for the other compiled 2-D window kernels
    span = _span

    # (element indexing throughout: row views inside these loops measured 3-5x
    # slower in numba 0.61 than the same loops on indices)
    @njit(nogil=True, cache=True)
    def _im2col_plane(x, cols, b, ch, sh, sw, dh, dw, pt, pl):  # pragma: no cover - compiled
        h, w = x.shape[2], x.shape[3]
        kh, kw, oh, ow = cols.shape[2], cols.shape[3], cols.shape[4], cols.shape[5]
        for i in range(kh):
            for j in range(kw):
                off = j * dw - pl
                lo, hi = _span(ow, sw, off, w)
                for oy in range(oh):
                    iy = oy * sh - pt + i * dh
                    if iy < 0 or iy >= h:
                        for ox in range(ow):
                            cols[b, ch, i, j, oy, ox] = 0
                        continue
                    for ox in range(lo):
                        cols[b, ch, i, j, oy, ox] = 0
                    for ox in range(hi, ow):
                        cols[b, ch, i, j, oy, ox] = 0
                    if sw == 1:
                        for ox in range(lo, hi):
                            cols[b, ch, i, j, oy, ox] = x[b, ch, iy, ox + off]
                    else:
                        for ox in range(lo, hi):
                            cols[b, ch, i, j, oy, ox] = x[b, ch, iy, ox * sw + off]

    @njit(parallel=True, nogil=True, cache=True)
    def _im2col(x, cols, sh, sw, dh, dw, pt, pl):  # pragma: no cover - compiled
        n, c = x.shape[0], x.shape[1]
        for nc in prange(n * c):
            _im2col_plane(x, cols, nc // c, nc % c, sh, sw, dh, dw, pt, pl)

    @njit(nogil=True, cache=True)
    def _im2col_serial(x, cols, sh, sw, dh, dw, pt, pl, start, stop):  # pragma: no cover
        c = x.shape[1]
        for nc in range(start, stop):
            _im2col_plane(x, cols, nc // c, nc % c, sh, sw, dh, dw, pt, pl)

    @njit(nogil=True, cache=True, fastmath=True, boundscheck=False, inline="always")
    def _dw3x3_row(xp, wp, yr, t, iy0, sw, pl, lo, hi):  # pragma: no cover - compiled
        """One output row of an undilated 3x3 depthwise plane whose input rows
        ``iy0 .. iy0 + 2`` are inside: columns ``[lo, hi)`` (every tap inside)
        in one pass, the edge columns tap by tap."""
        wd = xp.shape[1]
        ow = yr.shape[0]
        w00, w01, w02 = wp[0, 0], wp[0, 1], wp[0, 2]
        w10, w11, w12 = wp[1, 0], wp[1, 1], wp[1, 2]
        w20, w21, w22 = wp[2, 0], wp[2, 1], wp[2, 2]
        n = hi - lo
        s0 = lo * sw - pl
        yv = yr[lo:hi]
        if sw == 1:
            a = xp[iy0, s0:s0 + n + 2]
            b = xp[iy0 + 1, s0:s0 + n + 2]
            c = xp[iy0 + 2, s0:s0 + n + 2]
            for q in range(n):
                yv[q] = (w00 * a[q] + w01 * a[q + 1] + w02 * a[q + 2]
                         + w10 * b[q] + w11 * b[q + 1] + w12 * b[q + 2]
                         + w20 * c[q] + w21 * c[q + 1] + w22 * c[q + 2])
        else:  # strided: the stride-1 row over the span (vectorized) into t, then every sw-th
            L = (n - 1) * sw + 1
            a = xp[iy0, s0:s0 + L + 2]
            b = xp[iy0 + 1, s0:s0 + L + 2]
            c = xp[iy0 + 2, s0:s0 + L + 2]
            for q in range(L):
                t[q] = (w00 * a[q] + w01 * a[q + 1] + w02 * a[q + 2]
                        + w10 * b[q] + w11 * b[q + 1] + w12 * b[q + 2]
                        + w20 * c[q] + w21 * c[q + 1] + w22 * c[q + 2])
            for q in range(n):
                yv[q] = t[q * sw]
        for ox in range(ow):
            if lo <= ox < hi:
                continue
            acc = yr[ox] * 0
            for i in range(3):
                for j in range(3):
                    ix = ox * sw - pl + j
                    if 0 <= ix < wd:
                        acc += wp[i, j] * xp[iy0 + i, ix]
            yr[ox] = acc

    # The depthwise plane works on row views: the same loop on 4-D element
    # indices (``y[b, oc, oy, ox + off]``) did not vectorize (numba's index
    # arithmetic may wrap, so LLVM cannot prove the accesses consecutive) and
    # ran at 0.5-1 GFLOP/s; on row views it runs 2-5x faster (round 4)
    @njit(nogil=True, cache=True, fastmath=True, boundscheck=False)
    def _depthwise_plane(x, w, y, b, oc, sh, sw, dh, dw, pt, pl):  # pragma: no cover
        h, wd = x.shape[2], x.shape[3]
        m, kh, kw = w.shape[0], w.shape[2], w.shape[3]
        xp = x[b, oc // (m // x.shape[1])]
        yp = y[b, oc]
        wp = w[oc, 0]
        oh, ow = y.shape[2], y.shape[3]
        los = np.empty(kw, np.int64)
        his = np.empty(kw, np.int64)
        for j in range(kw):
            lo, hi = _span(ow, sw, j * dw - pl, wd)
            los[j] = lo
            his[j] = hi
        # 3x3 undilated: rows whose three input rows are inside take the nine
        # taps in one pass over their interior columns [lo3, hi3)
        fast = kh == 3 and kw == 3 and dh == 1 and dw == 1
        lo3 = max(los[0], max(los[1], los[2]))
        hi3 = min(his[0], min(his[1], his[2]))
        t = np.empty(wd if fast and sw > 1 else 1, x.dtype)  # _dw3x3_row's strided scratch
        for oy in range(oh):
            yr = yp[oy]
            iy0 = oy * sh - pt
            if fast and iy0 >= 0 and iy0 + 2 < h and hi3 > lo3:
                _dw3x3_row(xp, wp, yr, t, iy0, sw, pl, lo3, hi3)
                continue
            for ox in range(ow):
                yr[ox] = 0
            for i in range(kh):
                iy = oy * sh - pt + i * dh
                if iy < 0 or iy >= h:
                    continue
                for j in range(kw):
                    lo, hi = los[j], his[j]
                    if hi <= lo:
                        continue
                    wv = wp[i, j]
                    off = j * dw - pl
                    yv = yr[lo:hi]
                    if sw == 1:
                        xr = xp[iy, lo + off:hi + off]
                    else:
                        xr = xp[iy, lo * sw + off:(hi - 1) * sw + off + 1:sw]
                    for q in range(hi - lo):
                        yv[q] += wv * xr[q]

    @njit(parallel=True, nogil=True, cache=True)
    def _depthwise(x, w, y, sh, sw, dh, dw, pt, pl):  # pragma: no cover - compiled
        n, m = x.shape[0], w.shape[0]
        for nm in prange(n * m):
            _depthwise_plane(x, w, y, nm // m, nm % m, sh, sw, dh, dw, pt, pl)

    @njit(nogil=True, cache=True)
    def _depthwise_serial(x, w, y, sh, sw, dh, dw, pt, pl, start, stop):  # pragma: no cover
        m = w.shape[0]
        for nm in range(start, stop):
            _depthwise_plane(x, w, y, nm // m, nm % m, sh, sw, dh, dw, pt, pl)


#: below this many output elements times kernel taps a compiled kernel runs
#: on the calling thread alone; above, its planes are split into chunks run by
#: :func:`._parallel.run_chunks` (the serial driver over plane ranges: no
#: spinning OpenMP pool, which on a busy 2-core machine made every launch wait
#: for a descheduled worker)
PARALLEL_MIN_WORK = 1 << 20
#: run the numba ``parallel=True`` drivers (the OpenMP/TBB pool) instead
USE_NUMBA_POOL = False


def parallel_for(work: int) -> bool:
    """Whether a compiled kernel of ``work`` element-taps should be split
    across the session's intra-op threads (several threads and enough work)."""
    if work < PARALLEL_MIN_WORK:
        return False
    from ._threads import current
    return current() > 1


def run_planes(serial, parallel, args: tuple, planes: int, work: int) -> None:
    """Run a kernel over ``planes`` planes: ``serial(*args, start, stop)`` on
    the calling thread, split into plane ranges across the intra-op threads
    when :func:`parallel_for` says so (or ``parallel(*args)`` on numba's pool
    with :data:`USE_NUMBA_POOL`, when the kernel has one: ``parallel`` not None)."""
    if not parallel_for(work):
        serial(*args, 0, planes)
        return
    if USE_NUMBA_POOL and parallel is not None:
        with _LAUNCH:
            parallel(*args)
        return
    from . import _parallel
    from ._threads import current
    threads = current()
    per = max(1, -(-planes // (_parallel.CHUNKS_PER_THREAD * threads)))
    _parallel.run_chunks(lambda t: serial(*args, t * per, min(planes, (t + 1) * per)),
                         -(-planes // per), threads)


def num_threads() -> int:
    """numba threads the calling thread's parallel launches use (1 without numba)."""
    if not HAVE_NUMBA:
        return 1
    import numba
    return numba.get_num_threads()


def im2col2d(x: np.ndarray, kernel, strides, dilations, pads_begin, out_shape,
             cols: np.ndarray | None = None) -> np.ndarray:
    """Patch matrix ``(N, C, KH, KW, OH, OW)`` of ``x (N, C, H, W)``, built in
    ``cols`` when given (same dtype, that many elements), else in a new array."""
    n, c = x.shape[:2]
    shape = (n, c, kernel[0], kernel[1], out_shape[0], out_shape[1])
    if cols is None:
        cols = np.empty(shape, x.dtype)
    else:
        cols = cols.reshape(shape)
    run_planes(_im2col_serial, _im2col, (np.ascontiguousarray(x), cols, strides[0], strides[1],
                                         dilations[0], dilations[1], pads_begin[0], pads_begin[1]),
               n * c, cols.size)
    return cols


def depthwise2d(x: np.ndarray, w: np.ndarray, strides, dilations, pads_begin, out_shape) -> np.ndarray:
    """``(N, M, OH, OW)`` convolution of ``x (N, C, H, W)`` with ``w (M, 1, KH, KW)``,
    ``M`` a multiple of ``C`` (one input channel per group)."""
    n = x.shape[0]
    y = np.empty((n, w.shape[0], out_shape[0], out_shape[1]), x.dtype)
    run_planes(_depthwise_serial, _depthwise,
               (np.ascontiguousarray(x), np.ascontiguousarray(w, dtype=x.dtype), y, strides[0],
                strides[1], dilations[0], dilations[1], pads_begin[0], pads_begin[1]),
               n * w.shape[0], y.size * w.shape[2] * w.shape[3])
    return y
