"""The float32 direct convolution, depthwise convolution and direct MaxPool
work items split over the compiled partner threads (:mod:`._partner`).

:func:`._parallel.run_chunks` hands a kernel's item ranges to its helper
threads through Python closures: a thread wake-up and GIL hand-offs per
node, and on the 2-core machine the second thread often came late, so the
CNNs' two-thread times barely beat their one-thread times. Here each kernel
has a ``numba.cfunc`` of the C signature ``void(int64 params, int64 i0, int64
i1)`` that runs items ``i0 .. i1 - 1`` reading its operands from an int64
parameter block (array addresses, sizes, ints; floats in a float32 block),
posted with :func:`._partner.run_items`: the caller and its partners claim
chunks from one atomic word, no Python between them. After every job the
partners *linger* (:data:`LINGER_CYCLES`: they keep spinning instead of
parking) because the next convolution / pooling node comes soon.

* :func:`conv_rows` -- :func:`._conv_direct.run`'s work items
  (``_conv_direct._rows`` over item ranges);
* :func:`phase_copy` -- the direct convolution's padded phase-split input
  copy, planes as items (:func:`._conv_vec.phase_copy_rows`);
* :func:`depthwise` -- :func:`._conv_numba.depthwise2d`'s planes (float32);
* :func:`conv_blocked_images` / :func:`conv_blocked_phases` -- :mod:`._conv_blocked`'s
  whole images, or per image its input blocks then (output group, pixels) items;
* :func:`maxpool` -- the direct MaxPool's planes (copy and tiles of a plane
  in one item);
* :func:`row_pool` -- :mod:`._pool_rows`' planes (MaxPool / AveragePool);
* :func:`row_depthwise` -- :mod:`._dw_rows`' planes.

Each returns False (nothing done) where the partners do not apply
(:func:`team_for`: :data:`ENABLED` off, :data:`._partner.AVAILABLE` false,
one intra-op thread); the callers then keep their :mod:`._parallel` /
one-thread paths. A split result equals the one-thread result bit for bit
(every item is computed the same way whichever thread runs it).

Parameter blocks (:data:`SPLIT_BLOCKS`): a plan's constant slots (the plan's
ints, its offset and phase tables) are written once into a template block
kept on the plan (``Plan.blocks``); a call takes a copy of it from the plan's
free list and a compiled ``_fill_*`` helper writes the per-call array
addresses and sizes into it (no numpy array built from a Python list, no
``ndarray.ctypes`` per operand), then hands the copy back. Depthwise blocks
carry no constants and come from one module free list. Off, every call builds
its blocks with ``np.array`` as before (the A/B baseline).
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _conv_direct as _cd
from . import _partner

__all__ = ["ENABLED", "SPLIT_BLOCKS", "HAVE_SPLIT", "LINGER_CYCLES", "CHUNKS_PER_THREAD", "MIN_CONV_FLOPS",
           "MIN_DEPTHWISE_WORK", "MIN_POOL_WORK", "splits", "team_for",
           "conv_rows", "phase_copy", "depthwise", "maxpool", "row_pool", "row_depthwise"]

#: post the convolution / pooling items to the partner threads (tests switch
#: it off to check the :mod:`._parallel` fallback)
ENABLED = True
#: reuse per-plan template parameter blocks, filled by compiled helpers (off:
#: build each call's blocks with ``np.array``, the A/B baseline)
SPLIT_BLOCKS = True
#: cycle-counter ticks (2.6 GHz here: ~1 ms) the partners keep spinning after a
#: convolution / pooling job before they may park
LINGER_CYCLES = 2_600_000
#: chunks per thread a job is cut into: the caller and partners claim them one
#: at a time, so a partner that starts late still takes a share
CHUNKS_PER_THREAD = 4

#: the partners take a direct convolution from this many flops, a depthwise
#: one from this many output elements x taps and a MaxPool from this many:
#: below the chunk loop's start (:data:`._conv_direct.PARALLEL_MIN_FLOPS` 8M,
#: :data:`._conv_numba.PARALLEL_MIN_WORK`, :data:`._pool_direct.PARALLEL_MIN_WORK`).
#: Before the template blocks, 2M / 128K / 64K made resnetish 1.42x slower
#: (idle, round 9). With them (docs/speed.md round 10; interleaved A/B of
#: ``benchmarks/ab_split_thresholds.py``, 40 rounds, on the 2-core machine
#: shared with another engineer's benchmarks): 4M / 256K / 128K gave new/old
#: resnetish 0.83 and 0.99, mobilenetish 0.86; 1M / 128K / 64K gave resnetish
#: 0.99-1.07 in three runs, mobilenetish 0.96-1.00: the middle ones stay. A
#: split 3x3 conv of 0.3-14M flops still lost to one thread on the loaded
#: machine (1.06-1.42x): lower them only where an idle machine shows it paying
MIN_CONV_FLOPS = 1 << 22
MIN_DEPTHWISE_WORK = 1 << 18
MIN_POOL_WORK = 1 << 17

HAVE_SPLIT = bool(_partner.AVAILABLE and _cd.HAVE_KERNEL)

if HAVE_SPLIT:
    from numba import carray, cfunc

    from . import _conv_numba as _cn
    from . import _conv_vec as _cv
    from . import _pool_direct as _pd

    _f32p, _i64p = _partner.f32_ptr, _partner.i64_ptr
    _SIG = _partner.ITEMS_SIGNATURE

    # direct conv block: xs, offs, wp, y, bias, z (address, size each), has_z,
    # floats (lo, hi, alpha), then the plan's 15 ints
    _CONV_N = 29

    @cfunc(_SIG, nogil=True, cache=True)
    def _conv_items(params, i0, i1):  # pragma: no cover - compiled
        p = carray(_i64p(params), (_CONV_N,))
        xs = carray(_f32p(p[0]), (p[1],))
        offs = carray(_i64p(p[2]), (p[3],))
        wp = carray(_f32p(p[4]), (p[5],))
        y = carray(_f32p(p[6]), (p[7],))
        bias = carray(_f32p(p[8]), (p[9],))
        z = carray(_f32p(p[10]), (p[11],))
        f = carray(_f32p(p[13]), (3,))
        _cd.rows_range(xs, offs, wp, y, bias, z, p[12], f[0], f[1], f[2], p[14], p[15], p[16],
                  p[17], p[18], p[19], p[20], p[21], p[22], p[23], p[24], p[25], p[26], p[27],
                  p[28], i0, i1)

    # phase copy block: x, buf (address, size), table (address, rows), c, h,
    # w, nphase, hi, wj, sw
    _COPY_N = 13

    @cfunc(_SIG, nogil=True, cache=True)
    def _copy_items(params, i0, i1):  # pragma: no cover - compiled
        p = carray(_i64p(params), (_COPY_N,))
        xf = carray(_f32p(p[0]), (p[1],))
        buf = carray(_f32p(p[2]), (p[3],))
        table = carray(_i64p(p[4]), (p[5], 8))
        _cv.phase_copy_rows(xf, buf, table, p[6], p[7], p[8], p[9], p[10], p[11], p[12], i0, i1)

    # MaxPool block: the copy block's 13, then offs (address, size), y
    # (address, size), ntaps, x_plane, oh, ow
    _POOL_N = 21

    @cfunc(_SIG, nogil=True, cache=True)
    def _pool_items(params, i0, i1):  # pragma: no cover - compiled
        p = carray(_i64p(params), (_POOL_N,))
        xf = carray(_f32p(p[0]), (p[1],))
        buf = carray(_f32p(p[2]), (p[3],))
        table = carray(_i64p(p[4]), (p[5], 8))
        offs = carray(_i64p(p[13]), (p[14],))
        y = carray(_f32p(p[15]), (p[16],))
        _cv.phase_copy_rows(xf, buf, table, p[6], p[7], p[8], p[9], p[10], p[11], p[12], i0, i1)
        oh = p[19]
        _pd.rows_range(buf, offs, y, p[17], p[18], oh, p[20], p[11], i0 * oh, i1 * oh)

    # depthwise block: x, w, z, y (address + 4 dims each), bias (address, size),
    # ep (address: alpha, lo, hi), sh, sw, dh, dw, pt, pl, has_z, tile
    _DW_N = 31

    @cfunc(_SIG, nogil=True, cache=True)
    def _dw_items(params, i0, i1):  # pragma: no cover - compiled
        p = carray(_i64p(params), (_DW_N,))
        x = carray(_f32p(p[0]), (p[1], p[2], p[3], p[4]))
        w = carray(_f32p(p[5]), (p[6], p[7], p[8], p[9]))
        z = carray(_f32p(p[10]), (p[11], p[12], p[13], p[14]))
        y = carray(_f32p(p[15]), (p[16], p[17], p[18], p[19]))
        bias = carray(_f32p(p[20]), (p[21],))
        ep = carray(_f32p(p[22]), (3,))
        _cn.depthwise_planes(x, w, bias, z, y, p[23], p[24], p[25], p[26], p[27], p[28], ep,
                              p[29] != 0, p[30] != 0, i0, i1)

    CONV_ITEMS, COPY_ITEMS = _conv_items.address, _copy_items.address
    POOL_ITEMS, DW_ITEMS = _pool_items.address, _dw_items.address

    from . import _dw_blocked as _dwb

    # channel-blocked depthwise / pool block: x, wt, bias, z, y, toffs, cnt
    # (address, size each), has_z, ep (address: alpha, lo, hi), then mode, c,
    # h, w, oh, ow, sh, sw, pt, pl, hp, wp, window kind
    _DWB_N = 29
    DWB_ITEMS = 0
    if _dwb.HAVE_KERNEL:
        @cfunc(_SIG, nogil=True, cache=True)
        def _dwb_items(params, i0, i1):  # pragma: no cover - compiled
            p = carray(_i64p(params), (_DWB_N,))
            x = carray(_f32p(p[0]), (p[1],))
            wt = carray(_f32p(p[2]), (p[3],))
            bias = carray(_f32p(p[4]), (p[5],))
            z = carray(_f32p(p[6]), (p[7],))
            y = carray(_f32p(p[8]), (p[9],))
            toffs = carray(_i64p(p[10]), (p[11],))
            cnt = carray(_f32p(p[12]), (p[13],))
            ep = carray(_f32p(p[15]), (3,))
            _dwb.blocks_range(x, wt, bias, z, p[14], y, toffs, cnt, p[16], p[17], p[18], p[19],
                              p[20], p[21], p[22], p[23], p[24], p[25], p[26], p[27], p[28],
                              ep[0], ep[1], ep[2], i0, i1)

        DWB_ITEMS = _dwb_items.address

    from . import _conv_blocked as _cb

    # channel-blocked conv block: x, wt, bias, z, y, toffs, pix, dst, xs, os
    # (address, size each), groups (address, rows), ep (address: alpha, lo,
    # hi), then has_z, c, hw, m, ohw, geo (address: h, w, pt, pl, hp, wp, lanes,
    # items), n, chunk, nchunks
    _CB_N = 32
    CB_IMAGES = CB_IN = CB_TILES = 0
    if _cb.HAVE_KERNEL:
        @cfunc(_SIG, nogil=True, cache=True)
        def _cb_images(params, i0, i1):  # pragma: no cover - compiled
            p = carray(_i64p(params), (_CB_N,))
            ep = carray(_f32p(p[22]), (3,))
            _cb.images(carray(_f32p(p[0]), (p[1],)), carray(_f32p(p[2]), (p[3],)),
                       carray(_f32p(p[4]), (p[5],)), carray(_f32p(p[6]), (p[7],)), p[23],
                       carray(_f32p(p[8]), (p[9],)), carray(_i64p(p[10]), (p[11],)),
                       carray(_i64p(p[12]), (p[13],)), carray(_i64p(p[14]), (p[15],)),
                       carray(_i64p(p[20]), (p[21], 3)), p[24], p[25], p[26], p[27],
                       carray(_i64p(p[28]), (8,)), ep[0], ep[1], ep[2], i0, i1)

        @cfunc(_SIG, nogil=True, cache=True)
        def _cb_in(params, i0, i1):  # pragma: no cover - compiled
            p = carray(_i64p(params), (_CB_N,))
            _cb.in_range(carray(_f32p(p[0]), (p[1],)), carray(_f32p(p[16]), (p[17],)),
                         carray(_i64p(p[14]), (p[15],)), p[24], p[25],
                         carray(_i64p(p[28]), (8,)), p[29], i0, i1)

        @cfunc(_SIG, nogil=True, cache=True)
        def _cb_tiles(params, i0, i1):  # pragma: no cover - compiled
            p = carray(_i64p(params), (_CB_N,))
            ep = carray(_f32p(p[22]), (3,))
            _cb.tiles_range(carray(_f32p(p[16]), (p[17],)), carray(_f32p(p[2]), (p[3],)),
                            carray(_f32p(p[4]), (p[5],)), carray(_f32p(p[6]), (p[7],)), p[23],
                            carray(_f32p(p[8]), (p[9],)), carray(_i64p(p[10]), (p[11],)),
                            carray(_i64p(p[12]), (p[13],)), carray(_i64p(p[20]), (p[21], 3)),
                            p[26], p[27], carray(_f32p(p[18]), (p[19],)), ep[0], ep[1], ep[2],
                            p[29], p[30], p[31], i0, i1)

        CB_IMAGES, CB_IN, CB_TILES = _cb_images.address, _cb_in.address, _cb_tiles.address

    from . import _pool_rows as _pr

    # row pooling block: x, y, inv (address, size each), then the plan's 12
    # ints (h, w, oh, ow, kh, kw, sh, sw, pt, pl, vlen, is_max)
    _ROWPOOL_N = 18
    ROWPOOL_ITEMS = 0
    if _pr.HAVE_KERNEL:
        @cfunc(_SIG, nogil=True, cache=True)
        def _rowpool_items(params, i0, i1):  # pragma: no cover - compiled
            p = carray(_i64p(params), (_ROWPOOL_N,))
            _pr.planes_range(carray(_f32p(p[0]), (p[1],)), carray(_f32p(p[2]), (p[3],)),
                             carray(_f32p(p[4]), (p[5],)), p[6], p[7], p[8], p[9], p[10],
                             p[11], p[12], p[13], p[14], p[15], p[16], p[17] != 0, i0, i1)

        ROWPOOL_ITEMS = _rowpool_items.address

    from . import _dw_rows as _dr

    # row depthwise block: x, w, bias, z, y (address, size each), has_z, ep
    # (address: alpha, lo, hi), then the plan's 13 ints
    _ROWDW_N = 25
    ROWDW_ITEMS = 0
    if _dr.HAVE_KERNEL:
        @cfunc(_SIG, nogil=True, cache=True)
        def _rowdw_items(params, i0, i1):  # pragma: no cover - compiled
            p = carray(_i64p(params), (_ROWDW_N,))
            f = carray(_f32p(p[11]), (3,))
            _dr.planes_range(carray(_f32p(p[0]), (p[1],)), carray(_f32p(p[2]), (p[3],)),
                             carray(_f32p(p[4]), (p[5],)), carray(_f32p(p[6]), (p[7],)), p[10],
                             carray(_f32p(p[8]), (p[9],)), p[12], p[13], p[14], p[15], p[16],
                             p[17], p[18], p[19], p[20], p[21], p[22], p[23], p[24], f[0], f[1],
                             f[2], i0, i1)

        ROWDW_ITEMS = _rowdw_items.address

    from numba import njit

    @njit(nogil=True, cache=True)
    def _fill_rowdw(p, xf, wf, bias, zf, yf, ep):  # pragma: no cover
        p[0] = xf.ctypes.data
        p[1] = xf.size
        p[2] = wf.ctypes.data
        p[3] = wf.size
        p[4] = bias.ctypes.data
        p[5] = bias.size
        p[6] = zf.ctypes.data
        p[7] = zf.size
        p[8] = yf.ctypes.data
        p[9] = yf.size
        p[11] = ep.ctypes.data

    @njit(nogil=True, cache=True)
    def _fill_rowpool(p, xf, yf):  # pragma: no cover
        p[0] = xf.ctypes.data
        p[1] = xf.size
        p[2] = yf.ctypes.data
        p[3] = yf.size

    # the per-call slots of a template block (its constants are already in)
    @njit(nogil=True, cache=True)
    def _fill_conv(p, f, buf, wp, y, bias, z, has_z, lo, hi, alpha):  # pragma: no cover
        p[0] = buf.ctypes.data
        p[1] = buf.size
        p[4] = wp.ctypes.data
        p[5] = wp.size
        p[6] = y.ctypes.data
        p[7] = y.size
        p[8] = bias.ctypes.data
        p[9] = bias.size
        p[10] = z.ctypes.data
        p[11] = z.size
        p[12] = has_z
        f[0] = lo
        f[1] = hi
        f[2] = alpha

    @njit(nogil=True, cache=True)
    def _fill_cb(p, xf, wt, bias, zf, yf, toffs, pix, dst, xs, os_, groups, ep,
                 geo):  # pragma: no cover
        """The array slots of a channel-blocked conv block."""
        p[0], p[1] = xf.ctypes.data, xf.size
        p[2], p[3] = wt.ctypes.data, wt.size
        p[4], p[5] = bias.ctypes.data, bias.size
        p[6], p[7] = zf.ctypes.data, zf.size
        p[8], p[9] = yf.ctypes.data, yf.size
        p[10], p[11] = toffs.ctypes.data, toffs.size
        p[12], p[13] = pix.ctypes.data, pix.size
        p[14], p[15] = dst.ctypes.data, dst.size
        p[16], p[17] = xs.ctypes.data, xs.size
        p[18], p[19] = os_.ctypes.data, os_.size
        p[20], p[21] = groups.ctypes.data, groups.shape[0]
        p[22] = ep.ctypes.data
        p[28] = geo.ctypes.data

    @njit(nogil=True, cache=True)
    def _fill_cb_call(p, f, xf, bias, zf, has_z, yf, xs, os_, alpha, lo,
                      hi):  # pragma: no cover
        """The per-call slots of a kept channel-blocked conv block (the
        input, the bias, the residual, the output, the scratch; the epilogue
        in ``f``)."""
        p[0], p[1] = xf.ctypes.data, xf.size
        p[4], p[5] = bias.ctypes.data, bias.size
        p[6], p[7] = zf.ctypes.data, zf.size
        p[8], p[9] = yf.ctypes.data, yf.size
        p[16], p[17] = xs.ctypes.data, xs.size
        p[18], p[19] = os_.ctypes.data, os_.size
        p[23] = has_z
        f[0], f[1], f[2] = alpha, lo, hi

    @njit(nogil=True, cache=True)
    def _fill_dwb(p, x, wt, bias, z, y, toffs, cnt, ep):  # pragma: no cover
        """The array slots of a :mod:`._dw_blocked` block; its address."""
        p[0], p[1] = x.ctypes.data, x.size
        p[2], p[3] = wt.ctypes.data, wt.size
        p[4], p[5] = bias.ctypes.data, bias.size
        p[6], p[7] = z.ctypes.data, z.size
        p[8], p[9] = y.ctypes.data, y.size
        p[10], p[11] = toffs.ctypes.data, toffs.size
        p[12], p[13] = cnt.ctypes.data, cnt.size
        p[15] = ep.ctypes.data
        return p.ctypes.data

    @njit(nogil=True, cache=True)
    def _address(a):  # pragma: no cover - compiled
        """``a``'s data address (one compiled call: ``ndarray.ctypes`` from
        Python costs ~0.8 us)."""
        return a.ctypes.data

    @njit(nogil=True, cache=True)
    def _fill_copy(p, xf, buf, h, w):  # pragma: no cover
        p[0] = xf.ctypes.data
        p[1] = xf.size
        p[2] = buf.ctypes.data
        p[3] = buf.size
        p[7] = h
        p[8] = w

    @njit(nogil=True, cache=True)
    def _fill_pool(p, xf, buf, y, h, w):  # pragma: no cover
        p[0] = xf.ctypes.data
        p[1] = xf.size
        p[2] = buf.ctypes.data
        p[3] = buf.size
        p[7] = h
        p[8] = w
        p[15] = y.ctypes.data
        p[16] = y.size

    @njit(nogil=True, cache=True)
    def _fill_dw(p, x, w, z, y, bias, ep, sh, sw, dh, dw, pt, pl, has_z, tile):  # pragma: no cover
        p[0] = x.ctypes.data
        p[5] = w.ctypes.data
        p[10] = z.ctypes.data
        p[15] = y.ctypes.data
        for i in range(4):
            p[1 + i] = x.shape[i]
            p[6 + i] = w.shape[i]
            p[11 + i] = z.shape[i]
            p[16 + i] = y.shape[i]
        p[20] = bias.ctypes.data
        p[21] = bias.size
        p[22] = ep.ctypes.data
        p[23] = sh
        p[24] = sw
        p[25] = dh
        p[26] = dw
        p[27] = pt
        p[28] = pl
        p[29] = has_z
        p[30] = tile


class _Block:
    """One parameter block: the int64 slots ``p`` (a copy of a template), a
    float32 area ``f`` (the conv block's ``lo, hi, alpha``; its address goes
    to slot ``f_slot`` when given) and ``p``'s address."""

    __slots__ = ("p", "f", "addr")

    def __init__(self, template: np.ndarray, f_slot: int | None = None):
        self.p = template.copy()
        self.f = np.zeros(3, np.float32)
        if f_slot is not None:
            self.p[f_slot] = self.f.ctypes.data
        self.addr = self.p.ctypes.data


