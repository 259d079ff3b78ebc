"""MatMulNBits with int8 activations (``accuracy_level=4``): integer block dot
products over the packed weights, as onnxruntime's CompInt8 and llama.cpp's
Q4_1 x Q8_1 kernels do.

``accuracy_level=4`` (onnxruntime contrib op MatMulNBits) lets a kernel
quantize A to int8 "with the same block_size". Here each 32-value block of a
row of A gets a symmetric scale ``sx = max|a| / 127`` and values
``xq = round_half_even(a * (1 / sx))`` in [-127, 127] (float32, as onnxruntime
rounds; a block holding NaN or infinity makes its outputs NaN); a block's
contribution to ``y[m, n]`` is then

    scale[n, b] * sx[m, b] * sum_i(q[n, b, i] * xq[m, b, i])
        - scale[n, b] * zp[n, b] * sx[m, b] * sum_i(xq[m, b, i])

(the first sum in integers). The weight values stay as the file packs them:
4-bit values two per byte (16 bytes per block, as MatMulNBits packs them),
8-bit values one signed byte per value. Per block the kernel streams 16 (or
32) bytes of weights plus ``scale`` and ``scale * zp``: as float16 inside the
weight stream when every scale is a float16 value and every ``scale * zp``
one up to float32 rounding (GGUF Q4_0/Q4_1/Q8_0 weights: 0.625 bytes per
4-bit weight, as llama.cpp streams them), else as two float32 arrays (0.75
bytes per 4-bit weight). The float32-activation kernels of
:mod:`._contrib_numba` stream 1.25.

The block dot product is written in LLVM IR with the AVX2 byte
multiply-add instructions (``vpmaddubsw``, ``vpmaddwd``): numba's own loops
vectorize a 32-value integer dot product with a horizontal reduction per
block, ~4x slower. Every M runs tiles of up to four rows of A times one
interleaved group of four output columns (:func:`_tile_codegen`): the
group's weight blocks are adjacent in memory (one sequential stream), loaded
and unpacked once for all rows of the tile, with one accumulator per row;
rows run in blocks of :data:`ROW_BLOCK` so their activations stay in L2
while a column chunk passes over them. Each row's float operations are the
same whatever the tile, so a row's outputs are bit for bit the same at batch
1, in a decode batch and in a prompt. :data:`HAVE_INT8_DOT` is False without
numba, off x86-64, without AVX2, or when numba compiles for another CPU than
the host (``NUMBA_CPU_NAME``); MatMulNBits then keeps float32 activations.

Layouts (C-contiguous; :func:`pack_i8`):
    weight values: 4-bit 16 bytes per block, value ``2i`` in the low nibble
    of byte ``i`` (MatMulNBits' own layout); 8-bit 32 int8 bytes per block
    holding ``q - 128``, reordered as values 0, 2, ..., 30, 1, 3, ..., 31.
    Columns are interleaved by four: for each group of four output columns,
    block by block, the four columns' blocks (the last N % 4 columns follow,
    one after another).
    ``w`` (N, n_blocks * 16 or 32) and ``d`` / ``dz`` (N, n_blocks) float32
    scale and scale * zero point (8-bit: scale * (zero point - 128)), each in
    that column order; or, with float16 scales, ``w = d = dz``: (N, n_blocks
    * 20 or 36) bytes where a group's block is its four scales, four scale *
    zero points (float16) and four weight blocks, a last column's block its
    scale, scale * zero point and weight block. 8-bit weights whose every
    scale * (zero point - 128) is zero (GGUF Q8_0) leave those terms out:
    (N, n_blocks * 34) bytes, and ``dz`` is :data:`NO_ZERO_POINTS`.
    ``xq``: (M, n_blocks * 32) int8, each block reordered even values first,
    then odd (the order the 4-bit bytes unpack to); ``sx`` / ``xsum``:
    (M, n_blocks) float32 block scales and ``sx * sum(xq)``.
"""

from __future__ import annotations

import platform
import threading
import weakref

import numpy as np

from . import _contrib_numba as _nb

__all__ = ["HAVE_INT8_DOT", "BLOCK", "gemm_i8", "pack_i8", "quantize_rows", "warm_up"]

#: values per block of the int8 kernels (MatMulNBits block_size must match)
BLOCK = 32


def _host_has_avx2() -> bool:
    if not _nb.HAVE_NUMBA or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        import numba
        import llvmlite.binding as ll
        if numba.config.CPU_NAME or numba.config.CPU_FEATURES:
            return False  # compiling for another CPU: the AVX2 intrinsics may not exist there
        return bool(ll.get_host_cpu_features().get("avx2", False))
    except Exception:  # pragma: no cover - llvmlite without host feature queries
        return False


HAVE_INT8_DOT = _host_has_avx2()
#: one row of A (decode at batch 1) runs on one thread below this many weights
#: software prefetch distance of the prefetching decode kernel (``_cols``
#: with ``prefetch``), in weight blocks of a column group ahead
PREFETCH_BLOCKS = 16
GEMV_PARALLEL_MIN_WEIGHTS = 1 << 22
#: more rows run on one thread below this many multiply-adds (M x N x K)
GEMM_PARALLEL_MIN_WORK = 1 << 22
#: from this many rows of A the kernels run rows x columns tiles (:func:`_tile_codegen`):
#: each weight block unpacked once for up to four rows. 1: every row, decode
#: at batch 1 included, so a row's outputs do not depend on the batch; more
#: rows than that take the older one-row group kernel (for comparisons)
TILE_MIN_ROWS = 1
#: rows of A per pass over a column chunk's weights in the tiled kernel: a
#: block's activations (ROW_BLOCK x K int8, 36-96 KB for K 576-1536) stay in L2
ROW_BLOCK = 64
_WARM = False

