"""The batched-decode stage of the int8 kernels of :mod:`._int8_tiles`:
2 to :data:`._int8_panel.PANEL_MIN_ROWS` - 1 rows times sixteen output
columns on zmm, each weight block loaded and unpacked once, in registers,
for every row of the tile (no panel written to memory).

* ``_dtile1`` / ``_dtile2`` / ``_dtile4`` / ``_dtile8`` (and the prefetching
  ``_pf`` ones): up to eight rows times four interleaved column groups
  (:func:`._contrib_int8.pack_i8`). Per block the groups' four 64-byte
  weight vectors are rearranged into eight 64-byte steps (step s, s < 4:
  the low nibbles of every column's bytes 4s..4s+3; step s + 4 their high
  nibbles: what :func:`._int8_panel._panel_build_wide` writes to its
  panel), then per row and step one zmm ``vpdpbusd`` with the row's four
  activation bytes broadcast; the results go straight to ``out`` (one
  16-float store a row);
* ``_dtile8_codegen``: the same tiles for 8-bit weights (the LM head a
  GGUF Q8_0 embedding ties to, Q8 projections): per block each group's four
  32-byte columns are transposed in registers into the same eight 64-byte
  steps (step s: every column's bytes 4s..4s+3), and per row and step one
  zmm ``vpdpbusd`` of the activations plus 128 (unsigned: ``x ^ 0x80``)
  against the signed weights, the sums started at -128 * sum(w) (computed
  once a block for every row), so each half's int32 sum is exactly the
  8-bit ymm tile's;
* ``_wide_cols``: the driver (what :func:`._int8_tiles._cols` runs from
  :data:`WIDE_MIN_ROWS` rows below the panel's threshold: 4-bit weights
  with zero points where :data:`WIDE_DECODE` holds, 8-bit weights where
  :data:`WIDE_DECODE8` does).

**Same bits as the paired tile.** Each row's float operations are those of
the wide panel tile ``_int8_panel._wtile*`` lane for lane (the two halves,
steps 0, 2, 4, 6 and 1, 3, 5, 7, each an exact integer sum converted and
accumulated with one FMA by the block's scales times the row's scale; the
zero-point terms in a loop of their own, subtracted last), and those are the
paired tile's (:mod:`._int8_panel`'s docstring): a row's outputs are the
same bits alone (decode at batch 1), in a decode batch and in a prompt.
The 8-bit tiles reproduce the 8-bit ymm tile of :func:`._int8_tiles._tile_codegen`
the same way: per column two accumulators (block bytes 0-15 and 16-31), each
block one FMA by the column's scale times the row's scale, the zero-point
term subtracted from the first in the same loop, the two added at the end.
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

from . import _int8_tiles as _t

#: sixteen columns a tile on zmm where the host has AVX-512 VNNI
#: (:data:`._int8_tiles.HAVE_VNNI512`, :data:`._int8_tiles.USE_VNNI`) and the
#: 4-bit tiles run their paired, zero-points-apart form (the bits this tile
#: reproduces); False: the paired ymm tiles for every decode batch
WIDE_DECODE = _t.USE_VNNI and _t.HAVE_VNNI512 and _t.TILE_PAIRED and _t.TILE_Z_APART
#: the 8-bit tiles (``_dtile8_codegen``) on zmm where the host has AVX-512
#: VNNI: the bits of the 8-bit ymm tiles (never paired, zero points in the
#: block loop) whatever TILE_PAIRED / TILE_Z_APART say
WIDE_DECODE8 = _t.USE_VNNI and _t.HAVE_VNNI512
#: from this many rows (and below the panel's PANEL_MIN_ROWS) _cols runs the
#: wide decode tiles; one row keeps the one-row zmm tile of _int8_tiles
WIDE_MIN_ROWS = 2
#: rows of the largest tile (8 or 4): 8 shares each block's unpacking over
#: more rows, holding 16 float accumulators and the 8 steps in zmm registers
WIDE_TILE_ROWS = 8

if _t.HAVE_INT8_DOT:
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    _i8, _i32, _i64, _f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
    _V = ir.VectorType
    _h = _t.IR

    def _dtile_codegen(rows, locality=None):
        # rows x 16 columns (four groups: weight offsets w_off + j * wg,
        # scale / zero-point offsets d_off / z_off + j * dg), into out at
        # element o_off + r * o_ld + c
        def codegen(context, builder, sig, args):
            (wa, xa, sa, ua, da, za, oa), (w_off, wstride, x_off, s_off, d_off, z_off, dstride,
                                           wg, dg, nb, o_off, o_ld) = _h.unpack(
                context, builder, sig, args, (0, 3, 5, 6, 8, 9, 16),
                (1, 2, 4, 7, 10, 11, 12, 13, 14, 15, 17, 18))
            dty = sig.args[8]
            v16i, v16f, v64 = _V(_i32, 16), _V(_f32, 16), _V(_i8, 64)
            zero = _h.splat(_f32, 0.0, 16)
            fast = ("contract",)
            cat8 = ir.Constant(_V(_i32, 8), list(range(8)))
            cat16 = ir.Constant(_V(_i32, 16), list(range(16)))

            def bcast(value):  # a scalar in every lane
                vt = _V(value.type, 16)
                return builder.shuffle_vector(
                    builder.insert_element(ir.Constant(vt, None), value, _i32(0)),
                    ir.Constant(vt, None), ir.Constant(_V(_i32, 16), [0] * 16))

            def sixteen(load, off):  # the four groups' <4 x float> as <16 x float>
                q = [load(builder.add(off, builder.mul(dg, _i64(j)))) for j in range(4)]
                return builder.shuffle_vector(builder.shuffle_vector(q[0], q[1], cat8),
                                              builder.shuffle_vector(q[2], q[3], cat8), cat16)

            row_x = builder.mul(nb, _i64(_t.BLOCK))
            goffs = [builder.add(w_off, builder.mul(wg, _i64(j))) for j in range(4)]
            entry, loop, done, b = _h.block_loop(builder, nb, "i8dtile")
            accs = [[builder.phi(v16f) for _ in range(rows)] for _ in range(2)]
            for half in accs:
                for phi in half:
                    phi.add_incoming(zero, entry)
            at = builder.mul(b, wstride)
            if locality is not None:  # the groups' weights PREFETCH_BLOCKS blocks ahead
                ahead = builder.mul(builder.add(b, _i64(_t.PREFETCH_BLOCKS)), wstride)
                for go in goffs:
                    _h.prefetch(builder, wa, builder.add(go, ahead), locality)
            g = [_h.load_vec(builder, wa, builder.add(go, at), v16i) for go in goffs]
            steps = [None] * 8
            for s in range(4):  # column c's bytes 4s..4s+3 in lane c
                idx = ir.Constant(_V(_i32, 8), [s + 4 * c for c in range(8)])
                raw = builder.bitcast(builder.shuffle_vector(
                    builder.shuffle_vector(g[0], g[1], idx),
                    builder.shuffle_vector(g[2], g[3], idx), cat16), v64)
                steps[s] = builder.and_(raw, _h.splat(_i8, 15, 64))
                steps[s + 4] = builder.lshr(raw, _h.splat(_i8, 4, 64))
            step = builder.mul(b, dstride)
            dv = sixteen(lambda off: _h.load_scales(builder, dty, da, off, 4),
                         builder.add(d_off, step))
            x_at = builder.add(x_off, builder.mul(b, _i64(_t.BLOCK)))
            s_at = builder.add(s_off, b)
            new = [[], []]
            for r in range(rows):
                s_r = builder.add(s_at, builder.mul(nb, _i64(r)))
                sv = builder.fmul(dv, bcast(builder.load(builder.gep(sa, [s_r]))), flags=fast)
                x_row = builder.add(x_at, builder.mul(row_x, _i64(r)))
                for h, hs in enumerate(((0, 2, 4, 6), (1, 3, 5, 7))):
                    prods = []
                    for s in hs:
                        a4 = builder.load(builder.bitcast(
                            builder.gep(xa, [builder.add(x_row, _i64(4 * s))]),
                            _i32.as_pointer()), align=1)
                        prods.append((steps[s], builder.bitcast(bcast(a4), v64)))
                    isum = builder.add(
                        _h.dpbusd512(builder, _h.dpbusd512(builder, None, *prods[0]), *prods[1]),
                        _h.dpbusd512(builder, _h.dpbusd512(builder, None, *prods[2]), *prods[3]))
                    new[h].append(builder.fadd(accs[h][r], builder.fmul(
                        builder.sitofp(isum, v16f), sv, flags=fast), flags=fast))
            finals = _h.close_loop(builder, b, nb, entry, loop, done, accs, new, zero)
            # the zero-point terms in a loop of their own, as the paired tile
            zentry, zloop, zdone, b2 = _h.block_loop(builder, nb, "i8dtilez")
            zaccs = [builder.phi(v16f) for _ in range(rows)]
            for phi in zaccs:
                phi.add_incoming(zero, zentry)
            zv = sixteen(lambda off: _h.load_zero_points(builder, sig, 9, dty, za, off, 4),
                         builder.add(z_off, builder.mul(b2, dstride)))
            znew = []
            for r in range(rows):
                s_r = builder.add(builder.add(s_off, b2), builder.mul(nb, _i64(r)))
                xsv = bcast(builder.load(builder.gep(ua, [s_r])))
                znew.append(builder.fadd(zaccs[r], builder.fmul(zv, xsv, flags=fast),
                                         flags=fast))
            (zs,) = _h.close_loop(builder, b2, nb, zentry, zloop, zdone, [zaccs], [znew], zero)
            for r in range(rows):
                tot = builder.fsub(builder.fadd(finals[0][r], finals[1][r]), zs[r])
                o_r = builder.add(o_off, builder.mul(o_ld, _i64(r)))
                builder.store(tot, builder.bitcast(builder.gep(oa, [o_r]), v16f.as_pointer()),
                              align=4)
            return context.get_dummy_value()
        return codegen

    def _dtile_intrinsic(rows, locality=None):
        """The tile of ``rows`` rows (4- or 8-bit by the weights' type) as a
        numba intrinsic."""
        def typer(typingctx, w, w_off, wstride, xq, x_off, sx, xsum, s_off, d, dz, d_off,
                  z_off, dstride, wg, dg, nb, out, o_off, o_ld):
            # (the weights' numba type picks the 4-bit or the 8-bit tile)
            make = _dtile8_codegen if _t.bits_of(w) == 8 else _dtile_codegen
            return (types.void(w, w_off, wstride, xq, x_off, sx, xsum, s_off, d, dz, d_off,
                               z_off, dstride, wg, dg, nb, out, o_off, o_ld),
                    make(rows, locality))
        typer.__name__ = f"_dtile_i8_x{rows}" + ("_pf" if locality is not None else "")
        return intrinsic(typer)

    def _dtile8_codegen(rows, locality=None):
        # 8-bit: rows x 16 columns (four groups of four, as _dtile_codegen's),
        # the same bits as the 8-bit ymm tile of _int8_tiles (see WIDE_DECODE8)
        def codegen(context, builder, sig, args):
            (wa, xa, sa, ua, da, za, oa), (w_off, wstride, x_off, s_off, d_off, z_off, dstride,
                                           wg, dg, nb, o_off, o_ld) = _h.unpack(
                context, builder, sig, args, (0, 3, 5, 6, 8, 9, 16),
                (1, 2, 4, 7, 10, 11, 12, 13, 14, 15, 17, 18))
            dty = sig.args[8]
            sym = sig.args[9].dtype == types.float64
            v16i, v16f, v64 = _V(_i32, 16), _V(_f32, 16), _V(_i8, 64)
            zero = _h.splat(_f32, 0.0, 16)
            fast = ("contract",)
            cat8 = ir.Constant(_V(_i32, 8), list(range(8)))
            cat16 = ir.Constant(_V(_i32, 16), list(range(16)))
            bias = _h.splat(_i8, -128, 64)  # 0x80: x + 128 as the unsigned operand

            def bcast(value):
                vt = _V(value.type, 16)
                return builder.shuffle_vector(
                    builder.insert_element(ir.Constant(vt, None), value, _i32(0)),
                    ir.Constant(vt, None), ir.Constant(_V(_i32, 16), [0] * 16))

            def sixteen(load, off):
                q = [load(builder.add(off, builder.mul(dg, _i64(j)))) for j in range(4)]
                return builder.shuffle_vector(builder.shuffle_vector(q[0], q[1], cat8),
                                              builder.shuffle_vector(q[2], q[3], cat8), cat16)

            row_x = builder.mul(nb, _i64(_t.BLOCK))
            goffs = [builder.add(w_off, builder.mul(wg, _i64(j))) for j in range(4)]
            entry, loop, done, b = _h.block_loop(builder, nb, "i8dtile8")
            accs = [[builder.phi(v16f) for _ in range(rows)] for _ in range(2)]
            for half in accs:
                for phi in half:
                    phi.add_incoming(zero, entry)
            at = builder.mul(b, wstride)
            if locality is not None:  # each group's 128 bytes PREFETCH_BLOCKS blocks ahead
                ahead = builder.mul(builder.add(b, _i64(_t.PREFETCH_BLOCKS)), wstride)
                for go in goffs:
                    _h.prefetch(builder, wa, builder.add(go, ahead), locality)
                    _h.prefetch(builder, wa, builder.add(builder.add(go, ahead), _i64(64)),
                                locality)
            # group j's four columns, 32 bytes each: words c * 8 + s (s: bytes
            # 4s..4s+3 of the block), columns 0-1 in the first vector, 2-3 in
            # the second; step s: every column's word s, lane 4j + c
            per_group = []
            for go in goffs:
                a_ = _h.load_vec(builder, wa, builder.add(go, at), v16i)
                b_ = _h.load_vec(builder, wa, builder.add(builder.add(go, at), _i64(64)), v16i)
                lo4 = builder.shuffle_vector(a_, b_, ir.Constant(
                    _V(_i32, 16), [c * 8 + s if c < 2 else 16 + (c - 2) * 8 + s
                                   for s in range(4) for c in range(4)]))
                hi4 = builder.shuffle_vector(a_, b_, ir.Constant(
                    _V(_i32, 16), [c * 8 + s if c < 2 else 16 + (c - 2) * 8 + s
                                   for s in range(4, 8) for c in range(4)]))
                per_group.append((lo4, hi4))
            steps = []
            for s in range(8):
                part = [g[s // 4] for g in per_group]
                idx = ir.Constant(_V(_i32, 8), [4 * (s % 4) + i for i in range(4)]
                                  + [16 + 4 * (s % 4) + i for i in range(4)])
                steps.append(builder.bitcast(builder.shuffle_vector(
                    builder.shuffle_vector(part[0], part[1], idx),
                    builder.shuffle_vector(part[2], part[3], idx), cat16), v64))
            # dpbusd(x + 128, w) = w . x + 128 * sum(w): start each half's sums
            # at -128 * sum(w) (shared by the rows), exact integers
            negs = []
            for h in range(2):
                c = None
                for s in range(4 * h, 4 * h + 4):
                    c = _h.dpbusd512(builder, c, bias, steps[s])
                negs.append(builder.sub(_h.splat(_i32, 0, 16), c))
            step = builder.mul(b, dstride)
            dv = sixteen(lambda off: _h.load_scales(builder, dty, da, off, 4),
                         builder.add(d_off, step))
            zv = None if sym else sixteen(
                lambda off: _h.load_scales(builder, dty, za, off, 4), builder.add(z_off, step))
            x_at = builder.add(x_off, builder.mul(b, _i64(_t.BLOCK)))
            s_at = builder.add(s_off, b)
            flip = ir.Constant(_i32, -0x7F7F7F80)  # 0x80808080
            new = [[], []]
            for r in range(rows):
                s_r = builder.add(s_at, builder.mul(nb, _i64(r)))
                sv = builder.fmul(dv, bcast(builder.load(builder.gep(sa, [s_r]))), flags=fast)
                x_row = builder.add(x_at, builder.mul(row_x, _i64(r)))
                for h in range(2):
                    isum = negs[h]
                    for s in range(4 * h, 4 * h + 4):
                        a4 = builder.load(builder.bitcast(
                            builder.gep(xa, [builder.add(x_row, _i64(4 * s))]),
                            _i32.as_pointer()), align=1)
                        isum = _h.dpbusd512(builder, isum,
                                            builder.bitcast(bcast(builder.xor(a4, flip)), v64),
                                            steps[s])
                    acc = builder.fadd(accs[h][r], builder.fmul(
                        builder.sitofp(isum, v16f), sv, flags=fast), flags=fast)
                    if h == 0 and zv is not None:  # the zero-point term, in the low half
                        xsv = bcast(builder.load(builder.gep(ua, [s_r])))
                        acc = builder.fsub(acc, builder.fmul(zv, xsv, flags=fast), flags=fast)
                    new[h].append(acc)
            finals = _h.close_loop(builder, b, nb, entry, loop, done, accs, new, zero)
            for r in range(rows):
                o_r = builder.add(o_off, builder.mul(o_ld, _i64(r)))
                builder.store(builder.fadd(finals[0][r], finals[1][r]),
                              builder.bitcast(builder.gep(oa, [o_r]), v16f.as_pointer()),
                              align=4)
            return context.get_dummy_value()
        return codegen

    # (compiled only where WIDE_DECODE holds: the driver's branches are constants)
    _dtile8, _dtile4, _dtile2, _dtile1 = (_dtile_intrinsic(r) for r in (8, 4, 2, 1))
    _dtile8_pf, _dtile4_pf, _dtile2_pf, _dtile1_pf = (_dtile_intrinsic(r, 3)
                                                      for r in (8, 4, 2, 1))

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _dtiles(wf, wb, ws, xf, r0, kp, sf, uf, nb, df, zf, db, zb, ds, wg, dg, of, o_off,
                o_ld, rows, prefetch):  # pragma: no cover - compiled
        # tiles of 8 (WIDE_TILE_ROWS), 4, 2, 1 rows from row r0 over ``rows`` rows
        # (of: the 2-D output array, written at element o_off + r * o_ld + c)
        m = r0
        r1 = r0 + rows
        if WIDE_TILE_ROWS >= 8:
            while m + 8 <= r1:
                if prefetch:
                    _dtile8_pf(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb, ds, wg,
                               dg, nb, of, o_off + m * o_ld, o_ld)
                else:
                    _dtile8(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb, ds, wg, dg,
                            nb, of, o_off + m * o_ld, o_ld)
                m += 8
        while m + 4 <= r1:
            if prefetch:
                _dtile4_pf(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb, ds, wg, dg,
                           nb, of, o_off + m * o_ld, o_ld)
            else:
                _dtile4(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb, ds, wg, dg, nb,
                        of, o_off + m * o_ld, o_ld)
            m += 4
        if m + 2 <= r1:
            if prefetch:
                _dtile2_pf(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb, ds, wg, dg,
                           nb, of, o_off + m * o_ld, o_ld)
            else:
                _dtile2(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb, ds, wg, dg, nb,
                        of, o_off + m * o_ld, o_ld)
            m += 2
        if m < r1:
            if prefetch:
                _dtile1_pf(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb, ds, wg, dg,
                           nb, of, o_off + m * o_ld, o_ld)
            else:
                _dtile1(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, zb, ds, wg, dg, nb,
                        of, o_off + m * o_ld, o_ld)

    @njit(fastmath=True, nogil=True, cache=True)
    def _wide_cols(xq, sx, xsum, w, d, dz, out, lo, full, prefetch):  # pragma: no cover
        # columns lo.. (lo a multiple of 4) of every row in chunks of sixteen
        # (four column groups, all below ``full``); returns the first column
        # not done (the caller's tiles take the rest). out: rows of
        # contiguous floats (else nothing is done here)
        m_rows = xq.shape[0]
        n_all = w.shape[0]
        if m_rows == 0 or out.strides[1] != 4 or out.strides[0] % 4 != 0:
            return lo
        kp = xq.shape[1]
        nb = kp // 32
        emb = _t.embedded_scales(d)
        sym = _t.symmetric(dz)
        per = _t.block_bytes(w)
        wf = w.reshape(-1)
        df = d.reshape(-1)
        zf = dz.reshape(-1)
        xf = xq.reshape(-1)
        sf = sx.reshape(-1)
        uf = xsum.reshape(-1)
        o_ld = out.strides[0] // 4
        stop = lo + (full - lo) // 16 * 16
        if WIDE_DECODE if per == 16 else WIDE_DECODE8:
            # (constants: the zmm tiles compile only where they run)
            n = lo
            while n < stop:
                wb, ws, db, zb, ds = _t.column_layout(n, n_all, nb, per, emb, sym)
                wb4, _, db4, _, _ = _t.column_layout(n + 4, n_all, nb, per, emb, sym)
                _dtiles(wf, wb, ws, xf, 0, kp, sf, uf, nb, df, zf, db, zb, ds, wb4 - wb,
                        db4 - db, out, n, o_ld, m_rows, prefetch)
                n += 16
            return stop
        return lo