def _take(plan, kind: str, make, f_slot: int | None = None) -> _Block:
    """A free block of ``kind`` from ``plan.blocks`` (kind -> (template, free
    list); the int64 template ``make()`` builds once per plan and kind).
    Hand it back with :func:`_give`; list pop / append keep concurrent calls
    on one plan apart (each takes its own block)."""
    blocks = plan.blocks
    if blocks is None:
        blocks = plan.blocks = {}
    entry = blocks.get(kind)
    if entry is None:
        entry = blocks[kind] = (make(), [])
    try:
        return entry[1].pop()
    except IndexError:
        return _Block(entry[0], f_slot)


def _give(plan, kind: str, blk: _Block) -> None:
    plan.blocks[kind][1].append(blk)


_DW_FREE: list = []


def splits(threads: int) -> bool:
    """Whether work at ``threads`` intra-op threads goes to the partners
    (:data:`ENABLED`, compiled partners and kernels, ``threads`` >= 2)."""
    return ENABLED and HAVE_SPLIT and threads >= 2


def team_for(threads: int):
    """The calling thread's partner team for ``threads`` intra-op threads, or
    None where the split does not apply (:data:`ENABLED` off, no compiled
    partners or kernels, ``threads`` < 2)."""
    return _partner.team(threads) if splits(threads) else None


