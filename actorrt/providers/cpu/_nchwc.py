"""Compiled kernels of the NCHWc layout ops (:mod:`.nchwc`): channel-blocked
tensors kept between nodes.

A blocked tensor of logical shape ``(N, C, H, W)`` is float32 ``(N,
ceil(C/16), H, W, 16)``: channel ``c`` at ``[:, c // 16, :, :, c % 16]``,
the lanes past ``C`` zero (onnxruntime's NCHWc with 16-channel blocks, the
AVX-512 arrangement). :mod:`._conv_blocked` and :mod:`._dw_blocked` form
that arrangement from NCHW input for every call and transpose their results
back; inside a chain of such nodes this module's variants read and write
the blocks directly, so only the chain's ends are transposed.

* :func:`to_blocks` / :func:`from_blocks` -- NCHW <-> blocked (the 16 x 16
  in-register transposes of :mod:`._dw_blocked`).
* :class:`ConvCall` -- a one-group convolution, blocked (or, for a stem of
  few channels, NCHW planes) in, blocked out: the input blocks copied into
  a zero-padded scratch where the convolution pads (read in place where it
  does not), the tiles of :mod:`._conv_blocked` storing into the output's
  blocks with the epilogue (bias, residual, activation, lanes past the
  output channels zero) in their last reduction block's store.
* depthwise convolutions and pools: :mod:`._nchwc_window`.
* :func:`channel_affine` -- ``act(x * a[c] + t[c])`` (BatchNormalization
  folded to a per-channel affine, with its activation), blocked in and out.
* :func:`global_mean` -- GlobalAveragePool, blocked in, ``(N, C)`` out.

Every call runs its items on the compiled partners of :mod:`._partner` at
more than one thread, else on the caller; an item's result does not depend
on the thread that runs it. A call fills its parameter block and posts its
jobs in one compiled dispatch (:func:`post_jobs`, with :func:`job_rows` and
:func:`call_team`: also :mod:`._nchwc_window`'s).
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _conv_blocked as _cb
from . import _conv_split
from . import _dw_blocked as _dwb
from . import _partner

__all__ = ["HAVE_KERNEL", "LANES", "MIN_SPLIT_VALUES", "blocked_shape", "to_blocks",
           "from_blocks", "ConvCall", "channel_affine", "global_mean", "call_team", "job_rows",
           "post_jobs"]

LANES = 16
#: convolutions of at least as many images as threads split from this many
#: flops (whole images a thread: each thread reads the images it wrote in the
#: node before; resnetish, 4 images, 0.95x the time at 2 threads against
#: :data:`._conv_split.MIN_CONV_FLOPS`, which one-image splits keep)
MIN_IMAGES_FLOPS = 1 << 18
#: a one-image convolution's tile items run output group by output group
#: (each thread's share of the weights mostly its own), not pixels first
GROUP_MAJOR = True
#: the tile items' chunks a thread (0: :data:`._conv_split.CHUNKS_PER_THREAD`;
#: 4096: every item claimed alone)
TILE_CHUNKS = 4096
#: reorders and affines of fewer values than this run on the calling thread
#: (the partners' hand-off costs more; convolutions and pools use
#: :mod:`._conv_split`'s thresholds)
MIN_SPLIT_VALUES = 1 << 17
#: numba, AVX-512 and the compiled partner hook
HAVE_KERNEL = bool(_cb.HAVE_KERNEL and _dwb.HAVE_KERNEL and _partner.AVAILABLE)


def blocked_shape(n: int, c: int, h: int, w: int) -> tuple[int, int, int, int, int]:
    """The blocked array shape of a logical ``(n, c, h, w)`` tensor."""
    return (n, -(-c // LANES), h, w, LANES)


if HAVE_KERNEL:
    from numba import carray, cfunc, njit

    from . import _conv_tiles as _ct

    _copy = _ct.copy_f32
    _f32p, _i64p = _partner.f32_ptr, _partner.i64_ptr
    _SIG = _partner.ITEMS_SIGNATURE
    _tile1, _tile2, _tile3, _tile4 = _cb.tile_ep1, _cb.tile_ep2, _cb.tile_ep3, _cb.tile_ep4
    _P1, _P2, _P3, _P4 = (_cb.TILE_PIXELS[b] for b in (1, 2, 3, 4))
    _KB = _cb.K_BLOCK_BYTES

    from llvmlite import ir as _ir
    from numba import types as _nbt
    from numba.extending import intrinsic as _intrinsic

    #: pixel vectors a call of :func:`_affine4`
    _AFF = 4

    @_intrinsic
    def _affine4(typingctx, x, x_off, y, a, t, c_off, alpha, lo, hi, count, nvalid):
        """Pixel vectors ``i < count`` (at most 4) from ``x[x_off + 16 i :
        +16]``: ``v = x * a[c_off : +16] + t[c_off : +16]``, ``where(v < 0,
        alpha * v, v)`` clamped to ``[lo, hi]``, lanes from ``nvalid`` 0,
        stored to ``y`` at the same offsets."""
        if any(getattr(v, "dtype", None) != _nbt.float32 for v in (x, y, a, t)) or \
                any(f != _nbt.float32 for f in (alpha, lo, hi)):
            return None

        def codegen(context, builder, sig, args):
            xa, ya, aa, ta = (context.make_array(sig.args[i])(context, builder, args[i]).data
                              for i in (0, 2, 3, 4))
            x_off, c_off, count, nvalid = (_ct.as_i64(builder, args[i]) for i in (1, 5, 9, 10))
            i64 = _ir.IntType(64)
            vf = _ir.VectorType(_ir.FloatType(), LANES)
            zero = _ir.Constant(vf, [0.0] * LANES)
            av = builder.load(_ct.vec_ptr(builder, aa, c_off, LANES), align=4)
            tv = builder.load(_ct.vec_ptr(builder, ta, c_off, LANES), align=4)
            alv, lov, hiv = (_ct.splat(builder, v, LANES) for v in args[6:9])
            keep = builder.icmp_signed("<", _ir.Constant(_ir.VectorType(i64, LANES),
                                                         list(range(LANES))),
                                       _ct.splat(builder, nvalid, LANES))
            for i in range(_AFF):
                with builder.if_then(builder.icmp_signed("<", i64(i), count), likely=True):
                    at = builder.add(x_off, i64(i * LANES))
                    v = builder.load(_ct.vec_ptr(builder, xa, at, LANES), align=4)
                    v = builder.fadd(builder.fmul(v, av), tv)
                    v = builder.select(builder.fcmp_ordered("<", v, zero), builder.fmul(v, alv), v)
                    v = builder.select(builder.fcmp_ordered("<", v, lov), lov, v)
                    v = builder.select(builder.fcmp_ordered(">", v, hiv), hiv, v)
                    builder.store(builder.select(keep, v, zero),
                                  _ct.vec_ptr(builder, ya, at, LANES), align=4)
            return context.get_dummy_value()
        return (_nbt.void(x, x_off, y, a, t, c_off, alpha, lo, hi, count, nvalid), codegen)

    @njit(nogil=True, cache=True)
    def _affine_range(x, a, t, y, ep, hw, cbn, c, start, stop):  # pragma: no cover - compiled
        """Blocks ``[start, stop)`` (over every image's) of blocked ``x``:
        :func:`_affine4` on every pixel vector into ``y``."""
        alpha, lo, hi = ep[0], ep[1], ep[2]
        for blk in range(start, stop):
            b = blk % cbn
            base = blk * hw * LANES
            nv = min(LANES, c - b * LANES)
            for i in range(0, hw, _AFF):
                _affine4(x, base + i * LANES, y, a, t, b * LANES, alpha, lo, hi,
                         min(_AFF, hw - i), nv)

    # params: x, a, t, y (address, size each), ep, hw, CB, c
    _AFF_N = 12

    @cfunc(_SIG, nogil=True, cache=True)
    def _affine_items(params, i0, i1):  # pragma: no cover - compiled
        p = carray(_i64p(params), (_AFF_N,))
        _affine_range(carray(_f32p(p[0]), (p[1],)), carray(_f32p(p[2]), (p[3],)),
                      carray(_f32p(p[4]), (p[5],)), carray(_f32p(p[6]), (p[7],)),
                      carray(_f32p(p[8]), (3,)), p[9], p[10], p[11], i0, i1)

    _AFFINE = _affine_items.address

    @njit(nogil=True, cache=True)
    def _mean_range(x, y, hw, cbn, c, start, stop):  # pragma: no cover - compiled
        """Blocks ``[start, stop)`` (over every image's) of blocked ``x``: each
        lane's float32 sum over the ``hw`` pixels in order divided by ``hw``,
        into ``y`` (``(N, c)`` flat; lanes past ``c`` dropped)."""
        acc = np.empty(LANES, np.float32)
        div = np.float32(hw)
        for blk in range(start, stop):
            n, b = blk // cbn, blk % cbn
            base = blk * hw * LANES
            for j in range(LANES):
                acc[j] = 0.0
            for i in range(hw):
                o = base + i * LANES
                for j in range(LANES):
                    acc[j] += x[o + j]
            for j in range(min(LANES, c - b * LANES)):
                y[n * c + b * LANES + j] = acc[j] / div

    # params: x, y (address, size each), hw, CB, c
    _MEAN_N = 7

    @cfunc(_SIG, nogil=True, cache=True)
    def _mean_items(params, i0, i1):  # pragma: no cover - compiled
        p = carray(_i64p(params), (_MEAN_N,))
        _mean_range(carray(_f32p(p[0]), (p[1],)), carray(_f32p(p[2]), (p[3],)), p[4], p[5],
                    p[6], i0, i1)

    _MEAN = _mean_items.address

    # ------------------------------------------------------------ reorders
    # params: x, y (address, size each), c, hw, dst (address, size)
    _RE_N = 8

    @njit(nogil=True, cache=True)
    def _to_range(x, y, dst, c, hw, i0, i1):  # pragma: no cover - compiled
        """Items ``t = n * CB + b``: block ``b`` of image ``n`` of NCHW ``x``
        transposed into ``y``'s block ``t`` (lanes past ``c`` zero)."""
        cbn = (c + LANES - 1) // LANES
        for t in range(i0, i1):
            n, b = t // cbn, t % cbn
            sub = y[t * hw * LANES:(t + 1) * hw * LANES]
            for p0 in range(0, hw, LANES):
                _dwb.planes_in(x, (n * c + b * LANES) * hw, hw, min(LANES, c - b * LANES), p0,
                               sub, dst, min(LANES, hw - p0))

    @njit(nogil=True, cache=True)
    def _from_range(x, y, c, hw, i0, i1):  # pragma: no cover - compiled
        """Items ``t = n * CB + b``: blocked ``x``'s block ``t`` transposed into
        the ``c``-channel NCHW ``y`` (lanes past ``c`` dropped)."""
        cbn = (c + LANES - 1) // LANES
        for t in range(i0, i1):
            n, b = t // cbn, t % cbn
            sub = x[t * hw * LANES:(t + 1) * hw * LANES]
            for p0 in range(0, hw, LANES):
                _dwb.planes_out(sub, p0, y, (n * c + b * LANES) * hw, hw,
                                min(LANES, c - b * LANES), min(LANES, hw - p0))

    @cfunc(_SIG, nogil=True, cache=True)
    def _to_items(params, i0, i1):  # pragma: no cover - compiled
        p = carray(_i64p(params), (_RE_N,))
        _to_range(carray(_f32p(p[0]), (p[1],)), carray(_f32p(p[2]), (p[3],)),
                  carray(_i64p(p[6]), (p[7],)), p[4], p[5], i0, i1)

    @cfunc(_SIG, nogil=True, cache=True)
    def _from_items(params, i0, i1):  # pragma: no cover - compiled
        p = carray(_i64p(params), (_RE_N,))
        _from_range(carray(_f32p(p[0]), (p[1],)), carray(_f32p(p[2]), (p[3],)), p[4], p[5],
                    i0, i1)

    _TO, _FROM = _to_items.address, _from_items.address

    # -------------------------------------------------------- convolution
    # params: x, xs, wt (address, size each), groups (address, rows), toffs,
    # pix, bias, z (address, size each), has_z, y (address, size), ep
    # (address of 3 float32: alpha, lo, hi), ocb, m, ohw, chunk, nchunks,
    # xs floats an image, h, w, pt, pl, hp, wp, input items an image,
    # planes, dst (address, size), geo (address), c, input items an image,
    # whether there is an input phase
    _CONV_N = 41

    @njit(nogil=True, cache=True)
    def _pad_range(x, xs, h, w, pt, pl, hp, wp, start, stop):  # pragma: no cover - compiled
        """Blocks ``[start, stop)`` (over every image's) of blocked ``x``
        into the zero-padded ``(HP, WP, 16)`` blocks of ``xs``."""
        row = w * LANES
        blk = hp * wp * LANES
        for t in range(start, stop):
            src = x[t * h * row:(t + 1) * h * row]
            sub = xs[t * blk:(t + 1) * blk]
            sub[:pt * wp * LANES] = 0.0
            for iy in range(h):
                r = (iy + pt) * wp * LANES
                sub[r:r + pl * LANES] = 0.0
                _copy(sub, r + pl * LANES, src, iy * row, row)
                sub[r + pl * LANES + row:r + wp * LANES] = 0.0
            sub[(pt + h) * wp * LANES:] = 0.0

    @njit(nogil=True, cache=True)
    def _tiles_range(xs, wt, groups, toffs, pix, bias, z, has_z, y, ep, ocb, m, ohw, chunk,
                     nchunks, xs_img, group_major, start, stop):  # pragma: no cover - compiled
        """Items ``[start, stop)``, item ``(n * nchunks + q) * G + g``: output
        group ``g`` (``groups`` row: first block, blocks, weight offset) on
        pixels ``[q * chunk, (q + 1) * chunk)`` of image ``n``: the tiles
        into ``y``'s blocks, the epilogue (bias, ``z``, activation, lanes past
        ``m`` zero) on the last reduction block's stores."""
        kk = toffs.size
        ohw16 = ohw * LANES
        ng = groups.shape[0]
        alpha, lo, hi = ep[0], ep[1], ep[2]
        for it in range(start, stop):
            if group_major:  # item (n * G + g) * nchunks + q
                q0 = (it % nchunks) * chunk
                r = it // nchunks
                g = r % ng
                n = r // ng
            else:
                g = it % ng
                r = it // ng
                q0 = (r % nchunks) * chunk
                n = r // nchunks
            q1 = min(ohw, q0 + chunk)
            b0 = groups[g, 0]
            nb = groups[g, 1]
            wo = groups[g, 2]
            xsn = xs[n * xs_img:(n + 1) * xs_img]
            oo = (n * ocb + b0) * ohw16
            kb = max(LANES, _KB // (nb * LANES * 4) // LANES * LANES)
            bo = b0 * LANES
            nv = m - bo
            for k0 in range(0, kk, kb):
                k1 = min(kk, k0 + kb)
                last = 1 if k1 == kk else 0
                if nb == 4:
                    for p0 in range(q0, q1, _P4):
                        _tile4(xsn, pix, p0, min(_P4, q1 - p0), toffs, k0, wt, wo, y, oo, ohw16,
                               k1, bias, bo, z, has_z, alpha, lo, hi, nv, last)
                elif nb == 3:
                    for p0 in range(q0, q1, _P3):
                        _tile3(xsn, pix, p0, min(_P3, q1 - p0), toffs, k0, wt, wo, y, oo, ohw16,
                               k1, bias, bo, z, has_z, alpha, lo, hi, nv, last)
                elif nb == 2:
                    for p0 in range(q0, q1, _P2):
                        _tile2(xsn, pix, p0, min(_P2, q1 - p0), toffs, k0, wt, wo, y, oo, ohw16,
                               k1, bias, bo, z, has_z, alpha, lo, hi, nv, last)
                else:
                    for p0 in range(q0, q1, _P1):
                        _tile1(xsn, pix, p0, min(_P1, q1 - p0), toffs, k0, wt, wo, y, oo, ohw16,
                               k1, bias, bo, z, has_z, alpha, lo, hi, nv, last)

    @njit(nogil=True, cache=True)
    def _conv_in(p, i0, i1):  # pragma: no cover - compiled
        """The input phase's items: padded block copies (blocked input) or
        channel planes (NCHW input: :func:`._conv_blocked.in_range`)."""
        x = carray(_f32p(p[0]), (p[1],))
        xs = carray(_f32p(p[2]), (p[3],))
        if p[33] == 0:
            _pad_range(x, xs, p[26], p[27], p[28], p[29], p[30], p[31], i0, i1)
            return
        dst = carray(_i64p(p[34]), (p[35],))
        geo = carray(_i64p(p[36]), (8,))
        c, img = p[37], p[25]
        hw = p[26] * p[27]
        for t in range(i0, i1):
            n = t // c
            _cb.in_range(x, xs[n * img:(n + 1) * img], dst, c, hw, geo, n, t % c, t % c + 1)

    @njit(nogil=True, cache=True)
    def _conv_tiles(p, i0, i1):  # pragma: no cover - compiled
        xs = carray(_f32p(p[2]), (p[3],))
        wt = carray(_f32p(p[4]), (p[5],))
        groups = carray(_i64p(p[6]), (p[7], 3))
        toffs = carray(_i64p(p[8]), (p[9],))
        pix = carray(_i64p(p[10]), (p[11],))
        bias = carray(_f32p(p[12]), (p[13],))
        z = carray(_f32p(p[14]), (p[15],))
        y = carray(_f32p(p[17]), (p[18],))
        ep = carray(_f32p(p[19]), (3,))
        _tiles_range(xs, wt, groups, toffs, pix, bias, z, p[16], y, ep, p[20], p[21], p[22],
                     p[23], p[24], p[25], p[40], i0, i1)

    @cfunc(_SIG, nogil=True, cache=True)
    def _conv_in_items(params, i0, i1):  # pragma: no cover - compiled
        _conv_in(carray(_i64p(params), (_CONV_N,)), i0, i1)

    @cfunc(_SIG, nogil=True, cache=True)
    def _conv_tile_items(params, i0, i1):  # pragma: no cover - compiled
        _conv_tiles(carray(_i64p(params), (_CONV_N,)), i0, i1)

    @cfunc(_SIG, nogil=True, cache=True)
    def _conv_image_items(params, i0, i1):  # pragma: no cover - compiled
        """Whole images ``[i0, i1)``: an image's input items, then its tiles
        (one thread an image: its scratch and output blocks are its own)."""
        p = carray(_i64p(params), (_CONV_N,))
        per = p[38]
        tiles = p[24] * p[7]
        for n in range(i0, i1):
            if p[39]:
                _conv_in(p, n * per, (n + 1) * per)
            _conv_tiles(p, n * tiles, (n + 1) * tiles)

    _CONV_IN, _CONV_TILES = _conv_in_items.address, _conv_tile_items.address
    _CONV_IMAGES = _conv_image_items.address

    @njit(nogil=True, cache=True)
    def _conv_fill(p, ep, x, bias, z, has_z, y, alpha, lo, hi):  # pragma: no cover
        """A call's slots of the parameter block (``x`` read in place when
        there is no input phase)."""
        p[0], p[1] = x.ctypes.data, x.size
        if p[39] == 0:
            p[2], p[3] = p[0], p[1]
        p[12], p[13] = bias.ctypes.data, bias.size
        p[14], p[15], p[16] = z.ctypes.data, z.size, has_z
        p[17], p[18] = y.ctypes.data, y.size
        ep[0], ep[1], ep[2] = alpha, lo, hi

    @njit(nogil=True, cache=True)
    def _conv_one_thread(p, ep, x, bias, z, has_z, y, alpha, lo, hi, n):  # pragma: no cover
        """:func:`_conv_fill`, then every image on the calling thread."""
        _conv_fill(p, ep, x, bias, z, has_z, y, alpha, lo, hi)
        per = p[38]
        tiles = p[24] * p[7]
        for i in range(n):
            if p[39]:
                _conv_in(p, i * per, (i + 1) * per)
            _conv_tiles(p, i * tiles, (i + 1) * tiles)

    # ------------------------------------------------------------- posting
    _post = _partner.post_items

    @njit(nogil=True, cache=True)
    def post_jobs(ctrl, p, jobs, linger):  # pragma: no cover - compiled
        """Post parameter block ``p``'s jobs in order to the team of control
        block ``ctrl`` (:func:`._partner.post_items`; each job's items done on
        return): ``jobs`` rows (kernel address, items, chunks) of
        :func:`job_rows`. Compiled callers fill ``p`` first, in the same
        dispatch; the Python caller then calls ``team.ensure_awake()``."""
        addr = p.ctypes.data
        for j in range(jobs.shape[0]):
            _post(ctrl, jobs[j, 0], addr, jobs[j, 1], jobs[j, 2], linger)

    @njit(nogil=True, cache=True)
    def _conv_post(ctrl, jobs, linger, p, ep, x, bias, z, has_z, y, alpha, lo,
                   hi):  # pragma: no cover - compiled
        """:func:`_conv_fill`, then :func:`post_jobs` (one dispatch a call)."""
        _conv_fill(p, ep, x, bias, z, has_z, y, alpha, lo, hi)
        post_jobs(ctrl, p, jobs, linger)

    @njit(nogil=True, cache=True)
    def _reorder_post(ctrl, jobs, linger, x, y, dst, c, hw):  # pragma: no cover - compiled
        """A reorder's block (``x``, ``y``, ``c``, ``hw``, ``dst``), posted."""
        p = np.empty(_RE_N, np.int64)
        p[0], p[1], p[2], p[3] = x.ctypes.data, x.size, y.ctypes.data, y.size
        p[4], p[5], p[6], p[7] = c, hw, dst.ctypes.data, dst.size
        post_jobs(ctrl, p, jobs, linger)

    @njit(nogil=True, cache=True)
    def _mean_post(ctrl, jobs, linger, x, y, hw, cbn, c):  # pragma: no cover - compiled
        """A global mean's block, posted."""
        p = np.empty(_MEAN_N, np.int64)
        p[0], p[1], p[2], p[3] = x.ctypes.data, x.size, y.ctypes.data, y.size
        p[4], p[5], p[6] = hw, cbn, c
        post_jobs(ctrl, p, jobs, linger)

    @njit(nogil=True, cache=True)
    def _affine_post(ctrl, jobs, linger, x, a, t, y, ep, hw, cbn, c):  # pragma: no cover
        """An affine's block, posted."""
        p = np.empty(_AFF_N, np.int64)
        p[0], p[1], p[2], p[3] = x.ctypes.data, x.size, a.ctypes.data, a.size
        p[4], p[5], p[6], p[7] = t.ctypes.data, t.size, y.ctypes.data, y.size
        p[8], p[9], p[10], p[11] = ep.ctypes.data, hw, cbn, c
        post_jobs(ctrl, p, jobs, linger)


def _addr(a: np.ndarray) -> int:
    return a.ctypes.data


def job_rows(*jobs, threads: int, per_thread: int = 0) -> np.ndarray:
    """:func:`post_jobs`' rows for ``(kernel address, items)`` pairs: each
    cut into ``per_thread`` ranges a thread (0:
    :data:`._conv_split.CHUNKS_PER_THREAD`), at most its items and 4096."""
    per = per_thread or _conv_split.CHUNKS_PER_THREAD
    return np.array([(fn, items, max(1, min(items, per * threads, 4096)))
                     for fn, items in jobs if items > 0], np.int64).reshape(-1, 3)


def call_team(threads: int, items: int):
    """The partner team a call of ``items`` items at ``threads`` threads
    posts to, or None (run it on the caller)."""
    return _conv_split.team_for(threads) if threads > 1 and items > 1 else None


_IDENTITY: dict[int, np.ndarray] = {}


def _identity(hw: int) -> np.ndarray:
    """``arange(hw) * 16``: pixel ``i``'s place in a block (read-only, kept)."""
    t = _IDENTITY.get(hw)
    if t is None:
        if len(_IDENTITY) > 256:
            _IDENTITY.clear()
        t = _IDENTITY[hw] = np.arange(hw, dtype=np.int64) * LANES
        t.flags.writeable = False
    return t


def to_blocks(x: np.ndarray, threads: int = 1) -> np.ndarray:
    """NCHW float32 ``x (N, C, H, W)`` (``H * W >= 16``) -> blocked ``(N,
    ceil(C/16), H, W, 16)`` (lanes past ``C`` zero).

    Raises:
        ValueError: not 4-D, or planes under 16 pixels."""
    if x.ndim != 4 or x.shape[2] * x.shape[3] < LANES:
        raise ValueError(f"to_blocks takes (N, C, H, W) with H * W >= {LANES}, got {x.shape}")
    n, c, h, w = x.shape
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    y = np.empty(blocked_shape(n, c, h, w), np.float32)
    dst = _identity(h * w)
    items = n * y.shape[1]
    if threads <= 1 or items < 2 or y.size < MIN_SPLIT_VALUES:
        _to_range(xf, y.reshape(-1), dst, c, h * w, 0, items)
        return y
    team = call_team(threads, items)
    if team is None:
        _to_range(xf, y.reshape(-1), dst, c, h * w, 0, items)
        return y
    _reorder_post(team.ctrl, job_rows((_TO, items), threads=threads), _conv_split.LINGER_CYCLES,
                  xf, y.reshape(-1), dst, c, h * w)
    team.ensure_awake()
    return y


def from_blocks(x: np.ndarray, c: int, threads: int = 1) -> np.ndarray:
    """Blocked float32 ``x (N, CB, H, W, 16)`` -> NCHW ``(N, c, H, W)`` (``c``
    at most ``CB * 16``, ``H * W >= 16``).

    Raises:
        ValueError: not a blocked array of at least ``c`` channels."""
    if x.ndim != 5 or x.shape[4] != LANES or x.shape[1] != -(-c // LANES) or c < 1 \
            or x.shape[2] * x.shape[3] < LANES:
        raise ValueError(f"from_blocks takes (N, ceil({c}/16), H, W, 16) with H * W >= "
                         f"{LANES}, got {x.shape}")
    n, cbn, h, w, _ = x.shape
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    y = np.empty((n, c, h, w), np.float32)
    if threads <= 1 or n * cbn < 2 or x.size < MIN_SPLIT_VALUES:
        _from_range(xf, y.reshape(-1), c, h * w, 0, n * cbn)
        return y
    team = call_team(threads, n * cbn)
    if team is None:
        _from_range(xf, y.reshape(-1), c, h * w, 0, n * cbn)
        return y
    _reorder_post(team.ctrl, job_rows((_FROM, n * cbn), threads=threads),
                  _conv_split.LINGER_CYCLES, xf, y.reshape(-1), _identity(LANES), c, h * w)
    team.ensure_awake()
    return y


class ConvCall:
    """One convolution node's shape work for one input shape, done once
    (packed weights, offset tables, scratch sizes, the parameter block);
    :meth:`__call__` runs it.

    Args:
        x_shape: the input array's shape: blocked ``(N, CB, H, W, 16)``, or
            with ``planes`` NCHW ``(N, C, H, W)``.
        c: the input's channels (``C``).
        wt, groups: :func:`._conv_blocked.pack`'s (``planes`` as here).
        m: output channels.
        kernel, strides, dilations, pads_begin: the geometry (pairs).
        out: ``(OH, OW)``.
        planes: the input is NCHW channel planes (a stem of few channels).
        threads: intra-op threads.
    """

    def __init__(self, x_shape, c: int, wt: np.ndarray, groups: np.ndarray, m: int, kernel,
                 strides, dilations, pads_begin, out, planes: bool, threads: int):
        n = x_shape[0]
        h, w = (x_shape[2], x_shape[3])
        oh, ow = out
        if h * w < LANES or oh * ow < LANES:
            raise ValueError(f"NCHWc convolution takes planes of at least {LANES} pixels, got "
                             f"{(h, w)} -> {tuple(out)}")
        toffs, pix, dst, geo = _cb.geometry(c, h, w, *kernel, *strides, *dilations,
                                            *pads_begin, oh, ow, bool(planes))
        hp, wp = int(geo[4]), int(geo[5])
        pt, pl = pads_begin
        self.ocb = ocb = -(-m // LANES)
        self.y_shape = (n, ocb, oh, ow, LANES)
        self.x_shape = tuple(x_shape)
        ohw = oh * ow
        ng = groups.shape[0]
        self.in_place = not planes and pt == 0 and pl == 0 and hp == h and wp == w
        icb = -(-c // LANES)
        if self.in_place:
            img = icb * h * w * LANES
            self.xs_size = 0
        else:
            img = (c if planes else icb) * hp * wp * (1 if planes else LANES)
            self.xs_size = n * img
        per = c if planes else icb
        self.in_items = n * per
        flops = 2 * n * m * ohw * c * kernel[0] * kernel[1]
        if flops < (MIN_IMAGES_FLOPS if n >= threads else _conv_split.MIN_CONV_FLOPS):
            threads = 1  # a hand-off to the partners costs more than it saves
        # whole images a thread where there are enough (one post, nothing
        # shared); else the input items, then (pixels, group) items of all
        self.images = threads <= 1 or n >= threads
        chunk = min(_cb.IMAGE_CHUNK if self.images else
                    _cb.chunk_pixels(ohw, ng * n, threads), -(-ohw // LANES) * LANES)
        nchunks = -(-ohw // chunk)
        if not self.images:  # chunks of even size (the tiles' 6 / 8 pixels whole), not a
            # short last one: 196 pixels in 72 + 72 + 52, not 96 + 96 + 4
            chunk = min(chunk, -(-(-(-ohw // nchunks)) // 24) * 24)
            nchunks = -(-ohw // chunk)
        self.tile_items = n * nchunks * ng
        self.n = n
        self.threads = threads
        self._keep = (wt, groups, toffs, pix, dst, geo)
        p = np.zeros(_CONV_N, np.int64)
        p[4], p[5], p[6], p[7] = _addr(wt), wt.size, _addr(groups), ng
        p[8], p[9], p[10], p[11] = _addr(toffs), toffs.size, _addr(pix), pix.size
        p[20:33] = (ocb, m, ohw, chunk, nchunks, img, h, w, pt, pl, hp, wp,
                    c if planes else icb)
        p[33] = int(bool(planes))
        p[34], p[35], p[36], p[37] = _addr(dst), dst.size, _addr(geo), c
        p[38], p[39] = per, int(self.xs_size > 0)
        p[40] = int(GROUP_MAJOR)
        self.params = p
        if self.images:
            self.jobs = job_rows((_CONV_IMAGES, n), threads=threads, per_thread=1)
        else:
            self.jobs = job_rows((_CONV_IN, self.in_items if self.xs_size else 0),
                              threads=threads)
            self.jobs = np.concatenate([self.jobs, job_rows((_CONV_TILES, self.tile_items),
                                                            threads=threads,
                                                            per_thread=TILE_CHUNKS)])
        # parameter blocks (with their epilogue floats and input scratch) of
        # the calls not running now: concurrent runs of a session each take one
        self._free: list = []

    def _block(self):
        try:
            return self._free.pop()
        except IndexError:
            p = self.params.copy()
            ep = np.zeros(3, np.float32)
            p[19] = _addr(ep)
            xs = np.empty(self.xs_size, np.float32) if self.xs_size else None
            if xs is not None:
                p[2], p[3] = _addr(xs), xs.size
            return p, ep, xs

    def __call__(self, x: np.ndarray, bias: np.ndarray, z: np.ndarray | None, alpha, lo,
                 hi) -> np.ndarray:
        """``x`` float32 C-contiguous of :attr:`x_shape`; ``bias`` the padded
        ``(OCB * 16,)`` float32; ``z`` None or blocked float32 of
        :attr:`y_shape` (C-contiguous); the epilogue's floats. A new blocked
        ``y``."""
        y = np.empty(self.y_shape, np.float32)
        has_z = z is not None
        if not has_z:
            z = y
        blk = self._block()
        p, ep = blk[0], blk[1]
        team = call_team(self.threads, 2)
        if team is None:
            _conv_one_thread(p, ep, x, bias, z, has_z, y, alpha, lo, hi, self.n)
        else:
            _conv_post(team.ctrl, self.jobs, _conv_split.LINGER_CYCLES, p, ep, x, bias, z,
                       has_z, y, alpha, lo, hi)
            team.ensure_awake()
        self._free.append(blk)
        return y


def channel_affine(x: np.ndarray, a: np.ndarray, t: np.ndarray, c: int, alpha, lo, hi,
                   threads: int = 1) -> np.ndarray:
    """``act(x * a[c] + t[c])`` on blocked float32 ``x (N, CB, H, W, 16)`` of
    ``c`` channels, ``a`` / ``t`` padded ``(CB * 16,)`` float32, the
    epilogue ``min(max(where(v < 0, alpha*v, v), lo), hi)``: a new blocked
    array, lanes past ``c`` zero."""
    n, cbn, h, w, _ = x.shape
    y = np.empty(x.shape, np.float32)
    ep = np.array([alpha, lo, hi], np.float32)
    items = n * cbn
    if threads <= 1 or items < 2 or x.size < MIN_SPLIT_VALUES:
        _affine_range(x.reshape(-1), a, t, y.reshape(-1), ep, h * w, cbn, c, 0, items)
        return y
    team = call_team(threads, items)
    if team is None:
        _affine_range(x.reshape(-1), a, t, y.reshape(-1), ep, h * w, cbn, c, 0, items)
        return y
    _affine_post(team.ctrl, job_rows((_AFFINE, items), threads=threads), _conv_split.LINGER_CYCLES,
                 x.reshape(-1), a, t, y.reshape(-1), ep, h * w, cbn, c)
    team.ensure_awake()
    return y


def global_mean(x: np.ndarray, c: int, threads: int = 1) -> np.ndarray:
    """GlobalAveragePool of blocked float32 ``x (N, CB, H, W, 16)`` of ``c``
    channels: float32 ``(N, c)``, each channel's float32 sum over its plane
    in pixel order divided by ``H * W``: GlobalAveragePool without a
    reorder to NCHW first.

    Raises:
        ValueError: not a blocked array of ``c`` channels."""
    if x.ndim != 5 or x.shape[4] != LANES or x.shape[1] != -(-c // LANES) or c < 1:
        raise ValueError(f"global_mean takes (N, ceil({c}/16), H, W, 16), got {x.shape}")
    n, cbn, h, w, _ = x.shape
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    y = np.empty((n, c), np.float32)
    items = n * cbn
    team = call_team(threads, items) if x.size >= MIN_SPLIT_VALUES else None
    if team is None:
        _mean_range(xf, y.reshape(-1), h * w, cbn, c, 0, items)
        return y
    _mean_post(team.ctrl, job_rows((_MEAN, items), threads=threads),
               _conv_split.LINGER_CYCLES, xf, y.reshape(-1), h * w, cbn, c)
    team.ensure_awake()
    return y

