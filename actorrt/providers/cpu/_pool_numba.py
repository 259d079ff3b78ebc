"""Compiled (numba) 2-D pooling for :mod:`.pool`: MaxPool (no Indices output),
AveragePool and GlobalAveragePool, parallel over the ``N * C`` planes, reading
the unpadded input directly (no padded copy, no per-tap temporaries).

Loaded lazily by :mod:`.pool` on the first float32/float64 4-D pooling; without
numba :data:`HAVE_NUMBA` is False and the numpy paths run.

* :func:`maxpool2d` -- ``y (N, C, OH, OW)``: max over the window's taps that
  fall inside the image (a window wholly in the padding gives ``-inf``, as the
  numpy path's ``-inf`` padding); NaN inputs are skipped where the window has a number
  (the numpy path's ``np.fmax``; onnxruntime's NaN handling depends on position).
* :func:`avgpool2d` -- ``y (N, C, OH, OW)``: sum of the in-image taps divided by
  ``count_h[oy] * count_w[ox]`` (the caller's divisors: pads counted or not).
* :func:`global_avgpool` -- ``(N, C)`` means of ``x (N, C, S)``, accumulated in
  float64 (serial: one pass over memory).

Each kernel has a serial driver over plane ranges and a numba-parallel one;
:func:`._conv_numba.run_planes` picks and splits (the global mean, one pass
over memory, runs serially).
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from ._conv_numba import HAVE_NUMBA, run_planes

__all__ = ["HAVE_NUMBA", "maxpool2d", "avgpool2d", "global_avgpool"]

if HAVE_NUMBA:
    from numba import njit, prange

    from ._conv_numba import span as _span

    # (element indexing throughout: row views inside these loops measured 3-5x
    # slower in numba 0.61 than numpy's per-tap passes)
    @njit(nogil=True, cache=True)
    def _maxpool_plane(x, y, b, ch, kh, kw, sh, sw, dh, dw, pt, pl):  # pragma: no cover
        h, w = x.shape[2], x.shape[3]
        oh, ow = y.shape[2], y.shape[3]
        for oy in range(oh):
            for ox in range(ow):
                y[b, ch, oy, ox] = -np.inf
            for i in range(kh):
                iy = oy * sh - pt + i * dh
                if iy < 0 or iy >= h:
                    continue
                for j in range(kw):
                    off = j * dw - pl
                    lo, hi = _span(ow, sw, off, w)
                    for ox in range(lo, hi):
                        v = x[b, ch, iy, ox * sw + off]
                        r = y[b, ch, oy, ox]
                        y[b, ch, oy, ox] = v if v > r else r

    @njit(parallel=True, nogil=True, cache=True)
    def _maxpool(x, y, kh, kw, sh, sw, dh, dw, pt, pl):  # pragma: no cover - compiled
        n, c = x.shape[0], x.shape[1]
        for nc in prange(n * c):
            _maxpool_plane(x, y, nc // c, nc % c, kh, kw, sh, sw, dh, dw, pt, pl)

    @njit(nogil=True, cache=True)
    def _maxpool_serial(x, y, kh, kw, sh, sw, dh, dw, pt, pl, start, stop):  # pragma: no cover
        c = x.shape[1]
        for nc in range(start, stop):
            _maxpool_plane(x, y, nc // c, nc % c, kh, kw, sh, sw, dh, dw, pt, pl)

    # Separable (round 4): per output row the ``kh`` input rows are summed
    # column by column into a scratch row (contiguous, vectorized), then the
    # ``kw`` taps are taken from it: 2-2.5x faster than every tap from the 4-D
    # input (the sum is reassociated: rows, then columns). MaxPool keeps its
    # tap loop: the same separable form measured 2x slower there (numba did
    # not vectorize the row max)
    @njit(nogil=True, cache=True, boundscheck=False)
    def _avgpool_plane(x, y, cnt_h, cnt_w, b, ch, kh, kw, sh, sw, dh, dw, pt, pl):  # pragma: no cover
        h, w = x.shape[2], x.shape[3]
        oh, ow = y.shape[2], y.shape[3]
        xp = x[b, ch]
        yp = y[b, ch]
        t = np.empty(w, x.dtype)
        for oy in range(oh):
            for q in range(w):
                t[q] = 0
            for i in range(kh):
                iy = oy * sh - pt + i * dh
                if iy < 0 or iy >= h:
                    continue
                xr = xp[iy]
                for q in range(w):
                    t[q] += xr[q]
            yr = yp[oy]
            c = cnt_h[oy]
            for ox in range(ow):
                acc = t[0] * 0
                for j in range(kw):
                    ix = ox * sw + j * dw - pl
                    if 0 <= ix < w:
                        acc += t[ix]
                yr[ox] = acc / (c * cnt_w[ox])

    @njit(parallel=True, nogil=True, cache=True)
    def _avgpool(x, y, cnt_h, cnt_w, kh, kw, sh, sw, dh, dw, pt, pl):  # pragma: no cover
        n, c = x.shape[0], x.shape[1]
        for nc in prange(n * c):
            _avgpool_plane(x, y, cnt_h, cnt_w, nc // c, nc % c, kh, kw, sh, sw, dh, dw, pt, pl)

    @njit(nogil=True, cache=True)
    def _avgpool_serial(x, y, cnt_h, cnt_w, kh, kw, sh, sw, dh, dw, pt, pl, start,
                        stop):  # pragma: no cover
        c = x.shape[1]
        for nc in range(start, stop):
            _avgpool_plane(x, y, cnt_h, cnt_w, nc // c, nc % c, kh, kw, sh, sw, dh, dw, pt, pl)

    # row views and a reassociable float64 sum (fastmath), so the loop
    # vectorizes: the 3-D element loop ran scalar (~20x onnxruntime's time)
    @njit(nogil=True, cache=True, fastmath=True, boundscheck=False)
    def _global_avg(x, y):  # pragma: no cover - compiled
        n, c, s = x.shape
        for b in range(n):
            for ch in range(c):
                xr = x[b, ch]
                acc = 0.0
                for k in range(s):
                    acc += xr[k]
                y[b, ch] = acc / s


def maxpool2d(x: np.ndarray, kernel, strides, dilations, pads_begin, out_shape) -> np.ndarray:
    """Max pooling of C-contiguous float ``x (N, C, H, W)`` -> ``(N, C, OH, OW)``."""
    y = np.empty((*x.shape[:2], *out_shape), x.dtype)
    args = (np.ascontiguousarray(x), y, kernel[0], kernel[1], strides[0], strides[1],
            dilations[0], dilations[1], pads_begin[0], pads_begin[1])
    run_planes(_maxpool_serial, _maxpool, args, x.shape[0] * x.shape[1], y.size * kernel[0] * kernel[1])
    return y


def avgpool2d(x: np.ndarray, kernel, strides, dilations, pads_begin, out_shape,
              count_h: np.ndarray, count_w: np.ndarray) -> np.ndarray:
    """Average pooling of float ``x (N, C, H, W)`` with per-row / per-column
    divisor factors ``count_h (OH,)``, ``count_w (OW,)`` -> ``(N, C, OH, OW)``."""
    y = np.empty((*x.shape[:2], *out_shape), x.dtype)
    args = (np.ascontiguousarray(x), y, np.ascontiguousarray(count_h, dtype=x.dtype),
            np.ascontiguousarray(count_w, dtype=x.dtype), kernel[0], kernel[1], strides[0],
            strides[1], dilations[0], dilations[1], pads_begin[0], pads_begin[1])
    run_planes(_avgpool_serial, _avgpool, args, x.shape[0] * x.shape[1], y.size * kernel[0] * kernel[1])
    return y


def global_avgpool(x: np.ndarray) -> np.ndarray:
    """``(N, C)`` means over the last axis of float ``x (N, C, S)``."""
    y = np.empty(x.shape[:2], x.dtype)
    _global_avg(np.ascontiguousarray(x), y)  # memory-bound and small: serial
    return y