def _run(team, fn: int, params: np.ndarray, items: int, threads: int) -> None:
    _run_addr(team, fn, _address(params), items, threads)


def _run_addr(team, fn: int, addr: int, items: int, threads: int) -> None:
    _partner.run_items(team, fn, addr, items,
                       max(1, min(items, CHUNKS_PER_THREAD * threads, 4096)), LINGER_CYCLES)


def _conv_template(plan) -> np.ndarray:
    """The conv block's constants: offs (address, size) and the plan's ints."""
    p = np.zeros(_CONV_N, np.int64)
    p[2], p[3] = _addr(plan.offs), plan.offs.size
    p[14:] = plan.ints
    return p


def _copy_template(plan, n: int = None) -> np.ndarray:
    """The phase copy block's constants (table, c, nphase, hi, wj, sw), in a
    block of ``n`` slots (the copy block's 13 by default)."""
    _, c, nphase, hi, wj = plan.xs_shape
    table = plan.table
    p = np.zeros(n or _COPY_N, np.int64)
    p[4], p[5], p[6] = _addr(table), table.shape[0], c
    p[9:13] = nphase, hi, wj, plan.key[4][1]
    return p


def _pool_template(plan) -> np.ndarray:
    """The MaxPool block's constants: the copy block's, offs, ntaps, the
    phase-split plane size, OH, OW."""
    p = _copy_template(plan, _POOL_N)
    offs = plan.offs
    p[13], p[14] = _addr(offs), offs.size
    p[17], p[18] = offs.size, int(np.prod(plan.xs_shape[2:]))
    p[19], p[20] = plan.y_shape[2], plan.y_shape[3]
    return p


