"""Channel-blocked direct convolution for small planes: 16 output channels a
vector, onnxruntime's NCHWc arrangement formed per call from NCHW data.

The direct kernel of :mod:`._conv_direct` vectorizes over an output row's
pixels; on 4x4 to 14x14 planes most of its lanes are idle or its channel
tiles pay a scattered store (1.2-1.5x onnxruntime per layer, 3x in resnetish's
4x4 and 8x8 layers in the model). Here, per image:

1. every 16-channel block of the input goes into a zero-padded channels-last
   scratch ``xs (ICB, HP, WP, 16)`` by the 16 x 16 in-register transposes of
   :mod:`._dw_blocked`;
2. a tile of ``P`` output pixels (flat: a tile may span rows) x ``B``
   16-channel output blocks keeps ``P * B`` accumulators in registers; per
   reduction index ``k = (icb, kh, kw, lane)`` it loads ``B`` weight vectors
   and broadcasts ``P`` input values: ``acc[p, b] += xs[pix[p] + toffs[k]] *
   wt[k, b]``, the raw sums stored channels-last ``os (OCB, OH*OW, 16)``;
3. the same transposes take every output block back to 16 planes, adding the
   bias, the residual ``z`` (read in NCHW, contiguous) and the activation on
   the way.

The transposes cost ``O((C + M) * H * W)`` a call against the convolution's
``O(C * M * KH * KW * OH * OW)``: :func:`applies` asks for enough
multiply-adds per transposed value. An input of few channels (an RGB stem)
is instead copied as zero-padded channel planes and broadcast from there
(:func:`planes_applies`; the same tiles with element offsets).

Threads: a batch of at least ``threads`` images splits whole images over
the compiled partners of :mod:`._conv_split`; a smaller one runs per image
the input blocks, then (output group, pixel range) items.

* :data:`HAVE_KERNEL` -- built (numba, AVX-512 16-lane vectors).
* :func:`applies` / :func:`planes_applies` -- whether a conv of these shapes
  takes this kernel (:func:`fits` / :func:`planes_fit`: the same rule
  without :data:`ENABLED`).
* :func:`pack` -- weights ``(M, C, KH, KW)`` into the tiles' order.
* :func:`run` -- ``y = min(max(where(v < 0, alpha*v, v), lo), hi)`` of ``v =
  conv(x, w) + bias (+ z)``, float32 ``x (N, C, H, W)`` -> ``y (N, M, OH,
  OW)``; :func:`prepare` / :func:`execute` -- the same in two steps, the
  shape work done once per input shape (the per-call cost of small convs).
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import functools

import numpy as np

from . import _dw_blocked as _dwb

__all__ = ["HAVE_KERNEL", "ENABLED", "IMAGE_CHUNK", "K_BLOCK_BYTES", "MAX_PIXELS", "MIN_FILL",
           "MIN_INTENSITY", "MIN_INTENSITY_1X1", "PLANES_MAX_CHANNELS", "PLANES_MAX_PIXELS",
           "PLANES_MIN_REDUCTION", "applies", "fits", "pack", "pack_bias", "planes_applies",
           "planes_fit", "run", "prepare", "execute", "Prepared"]

LANES = 16
#: pixels a tile for ``B`` output blocks (``P * B`` = 24 accumulators of 32 zmm)
TILE_PIXELS = {1: 16, 2: 8, 3: 6, 4: 6}
_P1, _P2, _P3, _P4 = (TILE_PIXELS[b] for b in (1, 2, 3, 4))
HAVE_KERNEL = _dwb.HAVE_KERNEL
#: take this kernel where :func:`applies`
ENABLED = True
#: output planes of at most this many pixels (larger: the direct kernel's row
#: tiles; per layer, 1 thread, blocked / direct: 3x3 64 on 56x56 0.85, 3x3 128
#: on 28x28 0.84, 3x3 256 on 14x14 0.67; models up to 1 << 30 pixels:
#: vgg19 0.93, resnet50 / inception_v2 / mobilenetish 1.00-1.04)
MAX_PIXELS = 4096
#: a tile's reduction runs in blocks of about this many bytes of its group's
#: weights (kept in L2 across the pixel tiles; 3x3 512 on 7x7 holds 1.2 MB a
#: group)
K_BLOCK_BYTES = 1 << 18
#: inputs of at most this many channels (stems) are read as channel planes
PLANES_MAX_CHANNELS = 8
#: ... for outputs of at most this many pixels
PLANES_MAX_PIXELS = 1 << 16
#: ... and reductions (``C * KH * KW``) of at least this many values
PLANES_MIN_REDUCTION = 27
#: pixels a range of one thread's image (a multiple of 48: the tiles' 6, 8 and 16
#: pixels, the 16-pixel output transposes): a range's sums stay in L2
IMAGE_CHUNK = 768
#: input and output channels filling at least this share of their blocks
MIN_FILL = 0.75
#: multiply-adds per transposed value at least this: ``C * M * KH * KW / (C +
#: M)`` (the transposes move ``C + M`` values a pixel, the tiles do ``C * M *
#: KH * KW`` multiply-adds). Per layer, blocked / direct: 1x1 96 -> 16 (13.7)
#: 1.55, 128 -> 32 (25.6) 1.26, 32 -> 128 (25.6) 1.05, 256 -> 64 (51) 0.95,
#: 1024 -> 256 on 14x14 (205) 0.80; 3x3 16 -> 64 (115) 0.88
MIN_INTENSITY = 48
#: ... for 1x1 convolutions (the direct kernel / the GEMM read their input
#: in place): in resnet50, 1x1 64 -> 256 on 56x56 (51) 1.1-1.45, 128 -> 512
#: on 28x28 (102) 0.72-0.90, 1024 -> 256 on 14x14 (205) 0.91
MIN_INTENSITY_1X1 = 96

if HAVE_KERNEL:
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    from . import _conv_tiles as _ct

    _f32, _i1, _i32, _i64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
    _V = ir.VectorType
    _as_i64, _splat, _vptr = _ct.as_i64, _ct.splat, _ct.vec_ptr

    def _tile_codegen(npix_max: int, nb: int, epilogue: bool = False):
        """``P = npix_max`` pixels x ``B = nb`` output blocks, reduction
        indices ``k0 <= k < k1``: ``acc[p, b] = sum_k xs[pix[p0 + p] +
        toffs[k]] * wt[w_off + (k * B + b) * 16 : +16]``, starting from 0
        (``k0 == 0``) or from the sums stored so far, stored raw to ``os[o_off
        + b * ohw16 + (p0 + p) * 16 : +16]`` for ``p < npix`` (pixels past
        ``npix`` compute pixel ``p0``'s sums, stored nowhere).

        ``epilogue`` (:mod:`._nchwc`'s blocked outputs): seven more
        arguments ``bias, b_off, z, has_z, alpha, lo, hi, nvalid, last``;
        where ``last`` is nonzero the stored vectors are ``v = acc +
        bias[b_off + b * 16 : +16] (+ z at the store's offset)``, then
        ``where(v < 0, alpha * v, v)`` clamped to ``[lo, hi]``, lanes
        ``b * 16 + l >= nvalid`` set to 0."""
        def codegen(context, builder, sig, args):
            xa, pa, ta, wa, oa = (context.make_array(sig.args[i])(context, builder, args[i]).data
                                  for i in (0, 1, 4, 6, 8))
            p0, npix, k0, kk, w_off, o_off, ohw16 = (
                _as_i64(builder, args[i]) for i in (2, 3, 5, 11, 7, 9, 10))
            vf = _V(_f32, LANES)
            fast = ("fast",)
            zero = ir.Constant(vf, [0.0] * LANES)
            bases, outs = [], []
            for p in range(npix_max):
                at = builder.select(builder.icmp_signed("<", _i64(p), npix),
                                    builder.add(p0, _i64(p)), p0)
                bases.append(builder.load(builder.gep(pa, [at])))
                outs.append([builder.add(builder.add(o_off, builder.mul(_i64(b), ohw16)),
                                         builder.mul(at, _i64(LANES))) for b in range(nb)])
            # a later reduction block starts from the sums stored so far
            first = builder.icmp_signed("==", k0, _i64(0))
            inits = [builder.select(first, zero, builder.load(_vptr(builder, oa, outs[p][b],
                                                                    LANES), align=4))
                     for p in range(npix_max) for b in range(nb)]
            entry, loop, done, k, accs = _ct.open_loop(builder, kk, npix_max * nb, None, "cbt",
                                                       start=k0, inits=inits)
            t = builder.load(builder.gep(ta, [k]))
            wb = builder.add(w_off, builder.mul(k, _i64(LANES * nb)))
            wv = [builder.load(_vptr(builder, wa, builder.add(wb, _i64(LANES * b)), LANES),
                               align=4) for b in range(nb)]
            new = []
            for p in range(npix_max):
                xv = _splat(builder, builder.load(builder.gep(xa, [builder.add(bases[p], t)])),
                            LANES)
                for b in range(nb):
                    new.append(builder.fadd(accs[p * nb + b],
                                            builder.fmul(wv[b], xv, flags=fast), flags=fast))
            finals = _ct.close_loop(builder, kk, entry, loop, done, k, accs, new, None,
                                    inits=inits)
            if epilogue:
                finals = _tile_epilogue(context, builder, sig, args, finals, outs, npix_max, nb)
            for p in range(npix_max):
                with builder.if_then(builder.icmp_signed("<", _i64(p), npix), likely=True):
                    for b in range(nb):
                        builder.store(finals[p * nb + b], _vptr(builder, oa, outs[p][b], LANES),
                                      align=4)
            return context.get_dummy_value()
        return codegen

    def _tile_epilogue(context, builder, sig, args, finals, outs, npix_max, nb):
        """:func:`_tile_codegen`'s ``epilogue`` on the final sums (a branch on
        ``last``: earlier reduction blocks store the raw sums)."""
        ba, za = (context.make_array(sig.args[i])(context, builder, args[i]).data
                  for i in (12, 14))
        b_off, has_z, nvalid, last = (_as_i64(builder, args[i]) for i in (13, 15, 19, 20))
        alpha, lo, hi = args[16], args[17], args[18]
        vf = _V(_f32, LANES)
        fast = ("fast",)
        zero = ir.Constant(vf, [0.0] * LANES)
        before = builder.block
        with builder.if_then(builder.icmp_signed("!=", last, _i64(0)), likely=True):
            alv, lov, hiv = (_splat(builder, s, LANES) for s in (alpha, lo, hi))
            iota = ir.Constant(_V(_i64, LANES), list(range(LANES)))
            zflag = builder.icmp_signed("!=", has_z, _i64(0))
            bvs, keep = [], []
            for b in range(nb):
                bvs.append(builder.load(_vptr(builder, ba, builder.add(b_off, _i64(LANES * b)),
                                              LANES), align=4))
                keep.append(builder.icmp_signed("<", iota, _splat(
                    builder, builder.sub(nvalid, _i64(LANES * b)), LANES)))
            done_vals = []
            for p in range(npix_max):
                for b in range(nb):
                    v = builder.fadd(finals[p * nb + b], bvs[b], flags=fast)
                    zv = builder.load(_vptr(builder, za, outs[p][b], LANES), align=4)
                    v = builder.select(zflag, builder.fadd(v, zv, flags=fast), v)
                    v = builder.select(builder.fcmp_ordered("<", v, zero),
                                       builder.fmul(v, alv, flags=fast), v)
                    v = builder.select(builder.fcmp_ordered("<", v, lov), lov, v)
                    v = builder.select(builder.fcmp_ordered(">", v, hiv), hiv, v)
                    done_vals.append(builder.select(keep[b], v, zero))
            then = builder.block
        out = []
        for raw, val in zip(finals, done_vals):
            phi = builder.phi(raw.type)
            phi.add_incoming(raw, before)
            phi.add_incoming(val, then)
            out.append(phi)
        return out

    def _tile_intrinsic(nb: int):
        def typer(typingctx, xs, pix, p0, npix, toffs, k0, wt, w_off, os_, o_off, ohw16, k1):
            if any(getattr(a, "dtype", None) != types.float32 for a in (xs, wt, os_)):
                return None
            return (types.void(xs, pix, p0, npix, toffs, k0, wt, w_off, os_, o_off, ohw16, k1),
                    _tile_codegen(TILE_PIXELS[nb], nb))
        typer.__name__ = f"_cb_tile_{nb}"
        return intrinsic(typer)

    _tile1, _tile2, _tile3, _tile4 = (_tile_intrinsic(b) for b in (1, 2, 3, 4))

    def _tile_epilogue_intrinsic(nb: int):
        def typer(typingctx, xs, pix, p0, npix, toffs, k0, wt, w_off, os_, o_off, ohw16, k1,
                  bias, b_off, z, has_z, alpha, lo, hi, nvalid, last):
            if any(getattr(a, "dtype", None) != types.float32 for a in (xs, wt, os_, bias, z)) \
                    or any(f != types.float32 for f in (alpha, lo, hi)):
                return None
            return (types.void(xs, pix, p0, npix, toffs, k0, wt, w_off, os_, o_off, ohw16, k1,
                               bias, b_off, z, has_z, alpha, lo, hi, nvalid, last),
                    _tile_codegen(TILE_PIXELS[nb], nb, epilogue=True))
        typer.__name__ = f"_cb_tile_epilogue_{nb}"
        return intrinsic(typer)

    #: the tiles with the epilogue on their last reduction block (:mod:`._nchwc`)
    tile_ep1, tile_ep2, tile_ep3, tile_ep4 = (_tile_epilogue_intrinsic(b) for b in (1, 2, 3, 4))

    def _out_codegen(context, builder, sig, args):
        """Pixels ``p0 .. p0 + count - 1`` of one output block: the raw sums
        ``os[(p0 + i) * 16 : +16]`` transposed; channel ``l < nvalid``'s row
        ``v + bias[b_off + l] (+ z at the row's place)``, the epilogue,
        stored to ``y[y_off + l * ohw + p0 :][:count]`` (planes of at least
        16 pixels; a tail chunk as the plane's last 16 lanes, those before
        ``p0`` masked off, as :mod:`._dw_blocked`'s output transposes)."""
        oa, ya, ba, za = (context.make_array(sig.args[i])(context, builder, args[i]).data
                          for i in (0, 2, 7, 9))
        p0, y_off, ohw, nvalid, count, b_off, has_z = (_as_i64(builder, args[i])
                                                       for i in (1, 3, 4, 5, 6, 8, 10))
        alpha, lo, hi = args[11], args[12], args[13]
        vf = _V(_f32, LANES)
        fast = ("fast",)
        zero = ir.Constant(vf, [0.0] * LANES)
        mload, mstore = _dwb.mload_store_fns(builder)
        rows = []
        for i in range(LANES):  # pixels past count read pixel p0 (stored nowhere)
            at = builder.select(builder.icmp_signed("<", _i64(i), count),
                                builder.mul(builder.add(p0, _i64(i)), _i64(LANES)),
                                builder.mul(p0, _i64(LANES)))
            rows.append(builder.load(_vptr(builder, oa, at, LANES), align=4))
        full = builder.icmp_signed("==", count, _i64(LANES))
        start = builder.select(full, p0, builder.sub(ohw, _i64(LANES)))
        shift, iota = _dwb.tail_shift(builder, count)
        idx = builder.select(full, iota, builder.sub(iota, _splat(builder, shift, LANES)))
        cols = builder.select(full, _dwb.lanes_below(builder, _i64(LANES)), builder.icmp_signed(
            ">=", ir.Constant(_V(_i64, LANES), list(range(LANES))),
            _splat(builder, builder.sub(_i64(LANES), count), LANES)))
        alv, lov, hiv = (_splat(builder, s, LANES) for s in (alpha, lo, hi))
        zflag = builder.icmp_signed("!=", has_z, _i64(0))
        for l, v in enumerate(_dwb.transpose16(builder, rows)):
            valid = builder.icmp_signed("<", _i64(l), nvalid)
            ok = builder.and_(cols, _splat(builder, valid, LANES, ty=_i1))
            lane = builder.select(valid, _i64(l), _i64(0))
            at = builder.add(builder.add(y_off, builder.mul(lane, ohw)), start)
            v = _dwb.permute(builder, v, idx)
            v = builder.fadd(v, _splat(builder, builder.load(builder.gep(
                ba, [builder.add(b_off, lane)])), LANES), flags=fast)
            zv = builder.call(mload, [_vptr(builder, za, at, LANES), _i32(4),
                                      builder.and_(ok, _splat(builder, zflag, LANES, ty=_i1)),
                                      zero])
            v = builder.fadd(v, zv, flags=fast)
            v = builder.select(builder.fcmp_ordered("<", v, zero), builder.fmul(v, alv, flags=fast), v)
            v = builder.select(builder.fcmp_ordered("<", v, lov), lov, v)
            v = builder.select(builder.fcmp_ordered(">", v, hiv), hiv, v)
            builder.call(mstore, [v, _vptr(builder, ya, at, LANES), _i32(4), ok])
        return context.get_dummy_value()

    @intrinsic
    def _planes_out(typingctx, os_, p0, y, y_off, ohw, nvalid, count, bias, b_off, z, has_z,
                    alpha, lo, hi):
        if any(getattr(a, "dtype", None) != types.float32 for a in (os_, y, bias, z)) or \
                any(f != types.float32 for f in (alpha, lo, hi)):
            return None
        return (types.void(os_, p0, y, y_off, ohw, nvalid, count, bias, b_off, z, has_z, alpha,
                           lo, hi), _out_codegen)

    @njit(nogil=True, cache=True)
    def _in_range(x, xs, dst, c, hw, geo, n, start, stop):  # pragma: no cover - compiled
        """Input items ``[start, stop)`` of image ``n`` into the scratch ``xs``,
        their pad cells set to 0 (``geo``: ``h, w, pt, pl, hp, wp, lanes,
        items``): with 16 lanes an item is a 16-channel block (at ``b * HP *
        WP * 16``, channels last), with 1 a channel plane (at ``b * HP *
        WP``, row copies)."""
        h, w, pt, pl, hp, wp, ln = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6]
        blk = hp * wp * ln
        for b in range(start, stop):
            sub = xs[b * blk:(b + 1) * blk]
            sub[:pt * wp * ln] = 0.0
            for iy in range(pt, pt + h):
                r = iy * wp * ln
                sub[r:r + pl * ln] = 0.0
                sub[r + (pl + w) * ln:r + wp * ln] = 0.0
            sub[(pt + h) * wp * ln:] = 0.0
            if ln == 1:
                src = (n * c + b) * hw
                for iy in range(h):
                    r = (iy + pt) * wp + pl
                    _ct.copy_f32(sub, r, x, src + iy * w, w)
                continue
            c0 = b * LANES
            for p0 in range(0, hw, LANES):
                _dwb.planes_in(x, (n * c + c0) * hw, hw, min(LANES, c - c0), p0, sub, dst,
                               min(LANES, hw - p0))

    @njit(nogil=True, cache=True)
    def _tiles_range(xs, wt, bias, z, has_z, y, toffs, pix, groups, m, ohw, os_, alpha, lo, hi,
                     n, chunk, nchunks, start, stop):  # pragma: no cover - compiled
        """Items ``[start, stop)`` of image ``n``: item ``q * ngroups + g`` is
        output group ``g`` (``groups`` row: first block, blocks, weight
        offset) on pixels ``[q * chunk, (q + 1) * chunk)`` (``chunk`` a
        multiple of 16): its tiles into ``os_``, then its blocks' output
        transposes on those pixels."""
        kk = toffs.size
        ohw16 = ohw * LANES
        ng = groups.shape[0]
        for it in range(start, stop):
            g = it % ng
            q0 = (it // ng) * chunk
            q1 = min(ohw, q0 + chunk)
            b0 = groups[g, 0]
            nb = groups[g, 1]
            wo = groups[g, 2]
            oo = b0 * ohw16
            # reduction blocks of a group's weights of about K_BLOCK_BYTES
            kb = max(LANES, K_BLOCK_BYTES // (nb * LANES * 4) // LANES * LANES)
            for k0 in range(0, kk, kb):
                k1 = min(kk, k0 + kb)
                if nb == 4:
                    for p0 in range(q0, q1, _P4):
                        _tile4(xs, pix, p0, min(_P4, q1 - p0), toffs, k0, wt, wo, os_, oo, ohw16,
                               k1)
                elif nb == 3:
                    for p0 in range(q0, q1, _P3):
                        _tile3(xs, pix, p0, min(_P3, q1 - p0), toffs, k0, wt, wo, os_, oo, ohw16,
                               k1)
                elif nb == 2:
                    for p0 in range(q0, q1, _P2):
                        _tile2(xs, pix, p0, min(_P2, q1 - p0), toffs, k0, wt, wo, os_, oo, ohw16,
                               k1)
                else:
                    for p0 in range(q0, q1, _P1):
                        _tile1(xs, pix, p0, min(_P1, q1 - p0), toffs, k0, wt, wo, os_, oo, ohw16,
                               k1)
            for b in range(b0, b0 + nb):
                c0 = b * LANES
                sub = os_[b * ohw16:(b + 1) * ohw16]
                for p0 in range(q0, q1, LANES):
                    _planes_out(sub, p0, y, (n * m + c0) * ohw, ohw, min(LANES, m - c0),
                                min(LANES, q1 - p0), bias, c0, z, has_z, alpha, lo, hi)

    @njit(nogil=True, cache=True)
    def _images(x, wt, bias, z, has_z, y, toffs, pix, dst, groups, c, hw, m, ohw, geo,
                alpha, lo, hi, start, stop):  # pragma: no cover - compiled
        """Whole images ``[start, stop)`` on scratch of their own, in pixel
        ranges of :data:`IMAGE_CHUNK`."""
        xs = np.empty(geo[7] * geo[4] * geo[5] * geo[6], np.float32)
        os_ = np.empty((m + LANES - 1) // LANES * ohw * LANES, np.float32)
        ng = groups.shape[0]
        chunk = min(IMAGE_CHUNK, (ohw + LANES - 1) // LANES * LANES)
        nchunks = (ohw + chunk - 1) // chunk
        for n in range(start, stop):
            _in_range(x, xs, dst, c, hw, geo, n, 0, geo[7])
            _tiles_range(xs, wt, bias, z, has_z, y, toffs, pix, groups, m, ohw, os_, alpha, lo,
                         hi, n, chunk, nchunks, 0, ng * nchunks)

    #: public names of the phases (the compiled split of :mod:`._conv_split`)
    in_range, tiles_range, images = _in_range, _tiles_range, _images


#: ``bias (M,)`` or None -> ``(ceil(M/16) * 16,)`` float32 (padded with 0)
pack_bias = _dwb.pack_bias


def _groups(ocb: int) -> list[int]:
    """Output blocks per group: 4s, then one smaller group for the rest."""
    out = [4] * (ocb // 4)
    if ocb % 4:
        out.append(ocb % 4)
    return out


def applies(x_shape, w_shape, group: int, out_shape) -> bool:
    """A 2-D convolution with one group, input and output planes of 16 to
    :data:`MAX_PIXELS` pixels (output), channels filling at least
    :data:`MIN_FILL` of their 16-channel blocks and at least
    :data:`MIN_INTENSITY` (1x1: :data:`MIN_INTENSITY_1X1`) multiply-adds per
    transposed value."""
    return ENABLED and fits(x_shape, w_shape, group, out_shape)


def fits(x_shape, w_shape, group: int, out_shape) -> bool:
    """:func:`applies` whether or not :data:`ENABLED` (the shapes' rule)."""
    if not (HAVE_KERNEL and len(x_shape) == 4 and len(w_shape) == 4 and group == 1):
        return False
    c, m = x_shape[1], w_shape[0]
    ohw = out_shape[0] * out_shape[1]
    return LANES <= ohw <= MAX_PIXELS and x_shape[2] * x_shape[3] >= LANES and \
        c * m * w_shape[2] * w_shape[3] >= (
            MIN_INTENSITY_1X1 if w_shape[2] * w_shape[3] == 1 else MIN_INTENSITY) * (c + m) and \
        c >= MIN_FILL * LANES * -(-c // LANES) and m >= MIN_FILL * LANES * -(-m // LANES)


def planes_applies(x_shape, w_shape, group: int, out_shape, strides=(1, 1)) -> bool:
    """A 2-D convolution with one group and at most :data:`PLANES_MAX_CHANNELS`
    input channels (an RGB stem), read as channel planes (no input
    transposes): strided (both strides' product at least 4), 16 to
    :data:`PLANES_MAX_PIXELS` output pixels, a multiple of 16 output channels
    from 32, a reduction of at least :data:`PLANES_MIN_REDUCTION` values."""
    return ENABLED and planes_fit(x_shape, w_shape, group, out_shape, strides)


def planes_fit(x_shape, w_shape, group: int, out_shape, strides=(1, 1)) -> bool:
    """:func:`planes_applies` whether or not :data:`ENABLED`. Per stem, 1
    thread, this path / the direct kernel: 7x7 / 2 3 -> 64 on 224x224 0.87,
    11x11 / 4 3 -> 96 0.82, 3x3 / 2 3 -> 32 on 160x160 0.92; declined: 3x3 / 1
    3 -> 64 on 224x224 1.35, 3x3 / 2 3 -> 24 1.46, 7x7 / 2 3 -> 16 1.28."""
    if not (HAVE_KERNEL and len(x_shape) == 4 and len(w_shape) == 4 and group == 1):
        return False
    c, m = x_shape[1], w_shape[0]
    ohw = out_shape[0] * out_shape[1]
    return c <= PLANES_MAX_CHANNELS and LANES <= ohw <= PLANES_MAX_PIXELS and \
        strides[0] * strides[1] >= 4 and m >= 2 * LANES and m % LANES == 0 and \
        x_shape[2] * x_shape[3] >= LANES and c * w_shape[2] * w_shape[3] >= PLANES_MIN_REDUCTION


def pack(w: np.ndarray, bias, planes: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w (M, C, KH, KW)`` -> the tiles' weights (flat float32: per group of
    output blocks, per reduction index ``k`` -- ``(icb, kh, kw, lane)``, or
    with ``planes`` (an input read as channel planes) ``(c, kh, kw)`` -- the
    group's ``B`` vectors of 16 output channels; padded channels 0), the
    groups table ``(G, 3)`` int64 (first block, blocks, weight offset) and
    the bias ``(ceil(M/16) * 16,)`` float32."""
    m, c, kh, kw = w.shape
    ocb = -(-m // LANES)
    ci = c if planes else -(-c // LANES) * LANES
    wp = np.zeros((ocb * LANES, ci, kh, kw), np.float32)
    wp[:m, :c] = w
    if planes:  # (ocb, 16 o, c, kh, kw) -> (ocb, c, kh, kw, o)
        wr = wp.reshape(ocb, LANES, c, kh, kw).transpose(0, 2, 3, 4, 1)
    else:  # (ocb, 16 o, icb, 16 l, kh, kw) -> (ocb, icb, kh, kw, l, o)
        wr = wp.reshape(ocb, LANES, ci // LANES, LANES, kh, kw).transpose(0, 2, 4, 5, 3, 1)
    kk = ci * kh * kw
    parts, rows, off, b0 = [], [], 0, 0
    for nb in _groups(ocb):
        # (nb, k, 16) -> (k, nb, 16)
        g = wr[b0:b0 + nb].reshape(nb, kk, LANES).transpose(1, 0, 2)
        parts.append(np.ascontiguousarray(g).reshape(-1))
        rows.append((b0, nb, off))
        off += kk * nb * LANES
        b0 += nb
    return np.concatenate(parts), np.array(rows, np.int64), _dwb.pack_bias(bias, m)


def _chunk(ohw: int, ngroups: int, threads: int) -> int:
    """Pixels an item of the per-image split: a multiple of 48 (the tiles' 6,
    8 and 16 pixels and the 16-pixel output transposes) giving about four
    items a thread."""
    want = -(-ohw * ngroups // (4 * threads))
    per = max(1, -(-want // 48)) * 48
    return min(per, -(-ohw // 16) * 16)


@functools.lru_cache(maxsize=256)
def _geometry(c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, planes=False):
    """``(toffs, pix, dst, geo)`` of a geometry (read-only int64 arrays;
    ``geo`` = ``h, w, pt, pl, hp, wp, lanes, items``: 16 lanes and ``C/16``
    input blocks, or with ``planes`` 1 lane and ``C`` channel planes)."""
    hp = max((oh - 1) * sh + (kh - 1) * dh + 1, pt + h)
    wp = max((ow - 1) * sw + (kw - 1) * dw + 1, pl + w)
    ln = 1 if planes else LANES
    items = c if planes else -(-c // LANES)
    blk = hp * wp * ln
    toffs = (np.arange(items)[:, None, None, None] * blk
             + (np.arange(kh)[None, :, None, None] * dh * wp
                + np.arange(kw)[None, None, :, None] * dw) * ln
             + np.arange(ln)[None, None, None, :]).reshape(-1).astype(np.int64)
    oy, ox = np.divmod(np.arange(oh * ow), ow)
    pix = ((oy * sh * wp + ox * sw) * ln).astype(np.int64)
    iy, ix = np.divmod(np.arange(h * w), w)
    dst = (((iy + pt) * wp + ix + pl) * ln).astype(np.int64)
    geo = np.array([h, w, pt, pl, hp, wp, ln, items], np.int64)
    for a in (toffs, pix, dst, geo):
        a.flags.writeable = False
    return toffs, pix, dst, geo


#: public names of the geometry tables and the per-thread pixel chunk (:mod:`._nchwc`)
geometry, chunk_pixels = _geometry, _chunk


class Prepared:
    """One convolution's shape work, done once (:func:`prepare`): the packed
    weights, the offset tables, the output shape; :func:`execute` runs it."""

    __slots__ = ("wt", "groups", "toffs", "pix", "dst", "geo", "c", "hw", "m", "ohw",
                 "x_shape", "y_shape", "blocks")

    def __init__(self, **kw):
        self.blocks = []  # the partner split's parameter blocks (:mod:`._conv_split`)
        for k, v in kw.items():
            setattr(self, k, v)


def prepare(x_shape, wt: np.ndarray, groups: np.ndarray, kernel, strides, dilations,
            pads_begin, m: int, out_shape, planes: bool = False) -> Prepared:
    """The shape work of :func:`run` for inputs of ``x_shape``, once.

    Raises:
        ValueError: input or output planes under 16 pixels."""
    n, c, h, w = x_shape
    oh, ow = out_shape
    if h * w < LANES or oh * ow < LANES:
        raise ValueError(f"_conv_blocked takes planes of at least {LANES} pixels, got "
                         f"{(h, w)} -> {tuple(out_shape)}")
    toffs, pix, dst, geo = _geometry(c, h, w, *kernel, *strides, *dilations, *pads_begin,
                                     oh, ow, bool(planes))
    return Prepared(wt=wt, groups=groups, toffs=toffs, pix=pix, dst=dst, geo=geo, c=c,
                    hw=h * w, m=m, ohw=oh * ow, x_shape=tuple(x_shape),
                    y_shape=(n, m, oh, ow))


def execute(p: Prepared, x: np.ndarray, bias: np.ndarray, z, alpha, lo, hi,
            threads: int = 1) -> np.ndarray:
    """:func:`run` on prepared shape work: ``x`` float32 of ``p.x_shape``,
    ``bias`` :func:`pack_bias`'s, ``z`` None or of ``p.y_shape``; ``alpha``,
    ``lo``, ``hi`` the epilogue's (float32)."""
    n = p.y_shape[0]
    y = np.empty(p.y_shape, np.float32)
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    yf = y.reshape(-1)
    # without z the masked-off z loads address y itself (never an absent page)
    zf = yf if z is None else np.ascontiguousarray(z, dtype=np.float32).reshape(-1)
    args = (xf, p.wt, bias, zf, 0 if z is None else 1, yf, p.toffs, p.pix, p.dst, p.groups,
            p.c, p.hw, p.m, p.ohw, p.geo, alpha, lo, hi)
    if threads > 1:
        from . import _conv_split
        team = _conv_split.team_for(threads)
        if team is not None and n >= threads:  # whole images a thread
            if _conv_split.conv_blocked_images(team, args, n, threads, p.blocks):
                return y
        elif team is not None:  # per image: input blocks, then (group, pixels) items
            geo, m, ohw = p.geo, p.m, p.ohw
            xs = np.empty(int(geo[7] * geo[4] * geo[5] * geo[6]), np.float32)
            os_ = np.empty(-(-m // LANES) * LANES * ohw, np.float32)
            chunk = _chunk(ohw, p.groups.shape[0], threads)
            if _conv_split.conv_blocked_phases(team, args, xs, os_, chunk, n, threads,
                                               p.blocks):
                return y
    _images(*args, 0, n)
    return y


def run(x: np.ndarray, wt: np.ndarray, groups: np.ndarray, bias: np.ndarray, kernel, strides,
        dilations, pads_begin, m: int, out_shape, z=None, alpha: float = 1.0,
        lo: float = -np.inf, hi: float = np.inf, threads: int = 1,
        planes: bool = False) -> np.ndarray:
    """The convolution of float32 ``x (N, C, H, W)`` with :func:`pack`'s
    ``wt`` / ``groups`` / ``bias`` (``m`` output channels; ``planes``: packed
    with ``planes``, the input read as channel planes, :func:`planes_applies`'
    case): ``y (N, m, OH,
    OW)`` float32; ``z`` (optional) a residual of y's shape; the epilogue
    ``min(max(where(v < 0, alpha*v, v), lo), hi)``. Pads at the end are
    implied by ``out_shape``. Input and output planes of at least 16 pixels,
    else ValueError. ``threads > 1``: on the compiled partners (whole images
    a thread, or per image the input blocks, then output groups x pixel
    ranges), where there are partners. (:func:`prepare` then
    :func:`execute`.)"""
    p = prepare(x.shape, wt, groups, kernel, strides, dilations, pads_begin, m, out_shape,
                planes)
    return execute(p, x, bias, z, np.float32(alpha), np.float32(lo), np.float32(hi), threads)
