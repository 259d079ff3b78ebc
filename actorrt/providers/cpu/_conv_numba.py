"""Compiled (numba) pieces of the 2-D convolution paths of :func:`._conv_util.conv_core`.

Loaded lazily, on the first 2-D convolution (non-LLM models that never convolve
never import numba through here). Without numba :data:`HAVE_NUMBA` is False and
``conv_core`` keeps its numpy paths.

* :func:`num_threads` -- the calling thread's numba thread count.
* :func:`im2col2d` -- the patch matrix ``cols (N, C, KH, KW, OH, OW)`` of an
  unpadded ``x (N, C, H, W)``, zeros where a tap falls in the padding; parallel
  over the ``N * C`` planes.
* :func:`depthwise2d` -- ``y (N, C*mult, OH, OW)`` of a grouped convolution with
  one input channel per group, directly (no patch matrix), bias / residual /
  Relu-LeakyRelu-Clip applied in the store; parallel over planes (float32:
  on the compiled partner threads, :mod:`._conv_split`).

Both take float32 or float64 C-contiguous arrays and strides / dilations /
leading pads as ints. Each has a serial driver over a range of planes (im2col
also a numba-parallel one over one per-plane body); :func:`run_planes` runs small
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

if HAVE_NUMBA:
    from . import _conv_vec as _cv
    #: depthwise planes summed, copied in and stored by the vectorized LLVM
    #: row kernels (:mod:`._conv_vec`: every tap a masked vector load at its
    #: flat offset) where they are built; else numba's loops
    DW_TILE = _cv.HAVE_KERNEL
    if _cv.HAVE_KERNEL:
        _dw_sum, _dw_store, _copy1, _copy2 = _cv.dw_sum, _cv.dw_store, _cv.copy1, _cv.copy2
    else:  # pragma: no cover - without the AVX2 kernel
        @njit(nogil=True, cache=True)
        def _dw_sum(ph, offs, kk, w, w_off, acc, n, bias):
            for t in range(n):
                acc[t] = bias
            for k in range(kk):
                for t in range(n):
                    acc[t] += w[w_off + k] * ph[offs[k] + t]

        @njit(nogil=True, cache=True)
        def _dw_store(acc, a_off, y, y_off, z, z_off, has_z, n, alpha, lo, hi):
            for i in range(n):
                v = acc[a_off + i] + (z[z_off + i] if has_z else 0)
                v = alpha * v if v < 0 else v
                y[y_off + i] = min(max(v, lo), hi)

        @njit(nogil=True, cache=True)
        def _copy1(src, s_off, dst, d_off, n):
            for i in range(n):
                dst[d_off + i] = src[s_off + i]

        @njit(nogil=True, cache=True)
        def _copy2(src, s_off, dst, d_off, n):
            for i in range(n):
                dst[d_off + i] = src[s_off + 2 * i]
else:  # pragma: no cover
    DW_TILE = False

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

    # The depthwise planes work on views: the same loops on 4-D element
    # indices (``y[b, oc, oy, ox + off]``) did not vectorize (numba's index
    # arithmetic may wrap, so LLVM cannot prove the accesses consecutive), and
    # a view per tap per row cost more than the row's arithmetic on small
    # planes. So each input plane is first copied into a zeroed, padded,
    # phase-split scratch ``ph (SH*SW, HQ, WQ)`` (``ph[a*SW + b, r, k]`` = padded
    # input ``[r*SH + a, k*SW + b]``): output ``(oy, ox)``'s tap ``(i, j)`` then
    # reads flat element ``oy*WQ + ox + off(i, j)`` of one phase plane, so the
    # whole plane is one loop over ``t = oy*WQ + ox`` with one view per tap
    # (the ``WQ - OW`` columns past each row are computed and dropped). An
    # undilated-in-columns 3x3 kernel at column stride 1 or 2 sums its nine
    # taps per element in one pass, others tap by tap.
    # Bias, a residual ``z`` and ``min(max(where(v < 0, alpha*v, v), lo), hi)``
    # are applied copying the rows out. (The previous kernel, row by row with
    # the edge columns tap by tap, ran at 1.5-5 GFLOP/s here.)
    @njit(nogil=True, cache=True, fastmath=True, boundscheck=False)
    def _depthwise_serial(x, w, bias, z, y, sh, sw, dh, dw, pt, pl, ep, has_z, tile,
                          start, stop):  # pragma: no cover - compiled
        alpha, lo, hi = ep[0], ep[1], ep[2]  # x's dtype (no float64 promotion in the store)
        c, h, wd = x.shape[1], x.shape[2], x.shape[3]
        m, kh, kw = w.shape[0], w.shape[2], w.shape[3]
        oh, ow = y.shape[2], y.shape[3]
        mult = m // c
        hq = max(((kh - 1) * dh) // sh + oh, (h + pt + sh - 1) // sh)
        wq = max(((kw - 1) * dw) // sw + ow, (wd + pl + sw - 1) // sw)
        ph = np.zeros((sh * sw, hq * wq), x.dtype)  # pads stay zero: only the interior is written
        n_t = (oh - 1) * wq + ow
        acc = np.empty(oh * wq, x.dtype)
        acc2 = acc.reshape((oh, wq))
        kk = kh * kw
        tp = np.empty(kk, np.int64)  # phase plane of each tap
        to = np.empty(kk, np.int64)  # flat offset in it
        fo = np.empty(kk, np.int64)  # flat offset in ph
        for i in range(kh):
            for j in range(kw):
                tp[i * kw + j] = ((i * dh) % sh) * sw + (j * dw) % sw
                to[i * kw + j] = ((i * dh) // sh) * wq + (j * dw) // sw
                fo[i * kw + j] = tp[i * kw + j] * hq * wq + to[i * kw + j]
        phf = ph.reshape(sh * sw * hq * wq)
        wf = w.reshape(m * kk)
        xf = x.reshape(x.size)
        last = -1
        for nm in range(start, stop):
            b = nm // m
            oc = nm % m
            ic = oc // mult
            if tile and b * c + ic != last and sw <= 2:  # vector row copies on flat offsets
                last = b * c + ic
                for iy in range(h):
                    ry = iy + pt
                    src = ((b * c + ic) * h + iy) * wd
                    for p in range(sw):
                        ix0 = (p - pl) % sw
                        if ix0 >= wd:
                            continue
                        cnt = (wd - 1 - ix0) // sw + 1
                        dst = ((ry % sh) * sw + p) * hq * wq + (ry // sh) * wq + (ix0 + pl) // sw
                        if sw == 1:
                            _copy1(xf, src + ix0, phf, dst, cnt)
                        else:
                            _copy2(xf, src + ix0, phf, dst, cnt)
            elif b * c + ic != last:  # copy the input plane in (once per channel multiplier run)
                last = b * c + ic
                xpl = x[b, ic]
                for iy in range(h):
                    xr = xpl[iy]
                    ry = iy + pt
                    rowbase = (ry // sh) * wq
                    pa = (ry % sh) * sw
                    for p in range(sw):  # column phase p: input columns ix0, ix0 + SW, ...
                        ix0 = (p - pl) % sw
                        if ix0 >= wd:
                            continue
                        cnt = (wd - 1 - ix0) // sw + 1
                        k0 = rowbase + (ix0 + pl) // sw
                        if sw == 1:
                            dst = ph[pa, k0:k0 + cnt]
                            for t in range(cnt):
                                dst[t] = xr[t]
                        else:  # a strided gather: element indices (no views)
                            pp = pa + p
                            for t in range(cnt):
                                ph[pp, k0 + t] = xr[ix0 + t * sw]
            wp = w[oc, 0]
            bv = bias[oc]
            if tile:
                _dw_sum(phf, fo, kk, wf, oc * kk, acc, n_t, bv)
            elif kh == 3 and kw == 3 and dw == 1 and sw <= 2:
                # one view per kernel row (and column phase): a loop over more
                # than ~8 arrays is not vectorized (LLVM's runtime alias-check
                # limit), taps j = 1, 2 at constant offsets of the same view are
                w0, w1, w2 = wp[0, 0], wp[0, 1], wp[0, 2]
                w3, w4, w5 = wp[1, 0], wp[1, 1], wp[1, 2]
                w6, w7, w8 = wp[2, 0], wp[2, 1], wp[2, 2]
                o0, o1, o2 = to[0], to[3], to[6]
                q0, q1, q2 = tp[0], tp[3], tp[6]
                if sw == 1:
                    r0 = ph[q0, o0:o0 + n_t + 2]
                    r1 = ph[q1, o1:o1 + n_t + 2]
                    r2 = ph[q2, o2:o2 + n_t + 2]
                    for t in range(n_t):
                        acc[t] = (bv + w0 * r0[t] + w1 * r0[t + 1] + w2 * r0[t + 2]
                                  + w3 * r1[t] + w4 * r1[t + 1] + w5 * r1[t + 2]
                                  + w6 * r2[t] + w7 * r2[t + 1] + w8 * r2[t + 2])
                else:  # column phases: tap 0 even [t], tap 1 odd [t], tap 2 even [t + 1]
                    e0 = ph[q0, o0:o0 + n_t + 1]
                    d0 = ph[q0 + 1, o0:o0 + n_t]
                    e1 = ph[q1, o1:o1 + n_t + 1]
                    d1 = ph[q1 + 1, o1:o1 + n_t]
                    e2 = ph[q2, o2:o2 + n_t + 1]
                    d2 = ph[q2 + 1, o2:o2 + n_t]
                    for t in range(n_t):
                        acc[t] = (bv + w0 * e0[t] + w1 * d0[t] + w2 * e0[t + 1]
                                  + w3 * e1[t] + w4 * d1[t] + w5 * e1[t + 1]
                                  + w6 * e2[t] + w7 * d2[t] + w8 * e2[t + 1])
            else:
                for t in range(n_t):
                    acc[t] = bv
                for i in range(kh):
                    for j in range(kw):
                        q = i * kw + j
                        xr = ph[tp[q], to[q]:to[q] + n_t]
                        wv = wp[i, j]
                        for t in range(n_t):
                            acc[t] += wv * xr[t]
            if tile:  # the vectorized row stores
                yf = y.reshape(y.size)
                zf = z.reshape(z.size)
                for oy in range(oh):
                    o = ((b * m + oc) * oh + oy) * ow
                    _dw_store(acc, oy * wq, yf, o, zf, o, has_z, ow, alpha, lo, hi)
            # (element indices from here: a view per row cost as much as the row)
            elif has_z:
                for oy in range(oh):
                    for q in range(ow):
                        v = acc2[oy, q] + z[b, oc, oy, q]
                        v = alpha * v if v < 0 else v
                        y[b, oc, oy, q] = min(max(v, lo), hi)
            else:
                for oy in range(oh):
                    for q in range(ow):
                        v = acc2[oy, q]
                        v = alpha * v if v < 0 else v
                        y[b, oc, oy, q] = min(max(v, lo), hi)

    #: public name of :func:`_depthwise_serial` (planes ``[start, stop)``,
    #: image * M + output channel; the compiled split of :mod:`._conv_split`)
    depthwise_planes = _depthwise_serial

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


def depthwise2d(x: np.ndarray, w: np.ndarray, strides, dilations, pads_begin, out_shape,
                bias: np.ndarray | None = None, z: np.ndarray | None = None,
                alpha: float = 1.0, lo: float = -np.inf, hi: float = np.inf) -> np.ndarray:
    """``(N, M, OH, OW)`` convolution of ``x (N, C, H, W)`` with ``w (M, 1, KH, KW)``,
    ``M`` a multiple of ``C`` (one input channel per group), float32 or float64,
    with its epilogue in the store: ``bias (M,)`` and a residual ``z`` of the
    output's shape added (when given), then ``min(max(where(v < 0, alpha*v, v), lo), hi)``
    (the defaults apply nothing). Pads at the end are implied by ``out_shape``."""
    n = x.shape[0]
    m = w.shape[0]
    from . import _conv_tiles as _ct
    # the row copies read x, the row stores read z and write y, with masked
    # vectors (docs/speed.md round 13)
    x = _ct.readable(np.ascontiguousarray(x))
    y = _ct.empty_with_slack((n, m, out_shape[0], out_shape[1]), x.dtype)
    b = np.zeros(m, x.dtype) if bias is None else np.ascontiguousarray(bias, dtype=x.dtype).reshape(m)
    # without z the store's masked-off z loads read y at its own offsets: a
    # one-element placeholder would put them past its end, and a masked load
    # whose masked-off lanes reach a page not present (unmapped, or never
    # touched) is a microcode assist on AMD Zen (docs/speed.md round 11)
    zz = y if z is None else _ct.readable(np.ascontiguousarray(z, dtype=x.dtype))
    args = (x, np.ascontiguousarray(w, dtype=x.dtype), b, zz, y, strides[0],
            strides[1], dilations[0], dilations[1], pads_begin[0], pads_begin[1],
            np.array([alpha, lo, hi], x.dtype), z is not None, DW_TILE)
    work = y.size * w.shape[2] * w.shape[3]
    if n * m > 1 and not USE_NUMBA_POOL and x.dtype == np.float32:
        from . import _conv_split
        from ._threads import current
        if work >= min(_conv_split.MIN_DEPTHWISE_WORK, PARALLEL_MIN_WORK) and \
                _conv_split.depthwise(args[0], args[1], b, zz, y, strides, dilations, pads_begin,
                                 args[11], z is not None, DW_TILE, current()):
            return y  # planes on the compiled partner threads
    run_planes(_depthwise_serial, None, args, n * m, work)
    return y