def _addr(a: np.ndarray) -> int:
    return a.ctypes.data


def conv_rows(plan, buf: np.ndarray, offs: np.ndarray, wp: np.ndarray, y: np.ndarray,
              bias: np.ndarray, z: np.ndarray, has_z: int, lo, hi, alpha, threads: int) -> bool:
    """Work items ``0 .. plan.items - 1`` of :func:`._conv_direct.run` (its
    ``_rows`` arguments: flat C-contiguous float32 ``buf``, ``wp``, ``y``,
    ``bias``, ``z``; int64 ``offs``; the plan's ints) on the caller and its
    partners. False (nothing done) where :func:`team_for` gives no team."""
    team = team_for(threads)
    if team is None:
        return False
    if SPLIT_BLOCKS:
        blk = _take(plan, "conv", lambda: _conv_template(plan), 13)
        _fill_conv(blk.p, blk.f, buf, wp, y, bias, z, has_z, lo, hi, alpha)
        _run_addr(team, CONV_ITEMS, blk.addr, plan.items, threads)
        _give(plan, "conv", blk)
        return True
    fl = np.array([lo, hi, alpha], np.float32)
    params = np.array([_addr(buf), buf.size, _addr(offs), offs.size, _addr(wp), wp.size,
                       _addr(y), y.size, _addr(bias), bias.size, _addr(z), z.size, has_z,
                       _addr(fl), *plan.ints], np.int64)
    _run(team, CONV_ITEMS, params, plan.items, threads)
    return True


