"""The windowed NCHWc ops' compiled kernels: depthwise convolution, MaxPool
and AveragePool on channel-blocked tensors (:mod:`._nchwc`'s layout,
``(N, ceil(C/16), H, W, 16)``), blocked in and out; :mod:`.nchwc`'s
``NchwcConv`` (depthwise) and ``NchwcPool`` run them.

* :class:`DepthwiseCall` -- one node's shape work for one input shape (tap
  tables, the interior rows and columns, the parameter block), and the call.
* The rows of a block: :func:`_band_rows` copies bands of input rows into a
  small zero- (MaxPool: ``-inf``-) padded scratch kept in cache, then runs
  :mod:`._dw_blocked`'s unrolled windows (3x3 / 5x5 depthwise) or tap loops
  on it; :func:`_direct_rows` (strided pools) reads the rows and columns
  that need no padding in place and builds a window-sized patch for each
  border pixel.

Items are blocks (over every image's); the caller and the compiled partners
claim them (:func:`._nchwc.post_jobs`); an item's result does not depend on
the thread that runs it.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _conv_split
from . import _dw_blocked as _dwb
from . import _nchwc
from . import _partner
from ._nchwc import LANES, call_team, job_rows

__all__ = ["HAVE_KERNEL", "WINDOWS", "DIRECT", "BAND_BYTES", "DepthwiseCall"]

#: depthwise 3x3 / 5x5 convolutions by the unrolled windows of :mod:`._dw_blocked`
#: (else its tap loop; unrolled MaxPool windows measured 1.5x slower than the
#: tap loop on 3x3 / 2 64 x 111 x 111 and were dropped)
WINDOWS = True
#: depthwise convolutions and pools read the input rows and columns that
#: need no padding in place (only the border rows go through the padded band
#: scratch, the border columns through a window-sized patch); off: every row
#: through the band scratch
DIRECT = True
#: ... depthwise convolutions too from this many output columns (a row's border
#: patch costs about what the band copy of a short row does: 3x3 / 2 on 20 x 20
#: 1.35x the band path's time, 40 x 40 1.04, 80 x 80 0.89, 112 x 112 0.77)
DIRECT_DEPTHWISE_COLUMNS = 32
#: input bytes of a band of output rows that the depthwise / pool kernels pad
#: and read at a time (kept in L2 instead of a padded copy of the whole block)
BAND_BYTES = 1 << 16
#: numba, AVX-512 and the compiled partner hook (as :mod:`._nchwc`)
HAVE_KERNEL = _nchwc.HAVE_KERNEL


if HAVE_KERNEL:
    from numba import carray, cfunc, njit

    from . import _conv_tiles as _ct

    _copy = _ct.copy_f32
    _f32p, _i64p = _partner.f32_ptr, _partner.i64_ptr
    _SIG = _partner.ITEMS_SIGNATURE
    _PIX = _dwb.PIXELS
    _WIN = _dwb.WINDOW_PIXELS
    _post_jobs = _nchwc.post_jobs
    _window_at = _dwb.window_at

    # ------------------------------------------------- depthwise and pools
    # params: x, wt, bias, y, toffs, cnt (address, size each), ep, mode, CB,
    # h, w, oh, ow, sh, sw, pt, pl, hp, wp, m, window kind, kh, dh, band rows,
    # then the direct reads': tap tables at width w and of the patch
    # (address, size each), kw, dw, interior output rows [oy_lo, oy_hi) and
    # columns [ox_lo, ox_hi), whether to read the interior in place
    _DW_N = 41

    @njit(nogil=True, cache=True, inline="always")
    def _taps(mode, xs, off, step, npix, toffs, wt, wo, bias, bo, cnt, yb, at, alpha, lo,
              hi):  # pragma: no cover - compiled
        """``npix`` (at most :data:`._dw_blocked.PIXELS`) output pixels of one
        block by the tap loop from ``xs[off]`` (pixels ``step`` apart), stored
        at ``yb``'s pixel ``at``: ``mode`` 0 the depthwise conv with its
        epilogue, 1 MaxPool, 2 AveragePool (``cnt``: the divisors)."""
        kk = toffs.size
        if mode == 0:
            _dwb.pixels(xs, off, step, npix, toffs, kk, wt, wo, bias, bo, yb, 0, 0, LANES, yb, 0,
                        alpha, lo, hi, yb, at)
        elif mode == 1:
            # one max a tap; pixels with a lane at -inf (maybe an all-NaN window) again exactly
            if _dwb.max_pixels_fast(xs, off, step, npix, toffs, kk, cnt, yb, at):
                _dwb.max_pixels(xs, off, step, npix, toffs, kk, cnt, yb, at)
        else:
            _dwb.avg_pixels(xs, off, step, npix, toffs, kk, cnt, yb, at)

    @njit(nogil=True, cache=True)
    def _band_rows(src, xs, wt, bias, yb, toffs, cnt, mode, cb, h, w, ow, sh, sw, pt, pl, wp,
                   win, kh, dh, band, fill, oy_a, oy_b, alpha, lo,
                   hi):  # pragma: no cover - compiled
        """Output rows ``[oy_a, oy_b)`` of one block, in bands of ``band``
        rows: the band's input rows copied into the padded scratch ``xs``
        (``fill`` in the pads; kept in cache), then its output rows."""
        kk = toffs.size
        wrow = wp * LANES
        row = w * LANES
        for oy0 in range(oy_a, oy_b, band):
            oy1 = min(oy_b, oy0 + band)
            iy0 = oy0 * sh - pt
            nrows = (oy1 - oy0 - 1) * sh + (kh - 1) * dh + 1
            for r in range(nrows):
                iy = iy0 + r
                rb = r * wrow
                if 0 <= iy < h:
                    xs[rb:rb + pl * LANES] = fill
                    _copy(xs, rb + pl * LANES, src, iy * row, row)
                    xs[rb + pl * LANES + row:rb + wrow] = fill
                else:
                    xs[rb:rb + wrow] = fill
            if win:
                _window_rows(xs, wt, bias, yb, cb * kk * LANES, cb * LANES, oy0, oy1, ow, sh,
                             wrow, win, alpha, lo, hi)
            else:
                for oy in range(oy0, oy1):
                    xrow = (oy - oy0) * sh * wrow
                    for ox in range(0, ow, _PIX):
                        _taps(mode, xs, xrow + ox * sw * LANES, sw * LANES, min(_PIX, ow - ox),
                              toffs, wt, cb * kk * LANES, bias, cb * LANES, cnt, yb,
                              oy * ow + ox, alpha, lo, hi)

    @njit(nogil=True, cache=True)
    def _direct_rows(src, avail, patch, wt, bias, yb, td, tp, cnt, mode, cb, h, w, ow, sh, sw,
                     pt, pl, win, kh, kw, dh, dw, fill, oy_a, oy_b, ox_lo, ox_hi, alpha, lo,
                     hi):  # pragma: no cover - compiled
        """Output rows ``[oy_a, oy_b)`` of one block whose windows lie inside
        the input's rows: columns ``[ox_lo, ox_hi)`` (windows inside the
        columns too) read the block in place (``win``: the unrolled windows,
        a short last one where the columns it reads past the row stay inside
        the input, ``avail`` floats from ``src``'s start; else, and for the
        pools, the tap loop on table ``td``, row stride ``w``, which reads no
        pixel past ``npix``); the border columns each from a ``(kh - 1) * dh
        + 1`` x ``(kw - 1) * dw + 1`` patch of the input (:func:`_patch_pixel`)."""
        kk = td.size
        row = w * LANES
        ph = (kh - 1) * dh + 1
        pw = (kw - 1) * dw + 1
        wo, bo = cb * kk * LANES, cb * LANES
        # floats a window reads from its first input vector on (``avail``: floats
        # of the input from ``src``'s start)
        reach = (kh - 1) * dh * row + ((_WIN - 1) * sw + (kw - 1) * dw + 1) * LANES
        for oy in range(oy_a, oy_b):
            iy = oy * sh - pt
            xrow = iy * row
            ox = ox_lo
            if win:
                while ox < ox_hi:
                    npix = min(_WIN, ox_hi - ox)
                    xo = xrow + (ox * sw - pl) * LANES
                    # a short window reads its 8 pixels' columns (past the row: the next
                    # rows, inside the input); else the tap loop takes the tail
                    if npix < _WIN and xo + reach > avail:
                        break
                    _window_at(src, xo, row, win, npix, wt, wo, bias, bo, alpha, lo, hi, yb,
                               oy * ow + ox)
                    ox += npix
            while ox < ox_hi:
                npix = min(_PIX, ox_hi - ox)
                _taps(mode, src, xrow + (ox * sw - pl) * LANES, sw * LANES, npix, td, wt, wo,
                      bias, bo, cnt, yb, oy * ow + ox, alpha, lo, hi)
                ox += npix
            for ox in range(0, ox_lo):
                _patch_pixel(src, patch, tp, wt, wo, bias, bo, cnt, yb, mode, row, w, iy,
                             ox * sw - pl, ph, pw, fill, oy * ow + ox, alpha, lo, hi)
            for ox in range(ox_hi, ow):
                _patch_pixel(src, patch, tp, wt, wo, bias, bo, cnt, yb, mode, row, w, iy,
                             ox * sw - pl, ph, pw, fill, oy * ow + ox, alpha, lo, hi)

    @njit(nogil=True, cache=True, inline="always")
    def _patch_pixel(src, patch, tp, wt, wo, bias, bo, cnt, yb, mode, row, w, iy, ix, ph, pw,
                     fill, at, alpha, lo, hi):  # pragma: no cover - compiled
        """One border output pixel (``yb``'s pixel ``at``) from its window's
        ``ph x pw`` patch of the input rows ``iy ..`` and columns ``ix ..``,
        ``fill`` for the columns outside ``[0, w)`` (tap table ``tp``)."""
        for r in range(ph):
            for q in range(pw):
                o = (r * pw + q) * LANES
                jx = ix + q
                if 0 <= jx < w:
                    s0 = (iy + r) * row + jx * LANES
                    for j in range(LANES):
                        patch[o + j] = src[s0 + j]
                else:
                    for j in range(LANES):
                        patch[o + j] = fill
        _taps(mode, patch, 0, 0, 1, tp, wt, wo, bias, bo, cnt, yb, at, alpha, lo, hi)

    @njit(nogil=True, cache=True)
    def _dw_range(x, wt, bias, y, toffs, cnt, ep, mode, cbn, h, w, oh, ow, sh, sw, pt, pl,
                  hp, wp, m, win, kh, dh, band, td, tp, kw, dw, oy_lo, oy_hi, ox_lo, ox_hi,
                  direct, start, stop):  # pragma: no cover - compiled
        """Blocks ``[start, stop)`` (over every image's): a depthwise conv
        with its epilogue (``mode`` 0), MaxPool (1, padding ``-inf``) or
        AveragePool (2, ``cnt``: each output pixel's divisor). With
        ``direct`` the output rows ``[oy_lo, oy_hi)`` read the block in
        place (:func:`_direct_rows`) and only the rows above and below go
        through bands of a padded scratch (:func:`_band_rows`); else every
        row does. ``win`` (mode 0) the unrolled window of
        :func:`._dw_blocked.window_kind`, 0 the tap loop."""
        fill = -np.inf if mode == 1 else 0.0
        brows = (band - 1) * sh + (kh - 1) * dh + 1
        wrow = wp * LANES
        # every row of a band is written before it is read; the slack past the
        # last row (the windows' pixels past a row's end read on) is set once
        xs = np.empty(brows * wrow + (_WIN * 2 + 5) * LANES, np.float32)
        xs[brows * wrow:] = fill
        patch = np.empty(tp.size * LANES + ((kh - 1) * dh + 1) * ((kw - 1) * dw + 1) * LANES,
                         np.float32)
        ohw = oh * ow
        row = w * LANES
        for t in range(start, stop):
            cb = t % cbn
            src = x[t * h * row:(t + 1) * h * row]
            yo = t * ohw
            yb = y[yo * LANES:(yo + ohw) * LANES]
            if direct:
                _band_rows(src, xs, wt, bias, yb, toffs, cnt, mode, cb, h, w, ow, sh, sw, pt,
                           pl, wp, win, kh, dh, band, fill, 0, oy_lo, ep[0], ep[1], ep[2])
                _direct_rows(src, x.size - t * h * row, patch, wt, bias, yb, td, tp, cnt, mode,
                             cb, h, w, ow, sh, sw,
                             pt, pl, win, kh, kw, dh, dw, fill, oy_lo, oy_hi, ox_lo, ox_hi,
                             ep[0], ep[1], ep[2])
                _band_rows(src, xs, wt, bias, yb, toffs, cnt, mode, cb, h, w, ow, sh, sw, pt,
                           pl, wp, win, kh, dh, band, fill, oy_hi, oh, ep[0], ep[1], ep[2])
            else:
                _band_rows(src, xs, wt, bias, yb, toffs, cnt, mode, cb, h, w, ow, sh, sw, pt,
                           pl, wp, win, kh, dh, band, fill, 0, oh, ep[0], ep[1], ep[2])
            nvalid = m - cb * LANES
            if mode == 0 and nvalid < LANES:  # the padded lanes' epilogue of 0
                for i in range(ohw):
                    y[(yo + i) * LANES + nvalid:(yo + i + 1) * LANES] = 0.0

    @njit(nogil=True, cache=True)
    def _window_rows(xs, wt, bias, yb, wo, bo, oy0, oy1, ow, s, row, win, alpha, lo,
                     hi):  # pragma: no cover - compiled
        """Output rows ``[oy0, oy1)`` of one block (the scratch's band from
        ``oy0``) by the unrolled window ``win``."""
        for oy in range(oy0, oy1):
            xrow = (oy - oy0) * s * row
            for ox in range(0, ow, _WIN):
                _window_at(xs, xrow + ox * s * LANES, row, win, min(_WIN, ow - ox), wt, wo,
                           bias, bo, alpha, lo, hi, yb, oy * ow + ox)

    @njit(nogil=True, cache=True)
    def _dw_block(p, i0, i1):  # pragma: no cover - compiled
        """:func:`_dw_range` on the operands of parameter block ``p``."""
        _dw_range(carray(_f32p(p[0]), (p[1],)), carray(_f32p(p[2]), (p[3],)),
                  carray(_f32p(p[4]), (p[5],)), carray(_f32p(p[6]), (p[7],)),
                  carray(_i64p(p[8]), (p[9],)), carray(_f32p(p[10]), (p[11],)),
                  carray(_f32p(p[12]), (3,)), p[13], p[14], p[15], p[16], p[17], p[18],
                  p[19], p[20], p[21], p[22], p[23], p[24], p[25], p[26], p[27], p[28], p[29],
                  carray(_i64p(p[30]), (p[31],)), carray(_i64p(p[32]), (p[33],)), p[34], p[35],
                  p[36], p[37], p[38], p[39], p[40], i0, i1)

    @cfunc(_SIG, nogil=True, cache=True)
    def _dw_items(params, i0, i1):  # pragma: no cover - compiled
        _dw_block(carray(_i64p(params), (_DW_N,)), i0, i1)

    _DW = _dw_items.address

    @njit(nogil=True, cache=True)
    def _dw_fill(p, ep, x, bias, y, alpha, lo, hi):  # pragma: no cover - compiled
        p[0], p[1], p[4], p[5] = x.ctypes.data, x.size, bias.ctypes.data, bias.size
        p[6], p[7] = y.ctypes.data, y.size
        ep[0], ep[1], ep[2] = alpha, lo, hi

    @njit(nogil=True, cache=True)
    def _dw_one_thread(p, ep, x, bias, y, alpha, lo, hi, items):  # pragma: no cover
        _dw_fill(p, ep, x, bias, y, alpha, lo, hi)
        _dw_block(p, 0, items)

    @njit(nogil=True, cache=True)
    def _dw_post(ctrl, jobs, linger, p, ep, x, bias, y, alpha, lo, hi):  # pragma: no cover
        """:func:`_dw_fill`, then :func:`_post_jobs`."""
        _dw_fill(p, ep, x, bias, y, alpha, lo, hi)
        _post_jobs(ctrl, p, jobs, linger)


def _addr(a: np.ndarray) -> int:
    return a.ctypes.data


class DepthwiseCall:
    """A depthwise conv (``mode`` 0), MaxPool (1) or AveragePool (2) on
    blocked ``(N, CB, H, W, 16)`` input of ``c`` channels, for one input
    shape: :meth:`__call__` gives the blocked ``(N, CB, OH, OW, 16)``.

    Args:
        x_shape: the blocked input's shape.
        c: channels.
        wt: :func:`._dw_blocked.pack`'s weights (``mode`` 0; else unused).
        kernel, strides, dilations, pads_begin, out: the geometry (pairs).
        mode: 0, 1 or 2.
        counts: AveragePool's divisor factors per output row and column.
        threads: intra-op threads.
    """

    def __init__(self, x_shape, c: int, wt, kernel, strides, dilations, pads_begin, out,
                 mode: int, counts, threads: int):
        n, cbn, h, w, _ = x_shape
        kh, kw = kernel
        sh, sw = strides
        dh, dw = dilations
        pt, pl = pads_begin
        oh, ow = out
        hp, wp = _dwb.padded_extent(h, w, kernel, strides, dilations, pads_begin, out)
        toffs = _dwb.tap_offsets(kh, kw, dh, dw, wp)
        if mode == 2:
            cnt = np.ascontiguousarray(np.multiply.outer(
                np.asarray(counts[0], np.float32), np.asarray(counts[1], np.float32)).reshape(-1))
        else:
            cnt = np.ones(1, np.float32)
        wt = np.zeros(LANES, np.float32) if wt is None else wt
        self.x_shape = tuple(x_shape)
        self.y_shape = (n, cbn, oh, ow, LANES)
        self.items = n * cbn
        work = n * c * oh * ow * kh * kw
        if work < (_conv_split.MIN_DEPTHWISE_WORK if mode == 0 else _conv_split.MIN_POOL_WORK):
            threads = 1  # a hand-off to the partners costs more than it saves
        self.threads = threads
        self._keep = (wt, toffs, cnt)
        p = np.zeros(_DW_N, np.int64)
        p[2], p[3] = _addr(wt), wt.size
        p[8], p[9], p[10], p[11] = _addr(toffs), toffs.size, _addr(cnt), cnt.size
        win = 0
        if WINDOWS and mode == 0:
            win = _dwb.window_kind(kernel, strides, dilations)
        band = max(1, BAND_BYTES // (sh * wp * LANES * 4))
        p[13:30] = (mode, cbn, h, w, oh, ow, sh, sw, pt, pl, hp, wp, c, win, kh, dh, band)
        # the output rows / columns whose windows lie inside the input: read in place
        kw, dw = kernel[1], dilations[1]
        oy_lo = min(oh, -(-pt // sh))
        oy_hi = max(oy_lo, min(oh, (h - 1 + pt - (kh - 1) * dh) // sh + 1))
        ox_lo = min(ow, -(-pl // sw))
        ox_hi = max(ox_lo, min(ow, (w - 1 + pl - (kw - 1) * dw) // sw + 1))
        # strided pools, and strided depthwise convs on wide rows; a stride-1 row
        # with padded columns reads the band scratch as fast (measured)
        direct = DIRECT and (mode != 0 or ow >= DIRECT_DEPTHWISE_COLUMNS) and \
            oy_hi > oy_lo and ox_hi - ox_lo >= max(_dwb.PIXELS, ow // 2) and \
            (sw > 1 or (ox_lo == 0 and ox_hi == ow))
        td = _dwb.tap_offsets(kh, kw, dh, dw, w)
        tp = _dwb.tap_offsets(kh, kw, dh, dw, (kw - 1) * dw + 1)
        self._keep += (td, tp)
        p[30], p[31], p[32], p[33] = _addr(td), td.size, _addr(tp), tp.size
        p[34:41] = (kw, dw, oy_lo, oy_hi, ox_lo, ox_hi, int(direct))
        self.params = p
        self.jobs = job_rows((_DW, self.items), threads=threads)
        self._free: list = []  # (parameter block, epilogue floats) not in use

    def __call__(self, x: np.ndarray, bias: np.ndarray | None, alpha=1.0, lo=-np.inf,
                 hi=np.inf) -> np.ndarray:
        """``x`` float32 C-contiguous of :attr:`x_shape`, ``bias`` the padded
        ``(CB * 16,)`` float32 (mode 0)."""
        y = np.empty(self.y_shape, np.float32)
        try:
            p, ep = self._free.pop()
        except IndexError:
            p, ep = self.params.copy(), np.zeros(3, np.float32)
            p[12] = _addr(ep)
        b = ep if bias is None else bias
        a, l_, h_ = np.float32(alpha), np.float32(lo), np.float32(hi)
        team = call_team(self.threads, self.items)
        if team is None:
            _dw_one_thread(p, ep, x, b, y, a, l_, h_, self.items)
        else:
            _dw_post(team.ctrl, self.jobs, _conv_split.LINGER_CYCLES, p, ep, x, b, y, a, l_, h_)
            team.ensure_awake()
        self._free.append((p, ep))
        return y
