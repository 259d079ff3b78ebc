"""Float32 2-D MaxPool (no Indices) and AveragePool as two passes over rows,
16-lane vectors (AVX-512).

For each output row ``oy`` of a plane ``(H, W)``:

1. *vertical*: the input rows ``oy * SH - PT + ky`` (``ky < KH``) that lie in
   the plane are reduced element-wise (``llvm.maxnum`` / sum) into a row
   buffer ``v`` of the plane's width, padded left and right with the pad
   value (``-inf`` for MaxPool, ``0`` for AveragePool); rows in the padding
   are skipped (MaxPool folds one ``-inf`` in for them: a column of NaN
   next to the padding gives ``-inf``, as the numpy tap path);
2. *horizontal*: output ``ox`` reduces ``v[ox * SW + kx]``, ``kx < KW`` (at
   ``SW = 2`` two loads and an even-lane shuffle per tap), AveragePool then
   multiplies by ``1 / count`` (the window's counted cells: ONNX's
   ``count_include_pad``, never the ceil-mode overhang).

Both passes read and write contiguous vectors; a row's last vector is taken
as its last 16 elements (recomputed, never past the row), rows under 16
elements use masked loads and stores. The numpy tap path of :mod:`.pool`
takes the taps in row-major order; here columns of a window come after its
rows. ``maxNum`` is exact in any order (a NaN loses to a number, an all-NaN
window gives NaN, a window wholly in the padding ``-inf``); AveragePool's
float32 sums may differ from the tap order in the last bits.

Planes are the work items: on the compiled partner threads
(:func:`._conv_split.row_pool`) or :func:`._parallel.run_chunks` when more
than one intra-op thread runs and the work is large enough.

Shapes: ``x (N, C, H, W)`` float32 -> ``(N, C, OH, OW)`` float32. Spec: ONNX
MaxPool / AveragePool with ``dilations`` 1 and ``SW`` in {1, 2}.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _conv_tiles as _ct

__all__ = ["HAVE_KERNEL", "ENABLED", "MIN_WIDTH", "AVG_MIN_WIDTH", "applies", "Plan", "make_plan", "pool2d",
           "planes_range"]

#: use the row kernel where :func:`applies` (tests switch it off to check the
#: other paths)
ENABLED = True
#: ... MaxPool on planes at least this wide, AveragePool from
#: :data:`AVG_MIN_WIDTH` (narrower rows leave a vector's lanes idle and pay
#: the per-row cost more often: the other paths were as fast or faster there,
#: docs/speed.md round 15)
MIN_WIDTH = 24
AVG_MIN_WIDTH = 32
LANES = 16
HAVE_KERNEL = bool(_ct.HAVE_KERNEL and _ct.VW == LANES)

if HAVE_KERNEL:
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _f32, _i1, _i32, _i64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
    _V = ir.VectorType
    _VF = _V(_f32, LANES)

    from ._dw_blocked import mload_store_fns

    def _fns(builder):
        mload, mstore = mload_store_fns(builder)
        vmax = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VF, [_VF, _VF]), f"llvm.maxnum.v{LANES}f32")
        return mload, mstore, vmax

    def _mask(builder, nvalid):
        return builder.icmp_signed("<", ir.Constant(_V(_i64, LANES), list(range(LANES))),
                                   _ct.splat(builder, nvalid, LANES))

    def _reduce(builder, vmax, is_max, a, b):
        return builder.call(vmax, [a, b]) if is_max else builder.fadd(a, b)

    def _load(builder, mload, ptr, mask, masked):
        if masked:
            return builder.call(mload, [ptr, _i32(4), mask, ir.Constant(_VF, None)])
        return builder.load(ptr, align=4)

    def _store(builder, mstore, v, ptr, mask, masked):
        if masked:
            builder.call(mstore, [v, ptr, _i32(4), mask])
        else:
            builder.store(v, ptr, align=4)

    def _vertical_codegen(is_max, masked):
        def codegen(context, builder, sig, args):
            """``dst[d_off + i] = reduce over r < nrows of src[s_off + r *
            rstride + i]`` for lanes ``i < nvalid`` (16 elements); MaxPool
            with ``padded`` set (the window has rows in the padding) also
            takes ``-inf``, the pad (so an all-NaN column gives ``-inf``)."""
            da, sa = (context.make_array(sig.args[i])(context, builder, args[i]).data
                      for i in (0, 2))
            d_off, s_off, rstride, nrows, nvalid, padded = (_ct.as_i64(builder, args[i])
                                                            for i in (1, 3, 4, 5, 6, 7))
            mload, mstore, vmax = _fns(builder)
            mask = _mask(builder, nvalid) if masked else None
            first = _load(builder, mload, _ct.vec_ptr(builder, sa, s_off, LANES), mask, masked)
            if is_max:
                ninf = ir.Constant(_VF, [float("-inf")] * LANES)
                first = builder.select(builder.icmp_signed("!=", padded, _i64(0)),
                                       builder.call(vmax, [ninf, first]), first)
            entry, loop, done, r, accs = _ct.open_loop(builder, nrows, 1, None, "vrow", start=1,
                                                       inits=[first])
            at = builder.add(s_off, builder.mul(r, rstride))
            v = _load(builder, mload, _ct.vec_ptr(builder, sa, at, LANES), mask, masked)
            new = [_reduce(builder, vmax, is_max, accs[0], v)]
            acc, = _ct.close_loop(builder, nrows, entry, loop, done, r, accs, new, None,
                                  inits=[first])
            _store(builder, mstore, acc, _ct.vec_ptr(builder, da, d_off, LANES), mask, masked)
            return context.get_dummy_value()
        return codegen

    def _horizontal_codegen(is_max, stride, masked):
        def codegen(context, builder, sig, args):
            """``dst[d_off + i] = reduce over kx < kw of v[v_off + i * stride
            + kx]`` (times ``inv[inv_off + i]`` for AveragePool) for lanes
            ``i < nvalid``; ``v`` is read unmasked (a buffer with slack)."""
            da, va, ia = (context.make_array(sig.args[i])(context, builder, args[i]).data
                          for i in (0, 2, 5))
            d_off, v_off, kw, i_off, nvalid = (_ct.as_i64(builder, args[i])
                                               for i in (1, 3, 4, 6, 7))
            _, mstore, vmax = _fns(builder)
            even = ir.Constant(_V(_i32, LANES), [2 * i for i in range(LANES)])

            def tap(at):
                a = builder.load(_ct.vec_ptr(builder, va, at, LANES), align=4)
                if stride == 1:
                    return a
                b = builder.load(_ct.vec_ptr(builder, va, builder.add(at, _i64(LANES)), LANES),
                                 align=4)
                return builder.shuffle_vector(a, b, even)

            first = tap(v_off)
            entry, loop, done, k, accs = _ct.open_loop(builder, kw, 1, None, "hrow", start=1,
                                                       inits=[first])
            new = [_reduce(builder, vmax, is_max, accs[0], tap(builder.add(v_off, k)))]
            acc, = _ct.close_loop(builder, kw, entry, loop, done, k, accs, new, None,
                                  inits=[first])
            if not is_max:
                acc = builder.fmul(acc, builder.load(_ct.vec_ptr(builder, ia, i_off, LANES),
                                                     align=4))
            _store(builder, mstore, acc, _ct.vec_ptr(builder, da, d_off, LANES),
                   _mask(builder, nvalid) if masked else None, masked)
            return context.get_dummy_value()
        return codegen

    def _vertical_intrinsic(is_max, masked):
        def typer(typingctx, dst, d_off, src, s_off, rstride, nrows, nvalid, padded):
            return (types.void(dst, d_off, src, s_off, rstride, nrows, nvalid, padded),
                    _vertical_codegen(is_max, masked))
        typer.__name__ = f"_vertical_{'max' if is_max else 'sum'}{'_masked' if masked else ''}"
        return intrinsic(typer)

    def _horizontal_intrinsic(is_max, stride, masked):
        def typer(typingctx, dst, d_off, v, v_off, kw, inv, i_off, nvalid):
            return (types.void(dst, d_off, v, v_off, kw, inv, i_off, nvalid),
                    _horizontal_codegen(is_max, stride, masked))
        typer.__name__ = (f"_horizontal_{'max' if is_max else 'avg'}_s{stride}"
                          f"{'_masked' if masked else ''}")
        return intrinsic(typer)

    # full vectors (plain loads and stores) and masked ones (rows under 16)
    _vmax, _vsum = _vertical_intrinsic(True, False), _vertical_intrinsic(False, False)
    _vmax_m, _vsum_m = _vertical_intrinsic(True, True), _vertical_intrinsic(False, True)
    _hmax1, _hmax2 = _horizontal_intrinsic(True, 1, False), _horizontal_intrinsic(True, 2, False)
    _havg1, _havg2 = _horizontal_intrinsic(False, 1, False), _horizontal_intrinsic(False, 2, False)
    _hmax1_m, _hmax2_m = _horizontal_intrinsic(True, 1, True), _horizontal_intrinsic(True, 2, True)
    _havg1_m, _havg2_m = (_horizontal_intrinsic(False, 1, True),
                          _horizontal_intrinsic(False, 2, True))

    @njit(nogil=True, cache=True, inline="always")
    def _vertical(is_max, v, pl, x, at, w, nrows, padded):  # pragma: no cover - compiled
        if w < LANES:
            if is_max:
                _vmax_m(v, pl, x, at, w, nrows, w, padded)
            else:
                _vsum_m(v, pl, x, at, w, nrows, w, padded)
            return
        for j0 in range(0, w, LANES):
            j = min(j0, w - LANES)
            if is_max:
                _vmax(v, pl + j, x, at + j, w, nrows, LANES, padded)
            else:
                _vsum(v, pl + j, x, at + j, w, nrows, LANES, padded)

    @njit(nogil=True, cache=True, inline="always")
    def _hvec(is_max, sw, y, yr, v, kw, inv, ir_, o, nvalid):  # pragma: no cover - compiled
        if is_max:
            if sw == 1:
                _hmax1(y, yr + o, v, o, kw, inv, ir_ + o, nvalid)
            else:
                _hmax2(y, yr + o, v, 2 * o, kw, inv, ir_ + o, nvalid)
        else:
            if sw == 1:
                _havg1(y, yr + o, v, o, kw, inv, ir_ + o, nvalid)
            else:
                _havg2(y, yr + o, v, 2 * o, kw, inv, ir_ + o, nvalid)

    @njit(nogil=True, cache=True, inline="always")
    def _hvec_masked(is_max, sw, y, yr, v, kw, inv, ir_, nvalid):  # pragma: no cover - compiled
        if is_max:
            if sw == 1:
                _hmax1_m(y, yr, v, 0, kw, inv, ir_, nvalid)
            else:
                _hmax2_m(y, yr, v, 0, kw, inv, ir_, nvalid)
        else:
            if sw == 1:
                _havg1_m(y, yr, v, 0, kw, inv, ir_, nvalid)
            else:
                _havg2_m(y, yr, v, 0, kw, inv, ir_, nvalid)

    @njit(nogil=True, cache=True, inline="always")
    def _horizontal(is_max, sw, y, yr, v, kw, inv, ir_, ow):  # pragma: no cover - compiled
        if ow < LANES:
            _hvec_masked(is_max, sw, y, yr, v, kw, inv, ir_, ow)
            return
        for o in range(0, ow - LANES + 1, LANES):
            _hvec(is_max, sw, y, yr, v, kw, inv, ir_, o, LANES)
        if ow % LANES:  # the last 16 outputs, recomputed in part
            _hvec(is_max, sw, y, yr, v, kw, inv, ir_, ow - LANES, LANES)

    @njit(nogil=True, cache=True)
    def _planes(x, y, inv, h, w, oh, ow, kh, kw, sh, sw, pt, pl, vlen, is_max, p0, p1):
        # pragma: no cover - compiled
        # the vertical pass of a whole plane first, then the horizontal one:
        # a horizontal load right after the vertical stores it overlaps in
        # part would wait for them (no store forwarding across two stores)
        fill = np.float32(-np.inf) if is_max else np.float32(0.0)
        v = np.empty(oh * vlen + vlen, np.float32)
        v[:] = fill
        for p in range(p0, p1):
            xb = p * h * w
            yb = p * oh * ow
            for oy in range(oh):
                y0 = oy * sh - pt
                lo = max(y0, 0)
                hi = min(y0 + kh, h)
                if hi <= lo:
                    v[oy * vlen + pl:oy * vlen + pl + w] = fill
                else:
                    _vertical(is_max, v, oy * vlen + pl, x, xb + lo * w, w, hi - lo,
                              hi - lo < kh)
            for oy in range(oh):
                _horizontal(is_max, sw, y, yb + oy * ow, v[oy * vlen:], kw, inv, oy * ow, ow)

    #: public name of :func:`_planes`: planes ``[p0, p1)`` (image * C +
    #: channel) of flat ``x`` into flat ``y`` (the split of :mod:`._conv_split`)
    planes_range = _planes


def applies(x: np.ndarray, kernel, strides, dilations, is_max: bool) -> bool:
    """Whether :func:`pool2d` takes this pooling: float32 ``(N, C, H, W)``,
    ``W >= MIN_WIDTH`` (MaxPool) or :data:`AVG_MIN_WIDTH` (AveragePool),
    dilations 1, column stride 1 or 2, AVX-512 kernels."""
    return ENABLED and HAVE_KERNEL and x.dtype == np.float32 and x.ndim == 4 \
        and x.shape[3] >= (MIN_WIDTH if is_max else AVG_MIN_WIDTH) \
        and tuple(dilations) == (1, 1) and strides[1] in (1, 2) and len(kernel) == 2


class Plan:
    """The geometry of one pooling: ``ints`` (h, w, oh, ow, kh, kw, sh, sw,
    pt, pl, vlen, is_max), ``inv`` (float32 ``1 / count`` per output pixel
    with 16 elements of slack; ones for MaxPool), ``y_shape``."""

    __slots__ = ("ints", "inv", "y_shape", "blocks", "args")

    def __init__(self, ints, inv, y_shape):
        self.ints, self.inv, self.y_shape, self.blocks = ints, inv, y_shape, None
        # the compiled call's arguments after x, y (Python ints, made once)
        h, w, oh, ow, kh, kw, sh, sw, pt, pl, vlen, is_max = (int(v) for v in ints)
        self.args = (inv, h, w, oh, ow, kh, kw, sh, sw, pt, pl, vlen, bool(is_max))


def make_plan(x_shape, kernel, strides, pads_begin, out, counts=None) -> Plan:
    """The plan of a pooling over ``x (N, C, H, W)``: ``counts`` is
    AveragePool's ``(count_h (OH,), count_w (OW,))`` (the cells each window
    row / column counts); None for MaxPool."""
    n, c, h, w = x_shape
    (kh, kw), (sh, sw), (pt, pl), (oh, ow) = kernel, strides, pads_begin, out
    # the row buffer: left pad, the row, and what the horizontal loads reach
    # (two 16-float vectors from 2 * ox + kx at stride 2)
    vlen = max(pl + w, sw * ow + kw) + 3 * LANES
    inv = np.ones(oh * ow + LANES, np.float32)
    if counts is not None:
        with np.errstate(divide="ignore"):
            inv[:oh * ow] = (1.0 / np.multiply.outer(np.asarray(counts[0], np.float64),
                                                     np.asarray(counts[1], np.float64))).reshape(-1)
    is_max = counts is None
    return Plan(np.array([h, w, oh, ow, kh, kw, sh, sw, pt, pl, vlen, int(is_max)], np.int64),
                inv, (n, c, oh, ow))


#: split the planes over the intra-op threads from this many output elements x taps
PARALLEL_MIN_WORK = 1 << 17


def pool2d(plan: Plan, x: np.ndarray, threads: int = 1) -> np.ndarray:
    """``y (N, C, OH, OW)`` float32: the pooling of ``x`` (float32 of the
    plan's input shape; see the module doc). ``threads``: the intra-op
    threads to split the planes over (from :data:`PARALLEL_MIN_WORK`)."""
    n, c, oh, ow = plan.y_shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[3] < LANES:  # masked loads: lanes past the last row may address past x
        x = _ct.readable(x)
    # rows under 16 outputs: masked stores address the next row
    y = _ct.empty_with_slack(plan.y_shape, np.float32) if ow < LANES \
        else np.empty(plan.y_shape, np.float32)
    xf, yf = x.reshape(-1), y.reshape(-1)
    args = plan.args
    planes = n * c
    if threads > 1 and planes > 1 and y.size * args[5] * args[6] >= PARALLEL_MIN_WORK:
        from . import _conv_split
        if _conv_split.row_pool(plan, xf, yf, planes, threads):
            return y
        from . import _parallel
        per = -(-planes // (_parallel.CHUNKS_PER_THREAD * threads))

        def chunk(i):
            _planes(xf, yf, *args, i * per, min(planes, (i + 1) * per))

        _parallel.run_chunks(chunk, -(-planes // per), threads)
        return y
    _planes(xf, yf, *args, 0, planes)
    return y