def _copy_block(plan, xf: np.ndarray, buf: np.ndarray, h: int, w: int) -> list:
    n, c, nphase, hi, wj = plan.xs_shape
    table = plan.table
    return [_addr(xf), xf.size, _addr(buf), buf.size, _addr(table), table.shape[0], c, h, w,
            nphase, hi, wj, plan.key[4][1]]


def phase_copy(plan, x: np.ndarray, buf: np.ndarray, threads: int) -> bool:
    """:func:`._conv_direct.phase_copy` of ``x`` (float32, the plan's input
    shape) into ``buf`` (flat float32), input planes as items, on the caller
    and its partners. False (nothing done) without a team (:func:`team_for`)
    or with the compiled copy off."""
    if not _cd.COMPILED_COPY or x.ndim != 4:
        return False
    team = team_for(threads)
    if team is None:
        return False
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    items = plan.xs_shape[0] * plan.xs_shape[1]
    if SPLIT_BLOCKS:
        blk = _take(plan, "copy", lambda: _copy_template(plan))
        _fill_copy(blk.p, xf, buf, x.shape[2], x.shape[3])
        _run_addr(team, COPY_ITEMS, blk.addr, items, threads)
        _give(plan, "copy", blk)
        return True
    params = np.array(_copy_block(plan, xf, buf, x.shape[2], x.shape[3]), np.int64)
    _run(team, COPY_ITEMS, params, items, threads)
    return True


