"""Channel-blocked depthwise convolution and pooling for small and
mid-sized planes: 16 channels a vector, onnxruntime's NCHWc arrangement
formed per call from NCHW data.

On small and mid-sized planes (7x7 to 56x56) the plane-at-a-time kernel of
:mod:`._conv_numba` spends most of its time on per-row work (copy a row in,
sum a few vectors, store a row out): 150-300 ns a channel on 7x7 / 14x14
where onnxruntime's NCHWc kernel takes 26-100. Here a block of 16 channels
is moved into a zero-padded channels-last scratch ``xs (HP, WP, 16)`` by 16 x
16 in-register transposes (16 flat pixels of the 16 planes per step, each
pixel vector stored at its padded place); every output pixel is then ``bias +
sum_k w[k] * xs[pixel + tap_k]`` over ``<16 x float>`` vectors (one FMA per
tap for 16 channels), :data:`PIXELS` pixels of a row per step so each weight
vector is loaded once for them; the epilogue's results go to a channels-last
output scratch that the same transposes turn back into the 16 planes.
(Per-pixel ``llvm.masked.gather`` / scatter instead of the transposes: 1.6-2x
the time, docs/speed.md round 13.)

* :data:`HAVE_KERNEL` -- built (numba, AVX-512 16-lane vectors).
* :func:`applies` -- whether a depthwise conv of these shapes takes this kernel.
* :func:`pack` -- weights ``(C, 1, KH, KW)`` and bias to ``(C/16, KH*KW, 16)``
  / ``(C/16 * 16,)`` blocks, zero-padded channels.
* :func:`run` -- ``y = min(max(where(v < 0, alpha*v, v), lo), hi)`` of ``v =
  conv(x, w) + bias (+ z)``, float32 ``x (N, C, H, W)`` -> ``y (N, C, OH, OW)``;
* :func:`pool_applies`, :func:`pool` -- MaxPool / AveragePool on the same
  blocks (the tap loop a max or a sum, the sum divided by per-pixel counts).

Both split their channel blocks over the intra-op threads (the compiled
partners of :mod:`._conv_split`, else :func:`._parallel.run_chunks`).
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import functools

import numpy as np

from . import _conv_tiles as _ct

__all__ = ["HAVE_KERNEL", "ENABLED", "MAX_PIXELS", "MIN_FILL", "POOL_MAX_INPUT_PIXELS", "applies",
           "pool_applies", "pack", "pack_bias", "pool", "run"]

#: lanes of a channel block (one ``<16 x float>`` vector)
LANES = 16
#: output pixels a step (each weight vector loaded once for them)
PIXELS = 4
#: output pixels a call of the unrolled windows (:func:`window_kind`)
WINDOW_PIXELS = 8
#: depthwise convs without a residual take the unrolled windows (3x3 / 5x5,
#: stride 1 / 2) into the block's output scratch (off: the tap loop, which
#: reads the residual per pixel)
WINDOWS = True
HAVE_KERNEL = _ct.HAVE_KERNEL and _ct.VW == LANES
#: take this kernel where :func:`applies` (off: the plane kernel everywhere)
ENABLED = True
#: ... for output planes of at most this many pixels: per channel, one
#: thread, 3x3 (plane kernel -> this one): 7x7 176 -> 31 ns, 14x14 308 -> 96,
#: 28x28 stride 2 660 -> 189, 40x40 1,153 -> 628, 56x56 1,797 -> 1,537,
#: 112x112 stride 2 4,156 -> 2,671; 112x112 4,883 -> 6,414 (docs/speed.md
#: round 13)
MAX_PIXELS = 3200
#: ... and channels filling at least this share of their 16-lane blocks (17
#: channels in two blocks: 190 -> 254 ns a channel on 5x5)
MIN_FILL = 0.75
#: MaxPool / AveragePool take the blocks for input planes of at most this many
#: pixels (a pool's few operations a tap leave the transposes most of the
#: time: 3x3 / 2 on 56x56 x 192 154 -> 120 us, on 112x112 x 64 190 -> 200,
#: onnxruntime 87 / 113; docs/speed.md round 13)
POOL_MAX_INPUT_PIXELS = 4096

if HAVE_KERNEL:
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _f32, _i1, _i32, _i64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
    _V = ir.VectorType
    _as_i64, _splat, _vptr = _ct.as_i64, _ct.splat, _ct.vec_ptr

    def _fns(builder):
        vf, vp, mask_t = _V(_f32, LANES), _V(_f32.as_pointer(), LANES), _V(_i1, LANES)
        gather = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vf, [vp, _i32, mask_t, vf]),
            f"llvm.masked.gather.v{LANES}f32.v{LANES}p0f32")
        return vf, gather

    def _lane_addresses(builder, base_ptr, off, stride):
        """Pointers ``base + (off + l * stride)`` floats, ``l < 16``."""
        vp = _V(_f32.as_pointer(), LANES)
        lanes = ir.Constant(_V(_i64, LANES), list(range(LANES)))
        rel = builder.mul(lanes, _splat(builder, builder.mul(stride, _i64(4)), LANES))
        at = _splat(builder, builder.add(builder.ptrtoint(base_ptr, _i64),
                                         builder.mul(off, _i64(4))), LANES)
        return builder.inttoptr(builder.add(at, rel), vp)

    def _lanes_below(builder, n):
        return builder.icmp_signed("<", ir.Constant(_V(_i64, LANES), list(range(LANES))),
                                   _splat(builder, n, LANES))

    def _pixels_codegen(context, builder, sig, args):
        """Up to :data:`PIXELS` output pixels of one row for 16 channels:
        ``acc_p = sum_k wt[wo + 16k : +16] * xs[x_off + p * x_step + toffs[k] :
        +16]``, then ``v = acc_p + bias[bo : +16] (+ z: lanes ``l < nvalid``
        of ``z[y_off + p + l * y_stride]``), the epilogue, stored to
        ``out[(o_off + p) * 16 : +16]`` (pixels ``p < npix``)."""
        (xa, ta, wa, ba, za, oa) = (context.make_array(sig.args[i])(context, builder, args[i]).data
                                    for i in (0, 4, 6, 8, 14, 19))
        x_off, x_step, npix, kk, wo, bo, y_off, y_stride, nvalid, has_z, o_off = (
            _as_i64(builder, args[i]) for i in (1, 2, 3, 5, 7, 9, 11, 12, 13, 15, 20))
        alpha, lo, hi = args[16], args[17], args[18]
        vf, gather = _fns(builder)
        fast = ("fast",)
        zero = ir.Constant(vf, [0.0] * LANES)
        # pixels past npix read pixel 0's taps (addresses that exist); not stored
        pofs = [builder.select(builder.icmp_signed("<", _i64(p), npix),
                               builder.mul(_i64(p), x_step), _i64(0)) for p in range(PIXELS)]
        entry, loop, done, k, accs = _ct.open_loop(builder, kk, PIXELS, zero, "dwb")
        t = builder.load(builder.gep(ta, [k]))
        wv = builder.load(_vptr(builder, wa, builder.add(wo, builder.mul(k, _i64(LANES))), LANES),
                          align=4)
        base = builder.add(x_off, t)
        new = []
        for p in range(PIXELS):
            xv = builder.load(_vptr(builder, xa, builder.add(base, pofs[p]), LANES), align=4)
            new.append(builder.fadd(accs[p], builder.fmul(wv, xv, flags=fast), flags=fast))
        finals = _ct.close_loop(builder, kk, entry, loop, done, k, accs, new, zero)
        bv = builder.load(_vptr(builder, ba, bo, LANES), align=4)
        alv, lov, hiv = (_splat(builder, s, LANES) for s in (alpha, lo, hi))
        ch_ok = _lanes_below(builder, nvalid)
        for p in range(PIXELS):
            ok = builder.and_(ch_ok, _splat(builder, builder.icmp_signed("<", _i64(p), npix),
                                            LANES, ty=_i1))
            at = builder.add(y_off, _i64(p))
            zp = _lane_addresses(builder, za, at, y_stride)
            v = builder.fadd(finals[p], bv, flags=fast)
            v = _add_z(builder, v, zp, ok, has_z, gather, zero)
            v = builder.select(builder.fcmp_ordered("<", v, zero), builder.fmul(v, alv, flags=fast), v)
            v = builder.select(builder.fcmp_ordered("<", v, lov), lov, v)
            v = builder.select(builder.fcmp_ordered(">", v, hiv), hiv, v)
            with builder.if_then(builder.icmp_signed("<", _i64(p), npix), likely=True):
                builder.store(v, _vptr(builder, oa, builder.mul(builder.add(o_off, _i64(p)),
                                                                _i64(LANES)), LANES), align=4)
        return context.get_dummy_value()

    def _add_z(builder, v, zp, ok, has_z, gather, zero):
        """``v + z`` (the lanes ``ok`` gathered from ``zp``) where ``has_z``,
        else ``v``: the gather only on the branch that needs it (a gather
        with every lane masked off still costs its issue on AMD Zen)."""
        before = builder.block
        with builder.if_then(builder.icmp_signed("!=", has_z, _i64(0)), likely=False):
            zv = builder.call(gather, [zp, _i32(4), ok, zero])
            with_z = builder.fadd(v, zv, flags=("fast",))
            then = builder.block
        phi = builder.phi(v.type)
        phi.add_incoming(v, before)
        phi.add_incoming(with_z, then)
        return phi

    @intrinsic
    def _pixels(typingctx, xs, x_off, x_step, npix, toffs, kk, wt, wo, bias, bo, y, y_off,
                y_stride, nvalid, z, has_z, alpha, lo, hi, out, o_off):
        if any(getattr(a, "dtype", None) != types.float32 for a in (xs, wt, bias, y, z, out)) or \
                any(f != types.float32 for f in (alpha, lo, hi)):
            return None
        return (types.void(xs, x_off, x_step, npix, toffs, kk, wt, wo, bias, bo, y, y_off,
                           y_stride, nvalid, z, has_z, alpha, lo, hi, out, o_off),
                _pixels_codegen)

    def _window_codegen(kh: int, kw: int, stride: int, npix_max: int):
        """``npix_max`` output pixels of one row for 16 channels, a ``kh x kw``
        window of stride ``stride`` and dilation 1, unrolled: ``acc_p = sum
        wt[wo + (ky * kw + kx) * 16 : +16] * xs[x_off + ky * row + (p *
        stride + kx) * 16 : +16]`` in tap order (as :func:`_pixels_codegen`),
        each input vector loaded once for every pixel and tap that reads it,
        then ``v = acc + bias[bo : +16]``, the epilogue, stored to
        ``out[(o_off + p) * 16 : +16]`` for ``p < npix``. Pixels past
        ``npix`` read up to ``(npix_max - 1) * stride + kw - 1`` columns past
        ``x_off`` (the caller's scratch leaves that slack)."""
        def codegen(context, builder, sig, args):
            xa, wa, ba, oa = (context.make_array(sig.args[i])(context, builder, args[i]).data
                              for i in (0, 4, 6, 11))
            x_off, row, npix, wo, bo, o_off = (_as_i64(builder, args[i])
                                               for i in (1, 2, 3, 5, 7, 12))
            alpha, lo, hi = args[8], args[9], args[10]
            vf = _V(_f32, LANES)
            fast = ("fast",)
            zero = ir.Constant(vf, [0.0] * LANES)
            accs = [zero] * npix_max
            for ky in range(kh):
                rb = builder.add(x_off, builder.mul(row, _i64(ky)))
                cols = {}
                for kx in range(kw):
                    wv = builder.load(_vptr(builder, wa, builder.add(
                        wo, _i64((ky * kw + kx) * LANES)), LANES), align=4)
                    for p in range(npix_max):
                        c = p * stride + kx
                        if c not in cols:
                            cols[c] = builder.load(_vptr(builder, xa, builder.add(
                                rb, _i64(c * LANES)), LANES), align=4)
                        accs[p] = builder.fadd(accs[p], builder.fmul(wv, cols[c], flags=fast),
                                               flags=fast)
            bv = builder.load(_vptr(builder, ba, bo, LANES), align=4)
            alv, lov, hiv = (_splat(builder, v, LANES) for v in (alpha, lo, hi))
            for p in range(npix_max):
                v = builder.fadd(accs[p], bv, flags=fast)
                v = builder.select(builder.fcmp_ordered("<", v, zero),
                                   builder.fmul(v, alv, flags=fast), v)
                v = builder.select(builder.fcmp_ordered("<", v, lov), lov, v)
                v = builder.select(builder.fcmp_ordered(">", v, hiv), hiv, v)
                with builder.if_then(builder.icmp_signed("<", _i64(p), npix), likely=True):
                    builder.store(v, _vptr(builder, oa, builder.mul(
                        builder.add(o_off, _i64(p)), _i64(LANES)), LANES), align=4)
            return context.get_dummy_value()
        return codegen

    def _window_intrinsic(kh: int, kw: int, stride: int):
        def typer(typingctx, xs, x_off, row, npix, wt, wo, bias, bo, alpha, lo, hi, out, o_off):
            if any(getattr(a, "dtype", None) != types.float32 for a in (xs, wt, bias, out)) or \
                    any(f != types.float32 for f in (alpha, lo, hi)):
                return None
            return (types.void(xs, x_off, row, npix, wt, wo, bias, bo, alpha, lo, hi, out, o_off),
                    _window_codegen(kh, kw, stride, WINDOW_PIXELS))
        typer.__name__ = f"_dw_window_{kh}x{kw}_s{stride}"
        return intrinsic(typer)

    #: unrolled depthwise windows (3x3 and 5x5, stride 1 and 2, dilation 1):
    #: :data:`WINDOW_PIXELS` output pixels a call
    window_3s1, window_3s2, window_5s1, window_5s2 = (
        _window_intrinsic(k, k, st) for k, st in ((3, 1), (3, 2), (5, 1), (5, 2)))

    def _pool_pixels_codegen(is_max: bool):
        """Up to :data:`PIXELS` output pixels of a pooling for 16 channels:
        MaxPool IEEE ``maxNum`` over the taps in order from the first (a NaN
        loses to a number; ``-inf`` in the padding), AveragePool the taps'
        sum in order divided by ``cnt[o_off + p]``; stored to ``out[(o_off +
        p) * 16 : +16]`` for ``p < npix``. No fast-math flags: NaN tests and
        the sum's order stay as written."""
        def codegen(context, builder, sig, args):
            xa, ta, ca, oa = (context.make_array(sig.args[i])(context, builder, args[i]).data
                              for i in (0, 4, 6, 7))
            x_off, x_step, npix, kk, o_off = (_as_i64(builder, args[i]) for i in (1, 2, 3, 5, 8))
            pofs = [builder.select(builder.icmp_signed("<", _i64(p), npix),
                                   builder.mul(_i64(p), x_step), _i64(0)) for p in range(PIXELS)]
            t0 = builder.add(x_off, builder.load(builder.gep(ta, [_i64(0)])))
            first = [builder.load(_vptr(builder, xa, builder.add(t0, pofs[p]), LANES), align=4)
                     for p in range(PIXELS)]
            entry, loop, done, k, accs = _ct.open_loop(builder, kk, PIXELS, None, "pool",
                                                       start=1, inits=first)
            base = builder.add(x_off, builder.load(builder.gep(ta, [k])))
            new = []
            for p in range(PIXELS):
                v = builder.load(_vptr(builder, xa, builder.add(base, pofs[p]), LANES), align=4)
                a = accs[p]
                if is_max:
                    take = builder.or_(builder.fcmp_ordered(">", v, a),
                                       builder.fcmp_unordered("uno", a, a))
                    new.append(builder.select(take, v, a))
                else:
                    new.append(builder.fadd(a, v))
            finals = _ct.close_loop(builder, kk, entry, loop, done, k, accs, new, None, inits=first)
            for p in range(PIXELS):
                v = finals[p]
                with builder.if_then(builder.icmp_signed("<", _i64(p), npix), likely=True):
                    at = builder.add(o_off, _i64(p))
                    if not is_max:
                        v = builder.fdiv(v, _splat(builder, builder.load(builder.gep(ca, [at])),
                                                   LANES))
                    builder.store(v, _vptr(builder, oa, builder.mul(at, _i64(LANES)), LANES),
                                  align=4)
            return context.get_dummy_value()
        return codegen

    def _pool_typer(is_max):
        def typer(typingctx, xs, x_off, x_step, npix, toffs, kk, cnt, out, o_off):
            if any(getattr(a, "dtype", None) != types.float32 for a in (xs, cnt, out)):
                return None
            return (types.void(xs, x_off, x_step, npix, toffs, kk, cnt, out, o_off),
                    _pool_pixels_codegen(is_max))
        typer.__name__ = "_max_pixels" if is_max else "_avg_pixels"
        return intrinsic(typer)

    _max_pixels, _avg_pixels = _pool_typer(True), _pool_typer(False)

    def _max_fast_codegen(context, builder, sig, args):
        """Up to :data:`PIXELS` output pixels of a MaxPool for 16 channels,
        each lane ``max`` over the taps from ``-inf`` (``select(v > acc, v,
        acc)``: one ``vmaxps``, a NaN tap never taken), stored as
        :func:`_pool_pixels_codegen`'s; returns 1 where a stored lane is
        ``-inf`` (a window of only NaN / ``-inf`` taps, whose IEEE ``maxNum``
        may be NaN: the caller recomputes those pixels by
        :func:`_max_pixels`), else 0. Where it returns 0 the values equal
        :func:`_max_pixels`' (no lane's window held only NaNs, and the first
        of equal taps is kept by both)."""
        xa, ta, oa = (context.make_array(sig.args[i])(context, builder, args[i]).data
                      for i in (0, 4, 7))
        x_off, x_step, npix, kk, o_off = (_as_i64(builder, args[i]) for i in (1, 2, 3, 5, 8))
        pofs = [builder.select(builder.icmp_signed("<", _i64(p), npix),
                               builder.mul(_i64(p), x_step), _i64(0)) for p in range(PIXELS)]
        ninf = _splat(builder, ir.Constant(_f32, float("-inf")), LANES)
        entry, loop, done, k, accs = _ct.open_loop(builder, kk, PIXELS, ninf, "maxf")
        base = builder.add(x_off, builder.load(builder.gep(ta, [k])))
        new = []
        for p in range(PIXELS):
            v = builder.load(_vptr(builder, xa, builder.add(base, pofs[p]), LANES), align=4)
            new.append(builder.select(builder.fcmp_ordered(">", v, accs[p]), v, accs[p]))
        finals = _ct.close_loop(builder, kk, entry, loop, done, k, accs, new, ninf)
        i16 = ir.IntType(LANES)
        flag = ir.Constant(i16, 0)
        for p in range(PIXELS):
            v = finals[p]
            low = builder.bitcast(builder.fcmp_ordered("==", v, ninf), i16)
            flag = builder.or_(flag, builder.select(builder.icmp_signed("<", _i64(p), npix),
                                                    low, ir.Constant(i16, 0)))
            with builder.if_then(builder.icmp_signed("<", _i64(p), npix), likely=True):
                at = builder.add(o_off, _i64(p))
                builder.store(v, _vptr(builder, oa, builder.mul(at, _i64(LANES)), LANES),
                              align=4)
        return builder.zext(builder.icmp_unsigned("!=", flag, ir.Constant(i16, 0)), _i64)

    @intrinsic
    def _max_pixels_fast(typingctx, xs, x_off, x_step, npix, toffs, kk, cnt, out, o_off):
        if any(getattr(a, "dtype", None) != types.float32 for a in (xs, cnt, out)):
            return None
        return (types.int64(xs, x_off, x_step, npix, toffs, kk, cnt, out, o_off),
                _max_fast_codegen)

    def _transpose16(builder, rows):
        """The 16 x 16 transpose of ``rows`` (16 ``<16 x float>``): four
        butterfly stages, each swapping the off-diagonal ``b x b`` blocks of
        every ``2b x 2b`` block (``b`` = 1, 2, 4, 8; 64 two-source shuffles)."""
        rows = list(rows)
        vi = _V(_i32, LANES)
        for b in (1, 2, 4, 8):
            lo_mask = ir.Constant(vi, [j if not j & b else LANES + (j ^ b) for j in range(LANES)])
            hi_mask = ir.Constant(vi, [(j ^ b) if not j & b else LANES + j for j in range(LANES)])
            for i in range(LANES):
                if i & b:
                    continue
                a, c = rows[i], rows[i | b]
                rows[i] = builder.shuffle_vector(a, c, lo_mask)
                rows[i | b] = builder.shuffle_vector(a, c, hi_mask)
        return rows

    def _mload_store_fns(builder):
        vf, mask_t = _V(_f32, LANES), _V(_i1, LANES)
        mload = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vf, [vf.as_pointer(), _i32, mask_t, vf]),
            f"llvm.masked.load.v{LANES}f32.p0v{LANES}f32")
        mstore = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [vf, vf.as_pointer(), _i32, mask_t]),
            f"llvm.masked.store.v{LANES}f32.p0v{LANES}f32")
        return mload, mstore

    def _permute(builder, v, idx):
        """``v[idx[i]]`` per lane (``vpermps``: a run-time lane permutation)."""
        vf = _V(_f32, LANES)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vf, [vf, _V(_i32, LANES)]),
            "llvm.x86.avx512.permvar.sf.512")
        return builder.call(fn, [v, idx])

    def _tail_shift(builder, count):
        """``(shift, lanes)`` of a chunk of ``count`` (1-16) pixels read as a
        plane's last 16: the chunk's pixel ``i`` is lane ``i + shift`` there,
        ``shift = 16 - count``."""
        shift = builder.trunc(builder.sub(_i64(LANES), count), _i32)
        iota = ir.Constant(_V(_i32, LANES), list(range(LANES)))
        return shift, iota

    # Every address these form lies inside the plane it names (the rule of
    # docs/speed.md rounds 11 and 13): a masked load or store whose masked-off
    # lanes reach a page that is not present (past the array's end, or in an
    # output plane not yet written) costs a microcode assist on AMD Zen --
    # a chunk of 16 pixels that would run past the plane's end is taken as
    # the plane's last 16 and its lanes moved by a permutation; channels past
    # ``nvalid`` address channel 0 under an all-false mask.
    def _planes_in_codegen(context, builder, sig, args):
        """Pixels ``p0 .. p0 + count - 1`` (``count <= 16``, planes of at
        least 16 pixels) of 16 channel planes into the channels-last
        scratch: row ``l < nvalid`` of the 16 x 16 block is ``x[x_off + l *
        hw + p0 :][:count]`` (other rows 0), transposed, pixel ``i`` stored at
        ``xs[dst[p0 + i] : +16]``."""
        xa, sa, da = (context.make_array(sig.args[i])(context, builder, args[i]).data
                      for i in (0, 5, 6))
        x_off, hw, nvalid, p0, count = (_as_i64(builder, args[i]) for i in (1, 2, 3, 4, 7))
        vf = _V(_f32, LANES)
        mload, _ = _mload_store_fns(builder)
        zero = ir.Constant(vf, [0.0] * LANES)
        full = builder.icmp_signed("==", count, _i64(LANES))
        start = builder.select(full, p0, builder.sub(hw, _i64(LANES)))
        shift, iota = _tail_shift(builder, count)
        idx = builder.select(full, iota, builder.add(iota, _splat(builder, shift, LANES)))
        rows = []
        for l in range(LANES):
            valid = builder.icmp_signed("<", _i64(l), nvalid)
            ok = _splat(builder, valid, LANES, ty=_i1)
            at = builder.add(builder.add(x_off, builder.mul(
                builder.select(valid, _i64(l), _i64(0)), hw)), start)
            v = builder.call(mload, [_vptr(builder, xa, at, LANES), _i32(4), ok, zero])
            rows.append(_permute(builder, v, idx))
        for i, v in enumerate(_transpose16(builder, rows)):
            with builder.if_then(builder.icmp_signed("<", _i64(i), count), likely=True):
                d = builder.load(builder.gep(da, [builder.add(p0, _i64(i))]))
                builder.store(v, _vptr(builder, sa, d, LANES), align=4)
        return context.get_dummy_value()

    @intrinsic
    def _planes_in(typingctx, x, x_off, hw, nvalid, p0, xs, dst, count):
        if getattr(x, "dtype", None) != types.float32 or getattr(xs, "dtype", None) != types.float32:
            return None
        return types.void(x, x_off, hw, nvalid, p0, xs, dst, count), _planes_in_codegen

    def _planes_out_codegen(context, builder, sig, args):
        """The inverse for the output: pixel vectors ``out[(p0 + i) * 16 :
        +16]``, ``i < count``, transposed, channel ``l < nvalid``'s row stored
        to ``y[y_off + l * ohw + p0 :][:count]`` (planes of at least 16
        pixels; a tail chunk as the plane's last 16 lanes, those before
        ``p0`` masked off)."""
        oa, ya = (context.make_array(sig.args[i])(context, builder, args[i]).data for i in (0, 2))
        p0, y_off, ohw, nvalid, count = (_as_i64(builder, args[i]) for i in (1, 3, 4, 5, 6))
        vf = _V(_f32, LANES)
        _, mstore = _mload_store_fns(builder)
        rows = []
        for i in range(LANES):  # pixels past count read pixel 0 (stored nowhere)
            at = builder.select(builder.icmp_signed("<", _i64(i), count),
                                builder.mul(builder.add(p0, _i64(i)), _i64(LANES)),
                                builder.mul(p0, _i64(LANES)))
            rows.append(builder.load(_vptr(builder, oa, at, LANES), align=4))
        full = builder.icmp_signed("==", count, _i64(LANES))
        start = builder.select(full, p0, builder.sub(ohw, _i64(LANES)))
        shift, iota = _tail_shift(builder, count)
        # lane j of the stored vector is pixel j - shift of the chunk
        idx = builder.select(full, iota, builder.sub(iota, _splat(builder, shift, LANES)))
        cols = builder.select(full, _lanes_below(builder, _i64(LANES)), builder.icmp_signed(
            ">=", ir.Constant(_V(_i64, LANES), list(range(LANES))),
            _splat(builder, builder.sub(_i64(LANES), count), LANES)))
        for l, v in enumerate(_transpose16(builder, rows)):
            valid = builder.icmp_signed("<", _i64(l), nvalid)
            ok = builder.and_(cols, _splat(builder, valid, LANES, ty=_i1))
            at = builder.add(builder.add(y_off, builder.mul(
                builder.select(valid, _i64(l), _i64(0)), ohw)), start)
            builder.call(mstore, [_permute(builder, v, idx), _vptr(builder, ya, at, LANES),
                                  _i32(4), ok])
        return context.get_dummy_value()

    @intrinsic
    def _planes_out(typingctx, out, p0, y, y_off, ohw, nvalid, count):
        if getattr(out, "dtype", None) != types.float32 or getattr(y, "dtype", None) != types.float32:
            return None
        return types.void(out, p0, y, y_off, ohw, nvalid, count), _planes_out_codegen

    @njit(nogil=True, cache=True)
    def _blocks(x, wt, bias, z, has_z, y, toffs, cnt, mode, c, h, w, oh, ow, sh, sw, pt, pl,
                hp, wp, win, alpha, lo, hi, start, stop):  # pragma: no cover - compiled
        """Items ``[start, stop)`` = image * channel blocks + block: gather
        the block's 16 input planes into the padded channels-last scratch,
        then every output row in steps of :data:`PIXELS` pixels. ``x``, ``z``
        and ``y`` flat; ``toffs`` each tap's element offset in the scratch.
        ``mode``: 0 the depthwise conv (``wt``, ``bias``, ``z``, the
        epilogue), 1 MaxPool, 2 AveragePool (``cnt``: each output pixel's
        divisor). ``win`` (mode 0 without ``z``): the unrolled window of
        :func:`window_kind`, else 0 (the tap loop, ``z`` read per pixel).
        Every mode stores into the block's channels-last output scratch, then
        transposes it into ``y``."""
        # the pads stay as set here: only the image's cells are written; the
        # slack past the last row is what a short window reads on into
        xs = np.full(hp * wp * LANES + (WINDOW_PIXELS * 2 + 5) * LANES,
                     -np.inf if mode == 1 else 0.0, np.float32)
        os_ = np.empty(oh * ow * LANES, np.float32)
        nb = (c + LANES - 1) // LANES
        hw = h * w
        ohw = oh * ow
        kk = toffs.size
        dst = np.empty(hw, np.int64)  # each input pixel's place in the scratch
        for iy in range(h):
            for ix in range(w):
                dst[iy * w + ix] = ((iy + pt) * wp + ix + pl) * LANES
        for t in range(start, stop):
            n = t // nb
            cb = t % nb
            c0 = cb * LANES
            nvalid = min(LANES, c - c0)
            xb = (n * c + c0) * hw
            for p0 in range(0, hw, LANES):
                _planes_in(x, xb, hw, nvalid, p0, xs, dst, min(LANES, hw - p0))
            yb = (n * c + c0) * ohw
            windows = mode == 0 and win > 0 and has_z == 0
            for oy in range(oh):
                xrow = oy * sh * wp * LANES
                if windows:
                    for ox in range(0, ow, WINDOW_PIXELS):
                        _window_kind_at(xs, xrow + ox * sw * LANES, wp * LANES, win,
                                        min(WINDOW_PIXELS, ow - ox), wt, cb * kk * LANES, bias,
                                        c0, alpha, lo, hi, os_, oy * ow + ox)
                    continue
                for ox in range(0, ow, PIXELS):
                    npix = min(PIXELS, ow - ox)
                    if mode == 0:
                        _pixels(xs, xrow + ox * sw * LANES, sw * LANES, npix, toffs, kk, wt,
                                cb * kk * LANES, bias, c0, y, yb + oy * ow + ox, ohw, nvalid,
                                z, has_z, alpha, lo, hi, os_, oy * ow + ox)
                    elif mode == 1:
                        if _max_pixels_fast(xs, xrow + ox * sw * LANES, sw * LANES, npix, toffs,
                                            kk, cnt, os_, oy * ow + ox):
                            _max_pixels(xs, xrow + ox * sw * LANES, sw * LANES, npix, toffs, kk,
                                        cnt, os_, oy * ow + ox)
                    else:
                        _avg_pixels(xs, xrow + ox * sw * LANES, sw * LANES, npix, toffs, kk,
                                    cnt, os_, oy * ow + ox)
            for p0 in range(0, ohw, LANES):
                _planes_out(os_, p0, y, yb, ohw, nvalid, min(LANES, ohw - p0))

    @njit(nogil=True, cache=True, inline="always")
    def _window_kind_at(xs, xo, row, win, npix, wt, wo, bias, bo, alpha, lo, hi, out,
                        at):  # pragma: no cover - compiled
        """``npix`` (at most :data:`WINDOW_PIXELS`) output pixels by the
        unrolled window ``win`` (:func:`window_kind`) from ``xs[xo]`` (it
        reads all its pixels' columns) into ``out``'s pixel ``at``."""
        if win == 1:
            window_3s1(xs, xo, row, npix, wt, wo, bias, bo, alpha, lo, hi, out, at)
        elif win == 2:
            window_3s2(xs, xo, row, npix, wt, wo, bias, bo, alpha, lo, hi, out, at)
        elif win == 3:
            window_5s1(xs, xo, row, npix, wt, wo, bias, bo, alpha, lo, hi, out, at)
        else:
            window_5s2(xs, xo, row, npix, wt, wo, bias, bo, alpha, lo, hi, out, at)

    #: one of the unrolled windows by its :func:`window_kind` (1-4)
    window_at = _window_kind_at

    #: public name of :func:`_blocks` (the compiled split of :mod:`._conv_split`)
    blocks_range = _blocks
    #: the IR pieces and the plane transposes shared with :mod:`._conv_blocked`
    transpose16, permute, tail_shift, lanes_below, mload_store_fns = (
        _transpose16, _permute, _tail_shift, _lanes_below, _mload_store_fns)
    planes_in, planes_out = _planes_in, _planes_out
    #: the per-row pixel steps (:mod:`._nchwc`'s blocked inputs and outputs)
    pixels, max_pixels, avg_pixels = _pixels, _max_pixels, _avg_pixels
    max_pixels_fast = _max_pixels_fast


