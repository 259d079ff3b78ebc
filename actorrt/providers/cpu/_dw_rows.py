"""Float32 2-D depthwise convolution over NCHW rows, 16-lane vectors
(AVX-512): for wide planes, where the channel-blocked kernel of
:mod:`._dw_blocked` pays two 16 x 16 transposes a pixel vector.

Per plane (one channel of one image):

1. the input plane is copied into a zero-padded plane ``P (H + PT + PB,
   WP)`` (``PL`` zero columns on the left, zeros past the row; the pads are
   written once, the copy rewrites only the interior);
2. output row ``oy``'s vector of 16 outputs ``ox .. ox + 15`` is ``bias +
   sum over (ky, kx) of w[ky, kx] * P[oy * SH + ky, ox * SW + kx]`` (at ``SW
   = 2`` two loads and an even-lane shuffle per tap), then ``+ z``, then
   ``min(max(where(v < 0, alpha * v, v), lo), hi)``, stored; a row's last
   vector is its last 16 outputs (recomputed, never past the row), rows
   under 16 outputs store masked.

The taps are summed in row-major order from the bias (the order of
:mod:`._dw_blocked`), with fused multiply-adds. Planes are the work items: on
the compiled partner threads (:func:`._conv_split.row_depthwise`) or
:func:`._parallel.run_chunks` with more than one intra-op thread.

Shapes: ``x (N, C, H, W)`` float32, ``w (C, 1, KH, KW)`` float32 (one output
channel per input channel), ``y (N, C, OH, OW)`` float32. Spec: ONNX Conv with
``group = C``, dilations 1, column stride 1 or 2.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _conv_tiles as _ct

__all__ = ["HAVE_KERNEL", "ENABLED", "MIN_WIDTH", "PREFER_WIDTH", "applies", "Plan",
           "make_plan", "pack_bias", "run", "planes_range"]

#: use the row kernel where :func:`applies` (tests switch it off to check the
#: other depthwise paths)
ENABLED = True
#: ... for output rows at least this wide (narrower rows leave a vector's
#: lanes idle; the blocked kernel takes them: docs/speed.md round 15)
MIN_WIDTH = 32
#: ... and before the channel-blocked kernel (where that applies too) from
#: output rows this wide (per layer, one thread: 32x80x80 3x3 84 vs 98 us,
#: 144x56x56 178 vs 210, 96x112 -> 56 stride 2 262 vs 260; 128x40x40 99 vs
#: 80, 192x28x28 93 vs 69: the blocked kernel there)
PREFER_WIDTH = 56
LANES = 16
HAVE_KERNEL = bool(_ct.HAVE_KERNEL and _ct.VW == LANES)

if HAVE_KERNEL:
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from ._dw_blocked import mload_store_fns

    _f32, _i1, _i32, _i64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
    _V = ir.VectorType
    _VF = _V(_f32, LANES)

    def _loop(builder, n, inits, name, body):
        """``for i in range(n)`` (``n >= 1``) carrying the values ``inits``:
        ``body(i, values) -> new values``; returns the values after it."""
        entry = builder.block
        loop = builder.append_basic_block(f"{name}.loop")
        done = builder.append_basic_block(f"{name}.done")
        builder.branch(loop)
        builder.position_at_end(loop)
        i = builder.phi(_i64)
        i.add_incoming(_i64(0), entry)
        phis = []
        for v in inits:
            ph = builder.phi(v.type)
            ph.add_incoming(v, entry)
            phis.append(ph)
        new = body(i, phis)
        end = builder.block  # the body may have opened blocks of its own
        i1 = builder.add(i, _i64(1))
        i.add_incoming(i1, end)
        for ph, v in zip(phis, new):
            ph.add_incoming(v, end)
        builder.cbranch(builder.icmp_signed("<", i1, n), loop, done)
        builder.position_at_end(done)
        return new

    def _vecs_codegen(stride, nv, masked):
        def codegen(context, builder, sig, args):
            """``nv`` vectors of 16 outputs at ``y[y_off + o_v + i]``, ``o_v
            = 16 v`` and the last at ``o_last`` (lanes ``i < nvalid`` when
            ``masked``: one vector): the bias, the taps ``w[w_off + ky * kw
            + kx] * p[p_off + ky * wp + (o_v + i) * stride + kx]`` in
            row-major order (``p`` read unmasked: a padded plane with
            slack), ``z`` at y's offsets when ``has_z``, then the clamps.
            The vectors' sums are independent chains (a fused multiply-add's
            latency hidden) sharing each weight broadcast."""
            ya, pa, wa, za = (context.make_array(sig.args[i])(context, builder, args[i]).data
                              for i in (0, 2, 4, 10))
            y_off, p_off, w_off, kh, kw, wp, last, has_z = (
                _ct.as_i64(builder, args[i]) for i in (1, 3, 5, 6, 7, 8, 9, 11))
            bias, alpha, lo, hi = args[12], args[13], args[14], args[15]
            even = ir.Constant(_V(_i32, LANES), [2 * i for i in range(LANES)])
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]), f"llvm.fma.v{LANES}f32")
            offs = [_i64(LANES * v) for v in range(nv - 1)] + [last if nv > 1 or not masked
                                                              else _i64(0)]
            if nv == 1 and not masked:
                offs = [last]

            def tap(at):
                a = builder.load(_ct.vec_ptr(builder, pa, at, LANES), align=4)
                if stride == 1:
                    return a
                b = builder.load(_ct.vec_ptr(builder, pa, builder.add(at, _i64(LANES)), LANES),
                                 align=4)
                return builder.shuffle_vector(a, b, even)

            acc0 = _ct.splat(builder, bias, LANES)

            def row_body(ky, accs):
                row = builder.add(p_off, builder.mul(ky, wp))
                wrow = builder.add(w_off, builder.mul(ky, kw))

                def col_body(kx, accs2):
                    wv = _ct.splat(builder, builder.load(builder.gep(wa, [builder.add(wrow, kx)])),
                                   LANES)
                    base = builder.add(row, kx)
                    return [builder.call(fma, [wv, tap(builder.add(base, builder.mul(
                        o, _i64(stride)))), a]) for o, a in zip(offs, accs2)]
                return _loop(builder, kw, accs, "dwr.kx", col_body)

            finals = _loop(builder, kh, [acc0] * nv, "dwr.ky", row_body)
            zero = ir.Constant(_VF, [0.0] * LANES)
            zon = builder.icmp_signed("!=", has_z, _i64(0))
            alv = _ct.splat(builder, alpha, LANES)
            lov, hiv = _ct.splat(builder, lo, LANES), _ct.splat(builder, hi, LANES)
            mask = None
            mload, mstore = mload_store_fns(builder)
            if masked:
                mask = builder.icmp_signed(
                    "<", ir.Constant(_V(_i64, LANES), list(range(LANES))),
                    _ct.splat(builder, last, LANES))
            for o, v in zip(offs, finals):
                at = builder.add(y_off, o)
                zptr = _ct.vec_ptr(builder, za, at, LANES)
                if masked:
                    zmask = builder.and_(mask, _ct.splat(builder, zon, LANES, ty=_i1))
                    zv = builder.call(mload, [zptr, _i32(4), zmask, zero])
                else:  # no z: no load (y's own cells, just stored in part)
                    zv = builder.call(mload, [zptr, _i32(4), _ct.splat(builder, zon, LANES,
                                                                       ty=_i1), zero])
                v = builder.fadd(v, zv)
                v = builder.select(builder.fcmp_ordered("<", v, zero), builder.fmul(v, alv), v)
                v = builder.select(builder.fcmp_ordered("<", v, lov), lov, v)
                v = builder.select(builder.fcmp_ordered(">", v, hiv), hiv, v)
                yptr = _ct.vec_ptr(builder, ya, at, LANES)
                if masked:
                    builder.call(mstore, [v, yptr, _i32(4), mask])
                else:
                    builder.store(v, yptr, align=4)
            return context.get_dummy_value()
        return codegen

    def _vecs_intrinsic(stride, nv, masked):
        def typer(typingctx, y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias,
                  alpha, lo, hi):
            if any(getattr(a, "dtype", None) != types.float32 for a in (y, p, w, z)):
                return None
            sig = types.void(y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z,
                             types.float32, types.float32, types.float32, types.float32)
            return sig, _vecs_codegen(stride, nv, masked)
        typer.__name__ = f"_dw_vecs_s{stride}_x{nv}{'_masked' if masked else ''}"
        return intrinsic(typer)

    #: vectors a call computes at most (independent chains: 4 x 16 outputs)
    NV = 4
    _V1 = [None] + [_vecs_intrinsic(1, v, False) for v in range(1, NV + 1)]
    _V2 = [None] + [_vecs_intrinsic(2, v, False) for v in range(1, NV + 1)]
    _v1_1, _v1_2, _v1_3, _v1_4 = _V1[1:]
    _v2_1, _v2_2, _v2_3, _v2_4 = _V2[1:]
    _v1_m, _v2_m = _vecs_intrinsic(1, 1, True), _vecs_intrinsic(2, 1, True)

    @njit(nogil=True, cache=True, inline="always")
    def _vecs(sw, nv, y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias, alpha,
              lo, hi):  # pragma: no cover - compiled
        if sw == 1:
            if nv == 4:
                _v1_4(y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias, alpha, lo, hi)
            elif nv == 3:
                _v1_3(y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias, alpha, lo, hi)
            elif nv == 2:
                _v1_2(y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias, alpha, lo, hi)
            elif nv == 1:
                _v1_1(y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias, alpha, lo, hi)
            else:
                _v1_m(y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias, alpha, lo, hi)
        else:
            if nv == 4:
                _v2_4(y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias, alpha, lo, hi)
            elif nv == 3:
                _v2_3(y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias, alpha, lo, hi)
            elif nv == 2:
                _v2_2(y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias, alpha, lo, hi)
            elif nv == 1:
                _v2_1(y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias, alpha, lo, hi)
            else:
                _v2_m(y, y_off, p, p_off, w, w_off, kh, kw, wp, last, z, has_z, bias, alpha, lo, hi)

    @njit(nogil=True, cache=True)
    def _planes(x, w, bias, z, has_z, y, c, h, wd, oh, ow, kh, kw, sh, sw, pt, pl, hp, wp,
                alpha, lo, hi, p0, p1):  # pragma: no cover - compiled
        """Planes ``[p0, p1)`` (image * C + channel) of flat ``x`` into flat
        ``y`` (``z`` read at y's offsets when ``has_z``); ``w`` flat ``(C *
        KH * KW)``, ``bias (C,)``."""
        pad = np.zeros(hp * wp + 2 * LANES, np.float32)  # pads stay zero
        kk = kh * kw
        for p in range(p0, p1):
            ch = p % c
            xb = p * h * wd
            for iy in range(h):
                dst = pad[(iy + pt) * wp + pl:(iy + pt) * wp + pl + wd]
                src = x[xb + iy * wd:xb + (iy + 1) * wd]
                for j in range(wd):
                    dst[j] = src[j]
            yb = p * oh * ow
            b = bias[ch]
            for oy in range(oh):
                prow = oy * sh * wp
                yr = yb + oy * ow
                # one call site: two inlined copies of the vector variants
                # made the loop 4x slower (round 15)
                for o0 in range(0, max(ow, 1), NV * LANES):
                    rest = ow - o0
                    o = o0
                    if ow < LANES:  # one masked vector (nv 0)
                        nv, last = 0, ow
                    elif rest >= NV * LANES:
                        nv, last = NV, (NV - 1) * LANES
                    elif rest >= LANES:  # the last vector ends at the row's end
                        nv, last = (rest + LANES - 1) // LANES, rest - LANES
                    else:  # under 16 left: the row's last 16 outputs (recomputed in part)
                        nv, last, o = 1, 0, ow - LANES
                    _vecs(sw, nv, y, yr + o, pad, prow + o * sw, w, ch * kk, kh, kw, wp, last, z,
                          has_z, b, alpha, lo, hi)

    #: public name of :func:`_planes` (the split of :mod:`._conv_split`)
    planes_range = _planes


def applies(x_shape, w_shape, group: int, out_shape, strides, dilations) -> bool:
    """A float32 2-D depthwise conv (``group = C = M``) of dilation 1, column
    stride 1 or 2, output rows of at least :data:`MIN_WIDTH` (AVX-512
    kernels, :data:`ENABLED`)."""
    if not (ENABLED and HAVE_KERNEL and len(x_shape) == 4 and len(w_shape) == 4):
        return False
    c = x_shape[1]
    return group == c == w_shape[0] and w_shape[1] == 1 and tuple(dilations) == (1, 1) \
        and strides[1] in (1, 2) and out_shape[1] >= MIN_WIDTH


def pack_bias(bias, c: int) -> np.ndarray:
    """``bias (C,)`` or None as float32 ``(C,)`` (zeros for None)."""
    if bias is None:
        return np.zeros(c, np.float32)
    return np.ascontiguousarray(bias, dtype=np.float32).reshape(c)


class Plan:
    """The geometry of one depthwise conv: ``ints`` (c, h, w, oh, ow, kh, kw,
    sh, sw, pt, pl, hp, wp), ``y_shape``."""

    __slots__ = ("ints", "y_shape", "blocks")

    def __init__(self, ints, y_shape):
        self.ints, self.y_shape, self.blocks = ints, y_shape, None


def make_plan(x_shape, kernel, strides, pads_begin, out_shape) -> Plan:
    """The plan of a depthwise conv over ``x (N, C, H, W)`` (pads at the end
    implied by ``out_shape``)."""
    n, c, h, w = x_shape
    (kh, kw), (sh, sw), (pt, pl), (oh, ow) = kernel, strides, pads_begin, out_shape
    hp = max(h + pt, (oh - 1) * sh + kh)
    # the padded row: left pad, the row, what the taps reach (at stride 2 two
    # 16-float vectors from 2 * ox + kx)
    wp = max(pl + w, sw * ow + kw + LANES)
    return Plan(np.array([c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, hp, wp], np.int64),
                (n, c, oh, ow))


#: split the planes over the intra-op threads from this many outputs x taps
PARALLEL_MIN_WORK = 1 << 18


def run(plan: Plan, x: np.ndarray, w: np.ndarray, bias: np.ndarray, z=None,
        alpha: float = 1.0, lo: float = -np.inf, hi: float = np.inf,
        threads: int = 1) -> np.ndarray:
    """``y (N, C, OH, OW)`` float32 (the module doc) of float32 ``x`` of the
    plan's input shape, ``w (C, 1, KH, KW)``, ``bias (C,)`` float32, ``z``
    None or of y's shape; ``threads``: intra-op threads to split the planes
    over (from :data:`PARALLEL_MIN_WORK`)."""
    n, c, oh, ow = plan.y_shape
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    # rows under 16 outputs store masked vectors that address the next row
    y = _ct.empty_with_slack(plan.y_shape, np.float32) if ow < LANES \
        else np.empty(plan.y_shape, np.float32)
    yf = y.reshape(-1)
    zf = yf if z is None else np.ascontiguousarray(z, dtype=np.float32).reshape(-1)
    if z is not None and ow < LANES:
        zf = _ct.readable(zf)
    wf = np.ascontiguousarray(w, dtype=np.float32).reshape(-1)
    args = (xf, wf, bias, zf, 0 if z is None else 1, yf, *(int(v) for v in plan.ints),
            np.float32(alpha), np.float32(lo), np.float32(hi))
    planes = n * c
    kk = int(plan.ints[5] * plan.ints[6])
    if threads > 1 and planes > 1 and y.size * kk >= PARALLEL_MIN_WORK:
        from . import _conv_split
        if _conv_split.row_depthwise(plan, args, planes, threads):
            return y
        from . import _parallel
        per = -(-planes // (_parallel.CHUNKS_PER_THREAD * threads))
        _parallel.run_chunks(lambda i: _planes(*args, i * per, min(planes, (i + 1) * per)),
                             -(-planes // per), threads)
        return y
    _planes(*args, 0, planes)
    return y
