"""Direct (no patch matrix) float32 2-D convolution with a register-blocked
AVX2 micro-kernel, for the small-``M`` convolutions where im2col + OpenBLAS
sgemm loses most to onnxruntime's NCHWc kernels.

Used by :func:`._conv_util.conv_core` for float32 ``im2col`` / ``1x1``-path
convolutions when :func:`applies` (numba with AVX2 / FMA, see :data:`ENABLED`
and :data:`MAX_REDUCTION`); the numpy / BLAS path stays the fallback.

Layout and method:

* The input is copied once, zero-padded, into a *phase-split* buffer ``xs``
  ``(N, C, SH, SW, HI, WJ)`` with ``xs[n, c, py, px, i, j] = xpad[n, c, i*SH + py,
  j*SW + px]`` (for stride 1 it is just the padded input). Output ``(oy, ox)``'s
  tap ``(ky, kx)`` then reads ``xs[n, c, (ky*DH) % SH, (kx*DW) % SW, oy + (ky*DH)
  // SH, ox + (kx*DW) // SW]``: for consecutive ``ox`` consecutive elements, for any
  stride and dilation. A table ``offs`` holds each reduction index ``r = (c, ky,
  kx)``'s element offset from the row start.
* The micro-kernel (an LLVM IR intrinsic) computes ``MR`` output channels x
  ``8 * NV`` consecutive output columns of one output row: ``MR * NV`` ``<8 x
  float>`` accumulators in registers; per ``r`` it loads ``NV`` input vectors
  and broadcasts ``MR`` weights (packed ``(G, M/G/MR, R, MR)``, zero rows past
  ``M/G``). The store applies the epilogue (bias, residual ``Z``, then
  ``max(v, alpha*v)`` clamped to ``[lo, hi]``: Relu, LeakyRelu, Clip or none)
  and writes only the valid lanes and rows (``llvm.masked.store``), straight
  into ``y (N, M, OH, OW)``.
* Work items are (image, group, output row), each its column tiles times
  its channel blocks (the tile's input window stays in L1); more than one
  intra-op thread splits them into ranges on :func:`._parallel.run_chunks`.

Shapes: ``x (N, C, H, W)`` float32, ``w`` packed from the ``(G, M/G, C/G*KH*KW)``
GEMM layout of :func:`.conv._pack`; ``y (N, M, OH, OW)`` float32.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import math

import numpy as np

__all__ = ["HAVE_KERNEL", "ENABLED", "applies", "pack_weights", "conv2d", "make_plan", "run",
           "Plan", "act_params", "block_of", "ACT_BOUNDS"]

#: use the direct kernel where :func:`applies` (tests switch it off to check
#: the BLAS path and on to check this one)
ENABLED = True
#: ... and only up to this many output channels per group, unless the output
#: plane is at most :data:`SMALL_PLANE` pixels: in the A/B (loaded machine) 64+
#: channels over larger planes went 0.74-2.3x (1x16x55x55 -> 64: 1.55-1.99,
#: squeezenet's 7x7 stem -> 96: 2.26, 1x64x56x56 -> 64: 0.95-1.23), while every
#: layer of up to 32 channels, and the 64-channel ones on 4x4 planes, won (0.18-0.71);
#: squeezenet's 192/256-channel 13x13 expands (kernel A/B 0.84-1.01) made the model
#: 0.2-0.4 slower in four interleaved runs, so the plane limit is 8x8
MAX_MG = 32
SMALL_PLANE = 64
#: ... and only reductions of at least this many: shorter ones (3-channel 3x3
#: stems, 27) pay the tile's masked epilogue per 27 steps; shufflenet with its
#: 3x3 stem on the direct kernel measured 0.15-0.5 higher ratios in three
#: interleaved runs
MIN_REDUCTION = 64
#: reductions are cut into blocks of this many (channel, tap) pairs: a
#: block's input window stays in L1; later blocks add onto the stored sums,
#: the last applies the epilogue
REDUCTION_BLOCK = 576
#: bytes of packed weights (channel blocks x one reduction block) swept per
#: column tile: they stay in L2
WEIGHT_BLOCK_BYTES = 160 << 10
#: only convolutions whose reduction ``C/G * KH * KW`` is at most this take the
#: direct kernel: past it a tile's input window and a channel block's weights
#: outgrow L1 (no reduction blocking here) and im2col + sgemm was faster in the
#: A/B (3x3 over 128-512 channels: direct 1.2-1.9x slower; over 64 channels
#: 0.76-1.07; resnetish's 16-64-channel layers 0.18-0.58). Cutting the
#: reduction into L1-sized blocks (:data:`REDUCTION_BLOCK`) did not close that
#: gap (1.16-2.0x on the 128-512-channel layers, same A/B)
MAX_REDUCTION = 576

try:
    import numba  # noqa: F401
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic
    from numba.core import cgutils
    import llvmlite.binding as _llvm
    _features = _llvm.get_host_cpu_features()
    # compiling for another CPU (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES): the AVX2
    # intrinsics may not exist there, so the BLAS path runs
    HAVE_KERNEL = bool(_features.get("avx2") and _features.get("fma")) and not (
        numba.config.CPU_NAME or numba.config.CPU_FEATURES)
except Exception:  # pragma: no cover - exercised only without numba / AVX2
    HAVE_KERNEL = False

#: ``(MR, NV)`` register blocks: output channels x 8-float vectors of columns
BLOCK_WIDE = (4, 2)    # rows of more than 8 output columns
BLOCK_NARROW = (8, 1)  # rows of up to 8 output columns

if HAVE_KERNEL:
    _f32, _i1, _i32, _i64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
    _V = ir.VectorType

    def _as_i64(builder, v):
        return v if v.type == _i64 else builder.sext(v, _i64)

    def _vptr(builder, base, index):
        return builder.bitcast(builder.gep(base, [index]), _V(_f32, 8).as_pointer())

    def _splat(builder, value, n=8, ty=None):
        ty = ty or value.type
        vec = builder.insert_element(ir.Constant(_V(ty, n), None), value, _i32(0))
        return builder.shuffle_vector(vec, ir.Constant(_V(ty, n), None),
                                      ir.Constant(_V(_i32, n), [0] * n))

    #: IR helpers shared with the other direct kernels (:mod:`._pool_direct`)
    as_i64, vec_ptr, splat = _as_i64, _vptr, _splat

    def _tile_codegen(mr, nv):
        def codegen(context, builder, sig, args):
            arrays = [context.make_array(sig.args[i])(context, builder, args[i]).data
                      for i in (0, 2, 4, 6, 10, 12)]
            xa, oa, wa, ya, ba, za = arrays
            (x_off, nr, w_off, y_off, y_stride, ncols, b_off, has_z, mvalid, r0, flags) = [
                _as_i64(builder, args[i]) for i in (1, 3, 5, 7, 8, 9, 11, 13, 17, 18, 19)]
            lo, hi, alpha = args[14], args[15], args[16]
            v8f = _V(_f32, 8)
            fast = ("fast",)
            zero = ir.Constant(v8f, [0.0] * 8)
            entry = builder.block
            loop = builder.append_basic_block("dconv.loop")
            done = builder.append_basic_block("dconv.done")
            builder.cbranch(builder.icmp_signed(">", nr, _i64(0)), loop, done)
            builder.position_at_end(loop)
            r = builder.phi(_i64)
            r.add_incoming(_i64(0), entry)
            accs = [builder.phi(v8f) for _ in range(mr * nv)]
            for phi in accs:
                phi.add_incoming(zero, entry)
            xb = builder.add(x_off, builder.load(builder.gep(oa, [builder.add(r0, r)])))
            xv = [builder.load(_vptr(builder, xa, builder.add(xb, _i64(8 * v))), align=4)
                  for v in range(nv)]
            wb = builder.add(w_off, builder.mul(r, _i64(mr)))
            new = []
            for m in range(mr):
                wm = _splat(builder, builder.load(builder.gep(wa, [builder.add(wb, _i64(m))])))
                for v in range(nv):
                    new.append(builder.fadd(accs[m * nv + v],
                                            builder.fmul(wm, xv[v], flags=fast), flags=fast))
            r1 = builder.add(r, _i64(1))
            r.add_incoming(r1, loop)
            for phi, val in zip(accs, new):
                phi.add_incoming(val, loop)
            builder.cbranch(builder.icmp_signed("<", r1, nr), loop, done)

            builder.position_at_end(done)
            finals = []
            for val in new:
                phi = builder.phi(v8f)
                phi.add_incoming(zero, entry)
                phi.add_incoming(val, loop)
                finals.append(phi)
            mstore = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [v8f, v8f.as_pointer(), _i32,
                                                                _V(_i1, 8)]),
                "llvm.masked.store.v8f32.p0v8f32")
            mload = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v8f, [v8f.as_pointer(), _i32, _V(_i1, 8), v8f]),
                "llvm.masked.load.v8f32.p0v8f32")
            lov, hiv, alv = (_splat(builder, s) for s in (lo, hi, alpha))
            zflag = builder.icmp_signed("!=", has_z, _i64(0))
            # flags bit 0: add onto y's values (a later reduction block); bit 1:
            # apply the epilogue (the last block)
            accumulate = _splat(builder, builder.icmp_signed(
                "!=", builder.and_(flags, _i64(1)), _i64(0)), ty=_i1)
            final = builder.icmp_signed("!=", builder.and_(flags, _i64(2)), _i64(0))
            lanes = [builder.icmp_signed(
                "<", ir.Constant(_V(_i64, 8), list(range(8 * v, 8 * v + 8))),
                _splat(builder, ncols)) for v in range(nv)]
            for m in range(mr):
                row_ok = _splat(builder, builder.icmp_signed("<", _i64(m), mvalid), ty=_i1)
                bm = _splat(builder, builder.load(builder.gep(ba, [builder.add(b_off, _i64(m))])))
                base = builder.add(y_off, builder.mul(y_stride, _i64(m)))
                for v in range(nv):
                    mask = builder.and_(lanes[v], row_ok)
                    at = builder.add(base, _i64(8 * v))
                    prev = builder.call(mload, [_vptr(builder, ya, at), _i32(4),
                                                builder.and_(mask, accumulate), zero])
                    raw = builder.fadd(finals[m * nv + v], prev, flags=fast)
                    val = builder.fadd(raw, bm, flags=fast)
                    zmask = builder.and_(mask, _splat(builder, zflag, ty=_i1))
                    zv = builder.call(mload, [_vptr(builder, za, at), _i32(4), zmask, zero])
                    val = builder.fadd(val, zv, flags=fast)
                    val = builder.select(builder.fcmp_ordered("<", val, zero),
                                         builder.fmul(val, alv, flags=fast), val)
                    val = builder.select(builder.fcmp_ordered("<", val, lov), lov, val)
                    val = builder.select(builder.fcmp_ordered(">", val, hiv), hiv, val)
                    val = builder.select(final, val, raw)
                    builder.call(mstore, [val, _vptr(builder, ya, at), _i32(4), mask])
            return context.get_dummy_value()
        return codegen

    def _tile_intrinsic(mr, nv):
        def typer(typingctx, xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols,
                  bias, b_off, z, has_z, lo, hi, alpha, mvalid, r0, flags):
            return (types.void(xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols,
                               bias, b_off, z, has_z, lo, hi, alpha, mvalid, r0, flags),
                    _tile_codegen(mr, nv))
        typer.__name__ = f"_dconv_tile_{mr}x{nv}"
        return intrinsic(typer)

    _tile_wide = _tile_intrinsic(*BLOCK_WIDE)
    _tile_narrow = _tile_intrinsic(*BLOCK_NARROW)

    @njit(nogil=True, cache=True)
    def _rows(xs, offs, wp, y, bias, z, has_z, lo, hi, alpha, g, mb, mg, nr, x_img, x_grp,
              oh, ow, wj, kc, obg, wide, start, stop):  # pragma: no cover - compiled
        """Output rows ``[start, stop)``: per row, reduction blocks of kc,
        groups of obg channel blocks (their weights stay in L2), column tiles,
        channel blocks (a tile's input window stays in L1 while every block
        reads it). ``wide``: the 4 x 16 tile, else the 8 x 8 one. (One module-
        level function: numba's cache keys closures by their cells, which an
        intrinsic does not pickle stably, so a closure recompiled per process.)"""
        mr = BLOCK_WIDE[0] if wide else BLOCK_NARROW[0]
        cols = 8 * (BLOCK_WIDE[1] if wide else BLOCK_NARROW[1])
        m = g * mg
        plane = oh * ow
        for t in range(start, stop):
            oy = t % oh
            rest = t // oh
            gi = rest % g
            n = rest // g
            x_row = n * x_img + gi * x_grp + oy * wj
            for r0 in range(0, nr, kc):
                kn = min(kc, nr - r0)
                flags = (1 if r0 > 0 else 0) | (2 if r0 + kn >= nr else 0)
                for og in range(0, mb, obg):
                    for ox0 in range(0, ow, cols):
                        for ob in range(og, min(mb, og + obg)):
                            mvalid = min(mr, mg - ob * mr)
                            w_off = ((gi * mb + ob) * nr + r0) * mr
                            y_at = ((n * m + gi * mg + ob * mr) * oh + oy) * ow + ox0
                            if wide:
                                _tile_wide(xs, x_row + ox0, offs, kn, wp, w_off, y, y_at, plane,
                                           ow - ox0, bias, (gi * mb + ob) * mr, z, has_z, lo,
                                           hi, alpha, mvalid, r0, flags)
                            else:
                                _tile_narrow(xs, x_row + ox0, offs, kn, wp, w_off, y, y_at,
                                             plane, ow - ox0, bias, (gi * mb + ob) * mr, z,
                                             has_z, lo, hi, alpha, mvalid, r0, flags)

#: activation -> (alpha, lo, hi) of ``min(max(where(v < 0, alpha*v, v), lo), hi)``
ACT_BOUNDS = {"": (1.0, -np.inf, np.inf), "Relu": (1.0, 0.0, np.inf)}


def act_params(act: str, params=()) -> tuple[float, float, float] | None:
    """``(alpha, lo, hi)`` of an activation the kernel's store applies, or None."""
    if act in ACT_BOUNDS:
        return ACT_BOUNDS[act]
    if act == "LeakyRelu":
        return (float(params[0]) if params else 0.01, -np.inf, np.inf)
    if act == "Clip":
        lo = float(params[0]) if len(params) > 0 else -np.inf
        hi = float(params[1]) if len(params) > 1 else np.inf
        return (1.0, lo, hi)
    return None


