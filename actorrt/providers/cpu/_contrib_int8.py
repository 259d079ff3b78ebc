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

(the first sum in integers). The weights stay as the file packs them: 4-bit
values two per byte (16 bytes per block, as MatMulNBits packs them), 8-bit
values one signed byte per value. Per block the kernel streams 16 (or 32) bytes of
weights plus two float32 numbers (``scale`` and ``scale * zp``): 0.75 bytes
per 4-bit weight, where the float32-activation kernels of
:mod:`._contrib_numba` stream 1.25.

The block dot product is written in LLVM IR with the AVX2 byte
multiply-add instructions (``vpmaddubsw``, ``vpmaddwd``): numba's own loops
vectorize a 32-value integer dot product with a horizontal reduction per
block, ~4x slower. :data:`HAVE_INT8_DOT` is False without numba, off x86-64,
without AVX2, or when numba compiles for another CPU than the host
(``NUMBA_CPU_NAME``); MatMulNBits then keeps float32 activations.

Layouts (C-contiguous):
    ``w``: 4-bit (N, n_blocks * 16) uint8, value ``2i`` of a block in the low
    nibble of byte ``i`` (MatMulNBits' own layout); 8-bit (N, n_blocks * 32)
    int8 holding ``q - 128``, each block reordered as values 0, 2, ..., 30,
    1, 3, ..., 31.
    ``d`` / ``dz``: (N, n_blocks) float32 scale and scale * zero point
    (8-bit: scale * (zero point - 128)).
    ``xq``: (M, n_blocks * 32) int8, each block reordered even values first,
    then odd (the order the 4-bit bytes unpack to); ``sx`` / ``xsum``:
    (M, n_blocks) float32 block scales and ``sx * sum(xq)``.
"""

from __future__ import annotations

import platform

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
GEMV_PARALLEL_MIN_WEIGHTS = 1 << 22
#: more rows run on one thread below this many multiply-adds (M x N x K)
GEMM_PARALLEL_MIN_WORK = 1 << 22
_WARM = False

if HAVE_INT8_DOT:
    from llvmlite import ir
    from numba import njit, prange, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _i8, _i16, _i32, _i64, _f32 = (ir.IntType(8), ir.IntType(16), ir.IntType(32),
                                   ir.IntType(64), ir.FloatType())
    _V = ir.VectorType

    def _splat(t, value, n):
        return ir.Constant(_V(t, n), [value] * n)

    def _load_vec(builder, base, index, vty):
        return builder.load(builder.bitcast(builder.gep(base, [index]), vty.as_pointer()),
                            align=1)

    def _as_i64(builder, v):
        return v if v.type == _i64 else builder.sext(v, _i64)

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

    def _weight_block(builder, bits, wa, w_off, b, psign):
        """Block b of a weight row as the unsigned operand of vpmaddubsw, and
        (8-bit) the signed values whose signs go onto the activations."""
        if bits == 4:
            # 16 bytes -> 32 values 0..15: low nibbles (even values), then high
            raw = _load_vec(builder, wa, builder.add(w_off, builder.mul(b, _i64(16))),
                            _V(_i8, 16))
            lo = builder.and_(raw, _splat(_i8, 15, 16))
            hi = builder.lshr(raw, _splat(_i8, 4, 16))
            return builder.shuffle_vector(lo, hi, ir.Constant(_V(_i32, 32), list(range(32)))), None
        # signed x signed as |w| (<= 128 as u8) times sign(w) * x
        ws = _load_vec(builder, wa, builder.add(w_off, builder.mul(b, _i64(BLOCK))), _V(_i8, 32))
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

    def _dot_blocks_codegen(bits, rows):
        """IR of, for r < rows: sum over blocks b < nb of d[d_off + b] *
        sx[s_off + r*nb + b] * sum_i(w_i * xq[x_off + r*nb*32 + b*32 + i])
        (integer sums), one <8 x float> accumulator per row; each weight block
        is loaded (and its nibbles split) once for all rows."""

        def codegen(context, builder, sig, args):
            wa, xa, sa, da = (context.make_array(sig.args[i])(context, builder, args[i]).data
                              for i in (0, 2, 4, 6))
            w_off, x_off, s_off, d_off, nb = (_as_i64(builder, args[i]) for i in (1, 3, 5, 7, 8))
            ops = _declare(builder)
            v32, v8f = _V(_i8, 32), _V(_f32, 8)
            zero = _splat(_f32, 0.0, 8)
            row_x = builder.mul(nb, _i64(BLOCK))  # in the entry block, before the phis
            entry, loop, done, b = _block_loop(builder, nb, "i8dot")
            accs = []
            for _ in range(rows):
                acc = builder.phi(v8f)
                acc.add_incoming(zero, entry)
                accs.append(acc)
            wv, ws = _weight_block(builder, bits, wa, w_off, b, ops[2])
            dval = builder.load(builder.gep(da, [builder.add(d_off, b)]))
            x_at = builder.add(x_off, builder.mul(b, _i64(BLOCK)))
            s_at = builder.add(s_off, b)
            new_accs = []
            for r, acc in enumerate(accs):
                xv = _load_vec(builder, xa, builder.add(x_at, builder.mul(row_x, _i64(r))), v32)
                isum = _block_isum(builder, ops, wv, ws, xv)
                sxv = builder.load(builder.gep(sa, [builder.add(s_at, builder.mul(nb, _i64(r)))]))
                sv = _broadcast(builder, builder.fmul(dval, sxv))
                new_accs.append(builder.fadd(
                    acc, builder.fmul(builder.sitofp(isum, v8f), sv, flags=("fast",)),
                    flags=("fast",)))
            b1 = builder.add(b, _i64(1))
            b.add_incoming(b1, loop)
            for acc, acc1 in zip(accs, new_accs):
                acc.add_incoming(acc1, loop)
            builder.cbranch(builder.icmp_signed("<", b1, nb), loop, done)

            builder.position_at_end(done)
            totals = []
            for acc1 in new_accs:  # every phi first, then the reductions
                total = builder.phi(v8f)
                total.add_incoming(zero, entry)
                total.add_incoming(acc1, loop)
                totals.append(total)
            sums = [_hsum(builder, t) for t in totals]
            if rows == 1:
                return sums[0]
            return context.make_tuple(builder, sig.return_type, sums)

        return codegen

    def _dot_intrinsic(bits, rows):
        def typer(typingctx, w, w_off, xq, x_off, sx, s_off, d, d_off, nb):
            ret = types.float32 if rows == 1 else types.UniTuple(types.float32, rows)
            return ret(w, w_off, xq, x_off, sx, s_off, d, d_off, nb), _dot_blocks_codegen(bits,
                                                                                       rows)
        typer.__name__ = f"_dot_q{bits}_i8_x{rows}"
        return intrinsic(typer)

    def _dot8_codegen(bits):
        """IR of the eight outputs of rows r0..r0+7 for one weight row:
        sum over blocks b of d[n, b] * sx[r, b] * isum(r, b) - dz[n, b] * xsum[r, b].
        The eight rows' block sums are reduced into one <8 x i32> (lane r: row
        r) by a transpose-and-add tree, so one conversion and two FMAs serve
        all eight rows, with ``sxT`` / ``xsT`` holding each block's eight row
        scales / sums side by side."""

        def codegen(context, builder, sig, args):
            wa, xa, ta, ua, da, za = (context.make_array(sig.args[i])(context, builder,
                                                                     args[i]).data
                                      for i in (0, 2, 4, 5, 6, 7))
            w_off, x_off, t_off, n_off, nb = (_as_i64(builder, args[i]) for i in (1, 3, 8, 9, 10))
            ops = _declare(builder)
            v32, v8f = _V(_i8, 32), _V(_f32, 8)
            zero = _splat(_f32, 0.0, 8)
            row_x = builder.mul(nb, _i64(BLOCK))  # in the entry block, before the phis
            entry, loop, done, b = _block_loop(builder, nb, "i8dot8")
            acc = builder.phi(v8f)
            corr = builder.phi(v8f)
            acc.add_incoming(zero, entry)
            corr.add_incoming(zero, entry)
            wv, ws = _weight_block(builder, bits, wa, w_off, b, ops[2])
            x_at = builder.add(x_off, builder.mul(b, _i64(BLOCK)))
            parts = [_block_isum(builder, ops, wv, ws,
                                 _load_vec(builder, xa, builder.add(x_at, builder.mul(
                                     row_x, _i64(r))), v32)) for r in range(8)]

            def fold(a, c, lo_idx, hi_idx):
                return builder.add(
                    builder.shuffle_vector(a, c, ir.Constant(_V(_i32, 8), lo_idx)),
                    builder.shuffle_vector(a, c, ir.Constant(_V(_i32, 8), hi_idx)))

            # lanes of parts[r] summed into lane r: pairs, quads, then halves
            q = [fold(parts[i], parts[i + 1], [0, 8, 2, 10, 4, 12, 6, 14],
                      [1, 9, 3, 11, 5, 13, 7, 15]) for i in range(0, 8, 2)]
            u = [fold(q[i], q[i + 1], [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])
                 for i in (0, 2)]
            isum = fold(u[0], u[1], [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])
            at_n = builder.add(n_off, b)
            at_t = builder.add(t_off, builder.mul(b, _i64(8)))
            dv = _broadcast(builder, builder.load(builder.gep(da, [at_n])))
            zv = _broadcast(builder, builder.load(builder.gep(za, [at_n])))
            sxv = _load_vec(builder, ta, at_t, v8f)
            xsv = _load_vec(builder, ua, at_t, v8f)
            fast = ("fast",)
            acc1 = builder.fadd(acc, builder.fmul(builder.sitofp(isum, v8f),
                                                  builder.fmul(dv, sxv, flags=fast), flags=fast),
                                flags=fast)
            corr1 = builder.fadd(corr, builder.fmul(zv, xsv, flags=fast), flags=fast)
            b1 = builder.add(b, _i64(1))
            b.add_incoming(b1, loop)
            acc.add_incoming(acc1, loop)
            corr.add_incoming(corr1, loop)
            builder.cbranch(builder.icmp_signed("<", b1, nb), loop, done)

            builder.position_at_end(done)
            acc_f = builder.phi(v8f)
            corr_f = builder.phi(v8f)
            acc_f.add_incoming(zero, entry)
            acc_f.add_incoming(acc1, loop)
            corr_f.add_incoming(zero, entry)
            corr_f.add_incoming(corr1, loop)
            res = builder.fsub(acc_f, corr_f)
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_element(res, _i32(r)) for r in range(8)])

        return codegen

    def _dot8_intrinsic(bits):
        def typer(typingctx, w, w_off, xq, x_off, sx_t, xs_t, d, dz, t_off, n_off, nb):
            sig = types.UniTuple(types.float32, 8)(w, w_off, xq, x_off, sx_t, xs_t, d, dz, t_off,
                                                   n_off, nb)
            return sig, _dot8_codegen(bits)
        typer.__name__ = f"_dot_q{bits}_i8_x8"
        return intrinsic(typer)

    _dot8_q4 = _dot8_intrinsic(4)
    _dot8_q8 = _dot8_intrinsic(8)
    _dot_q4 = _dot_intrinsic(4, 1)
    _dot_q8 = _dot_intrinsic(8, 1)
    _dot4_q4 = _dot_intrinsic(4, 4)
    _dot4_q8 = _dot_intrinsic(8, 4)

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

    def _cols_kernel(dot, dot4, dot8, per_block):
        def cols(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, lo, hi):  # pragma: no cover
            # output columns lo..hi for every row of xq, eight (then four, then
            # one) rows per pass over a weight row (read from memory once,
            # reused from L1); sx_t / xs_t: (M // 8, nb, 8) transposed copies
            m_rows = xq.shape[0]
            nb = d.shape[1]
            kp = xq.shape[1]
            wf = w.reshape(-1)
            df = d.reshape(-1)
            zf = dz.reshape(-1)
            xf = xq.reshape(-1)
            sf = sx.reshape(-1)
            tf = sx_t.reshape(-1)
            uf = xs_t.reshape(-1)
            for n in range(lo, hi):
                w_at = n * nb * per_block
                m = 0
                while m + 8 <= m_rows:
                    t8 = dot8(wf, w_at, xf, m * kp, tf, uf, df, zf, m * nb, n * nb, nb)
                    for r in range(8):
                        out[m + r, n] = t8[r]
                    m += 8
                while m + 4 <= m_rows:
                    t = dot4(wf, w_at, xf, m * kp, sf, m * nb, df, n * nb, nb)
                    for r in range(4):
                        z = np.float32(0.0)
                        for b in range(nb):
                            z += dz[n, b] * xsum[m + r, b]
                        out[m + r, n] = t[r] - z
                    m += 4
                while m < m_rows:
                    t1 = dot(wf, w_at, xf, m * kp, sf, m * nb, df, n * nb, nb)
                    z = np.float32(0.0)
                    for b in range(nb):
                        z += dz[n, b] * xsum[m, b]
                    out[m, n] = t1 - z
                    m += 1
        return njit(fastmath=True, nogil=True, cache=True)(cols)

    _cols_q4 = _cols_kernel(_dot_q4, _dot4_q4, _dot8_q4, 16)
    _cols_q8 = _cols_kernel(_dot_q8, _dot4_q8, _dot8_q8, 32)

    @njit(nogil=True, cache=True)
    def _quantized(a):  # pragma: no cover - compiled
        m, kp = a.shape
        nb = kp // 32
        xq = np.empty((m, kp), np.int8)
        sx = np.empty((m, nb), np.float32)
        xsum = np.empty((m, nb), np.float32)
        _quantize_rows(a, xq, sx, xsum)
        groups = m // 8
        sx_t = np.empty((groups, nb, 8), np.float32)
        xs_t = np.empty((groups, nb, 8), np.float32)
        for g in range(groups):
            for b in range(nb):
                for r in range(8):
                    sx_t[g, b, r] = sx[g * 8 + r, b]
                    xs_t[g, b, r] = xsum[g * 8 + r, b]
        return xq, sx, xsum, sx_t, xs_t

    def _entry_points(cols):
        # one compiled entry per call (quantize A, then the columns): each numba
        # dispatch costs microseconds, and decode makes ~200 of these calls per
        # token
        def serial(a, w, d, dz, out):  # pragma: no cover - compiled
            xq, sx, xsum, sx_t, xs_t = _quantized(a)
            cols(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, 0, w.shape[0])

        def parallel(a, w, d, dz, out, chunks):  # pragma: no cover - compiled
            xq, sx, xsum, sx_t, xs_t = _quantized(a)
            n_cols = w.shape[0]
            per = (n_cols + chunks - 1) // chunks
            for c in prange(chunks):
                cols(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, c * per,
                     min(n_cols, (c + 1) * per))

        return (njit(fastmath=True, nogil=True, cache=True)(serial),
                njit(parallel=True, fastmath=True, nogil=True, cache=True)(parallel))

    # (numba's disk cache keys these closures by name and signature: the 4-bit
    # and 8-bit instances differ in the weight dtype, uint8 vs int8)
    _serial_q4, _par_q4 = _entry_points(_cols_q4)
    _serial_q8, _par_q8 = _entry_points(_cols_q8)


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


def pack_i8(q: np.ndarray, scales: np.ndarray, zps: np.ndarray, bits: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights of a block-32 MatMulNBits for :func:`gemm_i8`.

    Args:
        q: 4-bit: (N, n_blocks, 16) uint8 as MatMulNBits packs them (copied
            as is); 8-bit: (N, n_blocks, 32) uint8.
        scales / zps: (N, n_blocks) float32 scales and zero points.
        bits: 4 or 8.

    Returns:
        ``(w, d, dz)`` in the layouts of the module docstring.
    """
    n, nb = scales.shape
    d = np.ascontiguousarray(scales, np.float32)
    if bits == 4:
        # a copy, not a view of the (memory-mapped) initializer: numpy backs
        # large arrays with transparent huge pages, and decode streams every
        # weight each token; measured here ~8 % faster per step than the view
        w = np.array(q, np.uint8, order="C").reshape(n, nb * 16)
        dz = d * zps
    else:
        s = (q.astype(np.int16) - 128).astype(np.int8).reshape(n, nb, 16, 2)
        w = np.ascontiguousarray(s.transpose(0, 1, 3, 2)).reshape(n, nb * 32)
        dz = d * (zps - np.float32(128))
    return w, d, np.ascontiguousarray(dz, np.float32)


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