if HAVE_INT8_DOT:
    from llvmlite import ir
    from numba import njit, prange, types
    from numba.core import cgutils
    from numba.extending import intrinsic, overload

    _i8, _i16, _i32, _i64, _f32 = (ir.IntType(8), ir.IntType(16), ir.IntType(32),
                                   ir.IntType(64), ir.FloatType())
    _V = ir.VectorType

    def _splat(t, value, n):
        return ir.Constant(_V(t, n), [value] * n)

    def _load_vec(builder, base, index, vty):
        return builder.load(builder.bitcast(builder.gep(base, [index]), vty.as_pointer()),
                            align=1)

    def _load_scales(builder, arr_ty, data, off, n):
        """n float32 scales (a float for n == 1, else <n x float>) at element
        ``off`` of a float32 array, or at byte ``off`` of the (u)int8 weight
        array that embeds them as float16 (converted with vcvtph2ps)."""
        if arr_ty.dtype != types.float32:
            half, i16 = ir.HalfType(), _i16
            src, hty = (i16, half) if n == 1 else (_V(i16, n), _V(half, n))
            raw = builder.load(builder.bitcast(builder.gep(data, [off]), src.as_pointer()),
                               align=1)
            return builder.fpext(builder.bitcast(raw, hty), _f32 if n == 1 else _V(_f32, n))
        if n == 1:
            return builder.load(builder.gep(data, [off]))
        return _load_vec(builder, data, off, _V(_f32, n))

    def _load_zero_points(builder, sig, index, dty, data, off, n):
        """:func:`_load_scales` of the scale * zero point argument ``index``,
        or float32 zeros when its type marks a layout without zero points
        (:data:`NO_ZERO_POINTS`, float64): LLVM then drops the correction
        and the activation sums it would read."""
        if sig.args[index].dtype == types.float64:
            return ir.Constant(_f32, 0.0) if n == 1 else _splat(_f32, 0.0, n)
        return _load_scales(builder, dty, data, off, n)

    def _unpack(context, builder, sig, args, arrays, ints):
        """Data pointers of the array arguments at ``arrays`` and the integer
        arguments at ``ints`` (as i64) of an intrinsic call."""
        return ([context.make_array(sig.args[i])(context, builder, args[i]).data
                 for i in arrays], [_as_i64(builder, args[i]) for i in ints])

    def _as_i64(builder, v):
        return v if v.type == _i64 else builder.sext(v, _i64)

    def _prefetch(builder, base, index, locality):
        """A prefetch hint (read; locality 3: all cache levels, 0:
        non-temporal) for byte ``index`` of ``base``."""
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_i8.as_pointer(), _i32, _i32, _i32]),
            "llvm.prefetch.p0")
        builder.call(fn, [builder.gep(builder.bitcast(base, _i8.as_pointer()), [index]),
                          _i32(0), _i32(locality), _i32(1)])

    def _hsum(builder, v):
        half = builder.fadd(
            builder.shuffle_vector(v, v, ir.Constant(_V(_i32, 4), [0, 1, 2, 3])),
            builder.shuffle_vector(v, v, ir.Constant(_V(_i32, 4), [4, 5, 6, 7])))
        two = builder.fadd(builder.shuffle_vector(half, half, ir.Constant(_V(_i32, 2), [0, 1])),
                           builder.shuffle_vector(half, half, ir.Constant(_V(_i32, 2), [2, 3])))
        return builder.fadd(builder.extract_element(two, _i32(0)),
                            builder.extract_element(two, _i32(1)))

    def _declare(builder):
        """(vpmaddubsw, vpmaddwd, vpsignb) declarations in the builder's module."""
        mod = builder.module
        v32, v16i16, v8i32 = _V(_i8, 32), _V(_i16, 16), _V(_i32, 8)
        return (cgutils.get_or_insert_function(
                    mod, ir.FunctionType(v16i16, [v32, v32]), "llvm.x86.avx2.pmadd.ub.sw"),
                cgutils.get_or_insert_function(
                    mod, ir.FunctionType(v8i32, [v16i16, v16i16]), "llvm.x86.avx2.pmadd.wd"),
                cgutils.get_or_insert_function(
                    mod, ir.FunctionType(v32, [v32, v32]), "llvm.x86.avx2.psign.b"))

    def _weight_block(builder, bits, wa, w_off, b, psign, wstride):
        """Block b of a weight column (blocks ``wstride`` bytes apart) as the
        unsigned operand of vpmaddubsw, and (8-bit) the signed values whose
        signs go onto the activations."""
        at = builder.add(w_off, builder.mul(b, wstride))
        if bits == 4:
            # 16 bytes -> 32 values 0..15: low nibbles (even values), then high
            raw = _load_vec(builder, wa, at, _V(_i8, 16))
            lo = builder.and_(raw, _splat(_i8, 15, 16))
            hi = builder.lshr(raw, _splat(_i8, 4, 16))
            return builder.shuffle_vector(lo, hi, ir.Constant(_V(_i32, 32), list(range(32)))), None
        # signed x signed as |w| (<= 128 as u8) times sign(w) * x
        ws = _load_vec(builder, wa, at, _V(_i8, 32))
        return builder.call(psign, [ws, ws]), ws

    def _block_isum(builder, ops, wv, ws, xv):
        """<8 x i32> partial sums of w . x over one block (|pair| <= 2 * 15 * 127
        for 4-bit, 2 * 128 * 127 for 8-bit: vpmaddubsw never saturates)."""
        maddubs, maddwd, psign = ops
        if ws is not None:
            xv = builder.call(psign, [xv, ws])
        return builder.call(maddwd, [builder.call(maddubs, [wv, xv]), _splat(_i16, 1, 16)])

    def _broadcast(builder, value):
        v8f = _V(_f32, 8)
        return builder.shuffle_vector(builder.insert_element(ir.Constant(v8f, None), value,
                                                             _i32(0)),
                                      ir.Constant(v8f, None), ir.Constant(_V(_i32, 8), [0] * 8))

    def _lane(builder, vec, lane, n):
        """<n x float> holding lane ``lane`` of ``vec`` in every lane."""
        return builder.shuffle_vector(vec, vec, ir.Constant(_V(_i32, n), [lane] * n))

    def _block_loop(builder, nb, name):
        """Blocks of a loop over b in [0, nb): returns (entry, loop, done, b)
        with the builder inside the loop after b's phi (the caller adds its
        own phis next, then branches back with ``b + 1 < nb``)."""
        entry = builder.block
        loop = builder.append_basic_block(name + ".loop")
        done = builder.append_basic_block(name + ".done")
        builder.cbranch(builder.icmp_signed(">", nb, _i64(0)), loop, done)
        builder.position_at_end(loop)
        b = builder.phi(_i64)
        b.add_incoming(_i64(0), entry)
        return entry, loop, done, b

    def _dot_rows_codegen(bits, rows):
        """IR of, for r < rows: sum over blocks b < nb of d[d_off + b*dstride]
        * sx[s_off + r*nb + b] * sum_i(w_i * xq[x_off + r*nb*32 + b*32 + i])
        (integer sums) - dz[...] * xsum[...], one <8 x float> accumulator and
        one zero-point float per row; each weight block is loaded (and its
        nibbles split) once for all rows."""

        def codegen(context, builder, sig, args):
            (wa, xa, sa, ua, da, za), (w_off, wstride, x_off, s_off, d_off, z_off, dstride,
                                       nb) = _unpack(context, builder, sig, args,
                                                     (0, 3, 5, 6, 8, 9),
                                                     (1, 2, 4, 7, 10, 11, 12, 13))
            dty = sig.args[8]
            ops = _declare(builder)
            v32, v8f = _V(_i8, 32), _V(_f32, 8)
            zero, fzero = _splat(_f32, 0.0, 8), ir.Constant(_f32, 0.0)
            fast = ("fast",)
            row_x = builder.mul(nb, _i64(BLOCK))  # in the entry block, before the phis
            entry, loop, done, b = _block_loop(builder, nb, "i8rows")
            accs = [builder.phi(v8f) for _ in range(rows)]
            corrs = [builder.phi(_f32) for _ in range(rows)]
            for phi in accs:
                phi.add_incoming(zero, entry)
            for phi in corrs:
                phi.add_incoming(fzero, entry)
            wv, ws = _weight_block(builder, bits, wa, w_off, b, ops[2], wstride)
            step = builder.mul(b, dstride)
            dval = _load_scales(builder, dty, da, builder.add(d_off, step), 1)
            zval = _load_zero_points(builder, sig, 9, dty, za, builder.add(z_off, step), 1)
            x_at = builder.add(x_off, builder.mul(b, _i64(BLOCK)))
            s_at = builder.add(s_off, b)
            new, newc = [], []
            for r in range(rows):
                xv = _load_vec(builder, xa, builder.add(x_at, builder.mul(row_x, _i64(r))), v32)
                isum = _block_isum(builder, ops, wv, ws, xv)
                s_r = builder.add(s_at, builder.mul(nb, _i64(r)))
                sxv = builder.load(builder.gep(sa, [s_r]))
                xsv = builder.load(builder.gep(ua, [s_r]))
                sv = _broadcast(builder, builder.fmul(dval, sxv, flags=fast))
                new.append(builder.fadd(
                    accs[r], builder.fmul(builder.sitofp(isum, v8f), sv, flags=fast),
                    flags=fast))
                newc.append(builder.fadd(corrs[r], builder.fmul(zval, xsv, flags=fast),
                                         flags=fast))
            b1 = builder.add(b, _i64(1))
            b.add_incoming(b1, loop)
            for phi, val in zip(accs + corrs, new + newc):
                phi.add_incoming(val, loop)
            builder.cbranch(builder.icmp_signed("<", b1, nb), loop, done)

            builder.position_at_end(done)
            finals = []
            for val, z in zip(new + newc, [zero] * rows + [fzero] * rows):
                phi = builder.phi(val.type)  # every phi first, then the reductions
                phi.add_incoming(z, entry)
                phi.add_incoming(val, loop)
                finals.append(phi)
            outs = [builder.fsub(_hsum(builder, finals[r]), finals[rows + r])
                    for r in range(rows)]
            if rows == 1:
                return outs[0]
            return context.make_tuple(builder, sig.return_type, outs)

        return codegen

    def _bits_of(w):
        """4 for uint8 weights (two values a byte), 8 for int8."""
        return 4 if w.dtype == types.uint8 else 8

    def _dot_rows_intrinsic(rows):
        def typer(typingctx, w, w_off, wstride, xq, x_off, sx, xsum, s_off, d, dz, d_off,
                  z_off, dstride, nb):
            ret = types.float32 if rows == 1 else types.UniTuple(types.float32, rows)
            return (ret(w, w_off, wstride, xq, x_off, sx, xsum, s_off, d, dz, d_off, z_off,
                        dstride, nb), _dot_rows_codegen(_bits_of(w), rows))
        typer.__name__ = f"_dot_i8_x{rows}"
        return intrinsic(typer)

    def _dot_group_codegen(bits, locality=None):  # locality: prefetch ahead
        """IR of one row of A times the four output columns of one interleaved
        group (see :func:`pack_i8`): per block b the four columns' weight
        blocks are adjacent (read as one sequential stream) and their four
        scales / scale * zero points are one <4 x float> load. Per column
        c: sum over b of d[c, b] * sx[b] * isum(c, b) - dz[c, b] * xsum[b].
        The activation block is loaded once for all four columns, and the
        columns' accumulators are independent chains (the loop runs at the
        core's throughput, not at one add's latency per block)."""
        per = 16 if bits == 4 else BLOCK

        def codegen(context, builder, sig, args):
            (wa, xa, sa, ua, da, za), (w_off, wstride, x_off, s_off, d_off, z_off, dstride,
                                       nb) = _unpack(context, builder, sig, args,
                                                     (0, 3, 5, 6, 8, 9),
                                                     (1, 2, 4, 7, 10, 11, 12, 13))
            dty = sig.args[8]
            ops = _declare(builder)
            v32, v8f, v4f = _V(_i8, 32), _V(_f32, 8), _V(_f32, 4)
            zero, zero4 = _splat(_f32, 0.0, 8), _splat(_f32, 0.0, 4)
            fast = ("fast",)
            entry, loop, done, b = _block_loop(builder, nb, "i8group")
            accs = [builder.phi(v8f) for _ in range(4)]
            for phi in accs:
                phi.add_incoming(zero, entry)
            corr = builder.phi(v4f)
            corr.add_incoming(zero4, entry)
            if locality is not None:  # the weights PREFETCH_BLOCKS blocks ahead
                _prefetch(builder, wa, builder.add(w_off, builder.mul(
                    builder.add(b, _i64(PREFETCH_BLOCKS)), wstride)), locality)
            xv = _load_vec(builder, xa, builder.add(x_off, builder.mul(b, _i64(BLOCK))), v32)
            sxv = builder.load(builder.gep(sa, [builder.add(s_off, b)]))
            xsv = builder.load(builder.gep(ua, [builder.add(s_off, b)]))
            step = builder.mul(b, dstride)
            d4 = _load_scales(builder, dty, da, builder.add(d_off, step), 4)
            z4 = _load_zero_points(builder, sig, 9, dty, za, builder.add(z_off, step), 4)
            s4 = builder.fmul(d4, _lane(builder, builder.insert_element(
                ir.Constant(v4f, None), sxv, _i32(0)), 0, 4), flags=fast)
            corr1 = builder.fadd(corr, builder.fmul(z4, _lane(builder, builder.insert_element(
                ir.Constant(v4f, None), xsv, _i32(0)), 0, 4), flags=fast), flags=fast)
            new = []
            for c in range(4):
                wv, ws = _weight_block(builder, bits, wa, builder.add(w_off, _i64(c * per)), b,
                                       ops[2], wstride)
                isum = _block_isum(builder, ops, wv, ws, xv)
                new.append(builder.fadd(accs[c], builder.fmul(
                    builder.sitofp(isum, v8f), _lane(builder, s4, c, 8), flags=fast),
                    flags=fast))
            b1 = builder.add(b, _i64(1))
            b.add_incoming(b1, loop)
            for phi, val in zip(accs + [corr], new + [corr1]):
                phi.add_incoming(val, loop)
            builder.cbranch(builder.icmp_signed("<", b1, nb), loop, done)

            builder.position_at_end(done)
            finals = []
            for val, z in zip(new + [corr1], [zero] * 4 + [zero4]):
                phi = builder.phi(val.type)  # every phi first, then the reductions
                phi.add_incoming(z, entry)
                phi.add_incoming(val, loop)
                finals.append(phi)
            outs = [builder.fsub(_hsum(builder, finals[c]),
                                 builder.extract_element(finals[4], _i32(c))) for c in range(4)]
            return context.make_tuple(builder, sig.return_type, outs)

        return codegen

    @intrinsic
    def _group(typingctx, w, w_off, wstride, xq, x_off, sx, xsum, s_off, d, dz, d_off, z_off,
               dstride, nb):
        return (types.UniTuple(types.float32, 4)(w, w_off, wstride, xq, x_off, sx, xsum, s_off,
                                                 d, dz, d_off, z_off, dstride, nb),
                _dot_group_codegen(_bits_of(w)))

    @intrinsic
    def _group_pf(typingctx, w, w_off, wstride, xq, x_off, sx, xsum, s_off, d, dz, d_off, z_off,
                  dstride, nb):
        """_group, prefetching the weights PREFETCH_BLOCKS blocks ahead (into
        every cache level): the fused blocks' projections are short streams
        that the hardware prefetcher ramps up on too late (30 stacked int8
        blocks, interleaved A/B: 5.85 -> 5.15 ms; non-temporal 5.27). A long
        GEMV (the LM head) streams well without it."""
        return (types.UniTuple(types.float32, 4)(w, w_off, wstride, xq, x_off, sx, xsum, s_off,
                                                 d, dz, d_off, z_off, dstride, nb),
                _dot_group_codegen(_bits_of(w), 3))

    _dot1 = _dot_rows_intrinsic(1)

    def _tile_codegen(bits, rows, locality=None):  # locality: prefetch ahead
        """IR of ``rows`` rows of A times the four output columns of one
        interleaved group (see :func:`pack_i8`), rows ``row_x`` int8 values
        apart in ``xq`` and ``nb`` scales apart in ``sx`` / ``xsum``. Per
        block the four columns' weights are loaded and unpacked once for all
        rows; per row the four <8 x i32> block sums are reduced pairwise
        into one vector (lanes c and c + 4: column c's two halves), converted
        once and scaled by the four columns' scales times the row's scale
        (one FMA), the zero-point term subtracted in the same accumulator
        (lanes 0-3). One <8 x float> accumulator per row, so a tile of up to
        four rows stays in registers.

        Every row runs the same float operations in the same order whatever
        the tile's size (only FMA contraction allowed, no reassociation), so
        a row's outputs are bit for bit the same alone (decode at batch 1),
        in a batch or in a prompt."""
        per = 16 if bits == 4 else BLOCK

        def codegen(context, builder, sig, args):
            (wa, xa, sa, ua, da, za), (w_off, wstride, x_off, s_off, d_off, z_off, dstride,
                                       nb) = _unpack(context, builder, sig, args,
                                                     (0, 3, 5, 6, 8, 9),
                                                     (1, 2, 4, 7, 10, 11, 12, 13))
            dty = sig.args[8]
            ops = _declare(builder)
            v32, v8f, v4f, v8i = _V(_i8, 32), _V(_f32, 8), _V(_f32, 4), _V(_i32, 8)
            zero = _splat(_f32, 0.0, 8)
            zero4 = _splat(_f32, 0.0, 4)
            fast = ("contract",)
            row_x = builder.mul(nb, _i64(BLOCK))  # in the entry block, before the phis
            entry, loop, done, b = _block_loop(builder, nb, "i8tile")
            accs = [builder.phi(v8f) for _ in range(rows)]
            for phi in accs:
                phi.add_incoming(zero, entry)
            if locality is not None:  # the weights PREFETCH_BLOCKS blocks ahead
                _prefetch(builder, wa, builder.add(w_off, builder.mul(
                    builder.add(b, _i64(PREFETCH_BLOCKS)), wstride)), locality)
            step = builder.mul(b, dstride)
            d4 = _load_scales(builder, dty, da, builder.add(d_off, step), 4)
            z4 = _load_zero_points(builder, sig, 9, dty, za, builder.add(z_off, step), 4)
            both = ir.Constant(_V(_i32, 8), [0, 1, 2, 3, 0, 1, 2, 3])
            low = ir.Constant(_V(_i32, 8), [0, 1, 2, 3, 4, 5, 6, 7])
            d8 = builder.shuffle_vector(d4, d4, both)
            z8 = builder.shuffle_vector(z4, zero4, low)  # the zero-point term in lanes 0-3
            wts = [_weight_block(builder, bits, wa, builder.add(w_off, _i64(c * per)), b,
                                 ops[2], wstride) for c in range(4)]
            x_at = builder.add(x_off, builder.mul(b, _i64(BLOCK)))
            s_at = builder.add(s_off, b)

            def pairs(a, c):  # per 128-bit half: a0+a1, a2+a3, c0+c1, c2+c3
                return builder.add(
                    builder.shuffle_vector(a, c, ir.Constant(_V(_i32, 8),
                                                             [0, 2, 8, 10, 4, 6, 12, 14])),
                    builder.shuffle_vector(a, c, ir.Constant(_V(_i32, 8),
                                                             [1, 3, 9, 11, 5, 7, 13, 15])))

            new = []
            for r in range(rows):
                xv = _load_vec(builder, xa, builder.add(x_at, builder.mul(row_x, _i64(r))), v32)
                sums = [_block_isum(builder, ops, wv, ws, xv) for wv, ws in wts]
                isum = pairs(pairs(sums[0], sums[1]), pairs(sums[2], sums[3]))
                s_r = builder.add(s_at, builder.mul(nb, _i64(r)))
                sxv = _broadcast(builder, builder.load(builder.gep(sa, [s_r])))
                xsv = _broadcast(builder, builder.load(builder.gep(ua, [s_r])))
                acc = builder.fadd(accs[r], builder.fmul(builder.sitofp(isum, v8f),
                                                         builder.fmul(d8, sxv, flags=fast),
                                                         flags=fast), flags=fast)
                new.append(builder.fsub(acc, builder.fmul(z8, xsv, flags=fast), flags=fast))
            b1 = builder.add(b, _i64(1))
            b.add_incoming(b1, loop)
            for phi, val in zip(accs, new):
                phi.add_incoming(val, loop)
            builder.cbranch(builder.icmp_signed("<", b1, nb), loop, done)

            builder.position_at_end(done)
            finals = []
            for val in new:
                phi = builder.phi(v8f)  # every phi first, then the reductions
                phi.add_incoming(zero, entry)
                phi.add_incoming(val, loop)
                finals.append(phi)
            outs = []
            for r in range(rows):
                lo4 = builder.shuffle_vector(finals[r], finals[r],
                                             ir.Constant(_V(_i32, 4), [0, 1, 2, 3]))
                hi4 = builder.shuffle_vector(finals[r], finals[r],
                                             ir.Constant(_V(_i32, 4), [4, 5, 6, 7]))
                tot = builder.fadd(lo4, hi4)
                outs.extend(builder.extract_element(tot, _i32(c)) for c in range(4))
            return context.make_tuple(builder, sig.return_type, outs)

        return codegen

    def _tile_intrinsic(rows, locality=None):
        def typer(typingctx, w, w_off, wstride, xq, x_off, sx, xsum, s_off, d, dz, d_off,
                  z_off, dstride, nb):
            return (types.UniTuple(types.float32, 4 * rows)(
                w, w_off, wstride, xq, x_off, sx, xsum, s_off, d, dz, d_off, z_off, dstride, nb),
                _tile_codegen(_bits_of(w), rows, locality))
        typer.__name__ = f"_tile_i8_x{rows}" + ("_pf" if locality is not None else "")
        return intrinsic(typer)

    # (the prefetching ones for the fused blocks' short weight streams, as _group_pf)
    _tile4, _tile3, _tile2, _tile1 = (_tile_intrinsic(r) for r in (4, 3, 2, 1))
    _tile4_pf, _tile3_pf, _tile2_pf, _tile1_pf = (_tile_intrinsic(r, 3) for r in (4, 3, 2, 1))

    # Rounding must be onnxruntime's bit for bit: float32 scale = max|a| / 127,
    # inv = 1 / scale, q = rint(a * inv), each correctly rounded. numba may
    # compile this function with a fastmath caller's flags (seen: max|a| / 127
    # became a multiply by 1/127, one ulp off, flipping ties), so each step is
    # taken in float64 and rounded once to float32: exact whatever the flags
    # (float64 holds the float32 product exactly, and a quotient rounded
    # twice, 53 then 24 bits, is the correctly rounded float32 quotient).
    # NaN and infinity are found from the exponent bits (integer tests: a
    # fastmath build would fold float tests for them away).
    @njit(nogil=True, cache=True)
    def _quantize_rows(a, xq, sx, xsum):  # pragma: no cover - compiled
        # a (M, nb*32) float32 -> xq (M, nb*32) int8 (even values, then odd, per
        # block), sx / xsum (M, nb). A block holding NaN or infinity gets scale
        # NaN (its products are NaN, as in float32); a block whose max|a| is so
        # small that 1/scale overflows float32 is rounded in float64.
        nb = sx.shape[1]
        tiny = np.float32(np.finfo(np.float32).tiny)
        bits = a.view(np.uint32)
        for m in range(a.shape[0]):
            row = a[m]
            rbits = bits[m]
            for b in range(nb):
                base = b * 32
                amax = np.float32(0.0)
                finite = True
                for j in range(32):
                    if rbits[base + j] & 0x7F800000 == 0x7F800000:  # NaN or inf
                        finite = False
                    else:
                        amax = max(amax, abs(row[base + j]))
                scale = np.float32(np.float64(amax) / 127.0)
                total = 0
                if not finite:
                    for j in range(32):
                        xq[m, base + j] = 0
                    sx[m, b] = np.float32(np.nan)
                    xsum[m, b] = np.float32(np.nan)
                    continue
                if scale >= tiny:
                    inv = np.float64(np.float32(1.0 / np.float64(scale)))
                    for j in range(16):
                        q0 = min(max(np.rint(np.float32(row[base + 2 * j] * inv)), -127.0),
                                 127.0)
                        q1 = min(max(np.rint(np.float32(row[base + 2 * j + 1] * inv)), -127.0),
                                 127.0)
                        xq[m, base + j] = np.int8(q0)
                        xq[m, base + 16 + j] = np.int8(q1)
                        total += np.int32(q0) + np.int32(q1)
                else:  # zero or subnormal scale
                    inv64 = 127.0 / np.float64(amax) if amax > 0 else 0.0
                    for j in range(16):
                        q0 = min(max(np.rint(np.float64(row[base + 2 * j]) * inv64), -127.0), 127.0)
                        q1 = min(max(np.rint(np.float64(row[base + 2 * j + 1]) * inv64), -127.0),
                                 127.0)
                        xq[m, base + j] = np.int8(q0)
                        xq[m, base + 16 + j] = np.int8(q1)
                        total += np.int32(q0) + np.int32(q1)
                sx[m, b] = scale
                xsum[m, b] = scale * np.float32(total)

    def _embedded(d):  # pragma: no cover - typed by the overload below
        """Whether ``d`` is the uint8 weight array embedding float16 scales."""

    @overload(_embedded, jit_options={"cache": True})
    def _embedded_impl(d):
        value = d.dtype != types.float32
        return lambda d: value

    def _symmetric(dz):  # pragma: no cover - typed by the overload below
        """Whether ``dz`` is :data:`NO_ZERO_POINTS` (the layout has none)."""

    @overload(_symmetric, jit_options={"cache": True})
    def _symmetric_impl(dz):
        value = dz.dtype == types.float64
        return lambda dz: value

    def _per_block(w):  # pragma: no cover - typed by the overload below
        """Weight bytes per 32-value block: 16 (uint8, 4-bit) or 32 (int8)."""

    @overload(_per_block, jit_options={"cache": True})
    def _per_block_impl(w):
        value = 16 if w.dtype == types.uint8 else 32
        return lambda w: value

    @njit(nogil=True, cache=True, inline="always")
    def _column(n, n_all, nb, per, embedded, sym):  # pragma: no cover - compiled
        # (weight offset, weight block stride, scale offset, zero-point offset,
        # scale block stride) of output column n in the layout of pack_i8; the
        # float16 offsets are in bytes of the weight array (sym: embedded
        # scales without zero points; the zero-point offset is unused)
        g4 = n_all - n_all % 4
        if sym:
            grp = 4 * (per + 2)
            if n < g4:
                base = (n // 4) * nb * grp
                at = base + 2 * (n % 4)
                return base + 8 + (n % 4) * per, grp, at, at, grp
            base = (g4 // 4) * nb * grp + (n - g4) * nb * (per + 2)
            return base + 2, per + 2, base, base, per + 2
        if embedded:
            grp = 4 * (per + 4)
            if n < g4:
                base = (n // 4) * nb * grp
                at = base + 2 * (n % 4)
                return base + 16 + (n % 4) * per, grp, at, at + 8, grp
            base = (g4 // 4) * nb * grp + (n - g4) * nb * (per + 4)
            return base + 4, per + 4, base, base + 2, per + 4
        if n < g4:
            at = (n // 4) * nb * 4 + n % 4
            return (n // 4) * nb * 4 * per + (n % 4) * per, 4 * per, at, at, 4
        return n * nb * per, per, n * nb, n * nb, 1

    @njit(fastmath=True, nogil=True, cache=True)
    def _cols(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, lo, hi, prefetch):  # pragma: no cover
        # output columns lo..hi (lo a multiple of 4) of every row of xq:
        # from TILE_MIN_ROWS rows (every row by default) tiles of up to
        # four rows x one interleaved group of four columns (_tile4, each weight
        # block unpacked once for the tile), the rows in blocks of ROW_BLOCK
        # so a block's activations stay in L2 while the chunk's column groups
        # pass over them; the last N % 4 columns one row at a time. sx_t /
        # xs_t: (M // 8, nb, 8) transposed copies of sx / xsum (unused by
        # the tiles; the quantize stages still write them). Fewer rows than
        # TILE_MIN_ROWS: one group of four columns per pass over a row
        # (prefetch: with _group_pf and the _pf tiles)
        m_rows = xq.shape[0]
        n_all = w.shape[0]
        kp = xq.shape[1]
        nb = kp // 32
        emb = _embedded(d)
        sym = _symmetric(dz)
        per = _per_block(w)
        g4 = n_all - n_all % 4
        wf = w.reshape(-1)
        df = d.reshape(-1)
        zf = dz.reshape(-1)
        xf = xq.reshape(-1)
        sf = sx.reshape(-1)
        uf = xsum.reshape(-1)
        full = min(hi, g4)
        if m_rows >= TILE_MIN_ROWS:
            r0 = 0
            while r0 < m_rows:
                r1 = min(m_rows, r0 + ROW_BLOCK)
                n = lo
                while n + 4 <= full:
                    wb, ws, db, zb, ds = _column(n, n_all, nb, per, emb, sym)
                    m = r0
                    while m + 4 <= r1:
                        if prefetch:
                            t = _tile4_pf(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db,
                                          zb, ds, nb)
                        else:
                            t = _tile4(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb,
                                       ds, nb)
                        for i in range(16):
                            out[m + i // 4, n + i % 4] = t[i]
                        m += 4
                    if r1 - m == 3:
                        if prefetch:
                            t3 = _tile3_pf(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db,
                                           zb, ds, nb)
                        else:
                            t3 = _tile3(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb,
                                        ds, nb)
                        for i in range(12):
                            out[m + i // 4, n + i % 4] = t3[i]
                    elif r1 - m == 2:
                        if prefetch:
                            t2 = _tile2_pf(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db,
                                           zb, ds, nb)
                        else:
                            t2 = _tile2(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb,
                                        ds, nb)
                        for i in range(8):
                            out[m + i // 4, n + i % 4] = t2[i]
                    elif r1 - m == 1:
                        if prefetch:
                            t1 = _tile1_pf(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db,
                                           zb, ds, nb)
                        else:
                            t1 = _tile1(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb,
                                        ds, nb)
                        for i in range(4):
                            out[m, n + i] = t1[i]
                    n += 4
                r0 = r1
            # the last N % 4 columns one row at a time (the same arithmetic for
            # every row, as the tiles)
            for n in range(max(lo, g4), hi):
                wb, ws, db, zb, ds = _column(n, n_all, nb, per, emb, sym)
                for m in range(m_rows):
                    out[m, n] = _dot1(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb,
                                      ds, nb)
            return
        for m in range(m_rows):
            n = lo
            while n + 4 <= full:
                wb, ws, db, zb, ds = _column(n, n_all, nb, per, emb, sym)
                if prefetch:
                    t4 = _group_pf(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb, ds, nb)
                else:
                    t4 = _group(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb, ds, nb)
                for c in range(4):
                    out[m, n + c] = t4[c]
                n += 4
            while n < hi:
                wb, ws, db, zb, ds = _column(n, n_all, nb, per, emb, sym)
                out[m, n] = _dot1(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb, ds,
                                  nb)
                n += 1

    @njit(nogil=True, cache=True)
    def _quantize_into(a, xq, sx, xsum, sx_t, xs_t, r0, r1):  # pragma: no cover - compiled
        # rows r0..r1 (r0 a multiple of 8) of _quantize_rows, then the
        # (M // 8, nb, 8) transposed copies of their scales and sums that the
        # eight-row kernel reads
        _quantize_rows(a[r0:r1], xq[r0:r1], sx[r0:r1], xsum[r0:r1])
        for g in range(r0 // 8, min(r1 // 8, sx_t.shape[0])):
            for b in range(sx_t.shape[1]):
                for r in range(8):
                    sx_t[g, b, r] = sx[g * 8 + r, b]
                    xs_t[g, b, r] = xsum[g * 8 + r, b]

    @njit(nogil=True, cache=True)
    def _act_buffers(m, kp):  # pragma: no cover - compiled
        # (xq, sx, xsum, sx_t, xs_t) for m rows of kp (a multiple of 32) values
        nb = kp // 32
        return (np.empty((m, kp), np.int8), np.empty((m, nb), np.float32),
                np.empty((m, nb), np.float32), np.empty((m // 8, nb, 8), np.float32),
                np.empty((m // 8, nb, 8), np.float32))

    @njit(nogil=True, cache=True)
    def _quantized(a):  # pragma: no cover - compiled
        xq, sx, xsum, sx_t, xs_t = _act_buffers(a.shape[0], a.shape[1])
        _quantize_into(a, xq, sx, xsum, sx_t, xs_t, 0, a.shape[0])
        return xq, sx, xsum, sx_t, xs_t

    # one compiled entry per call (quantize A, then the columns): each numba
    # dispatch costs microseconds. Module-level functions, not closures over
    # the kernels: numba's disk cache keys a closure by its cell contents,
    # which differ per process, so closures were compiled again in every one.
    @njit(fastmath=True, nogil=True, cache=True)
    def _serial_i8(a, w, d, dz, out):  # pragma: no cover - compiled
        xq, sx, xsum, sx_t, xs_t = _quantized(a)
        _cols(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, 0, w.shape[0], 0)

    @njit(parallel=True, fastmath=True, nogil=True, cache=True)
    def _par_i8(a, w, d, dz, out, chunks):  # pragma: no cover - compiled
        xq, sx, xsum, sx_t, xs_t = _quantized(a)
        n_cols = w.shape[0]
        per = ((n_cols + chunks - 1) // chunks + 3) // 4 * 4  # whole column groups
        for c in prange(chunks):
            _cols(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, c * per, min(n_cols, (c + 1) * per),
                  0)

    # the 4- and 8-bit kernels are the same functions typed by the weight
    # dtype (uint8: 4-bit, int8: 8-bit)
    _serial_q4 = _serial_q8 = _serial_i8
    _par_q4 = _par_q8 = _par_i8


def quantize_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize A for the int8 kernels.

    Args:
        a: (M, n_blocks * 32) float32, C-contiguous (zero-padded past K).

    Returns:
        ``(xq, sx, xsum)``: (M, n_blocks * 32) int8 (per block even values, then
        odd), (M, n_blocks) float32 scales ``max|a| / 127`` and ``sx * sum(xq)``.
    """
    m, kp = a.shape
    nb = kp // BLOCK
    xq = np.empty((m, kp), np.int8)
    sx = np.empty((m, nb), np.float32)
    xsum = np.empty((m, nb), np.float32)
    _quantize_rows(a, xq, sx, xsum)
    return xq, sx, xsum


def interleave_columns(x: np.ndarray) -> np.ndarray:
    """(N, n_blocks, ...) -> the same shape holding the pack_i8 column order:
    the first N - N % 4 columns in groups of four, block-major within a group
    ((N // 4, n_blocks, 4, ...)), then the last N % 4 columns as they were."""
    n, nb = x.shape[:2]
    g4 = n - n % 4
    head = x[:g4].reshape(g4 // 4, 4, nb, *x.shape[2:]).swapaxes(1, 2)
    return np.concatenate([head.reshape(-1), x[g4:].reshape(-1)]).reshape(x.shape)


#: prepacked weights smaller than this are carved from shared buffers of
#: SLAB_BYTES (see :func:`_in_slab`); larger ones get an allocation of their own
SLAB_BYTES = 64 << 20
_HUGE_PAGE = 2 << 20
_slab_lock = threading.Lock()
_slab: list = [None, 0]  # weak reference to the current buffer, next free byte


def _in_slab(arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Copies of ``arrays`` (an array listed twice copied once) in a shared,
    2 MiB-aligned buffer of :data:`SLAB_BYTES`, which numpy asks the kernel
    to back with transparent huge pages (it does so for allocations of 4 MiB
    and more): one projection's weights are 0.1-1 MB, so each would sit in
    4 KiB pages of its own, and decode streams every one of them each token
    (a TLB walk and a hardware-prefetcher stop every 4 KiB). SmolLM2 level 4,
    the 30 decoder blocks' 66 MB copied into one huge-page buffer,
    interleaved A/B of streamed decode: +2 to +4 %. A buffer lives as long as
    one of its arrays."""
    out: dict[int, np.ndarray] = {}
    for a in arrays:
        if id(a) in out:
            continue
        size = (a.nbytes + 63) // 64 * 64
        if size == 0 or size > SLAB_BYTES // 4:
            out[id(a)] = a
            continue
        with _slab_lock:
            ref, off = _slab
            buf = ref() if ref is not None else None
            if buf is None or off + size > buf.nbytes:
                buf = np.empty(SLAB_BYTES + _HUGE_PAGE, np.uint8)
                off = (-buf.ctypes.data) % _HUGE_PAGE
            _slab[0], _slab[1] = weakref.ref(buf), off + size
        v = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
        v[...] = a
        out[id(a)] = v
    return tuple(out[id(a)] for a in arrays)


def pack_i8(q: np.ndarray, scales: np.ndarray, zps: np.ndarray, bits: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights of a block-32 MatMulNBits for :func:`gemm_i8`.

    Args:
        q: 4-bit: (N, n_blocks, 16) uint8 as MatMulNBits packs them; 8-bit:
            (N, n_blocks, 32) uint8.
        scales / zps: (N, n_blocks) float32 scales and zero points.
        bits: 4 or 8.

    Returns:
        ``(w, d, dz)``: (N, n_blocks * 16 or 32) and (N, n_blocks) arrays in
        the layouts of the module docstring, columns interleaved by four
        (:func:`interleave_columns`). A fresh copy, not a view of the
        (memory-mapped) initializer, in memory backed by transparent huge
        pages (:func:`_in_slab`): decode streams every weight each token.
    """
    n, nb = scales.shape
    d = np.ascontiguousarray(scales, np.float32)
    if bits == 4:
        w = np.ascontiguousarray(q, np.uint8).reshape(n, nb, 16)
        dz = d * zps
    else:
        s = (q.astype(np.int16) - 128).astype(np.int8).reshape(n, nb, 16, 2)
        w = np.ascontiguousarray(s.transpose(0, 1, 3, 2)).reshape(n, nb, 32)
        dz = d * (zps - np.float32(128))
    dz = np.ascontiguousarray(dz, np.float32)
    halves = _as_halves(d, dz) if EMBED_HALF_SCALES else None
    if halves is None:
        return _in_slab((interleave_columns(w).reshape(n, -1), interleave_columns(d),
                         interleave_columns(dz)))
    if bits == 8 and OMIT_ZERO_ZERO_POINTS and not np.any(dz):
        # every scale * (zero point - 128) is zero (GGUF Q8_0: symmetric
        # blocks): 34 bytes per block, as the file stores them, not 36
        (e,) = _in_slab((_embed(w.view(np.uint8), halves[0], None).view(w.dtype),))
        return e, e, NO_ZERO_POINTS
    (e,) = _in_slab((_embed(w.view(np.uint8), *halves).view(w.dtype),))
    return e, e, e


#: the ``dz`` of an 8-bit layout without zero points (every block symmetric):
#: its float64 type selects the kernels that skip the correction term
NO_ZERO_POINTS = np.zeros(0, np.float64)
NO_ZERO_POINTS.flags.writeable = False


#: store float16-exact scales inside the weight stream (False: always the
#: separate float32 arrays; for comparisons)
EMBED_HALF_SCALES = True
#: with embedded scales, leave out 8-bit blocks' scale * zero point terms when
#: every one is zero (False: always store them; for comparisons)
OMIT_ZERO_ZERO_POINTS = True
#: a scale * zero point is stored as float16 when that changes it by at most
#: this much relative to it (it was a float16 value up to float32 rounding: a
#: GGUF Q4_1 block's minimum, as the builder writes d * zp = -m)
HALF_ZERO_POINT_RTOL = 2.0 ** -20


def _as_halves(d: np.ndarray, dz: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(d, dz) as float16 bit patterns (uint16) when every scale is a float16
    value exactly and every scale * zero point within
    :data:`HALF_ZERO_POINT_RTOL` of one; else None."""
    with np.errstate(over="ignore", invalid="ignore"):
        d16 = d.astype(np.float16)
        z16 = dz.astype(np.float16)
        ok = (np.isfinite(d).all() and np.array_equal(d16.astype(np.float32), d)
              and np.isfinite(z16).all()
              and bool(np.all(np.abs(z16.astype(np.float32) - dz)
                              <= np.float32(HALF_ZERO_POINT_RTOL) * np.abs(dz))))
    return (d16.view(np.uint16), z16.view(np.uint16)) if ok else None


def _embed(w: np.ndarray, d16: np.ndarray, z16: np.ndarray | None) -> np.ndarray:
    """(N, nb, per) uint8 weights and (N, nb) float16 bits -> (N, nb * (per +
    4)) uint8: per group of four columns and block, the four scales, the four
    scale * zero points (float16, little-endian), then the four weight blocks;
    the last N % 4 columns per block: scale, scale * zero point, weights.
    Without ``z16``: (N, nb * (per + 2)), the same without the zero points."""
    n, nb, per = w.shape
    g4 = n - n % 4
    g = g4 // 4

    def grouped(x: np.ndarray) -> np.ndarray:  # (N, nb, k) -> (G, nb, 4 * k) bytes
        k = x.shape[2]
        x = np.ascontiguousarray(x[:g4].reshape(g, 4, nb, k).swapaxes(1, 2))
        if not g:
            return np.zeros((0, nb, 4 * x.itemsize * k), np.uint8)
        return x.view(np.uint8).reshape(g, nb, -1)

    def tail_bytes(x: np.ndarray) -> np.ndarray:  # (N, nb, k) -> (N % 4, nb, k) bytes
        x = np.ascontiguousarray(x[g4:])
        return x.view(np.uint8).reshape(n - g4, nb, -1) if n > g4 else np.zeros(
            (0, nb, x.itemsize * x.shape[2]), np.uint8)

    halves = [d16] if z16 is None else [d16, z16]
    head = np.concatenate([grouped(x[..., None]) for x in halves] + [grouped(w)], axis=2)
    tail = np.concatenate([tail_bytes(x[..., None]) for x in halves] + [tail_bytes(w)], axis=2)
    return np.concatenate([head.reshape(-1), tail.reshape(-1)]).reshape(
        n, nb * (per + 2 * len(halves)))


def gemm_i8(a: np.ndarray, w: np.ndarray, d: np.ndarray, dz: np.ndarray, bits: int,
            out: np.ndarray) -> None:
    """out = A @ dequant(B)^T with A quantized to int8 per 32-value block.

    Args:
        a: (M, n_blocks * 32) float32, C-contiguous, zero-padded past K.
        w, d, dz: from :func:`pack_i8`; bits: 4 or 8.
        out: (M, N) float32, written.

    Parallel over column chunks when M x N x K reaches
    :data:`GEMV_PARALLEL_MIN_WEIGHTS` (one row) or :data:`GEMM_PARALLEL_MIN_WORK`
    (more rows); below, one thread (waking the second costs ~50 µs in a graph).
    """
    n = w.shape[0]
    work = a.shape[0] * n * a.shape[1]
    least = GEMV_PARALLEL_MIN_WEIGHTS if a.shape[0] == 1 else GEMM_PARALLEL_MIN_WORK
    if work < least or n < 4:
        (_serial_q4 if bits == 4 else _serial_q8)(a, w, d, dz, out)
        return
    chunks = max(1, min(n // 4, 2 * _nb.num_threads()))
    _nb._parallel(_par_q4 if bits == 4 else _par_q8, a, w, d, dz, out, chunks)


def warm_up() -> None:
    """Compile (or load from numba's disk cache) the int8 kernels once."""
    global _WARM
    if _WARM or not HAVE_INT8_DOT:
        return
    a = np.zeros((1, BLOCK), np.float32)
    quantize_rows(a)
    out = np.zeros((1, 2), np.float32)
    d = np.ones((2, 1), np.float32)
    for bits, per in ((4, 16), (8, 32)):
        w = np.zeros((2, per), np.uint8 if bits == 4 else np.int8)
        (_serial_q4 if bits == 4 else _serial_q8)(a, w, d, d, out)
        (_par_q4 if bits == 4 else _par_q8)(a, w, d, d, out, 1)
    _WARM = True