def maxpool(plan, x: np.ndarray, buf: np.ndarray, y: np.ndarray, threads: int) -> bool:
    """The direct MaxPool's copy and tiles (:func:`._pool_direct.maxpool2d`:
    ``x`` float32 of the plan's input shape, ``buf`` its ``-inf`` buffer, ``y``
    the ``(N, C, OH, OW)`` float32 output), planes as items, on the caller and
    its partners. False (nothing done) without a team (:func:`team_for`)."""
    team = team_for(threads)
    if team is None:
        return False
    n, c, oh, ow = plan.y_shape
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if SPLIT_BLOCKS:
        blk = _take(plan, "pool", lambda: _pool_template(plan))
        _fill_pool(blk.p, xf, buf, y, x.shape[2], x.shape[3])
        _run_addr(team, POOL_ITEMS, blk.addr, n * c, threads)
        _give(plan, "pool", blk)
        return True
    offs = plan.offs
    params = np.array(_copy_block(plan, xf, buf, x.shape[2], x.shape[3])
                      + [_addr(offs), offs.size, _addr(y), y.size, offs.size,
                         int(np.prod(plan.xs_shape[2:])), oh, ow], np.int64)
    _run(team, POOL_ITEMS, params, n * c, threads)
    return True


def row_pool(plan, xf: np.ndarray, yf: np.ndarray, planes: int, threads: int) -> bool:
    """:func:`._pool_rows.pool2d`'s planes (flat float32 ``xf`` of the plan's
    input, ``yf`` its output) on the caller and its partners. False (nothing
    done) without a team (:func:`team_for`) or the row kernel."""
    team = team_for(threads)
    if team is None or not ROWPOOL_ITEMS:
        return False

    def template():
        p = np.zeros(_ROWPOOL_N, np.int64)
        p[4], p[5] = _addr(plan.inv), plan.inv.size
        p[6:] = plan.ints
        return p

    blk = _take(plan, "rowpool", template)
    _fill_rowpool(blk.p, xf, yf)
    _run_addr(team, ROWPOOL_ITEMS, blk.addr, planes, threads)
    _give(plan, "rowpool", blk)
    return True