def applies(x_shape, w_shape, group: int, out_shape) -> bool:
    """A 2-D depthwise conv (one output channel per input channel) whose
    output plane has at most :data:`MAX_PIXELS` pixels and whose channels
    fill at least :data:`MIN_FILL` of their 16-channel blocks."""
    if not (HAVE_KERNEL and ENABLED and len(x_shape) == 4 and len(w_shape) == 4):
        return False
    c = x_shape[1]
    return group == c == w_shape[0] and w_shape[1] == 1 and \
        LANES <= out_shape[0] * out_shape[1] <= MAX_PIXELS and \
        x_shape[2] * x_shape[3] >= LANES and c >= MIN_FILL * LANES * -(-c // LANES)


def pool_applies(x_shape, out_shape) -> bool:
    """A 2-D pooling of a 4-D input of at most :data:`POOL_MAX_INPUT_PIXELS`
    pixels a plane, channels filling at least :data:`MIN_FILL` of their
    blocks."""
    if not (HAVE_KERNEL and ENABLED and len(x_shape) == 4):
        return False
    c = x_shape[1]
    return LANES <= x_shape[2] * x_shape[3] <= POOL_MAX_INPUT_PIXELS and \
        out_shape[0] * out_shape[1] >= LANES and c >= MIN_FILL * LANES * -(-c // LANES)


def pack(w: np.ndarray, bias) -> tuple[np.ndarray, np.ndarray]:
    """``w (C, 1, KH, KW)`` -> ``(ceil(C/16), KH*KW, 16)`` float32 (flat), and
    :func:`pack_bias` of ``bias``; padded channels 0."""
    c, kk = w.shape[0], w.shape[2] * w.shape[3]
    nb = -(-c // LANES)
    wt = np.zeros((nb * LANES, kk), np.float32)
    wt[:c] = np.asarray(w, np.float32).reshape(c, kk)
    return np.ascontiguousarray(wt.reshape(nb, LANES, kk).transpose(0, 2, 1)).reshape(-1), \
        pack_bias(bias, c)


def pack_bias(bias, c: int) -> np.ndarray:
    """``bias (C,)`` or None -> ``(ceil(C/16) * 16,)`` float32, padded with 0."""
    b = np.zeros(-(-c // LANES) * LANES, np.float32)
    if bias is not None:
        b[:c] = np.asarray(bias, np.float32).reshape(c)
    return b


def run(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, kernel, strides, dilations,
        pads_begin, out_shape, z=None, alpha: float = 1.0, lo: float = -np.inf,
        hi: float = np.inf, threads: int = 1) -> np.ndarray:
    """The depthwise conv of float32 ``x (N, C, H, W)`` with :func:`pack`'s
    ``wt`` / ``bias`` (input and output planes of at least 16 pixels, else
    ValueError): ``y (N, C, OH, OW)`` float32, ``z`` (optional) a
    residual of y's shape, the epilogue ``min(max(where(v < 0, alpha*v, v),
    lo), hi)``. Pads at the end are implied by ``out_shape``."""
    return _drive(x, 0, wt, bias, None, kernel, strides, dilations, pads_begin, out_shape, z,
                  alpha, lo, hi, threads)


def pool(x: np.ndarray, is_max: bool, kernel, strides, dilations, pads_begin, out_shape,
         counts=None, threads: int = 1) -> np.ndarray:
    """MaxPool / AveragePool of float32 ``x (N, C, H, W)`` -> ``y (N, C, OH,
    OW)`` float32 (input and output planes of at least 16 pixels, else
    ValueError). MaxPool: IEEE ``maxNum`` over the window's taps in
    row-major order from the first (a NaN loses to a number, an all-NaN
    window gives NaN, a window wholly in the padding ``-inf``: the values of
    :mod:`._pool_flat` and the numpy tap path). AveragePool: the taps' sum in
    row-major order (pads add 0) divided by ``counts[0][oy] * counts[1][ox]``
    (the caller's divisor factors: pads counted or not)."""
    oh, ow = out_shape
    cnt = np.ones(1, np.float32) if is_max else np.ascontiguousarray(
        np.multiply.outer(np.asarray(counts[0], np.float32),
                          np.asarray(counts[1], np.float32)).reshape(oh * ow))
    return _drive(x, 1 if is_max else 2, _EMPTY, _EMPTY, cnt, kernel, strides, dilations,
                  pads_begin, out_shape, None, 1.0, -np.inf, np.inf, threads)


_EMPTY = np.zeros(LANES, np.float32)


@functools.lru_cache(maxsize=256)
def _tap_offsets(kh: int, kw: int, dh: int, dw: int, wp: int) -> np.ndarray:
    """Each tap's element offset in the channels-last scratch (read-only)."""
    t = np.array([(i * dh * wp + j * dw) * LANES for i in range(kh) for j in range(kw)], np.int64)
    t.flags.writeable = False
    return t


#: public name of the tap table (:mod:`._nchwc`)
tap_offsets = _tap_offsets


def padded_extent(h: int, w: int, kernel, strides, dilations, pads_begin, out) -> tuple[int, int]:
    """``(HP, WP)``: the padded plane every output pixel's window reads inside
    (the input plus its begin pads, and the end pads ``out`` implies)."""
    hp = max((out[0] - 1) * strides[0] + (kernel[0] - 1) * dilations[0] + 1, pads_begin[0] + h)
    wp = max((out[1] - 1) * strides[1] + (kernel[1] - 1) * dilations[1] + 1, pads_begin[1] + w)
    return hp, wp


def window_kind(kernel, strides, dilations) -> int:
    """Which unrolled window takes a depthwise conv: 1 (3x3 / 1), 2 (3x3 /
    2), 3 (5x5 / 1), 4 (5x5 / 2), both axes alike and dilation 1; else 0
    (the tap loop of the pixel steps)."""
    if tuple(dilations) != (1, 1) or kernel[0] != kernel[1] or strides[0] != strides[1]:
        return 0
    return {(3, 1): 1, (3, 2): 2, (5, 1): 3, (5, 2): 4}.get((kernel[0], strides[0]), 0)


def _drive(x, mode, wt, bias, cnt, kernel, strides, dilations, pads_begin, out_shape, z,
           alpha, lo, hi, threads):
    n, c, h, w = x.shape
    if h * w < LANES or out_shape[0] * out_shape[1] < LANES:
        raise ValueError(f"_dw_blocked takes planes of at least {LANES} pixels, got "
                         f"{(h, w)} -> {tuple(out_shape)}")
    kh, kw = kernel
    sh, sw = strides
    dh, dw = dilations
    pt, pl = pads_begin
    oh, ow = out_shape
    hp, wp = padded_extent(h, w, kernel, strides, dilations, pads_begin, out_shape)
    toffs = _tap_offsets(kh, kw, dh, dw, wp)
    y = np.empty((n, c, oh, ow), np.float32)
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    yf = y.reshape(-1)
    # without z the masked-off z gathers address y itself (never a page that
    # is not present: docs/speed.md round 11)
    zf = yf if z is None else np.ascontiguousarray(z, dtype=np.float32).reshape(-1)
    cnt = _EMPTY if cnt is None else cnt
    win = window_kind(kernel, strides, dilations) if mode == 0 and WINDOWS else 0
    ints = (mode, c, h, w, oh, ow, sh, sw, pt, pl, hp, wp, win)
    has_z = 0 if z is None else 1
    args = (xf, wt, bias, zf, has_z, yf, toffs, cnt, *ints, np.float32(alpha), np.float32(lo),
            np.float32(hi))
    items = n * -(-c // LANES)
    if threads > 1 and items > 1:
        from . import _conv_split, _parallel
        if _conv_split.depthwise_blocks(xf, wt, bias, zf, has_z, yf, toffs, cnt, ints,
                                        np.array([alpha, lo, hi], np.float32), items, threads):
            return y  # on the compiled partner threads
        per = -(-items // threads)
        _parallel.run_chunks(lambda i: _blocks(*args, i * per, min(items, (i + 1) * per)),
                             -(-items // per), threads)
    else:
        _blocks(*args, 0, items)
    return y
