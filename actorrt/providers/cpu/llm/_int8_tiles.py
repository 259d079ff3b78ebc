"""The int8 block dot-product kernels of :mod:`._contrib_int8`: LLVM IR
through numba intrinsics (``vpmaddubsw`` / ``vpmaddwd``) and the column-chunk
driver :func:`_cols` over the layouts of :mod:`._contrib_int8`'s docstring.

* ``_tile_codegen`` / ``_tile1.._tile4`` (and the prefetching ``_pf``
  ones): up to four rows of the quantized activations times one interleaved
  group of four output columns, each weight block loaded and unpacked once
  for every row of the tile (4-bit: two columns a 32-byte load against the
  activations' halves broadcast to both 128-bit lanes, the zero-point terms
  in a loop of their own: ``TILE_PAIRED``, ``TILE_Z_APART``);
  (with :data:`USE_VNNI` ``vpdpbusd``; the one-row tile on zmm with
  :data:`TILE_ZMM`);
* ``_dot1``: one row times one column (the last N % 4 columns);
* ``_group`` / ``_group_pf``: one row times a column group (the older
  one-row path, kept for comparisons: ``TILE_MIN_ROWS``);
* ``_cols(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, lo, hi, prefetch)``:
  output columns lo..hi of every row (what the fused decoder stack's
  projection stages and :func:`._contrib_int8.gemm_i8` call); from
  :data:`._int8_panel.PANEL_MIN_ROWS` rows, 4-bit, eight columns at a time
  against an unpacked int8 panel (:mod:`._int8_panel`, the same bits);
  from :data:`._int8_wide.WIDE_MIN_ROWS` rows below that (a decode batch),
  4-bit with zero points and 8-bit on AVX-512 VNNI, sixteen columns at a
  time in zmm tiles of up to eight rows (:mod:`._int8_wide`, the same bits).

:data:`HAVE_INT8_DOT` is False without numba, off x86-64, without AVX2, or
when numba compiles for another CPU than the host (``NUMBA_CPU_NAME``); the
kernels then do not exist.

**VNNI.** :data:`HAVE_VNNI`: the host has ``vpdpbusd`` on ymm (AVX-VNNI, or
AVX-512 VNNI with AVX512VL; the same conditions as AVX2 otherwise). Then
(:data:`USE_VNNI`, unless ``ACTORRT_INT8_VNNI=0`` forces the AVX2 path) every
``vpmaddubsw`` + ``vpmaddwd`` (+ the int16 / int32 adds between them) becomes
``vpdpbusd`` (u8 x s8, four products summed into each int32 lane and added
to an accumulator): in our operand ranges the AVX2 pairs never saturate
(4-bit: |pair| <= 2 * 15 * 127; 8-bit: |w| <= 128 as u8 times +-127), so the
int32 lanes, and then every float operation after them, are bit for bit the
AVX2 path's. The switch is read at import and joins the numba cache stamp
(:data:`.._numba_cache.SWITCHES`), so a cache compiled under the other value
is not run.

Callers cached from other files (:mod:`._contrib_int8`, :mod:`._block_kernels`)
recompile after an edit here: the kernels' disk cache is keyed on every kernel
source file (:mod:`.._numba_cache`), not only the caller's own.
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import os
import platform
from types import SimpleNamespace

from . import _contrib_numba as _nb

#: values per block of the int8 kernels (MatMulNBits block_size must match)
BLOCK = 32


def _host_features() -> dict:
    """llvmlite's host CPU features (name -> bool); empty without numba, off
    x86-64, or when numba compiles for another CPU (``NUMBA_CPU_NAME`` /
    ``NUMBA_CPU_FEATURES``: the intrinsics may not exist there)."""
    if not _nb.HAVE_NUMBA or platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    try:
        import numba
        import llvmlite.binding as ll
        if numba.config.CPU_NAME or numba.config.CPU_FEATURES:
            return {}
        return dict(ll.get_host_cpu_features())
    except Exception:  # pragma: no cover - llvmlite without host feature queries
        return {}


def _host_has_avx2() -> bool:
    return bool(_host_features().get("avx2", False))


def _host_has_vnni() -> bool:
    """vpdpbusd on ymm: AVX-VNNI (VEX), or AVX-512 VNNI with AVX512VL."""
    f = _host_features()
    return bool(f.get("avx2", False)) and bool(
        f.get("avxvnni", False) or (f.get("avx512vnni", False) and f.get("avx512vl", False)))


HAVE_INT8_DOT = _host_has_avx2()
#: the host has vpdpbusd on ymm (and HAVE_INT8_DOT)
HAVE_VNNI = HAVE_INT8_DOT and _host_has_vnni()
#: HAVE_VNNI and vpdpbusd on zmm (AVX-512 F/BW/VNNI: the wide panel tiles
#: of :mod:`._int8_panel`)
HAVE_VNNI512 = HAVE_VNNI and all(_host_features().get(f, False)
                                 for f in ("avx512f", "avx512bw", "avx512vnni"))
#: the kernels compile to vpdpbusd (HAVE_VNNI, and the environment does not
#: set ``ACTORRT_INT8_VNNI=0``: the AVX2 path, for comparisons and tests);
#: read at import, the same bits either way
USE_VNNI = HAVE_VNNI and os.environ.get("ACTORRT_INT8_VNNI", "1").strip() != "0"
#: software prefetch distance of the prefetching decode kernel (``_cols``
#: with ``prefetch``), in weight blocks of a column group ahead
PREFETCH_BLOCKS = 16
#: from this many rows of A the kernels run rows x columns tiles (:func:`_tile_codegen`):
#: each weight block unpacked once for up to four rows. 1: every row, decode
#: at batch 1 included, so a row's outputs do not depend on the batch; more
#: rows than that take the older one-row group kernel (for comparisons)
TILE_MIN_ROWS = 1
#: rows of A per pass over a column chunk's weights in the tiled kernel: a
#: block's activations (ROW_BLOCK x K int8, 36-96 KB for K 576-1536) stay in L2
ROW_BLOCK = 64
#: 4-bit tiles sum each row's four column products in int16 before widening
#: (``narrow`` in :func:`_tile_codegen`); False: widen each (for comparisons)
TILE_I16_SUMS = True
#: 4-bit tiles load two columns' weight blocks as one 32-byte vector and
#: multiply them by the row's even / odd activations broadcast to both
#: 128-bit lanes (``paired`` in :func:`_tile_codegen`); False: ``narrow``
TILE_PAIRED = True
#: 4-bit tiles sum the zero-point terms in a loop of their own after the
#: block loop (False: in the block loop's accumulators, lanes 0-3, as the
#: 8-bit tiles do: apart, their one-row tile measured 12 % slower)
TILE_Z_APART = True
#: the one-row 4-bit paired tile on zmm where USE_VNNI and HAVE_VNNI512: the
#: group's four columns one 64-byte load, two zmm vpdpbusd a block (ymm:
#: four); 1.05-1.07x at M = 1, but 0.92-0.97x at M = 4-16 as the 2-4-row
#: tiles (the same run, docs/int8_tiles.md round 7), so only there
TILE_ZMM = USE_VNNI and HAVE_VNNI512

if HAVE_INT8_DOT:
    from llvmlite import ir
    from numba import njit, types
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

    def _dpbusd(builder, acc, u, x):
        """vpdpbusd: ``acc`` (<8 x i32>, or None: zeros) plus, in lane j, the
        sum of the four products u[4j + i] (unsigned) * x[4j + i] (signed) of
        the <32 x i8> operands (not saturating)."""
        v32, v8i = _V(_i8, 32), _V(_i32, 8)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v8i, [v8i, v32, v32]),
            "llvm.x86.avx512.vpdpbusd.256")
        return builder.call(fn, [_splat(_i32, 0, 8) if acc is None else acc, u, x])

    def _dpbusd512(builder, acc, u, x):
        """:func:`_dpbusd` on zmm (<16 x i32> acc or None; <64 x i8> u, x)."""
        v64, v16i = _V(_i8, 64), _V(_i32, 16)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v16i, [v16i, v64, v64]),
            "llvm.x86.avx512.vpdpbusd.512")
        return builder.call(fn, [_splat(_i32, 0, 16) if acc is None else acc, u, x])

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
        if USE_VNNI:  # the same int32 lanes (no pair saturates)
            return _dpbusd(builder, None, wv, xv)
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

    def _close_loop(builder, b, nb, entry, loop, done, accs, new, zero):
        """Close a :func:`_block_loop` whose accumulator phis are ``accs``
        (lists of phis) and whose loop values are ``new`` (the same shape):
        branch back with ``b + 1 < nb``, then, at ``done``, the final values
        (``zero`` where the loop did not run: one constant for every part, or
        a list or tuple of one per part), in ``accs``' shape; every final phi
        comes before anything the caller adds at ``done``."""
        zeros = zero if isinstance(zero, (list, tuple)) else [zero] * len(new)
        b1 = builder.add(b, _i64(1))
        b.add_incoming(b1, loop)
        for part_phis, part_new in zip(accs, new):
            for phi, val in zip(part_phis, part_new):
                phi.add_incoming(val, loop)
        builder.cbranch(builder.icmp_signed("<", b1, nb), loop, done)
        builder.position_at_end(done)
        finals = []
        for part_new, part_zero in zip(new, zeros):
            out = []
            for val in part_new:
                phi = builder.phi(val.type)
                phi.add_incoming(part_zero, entry)
                phi.add_incoming(val, loop)
                out.append(phi)
            finals.append(out)
        return finals

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
            fin, finc = _close_loop(builder, b, nb, entry, loop, done, [accs, corrs],
                                    [new, newc], [zero, fzero])
            outs = [builder.fsub(_hsum(builder, fin[r]), finc[r]) for r in range(rows)]
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
            fin, (fcorr,) = _close_loop(builder, b, nb, entry, loop, done, [accs, [corr]],
                                        [new, [corr1]], [zero, zero4])
            outs = [builder.fsub(_hsum(builder, fin[c]),
                                 builder.extract_element(fcorr, _i32(c))) for c in range(4)]
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

    def _tile_codegen(bits, rows, locality=None, paired=None, z_apart=None):
        # locality: prefetch ahead; paired / z_apart: TILE_PAIRED /
        # TILE_Z_APART when None (the others for comparisons)
        """IR of ``rows`` rows of A times the four output columns of one
        interleaved group (see :func:`pack_i8`), rows ``row_x`` int8 values
        apart in ``xq`` and ``nb`` scales apart in ``sx`` / ``xsum``. Per
        block the four columns' weights are loaded and unpacked once for all
        rows; per row the four columns' block sums are reduced into one
        <8 x i32> vector, converted once and scaled by the four columns'
        scales times the row's scale (one FMA). 8-bit (and 4-bit without
        ``paired``): lanes c and c + 4 hold column c's two halves, the
        zero-point term is subtracted in the same accumulator (lanes 0-3).
        4-bit ``paired`` (the default, :data:`TILE_PAIRED`): two columns'
        nibbles are one 32-byte load (column 2p in the low 128-bit lane,
        2p + 1 in the high one) against the row's even / odd activations
        broadcast to both lanes, the lanes [c0, c2, c0, c2 | c1, c3, c1, c3];
        with ``z_apart`` (:data:`TILE_Z_APART`) the zero-point terms
        sum_b dz[c, b] * xsum[r, b] run in a second, short loop and are
        subtracted from each column's total at the end. One <8 x float>
        accumulator per row, so a tile of up to four rows stays in registers.

        Every row runs the same float operations in the same order whatever
        the tile's size (only FMA contraction allowed, no reassociation), so
        a row's outputs are bit for bit the same alone (decode at batch 1),
        in a batch or in a prompt."""
        per = 16 if bits == 4 else BLOCK

        z_apart = bits == 4 and (TILE_Z_APART if z_apart is None else z_apart)
        pair = bits == 4 and (TILE_PAIRED if paired is None else paired)
        zmm = pair and TILE_ZMM and rows == 1

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
            wts = [] if pair else [_weight_block(builder, bits, wa, builder.add(
                w_off, _i64(c * per)), b, ops[2], wstride) for c in range(4)]
            x_at = builder.add(x_off, builder.mul(b, _i64(BLOCK)))
            s_at = builder.add(s_off, b)

            def unpacked(s0, s1, s2, s3):
                # the four columns' <8 x i32> sums into one vector, lane c
                # column c's lanes 0-3 and lane c + 4 its lanes 4-7, with
                # unpacks (one uop each) and vertical adds: the pairwise
                # shuffle-adds this replaced became vphaddd (several uops on
                # Zen 3); integer sums, so the bits are the same either way
                def shuf(a, c, idx):
                    return builder.shuffle_vector(a, c, ir.Constant(_V(_i32, 8), idx))
                ab = builder.add(shuf(s0, s1, [0, 8, 1, 9, 4, 12, 5, 13]),
                                 shuf(s0, s1, [2, 10, 3, 11, 6, 14, 7, 15]))
                cd = builder.add(shuf(s2, s3, [0, 8, 1, 9, 4, 12, 5, 13]),
                                 shuf(s2, s3, [2, 10, 3, 11, 6, 14, 7, 15]))
                return builder.add(shuf(ab, cd, [0, 1, 8, 9, 4, 5, 12, 13]),
                                   shuf(ab, cd, [2, 3, 10, 11, 6, 7, 14, 15]))

            v16i = _V(_i16, 16)

            def narrow(p0, p1, p2, p3):
                # 4-bit: the same lanes from the four columns' vpmaddubsw
                # products (<16 x i16>, |pair sum| <= 2 * 15 * 127), summed in
                # int16 first (four of them, <= 15240: no overflow) with
                # unpacks and adds, then widened by one vpmaddwd: 5 multiply
                # uops a row and four columns instead of 8. Exact integer
                # sums, so the same bits as ``unpacked``
                def shuf(a, c, idx):
                    return builder.shuffle_vector(a, c, ir.Constant(_V(_i32, 16), idx))
                lo32 = [0, 1, 16, 17, 2, 3, 18, 19, 8, 9, 24, 25, 10, 11, 26, 27]
                hi32 = [4, 5, 20, 21, 6, 7, 22, 23, 12, 13, 28, 29, 14, 15, 30, 31]
                lo64 = [0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27]
                hi64 = [4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31]
                ab = builder.add(shuf(p0, p1, lo32), shuf(p0, p1, hi32))
                cd = builder.add(shuf(p2, p3, lo32), shuf(p2, p3, hi32))
                abcd = builder.add(shuf(ab, cd, lo64), shuf(ab, cd, hi64))
                return builder.call(ops[1], [abcd, _splat(_i16, 1, 16)])

            if pair:
                # the lanes of ``paired``: low half [c0, c2, c0, c2], high half
                # [c1, c3, c1, c3]; the zero-point terms in lanes 0, 1, 4, 5
                d8 = builder.shuffle_vector(d4, d4, ir.Constant(_V(_i32, 8),
                                                                [0, 2, 0, 2, 1, 3, 1, 3]))
                z8 = builder.shuffle_vector(z4, zero4, ir.Constant(_V(_i32, 8),
                                                                   [0, 2, 4, 4, 1, 3, 4, 4]))
                pairs = []
                if zmm:  # the group's 64 bytes (columns 0-3) as one vector
                    raw = _load_vec(builder, wa, builder.add(w_off, builder.mul(b, wstride)),
                                    _V(_i8, 64))
                    wide = (builder.and_(raw, _splat(_i8, 15, 64)),
                            builder.lshr(raw, _splat(_i8, 4, 64)))
                for p in range(0 if zmm else 2):  # columns 2p, 2p + 1: 32 adjacent bytes
                    raw = _load_vec(builder, wa, builder.add(builder.add(
                        w_off, _i64(2 * p * per)), builder.mul(b, wstride)), v32)
                    pairs.append((builder.and_(raw, _splat(_i8, 15, 32)),
                                  builder.lshr(raw, _splat(_i8, 4, 32))))

            def paired(x_row):
                # 4-bit, the activations' halves (even values, odd values)
                # each broadcast to both 128-bit lanes (vbroadcasti128: load
                # ports only) against two columns' nibbles at once (low
                # 128-bit lane column 2p, high 2p + 1): 4 vpmaddubsw, one add
                # a pair (|lane| <= 2 * 2 * 15 * 127), one 32-bit unpack pair
                # and add across the pairs (<= 15,240: no int16 overflow), one
                # vpmaddwd. No per-column unpacking of the weights and two
                # shuffles a row instead of six
                bcast = ir.Constant(_V(_i32, 32), list(range(16)) * 2)
                half = _V(_i8, 16)
                xe = _load_vec(builder, xa, x_row, half)
                xo = _load_vec(builder, xa, builder.add(x_row, _i64(16)), half)
                if zmm:
                    # the halves broadcast to all four 128-bit lanes against
                    # the four columns at once: lanes 0-7 of the two zmm
                    # vpdpbusd are pair 0's int32 lanes below, 8-15 pair 1's
                    b4 = ir.Constant(_V(_i32, 64), list(range(16)) * 4)
                    z = _dpbusd512(builder, _dpbusd512(
                        builder, None, wide[0], builder.shuffle_vector(xe, xe, b4)),
                        wide[1], builder.shuffle_vector(xo, xo, b4))
                    lo32 = builder.shuffle_vector(z, z, ir.Constant(
                        _V(_i32, 8), [0, 8, 1, 9, 4, 12, 5, 13]))
                    hi32 = builder.shuffle_vector(z, z, ir.Constant(
                        _V(_i32, 8), [2, 10, 3, 11, 6, 14, 7, 15]))
                    return builder.add(lo32, hi32)
                xe = builder.shuffle_vector(xe, xe, bcast)
                xo = builder.shuffle_vector(xo, xo, bcast)
                if USE_VNNI:
                    # each int32 lane of a pair's two vpdpbusd: the sum of
                    # the two int16 lanes vpmaddwd adds below, exactly
                    ps = [_dpbusd(builder, _dpbusd(builder, None, lo_, xe), hi_, xo)
                          for lo_, hi_ in pairs]
                else:
                    ps = [builder.bitcast(builder.add(builder.call(ops[0], [lo_, xe]),
                                                      builder.call(ops[0], [hi_, xo])), v8i)
                          for lo_, hi_ in pairs]
                lo32 = builder.shuffle_vector(ps[0], ps[1], ir.Constant(
                    _V(_i32, 8), [0, 8, 1, 9, 4, 12, 5, 13]))
                hi32 = builder.shuffle_vector(ps[0], ps[1], ir.Constant(
                    _V(_i32, 8), [2, 10, 3, 11, 6, 14, 7, 15]))
                if USE_VNNI:
                    return builder.add(lo32, hi32)
                both16 = builder.add(builder.bitcast(lo32, v16i), builder.bitcast(hi32, v16i))
                return builder.call(ops[1], [both16, _splat(_i16, 1, 16)])

            new = []
            for r in range(rows):
                x_row = builder.add(x_at, builder.mul(row_x, _i64(r)))
                xv = None if pair else _load_vec(builder, xa, x_row, v32)
                if pair:
                    isum = paired(x_row)
                elif bits == 4 and TILE_I16_SUMS and not USE_VNNI:
                    isum = narrow(*(builder.call(ops[0], [wv, xv]) for wv, _ in wts))
                else:
                    isum = unpacked(*(_block_isum(builder, ops, wv, ws, xv) for wv, ws in wts))
                s_r = builder.add(s_at, builder.mul(nb, _i64(r)))
                sxv = _broadcast(builder, builder.load(builder.gep(sa, [s_r])))
                acc = builder.fadd(accs[r], builder.fmul(builder.sitofp(isum, v8f),
                                                         builder.fmul(d8, sxv, flags=fast),
                                                         flags=fast), flags=fast)
                if z_apart:
                    new.append(acc)
                else:
                    xsv = _broadcast(builder, builder.load(builder.gep(ua, [s_r])))
                    new.append(builder.fsub(acc, builder.fmul(z8, xsv, flags=fast), flags=fast))
            (finals,) = _close_loop(builder, b, nb, entry, loop, done, [accs], [new], zero)
            zs = None
            if z_apart and sig.args[9].dtype != types.float64:
                # the zero-point terms sum_b dz[c, b] * xsum[r, b] in a loop of
                # their own (<4 x float> a row, columns in order): off the
                # main loop's accumulator chains, which are then one FMA a
                # block (4 cycles, not 8: the one-row tile was bound by it)
                zentry, zloop, zdone, b2 = _block_loop(builder, nb, "i8tilez")
                zaccs = [builder.phi(v4f) for _ in range(rows)]
                for phi in zaccs:
                    phi.add_incoming(zero4, zentry)
                zb4 = _load_zero_points(builder, sig, 9, dty, za,
                                        builder.add(z_off, builder.mul(b2, dstride)), 4)
                znew = []
                for r in range(rows):
                    s_r = builder.add(builder.add(s_off, b2), builder.mul(nb, _i64(r)))
                    xs4 = _lane(builder, builder.insert_element(
                        ir.Constant(v4f, None), builder.load(builder.gep(ua, [s_r])), _i32(0)),
                        0, 4)
                    znew.append(builder.fadd(zaccs[r], builder.fmul(zb4, xs4, flags=fast),
                                             flags=fast))
                (zs,) = _close_loop(builder, b2, nb, zentry, zloop, zdone, [zaccs], [znew],
                                    zero4)
            outs = []
            # (paired: lanes 0 + 2, 4 + 6, 1 + 3, 5 + 7; else c + (c + 4))
            first, second, order = (([0, 1, 4, 5], [2, 3, 6, 7], (0, 2, 1, 3))
                                    if pair else
                                    ([0, 1, 2, 3], [4, 5, 6, 7], (0, 1, 2, 3)))
            for r in range(rows):
                lo4 = builder.shuffle_vector(finals[r], finals[r],
                                             ir.Constant(_V(_i32, 4), first))
                hi4 = builder.shuffle_vector(finals[r], finals[r],
                                             ir.Constant(_V(_i32, 4), second))
                tot = builder.fadd(lo4, hi4)
                if zs is not None:
                    outs.extend(builder.fsub(builder.extract_element(tot, _i32(c)),
                                             builder.extract_element(zs[r], _i32(j)))
                                for j, c in enumerate(order))
                else:
                    outs.extend(builder.extract_element(tot, _i32(c)) for c in order)
            return context.make_tuple(builder, sig.return_type, outs)

        return codegen

    def _tile_intrinsic(rows, locality=None, **variant):
        """The tile of ``rows`` rows as a numba intrinsic; ``variant``:
        :func:`_tile_codegen`'s ``paired`` / ``z_apart`` (for comparisons)."""
        def typer(typingctx, w, w_off, wstride, xq, x_off, sx, xsum, s_off, d, dz, d_off,
                  z_off, dstride, nb):
            return (types.UniTuple(types.float32, 4 * rows)(
                w, w_off, wstride, xq, x_off, sx, xsum, s_off, d, dz, d_off, z_off, dstride, nb),
                _tile_codegen(_bits_of(w), rows, locality, **variant))
        typer.__name__ = f"_tile_i8_x{rows}" + ("_pf" if locality is not None else "")
        return intrinsic(typer)

    #: the IR helpers, for the other kernel stages (:mod:`._int8_panel`)
    IR = SimpleNamespace(unpack=_unpack, block_loop=_block_loop, close_loop=_close_loop,
                         load_vec=_load_vec,
                         load_scales=_load_scales, load_zero_points=_load_zero_points,
                         splat=_splat, broadcast=_broadcast, declare=_declare, dpbusd=_dpbusd,
                         dpbusd512=_dpbusd512,
                         prefetch=_prefetch, weight_block=_weight_block,
                         block_isum=_block_isum)

    # (the prefetching ones for the fused blocks' short weight streams, as _group_pf)
    _tile4, _tile3, _tile2, _tile1 = (_tile_intrinsic(r) for r in (4, 3, 2, 1))
    _tile4_pf, _tile3_pf, _tile2_pf, _tile1_pf = (_tile_intrinsic(r, 3) for r in (4, 3, 2, 1))

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

    #: the layout hooks, for the other kernel stages (:mod:`._int8_panel`):
    #: a column's offsets / strides, whether the scales are embedded, weight
    #: bytes a block, the weights' bits (4 or 8) from their numba type, whether
    #: the 8-bit layout has no zero points
    column_layout, embedded_scales, block_bytes, bits_of, symmetric = (
        _column, _embedded, _per_block, _bits_of, _symmetric)

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
        if (_panel.PANEL_MIN_ROWS > 0 and m_rows >= _panel.PANEL_MIN_ROWS and per == 16
                and not sym and TILE_PAIRED and TILE_Z_APART):
            # prefill-size M, 4-bit: eight columns at a time against a panel
            # unpacked once (the same bits as the paired tiles below)
            lo = _panel._panel_cols(xq, sx, xsum, w, d, dz, out, lo, full)
        elif m_rows >= _wide.WIDE_MIN_ROWS and ((_wide.WIDE_DECODE and per == 16 and not sym)
                                                or (_wide.WIDE_DECODE8 and per == 32)):
            # a decode batch: sixteen columns at a time on zmm, each weight
            # block unpacked (4-bit) or transposed (8-bit) in registers once
            # for up to eight rows (the same bits as the tiles below)
            lo = _wide._wide_cols(xq, sx, xsum, w, d, dz, out, lo, full, prefetch)
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

    @njit(fastmath=True, nogil=True, cache=True)
    def _cols_rows(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, r0, r1, lo, hi,
                   prefetch):  # pragma: no cover - compiled
        # _cols on rows r0..r1 only (one (row tile, column chunk) work item of
        # the fused decoder stack's projection stages): each row's outputs
        # are the same bits whichever rows share its tile
        _cols(xq[r0:r1], sx[r0:r1], xsum[r0:r1], sx_t, xs_t, w, d, dz, out[r0:r1], lo, hi,
              prefetch)


if HAVE_INT8_DOT:
    from . import _int8_panel as _panel  # noqa: E402  (uses IR above; read by _cols)
    from . import _int8_wide as _wide  # noqa: E402  (the same)