def row_depthwise(plan, args: tuple, planes: int, threads: int) -> bool:
    """:func:`._dw_rows.run`'s planes (``args``: its ``_planes`` arguments
    before the range) on the caller and its partners. False (nothing done)
    without a team (:func:`team_for`) or the row kernel."""
    team = team_for(threads)
    if team is None or not ROWDW_ITEMS:
        return False
    xf, wf, bias, zf, has_z, yf = args[:6]

    def template():
        p = np.zeros(_ROWDW_N, np.int64)
        p[12:] = plan.ints
        return p

    blk = _take(plan, "rowdw", template)
    blk.f[:] = args[-3:]
    blk.p[10] = has_z
    _fill_rowdw(blk.p, xf, wf, bias, zf, yf, blk.f)
    _run_addr(team, ROWDW_ITEMS, blk.addr, planes, threads)
    _give(plan, "rowdw", blk)
    return True


def depthwise(x: np.ndarray, w: np.ndarray, bias: np.ndarray, z: np.ndarray, y: np.ndarray,
              strides, dilations, pads_begin, ep: np.ndarray, has_z: bool, tile: bool,
              threads: int) -> bool:
    """:func:`._conv_numba.depthwise2d`'s planes (its ``_depthwise_serial``
    arguments: C-contiguous float32 ``x (N, C, H, W)``, ``w (M, 1, KH, KW)``,
    ``bias (M,)``, ``z`` (the output's shape, or a ``(1, 1, 1, 1)``
    placeholder), ``y (N, M, OH, OW)``, ``ep`` ``[alpha, lo, hi]``) as items
    on the caller and its partners. False (nothing done) for other dtypes or
    without a team (:func:`team_for`)."""
    if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in (x, w, bias, z, y, ep)):
        return False
    team = team_for(threads)
    if team is None:
        return False
    if SPLIT_BLOCKS:
        try:
            blk = _DW_FREE.pop()
        except IndexError:
            blk = _Block(np.zeros(_DW_N, np.int64))
        _fill_dw(blk.p, x, w, z, y, bias, ep, strides[0], strides[1], dilations[0],
                 dilations[1], pads_begin[0], pads_begin[1], int(has_z), int(tile))
        _run_addr(team, DW_ITEMS, blk.addr, y.shape[0] * y.shape[1], threads)
        _DW_FREE.append(blk)
        return True
    params = np.array([_addr(x), *x.shape, _addr(w), *w.shape, _addr(z), *z.shape,
                       _addr(y), *y.shape, _addr(bias), bias.size, _addr(ep),
                       strides[0], strides[1], dilations[0], dilations[1], pads_begin[0],
                       pads_begin[1], int(has_z), int(tile)], np.int64)
    _run(team, DW_ITEMS, params, y.shape[0] * y.shape[1], threads)
    return True