def block_of(ow: int) -> tuple[int, int]:
    """The ``(MR, NV)`` register block for rows of ``ow`` output columns."""
    return BLOCK_NARROW if ow <= 8 else BLOCK_WIDE


def applies(dtype, channels: int, kernel, group: int, mg: int, out_shape) -> bool:
    """Whether :func:`conv2d` takes a convolution of ``channels`` input
    channels in ``dtype`` to ``mg`` output channels per group (float32, 2-D,
    the kernel built, enabled, a reduction ``channels / group * KH * KW`` in
    ``[MIN_REDUCTION, MAX_REDUCTION]``, and at most :data:`MAX_MG` output channels
    per group unless the output plane has at most :data:`SMALL_PLANE` pixels)."""
    if not (ENABLED and HAVE_KERNEL) or np.dtype(dtype) != np.float32 or len(kernel) != 2:
        return False
    if not MIN_REDUCTION <= (channels // group) * math.prod(kernel) <= MAX_REDUCTION:
        return False
    return mg <= MAX_MG or math.prod(out_shape) <= SMALL_PLANE


def pack_weights(wpack: np.ndarray, ow: int) -> np.ndarray:
    """``(G, Mg, R)`` GEMM-layout weights -> ``(G, ceil(Mg/MR), R, MR)`` float32
    (zero rows past ``Mg``), ``MR`` from :func:`block_of` ``(ow)``."""
    g, mg, r = wpack.shape
    mr = block_of(ow)[0]
    mb = -(-mg // mr)
    wp = np.zeros((g, mb * mr, r), np.float32)
    wp[:, :mg] = wpack
    return np.ascontiguousarray(wp.reshape(g, mb, mr, r).transpose(0, 1, 3, 2))


def _offsets(cg, kernel, strides, dilations, hi, wj):
    sh, sw = strides
    dh, dw = dilations
    kh, kw = kernel
    plane = sh * sw * hi * wj
    offs = np.empty((cg, kh, kw), np.int64)
    for ky in range(kh):
        py, iy = divmod(ky * dh, sh)[1], (ky * dh) // sh
        for kx in range(kw):
            px, ix = (kx * dw) % sw, (kx * dw) // sw
            offs[:, ky, kx] = np.arange(cg) * plane + (py * sw + px) * hi * wj + iy * wj + ix
    return offs.reshape(-1)


class Plan:
    """Everything :func:`run` needs that depends only on the input signature
    (from :func:`make_plan`; immutable, shareable between threads)."""

    __slots__ = ("offs", "total", "copies", "xs_shape", "y_shape", "rows", "ints", "items",
                 "mr", "mb", "mg", "g", "split", "key")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


def make_plan(x_shape, wpack_shape, group: int, kernel, strides, dilations, pb,
              out_shape) -> Plan:
    """The :class:`Plan` of ``x (N, C, H, W)`` convolved with ``(G, M/G, R)``
    GEMM-layout weights (geometry as :func:`conv2d`'s arguments)."""
    n, c, h, w = x_shape
    g, mg, r = wpack_shape
    cg = c // group
    kh, kw = kernel
    sh, sw = strides
    dh, dw = dilations
    oh, ow = out_shape
    mr, nv = block_of(ow)
    mb = -(-mg // mr)
    # padded extent that the taps reach, rounded up to whole phases
    hp = max((oh - 1) * sh + (kh - 1) * dh + 1, pb[0] + h)
    wpd = max((ow - 1) * sw + (kw - 1) * dw + 1, pb[1] + w)
    hi_, wj = -(-hp // sh), -(-wpd // sw)
    x_grp = cg * sh * sw * hi_ * wj
    x_img = group * x_grp
    offs = _offsets(cg, kernel, strides, dilations, hi_, wj)
    ncol = -(-ow // (8 * nv)) * 8 * nv
    need = (n - 1) * x_img + (group - 1) * x_grp + (oh - 1) * wj + ncol + int(offs.max())
    t, l = pb
    copies = []
    for py in range(sh):
        # padded rows i*sh + py that hold input rows: input row = i*sh + py - t
        i0 = max(0, -(-(t - py) // sh))
        i1 = min(hi_, (h - 1 + t - py) // sh + 1)
        if i1 <= i0:
            continue
        for px in range(sw):
            j0 = max(0, -(-(l - px) // sw))
            j1 = min(wj, (w - 1 + l - px) // sw + 1)
            if j1 <= j0:
                continue
            r0, c0 = i0 * sh + py - t, j0 * sw + px - l
            copies.append(((slice(None), slice(None), py * sw + px, slice(i0, i1), slice(j0, j1)),
                           (slice(None), slice(None), slice(r0, r0 + (i1 - i0 - 1) * sh + 1, sh),
                            slice(c0, c0 + (j1 - j0 - 1) * sw + 1, sw))))
    return Plan(offs=offs, total=max(need, n * x_img), copies=tuple(copies),
                xs_shape=(n, c, sh * sw, hi_, wj), y_shape=(n, group * mg, oh, ow),
                rows=_rows,
                ints=(g, mb, mg, r, x_img, x_grp, oh, ow, wj, REDUCTION_BLOCK,
                      max(1, WEIGHT_BLOCK_BYTES // (4 * mr * min(r, REDUCTION_BLOCK))),
                      (mr, nv) == BLOCK_WIDE),
                items=n * g * oh, mr=mr, mb=mb,
                mg=mg, g=g, split=2 * n * group * mg * r * oh * ow >= PARALLEL_MIN_FLOPS,
                key=(tuple(x_shape), tuple(wpack_shape), group, tuple(kernel), tuple(strides),
                     tuple(dilations), tuple(pb), tuple(out_shape)))


def run(plan: Plan, x: np.ndarray, wp: np.ndarray, bias, z, alpha: float, lo: float,
        hi: float) -> np.ndarray:
    """``y = min(max(where(v < 0, alpha*v, v), lo), hi)`` for ``v = conv(x, w) +
    bias + z``: ``x`` of the plan's input shape (float32), ``wp`` the
    :func:`pack_weights` of the weights for the plan's output width, ``bias``
    ``(M,)`` or None, ``z`` of the output's shape or None."""
    buf = np.zeros(plan.total, np.float32)
    xs = buf[:math.prod(plan.xs_shape)].reshape(plan.xs_shape)
    for dst, src in plan.copies:
        xs[dst] = x[src]
    y = np.empty(plan.y_shape, np.float32)
    mr, mb, mg = plan.mr, plan.mb, plan.mg
    if bias is not None and mb * mr == mg and bias.dtype == np.float32 and bias.ndim == 1 \
            and bias.flags.c_contiguous:
        bp = bias
    else:
        bp = np.zeros(plan.g * mb * mr, np.float32)
        if bias is not None:
            bp.reshape(plan.g, mb * mr)[:, :mg] = np.asarray(bias, np.float32).reshape(plan.g, mg)
    if z is not None:
        zz = np.ascontiguousarray(z, dtype=np.float32).reshape(-1)
        has_z = 1
    else:
        zz, has_z = bp, 0
    rows, items = plan.rows, plan.items
    args = (buf, plan.offs, wp.reshape(-1), y.reshape(-1), bp, zz, has_z, np.float32(lo),
            np.float32(hi), np.float32(alpha), *plan.ints)
    threads = current_threads() if plan.split and items > 1 else 1
    if threads <= 1:
        rows(*args, 0, items)
    else:
        from . import _parallel
        per = -(-items // (_parallel.CHUNKS_PER_THREAD * threads))
        _parallel.run_chunks(lambda i: rows(*args, i * per, min(items, (i + 1) * per)),
                             -(-items // per), threads)
    return y


def current_threads() -> int:
    from ._threads import current
    return current()


def conv2d(x: np.ndarray, wpack: np.ndarray, wp: np.ndarray | None, group: int, kernel,
           strides, dilations, pb, out_shape, bias=None, z=None, act: str = "",
           params=()) -> np.ndarray:
    """``y (N, M, OH, OW)`` float32 = ``act(conv(x, w) + bias + z)`` (a
    :func:`make_plan` and :func:`run`; callers that convolve one signature
    repeatedly keep the plan).

    Args:
        x: ``(N, C, H, W)`` float32; wpack: ``(G, M/G, C/G*KH*KW)``; wp: the
            :func:`pack_weights` of it for this ``OW`` (packed here when None);
            pb: leading pads ``(top, left)`` (trailing pads follow from
            ``out_shape``); bias ``(M,)`` or None; z ``(N, M, OH, OW)`` or None.
        act: "", "Relu", "LeakyRelu" or "Clip" (``params`` as onnxruntime's).

    Raises:
        ValueError: an activation the kernel's store does not apply.
    """
    ap = act_params(act, params)
    if ap is None:
        raise ValueError(f"direct conv: activation {act!r} is not fused in the store")
    if wp is None:
        wp = pack_weights(wpack, out_shape[1])
    plan = make_plan(x.shape, wpack.shape, group, kernel, strides, dilations, pb, out_shape)
    return run(plan, x, wp, bias, z, *ap)


#: the direct kernel splits over the intra-op threads from this many flops
PARALLEL_MIN_FLOPS = 1 << 23
