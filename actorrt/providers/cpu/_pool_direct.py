"""Vectorized float32 2-D MaxPool (no Indices output) on the direct
convolution's phase-split input (:mod:`._conv_direct`).

The input is copied once into the phase-split buffer padded with ``-inf``
(:func:`._conv_direct.make_plan` with one channel per group; the compiled
row copies of :mod:`._conv_vec`); a tile (an LLVM intrinsic: one 16-lane
vector with AVX-512, two 8-lane ones with AVX2) then takes 16 consecutive
outputs of one output row as ``llvm.maxnum`` (IEEE ``maxNum``: a NaN operand
loses to a number, as ``np.fmax``) over the window's taps, starting from the first tap, and stores
the valid lanes (``llvm.masked.store``). So the result equals the numpy tap
path of :mod:`.pool` (``np.fmax`` in tap order over a ``-inf``-padded input)
bit for bit: NaN skipped where the window has a number or a pad, NaN where it
has only NaN, ``-inf`` for a window wholly in the padding.

Shapes: ``x (N, C, H, W)`` float32 -> ``(N, C, OH, OW)`` float32.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import math

import numpy as np

from . import _conv_direct as _cd
from . import _conv_tiles as _ct

__all__ = ["HAVE_KERNEL", "ENABLED", "maxpool2d"]

#: use the vectorized MaxPool where it applies (float32, 2-D, no Indices)
ENABLED = True
#: ... on inputs of at most this many elements. Round 5 set 128K (the numpy
#: strided phase copy then dominated larger inputs); with the compiled row
#: copies, a reused ``-inf`` buffer and the plane split over threads the
#: direct MaxPool beat the separable numpy max on 0.6-0.8M-element inputs too
#: (round 8), so no limit by default
MAX_ELEMENTS = 1 << 62
HAVE_KERNEL = _cd.HAVE_KERNEL

if HAVE_KERNEL:
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _f32, _i1, _i32, _i64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
    _V = ir.VectorType

    def _max_codegen(nv, vw=8):
        def codegen(context, builder, sig, args):
            xa, oa, ya = [context.make_array(sig.args[i])(context, builder, args[i]).data
                          for i in (0, 2, 4)]
            x_off, ntaps, y_off, ncols = [_ct.as_i64(builder, args[i]) for i in (1, 3, 5, 6)]
            v8f = _V(_f32, vw)
            vmax = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v8f, [v8f, v8f]), f"llvm.maxnum.v{vw}f32")
            first = builder.add(x_off, builder.load(oa))
            init = [builder.load(_ct.vec_ptr(builder, xa, builder.add(first, _i64(vw * v)), vw), align=4)
                    for v in range(nv)]
            entry, loop, done, t, accs = _ct.open_loop(builder, ntaps, nv, None, "maxpool",
                                                       start=1, inits=init)
            xb = builder.add(x_off, builder.load(builder.gep(oa, [t])))
            new = [builder.call(vmax, [accs[v], builder.load(
                _ct.vec_ptr(builder, xa, builder.add(xb, _i64(vw * v)), vw), align=4)])
                for v in range(nv)]
            finals = _ct.close_loop(builder, ntaps, entry, loop, done, t, accs, new, None, inits=init)
            mstore = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [v8f, v8f.as_pointer(), _i32,
                                                                _V(_i1, vw)]),
                f"llvm.masked.store.v{vw}f32.p0v{vw}f32")
            for v, phi in enumerate(finals):
                mask = builder.icmp_signed(
                    "<", ir.Constant(_V(_i64, vw), list(range(vw * v, vw * v + vw))),
                    _ct.splat(builder, ncols, vw))
                builder.call(mstore, [phi, _ct.vec_ptr(builder, ya, builder.add(y_off, _i64(vw * v)), vw),
                                      _i32(4), mask])
            return context.get_dummy_value()
        return codegen

    def _max_intrinsic(nv, vw):
        def typer(typingctx, xs, x_off, offs, ntaps, y, y_off, ncols):
            return types.void(xs, x_off, offs, ntaps, y, y_off, ncols), _max_codegen(nv, vw)
        typer.__name__ = f"_maxpool_tile_x{nv}x{vw}"
        return intrinsic(typer)

    #: 16 columns per tile: one 16-lane vector with AVX-512 (:data:`._conv_direct.VW`), else two
    _tile2 = _max_intrinsic(16 // _cd.VW, _cd.VW)

    @njit(nogil=True, cache=True)
    def _rows(xs, offs, y, ntaps, x_plane, oh, ow, wj, start, stop):  # pragma: no cover
        for t in range(start, stop):
            oy = t % oh
            p = t // oh
            x_row = p * x_plane + oy * wj
            y_row = t * ow
            for ox0 in range(0, ow, 16):
                _tile2(xs, x_row + ox0, offs, ntaps, y, y_row + ox0, ow - ox0)

    #: public name of :func:`_rows`: output rows ``[start, stop)`` (plane * OH
    #: + row) of the phase-split buffer ``xs`` (the split of :mod:`._conv_split`)
    rows_range = _rows


def applies(x: np.ndarray, want_indices: bool) -> bool:
    """Whether :func:`maxpool2d` takes this MaxPool."""
    return ENABLED and HAVE_KERNEL and not want_indices and x.dtype == np.float32 \
        and x.ndim == 4 and x.size <= MAX_ELEMENTS


def make_plan(x_shape, kernel, strides, dilations, pb, out_shape) -> "_cd.Plan":
    """The phase-split geometry of a MaxPool over ``x (N, C, H, W)`` (one
    channel per group of :func:`._conv_direct.make_plan`; 16-column tiles)."""
    n, c = x_shape[:2]
    return _cd.make_plan(x_shape, (c, 1, math.prod(kernel)), c, kernel, strides, dilations,
                         pb, out_shape)


def new_buffer(plan: "_cd.Plan") -> np.ndarray:
    """A phase-split buffer for :func:`maxpool2d` (``-inf`` everywhere). The
    copy rewrites only the cells that hold input, so a buffer can be handed
    back to later calls of the same plan (one call at a time per buffer)."""
    return np.full(plan.total + 16, -np.inf, np.float32)  # 16: the tiles' over-read


#: split a MaxPool over the intra-op threads from this many outputs x taps
PARALLEL_MIN_WORK = 1 << 18


def maxpool2d(plan: "_cd.Plan", x: np.ndarray, buf: np.ndarray | None = None) -> np.ndarray:
    """``y (N, C, OH, OW)``: the max over each window (see the module doc) of
    ``x`` of the plan's input shape, float32. ``buf``: a :func:`new_buffer`
    of this plan to reuse (made here when None). Planes split over the
    intra-op threads (copy and tiles of a plane range in one chunk; on the
    compiled partner threads of :mod:`._conv_split` where they run, else
    :func:`._parallel.run_chunks`) from :data:`PARALLEL_MIN_WORK`."""
    if buf is None:
        buf = new_buffer(plan)
    n, c, oh, ow = plan.y_shape
    # the row copies read x, the tiles store y, with masked vectors
    x = _ct.readable(np.ascontiguousarray(x, dtype=np.float32))
    y = _ct.empty_with_slack(plan.y_shape, np.float32)
    yf = y.reshape(-1)
    x_plane = math.prod(plan.xs_shape[2:])
    planes = n * c
    ntaps = len(plan.offs)
    from . import _conv_split
    threads = 1
    if planes > 1 and y.size * ntaps >= PARALLEL_MIN_WORK:
        threads = _cd.current_threads()
    elif planes > 1 and y.size * ntaps >= _conv_split.MIN_POOL_WORK:
        threads = _cd.current_threads()  # small for the chunk loop: only the partners take it
        if not _conv_split.splits(threads):
            threads = 1
    if threads <= 1 or not _cd.COMPILED_COPY:
        _cd.phase_copy(plan, x, buf)
        _rows(buf, plan.offs, yf, ntaps, x_plane, oh, ow, plan.xs_shape[4], 0, planes * oh)
        return y
    if _conv_split.maxpool(plan, x, buf, yf, threads):
        return y  # planes on the compiled partner threads
    from . import _parallel
    from ._conv_vec import phase_copy_rows
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    _, _, nphase, hi, wj = plan.xs_shape
    h, w, sw = x.shape[2], x.shape[3], plan.key[4][1]
    per = -(-planes // (_parallel.CHUNKS_PER_THREAD * threads))

    def chunk(i):
        p0, p1 = i * per, min(planes, (i + 1) * per)
        phase_copy_rows(xf, buf, plan.table, c, h, w, nphase, hi, wj, sw, p0, p1)
        _rows(buf, plan.offs, yf, ntaps, x_plane, oh, ow, wj, p0 * oh, p1 * oh)

    _parallel.run_chunks(chunk, -(-planes // per), threads)
    return y