def depthwise_blocks(x, wt, bias, z, has_z: int, y, toffs, cnt, ints, ep: np.ndarray,
                     items: int, threads: int) -> bool:
    """:mod:`._dw_blocked`'s items ``0 .. items - 1`` (its ``_blocks``
    arguments: flat float32 ``x``, ``wt``, ``bias``, ``z``, ``y``, ``cnt``;
    int64 ``toffs``; ``ints`` ``(mode, c, h, w, oh, ow, sh, sw, pt, pl, hp,
    wp, win)``; ``ep`` ``[alpha, lo, hi]`` float32) on the caller and its
    partners. False (nothing done) without a team (:func:`team_for`) or the
    kernel."""
    team = team_for(threads)
    if team is None or not DWB_ITEMS:
        return False
    params = np.empty(_DWB_N, np.int64)
    params[14] = has_z
    params[16:] = ints
    _run_addr(team, DWB_ITEMS, _fill_dwb(params, x, wt, bias, z, y, toffs, cnt, ep), items,
              threads)
    return True


def _cb_params(args, xs, os_) -> tuple[np.ndarray, np.ndarray]:
    (xf, wt, bias, zf, has_z, yf, toffs, pix, dst, groups, c, hw, m, ohw, geo,
     alpha, lo, hi) = args
    ep = np.array([alpha, lo, hi], np.float32)
    p = np.empty(_CB_N, np.int64)
    _fill_cb(p, xf, wt, bias, zf, yf, toffs, pix, dst, xs, os_, groups, ep, geo)
    p[23:28] = has_z, c, hw, m, ohw
    return p, ep


def conv_blocked_images(team, args, n: int, threads: int, free: list | None = None) -> bool:
    """:mod:`._conv_blocked`'s whole images ``0 .. n - 1`` (``args``: its
    ``_images`` arguments before the range) on the caller and ``team``.
    ``free``: a list of parameter blocks kept by the caller for calls of
    these shapes, weights and tables (:data:`SPLIT_BLOCKS`: a block's
    constant slots are written once, a call writes the input, bias,
    residual, output and epilogue slots). False (nothing done) without the
    kernel."""
    if not CB_IMAGES:
        return False
    if free is None or not SPLIT_BLOCKS:
        p, ep = _cb_params(args, args[0], args[0])
        _run(team, CB_IMAGES, p, n, threads)
        return True
    blk = _cb_block(free, args, args[0], args[0])
    _run_addr(team, CB_IMAGES, blk.addr, n, threads)
    free.append(blk)
    return True


def _cb_block(free: list, args, xs, os_) -> _Block:
    """A kept channel-blocked conv block from ``free`` (or a new one: every
    slot), its per-call slots written for ``args`` and the scratch ``xs``,
    ``os_`` (the input itself in the whole-image split: scratch of its own)."""
    try:
        blk = free.pop()
    except IndexError:
        blk = _Block(_cb_params(args, xs, os_)[0], 22)
    _fill_cb_call(blk.p, blk.f, args[0], args[2], args[3], args[4], args[5], xs, os_,
                  args[15], args[16], args[17])
    return blk


def conv_blocked_phases(team, args, xs: np.ndarray, os_: np.ndarray, chunk: int, n: int,
                        threads: int, free: list | None = None) -> bool:
    """:mod:`._conv_blocked` per image on the caller and ``team``: the input
    blocks into the shared scratch ``xs``, then (output group, ``chunk``
    pixels) items through ``os_``. False (nothing done) without the kernel."""
    if not CB_IN:
        return False
    blk = None
    if free is not None and SPLIT_BLOCKS:
        blk = _cb_block(free, args, xs, os_)
        p, addr = blk.p, blk.addr
    else:
        p, ep = _cb_params(args, xs, os_)
        addr = p.ctypes.data
    ohw, groups = args[13], args[9]
    nchunks = -(-ohw // chunk)
    p[30], p[31] = chunk, nchunks
    items = int(args[14][7])  # input blocks or planes
    for i in range(n):
        p[29] = i
        _run_addr(team, CB_IN, addr, items, threads)
        _run_addr(team, CB_TILES, addr, groups.shape[0] * nchunks, threads)
    if blk is not None:
        free.append(blk)
    return True
