"""The many-row (prefill) stage of the 4-bit int8 kernels of
:mod:`._int8_tiles`: a column chunk's weights unpacked once into an
L1-resident int8 panel, then rows x 8-column tiles against it.

* ``_panel_build``: eight output columns (two interleaved groups of
  :func:`._contrib_int8.pack_i8`) of every block -> ``P`` (nb * 256 bytes:
  per block eight 32-byte steps, step s holding columns 0..7's values at
  activation positions 4s..4s+3, one byte each, 0..15) and their scales /
  scale * zero points as float32 (nb * 8 each);
* ``_ptile1.._ptile4``: up to four rows times the panel's eight columns. Per
  row and step one ``vpbroadcastd`` of four activations and one
  ``vpmaddubsw`` against the step's 32 bytes; the four steps of a half
  summed in int16 (<= 4 * 2 * 15 * 127 = 15,240), widened by one
  ``vpmaddwd`` (lane c: column c), converted and scaled with one FMA;
* ``_wtile1.._wtile4`` (:data:`WIDE_PANEL`: AVX-512 VNNI): sixteen columns
  against the wide panel (per block and step columns 0-7 then 8-15, built
  by two ``_panel_build_wide`` passes), one zmm ``vpdpbusd`` per row and
  step with the four activation bytes broadcast, lane c the float
  operations of the 8-column tile's lane c % 8 (the same bits);
* ``_panel_cols``: the driver (what :func:`._int8_tiles._cols` runs from
  :data:`PANEL_MIN_ROWS` rows for 4-bit weights with zero points).

**Same bits as the paired tile.** The halves are those of
``_int8_tiles._tile_codegen``'s paired 4-bit tile (steps 0, 2, 4, 6: the
positions its lanes c hold; steps 1, 3, 5, 7: lanes c + 2), each an exact
integer sum, each accumulated in float32 with the same product and FMA, the
two added and the zero-point terms (their own loop) subtracted in the same
order: a row's outputs are bit for bit those of the tiles, so the batch
invariance of :mod:`._int8_tiles` holds across the switch.
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _int8_tiles as _t

#: from this many rows (and 4-bit weights with zero points) _cols runs the
#: panel tiles; 0: never (for comparisons). 32, not 8: in the engine a decode
#: batch streams its weights from memory, and building the panel (a write of
#: the streamed weights, without the decode tiles' prefetch) cost more than
#: its tiles saved: 8-stream decode 1.03-1.34x faster at 32 than at 8 (4
#: interleaved rounds, idle machine, docs/int8_tiles.md), prompts (64-row
#: work items) unchanged
PANEL_MIN_ROWS = 32
#: the panel builds prefetch the weights PREFETCH_BLOCKS blocks ahead, as
#: the decode tiles do; off: cache-hot M = 64 read 0.90-1.04x with it, and
#: with PANEL_MIN_ROWS 32 no decode batch builds a panel (for comparisons)
PANEL_PREFETCH = False
#: rows per pass over a chunk's panel (their activations stay in L2)
PANEL_ROWS = 256
#: sixteen columns at a time against a 512-byte-a-block panel, zmm tiles
#: (``vpdpbusd`` on zmm, the activations' four bytes broadcast from memory):
#: where :data:`._int8_tiles.USE_VNNI` and the host has AVX-512 VNNI
#: (:data:`._int8_tiles.HAVE_VNNI512`); the same bits as the 8-column tiles
WIDE_PANEL = _t.USE_VNNI and _t.HAVE_VNNI512

if _t.HAVE_INT8_DOT:
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    _i8, _i16, _i32, _i64, _f32 = (ir.IntType(8), ir.IntType(16), ir.IntType(32),
                                   ir.IntType(64), ir.FloatType())
    _V = ir.VectorType
    _h = _t.IR

    def _store_vec(builder, base, index, value):
        builder.store(value, builder.bitcast(builder.gep(base, [index]),
                                             value.type.as_pointer()), align=1)

    def _build_codegen(bits, cols=8):
        # cols 8: the panel of _ptile (256 bytes, 8 scales a block); 16: the
        # wide panel of _wtile (512 bytes a block, step s's 64 bytes columns
        # 0-7 then 8-15; 16 scales), this call writing half ``part`` (0: the
        # columns 0-7, 1: 8-15) from its two column groups
        pitch = 32 * cols // 8  # bytes a step

        def codegen(context, builder, sig, args):
            (wa, da, za, pa, pda, pza), (wb0, wb1, ws, db0, zb0, db1, zb1, ds, nb,
                                         part) = _h.unpack(
                context, builder, sig, args, (0, 4, 5, 12, 13, 14),
                (1, 2, 3, 6, 7, 8, 9, 10, 11, 15))
            if bits != 4:  # (typed for the 8-bit kernels too; never called there)
                return context.get_dummy_value()
            dty = sig.args[4]
            v16i = _V(_i32, 16)
            entry, loop, done, b = _h.block_loop(builder, nb, "i8panel")
            if PANEL_PREFETCH:  # both groups' weights PREFETCH_BLOCKS blocks ahead
                ahead = builder.mul(builder.add(b, _i64(_t.PREFETCH_BLOCKS)), ws)
                for wo in (wb0, wb1):
                    _h.prefetch(builder, wa, builder.add(wo, ahead), 3)
            g = [_h.load_vec(builder, wa, builder.add(wo, builder.mul(b, ws)), v16i)
                 for wo in (wb0, wb1)]
            pbase = builder.add(builder.mul(b, _i64(8 * pitch)), builder.mul(part, _i64(32)))
            for s in range(4):
                dw = builder.shuffle_vector(g[0], g[1], ir.Constant(
                    _V(_i32, 8), [s, 4 + s, 8 + s, 12 + s, 16 + s, 20 + s, 24 + s, 28 + s]))
                raw = builder.bitcast(dw, _V(_i8, 32))
                _store_vec(builder, pa, builder.add(pbase, _i64(pitch * s)),
                           builder.and_(raw, _h.splat(_i8, 15, 32)))
                _store_vec(builder, pa, builder.add(pbase, _i64(pitch * (s + 4))),
                           builder.lshr(raw, _h.splat(_i8, 4, 32)))
            step = builder.mul(b, ds)
            cat = ir.Constant(_V(_i32, 8), list(range(8)))
            d8 = builder.shuffle_vector(
                _h.load_scales(builder, dty, da, builder.add(db0, step), 4),
                _h.load_scales(builder, dty, da, builder.add(db1, step), 4), cat)
            z8 = builder.shuffle_vector(
                _h.load_zero_points(builder, sig, 5, dty, za, builder.add(zb0, step), 4),
                _h.load_zero_points(builder, sig, 5, dty, za, builder.add(zb1, step), 4), cat)
            b8 = builder.add(builder.mul(b, _i64(cols)), builder.mul(part, _i64(8)))
            _store_vec(builder, pda, b8, d8)
            _store_vec(builder, pza, b8, z8)
            _h.close_loop(builder, b, nb, entry, loop, done, [], [], None)  # no accumulators
            return context.get_dummy_value()
        return codegen

    @intrinsic
    def _panel_build(typingctx, w, wb0, wb1, ws, d, dz, db0, zb0, db1, zb1, ds, nb, p, pd, pz,
                     part):
        """Eight columns' blocks (groups at weight offsets wb0, wb1, blocks ws
        apart; scales at db0 / db1, scale * zero points at zb0 / zb1, ds
        apart) -> the panel ``p`` (uint8, nb * 256) and float32 ``pd`` /
        ``pz`` (nb * 8); ``part`` 0 (unused)."""
        return (types.void(w, wb0, wb1, ws, d, dz, db0, zb0, db1, zb1, ds, nb, p, pd, pz,
                           part),
                _build_codegen(_t.bits_of(w)))

    @intrinsic
    def _panel_build_wide(typingctx, w, wb0, wb1, ws, d, dz, db0, zb0, db1, zb1, ds, nb, p, pd,
                          pz, part):
        """:func:`_panel_build` into half ``part`` (0 or 1) of the 16-column
        panel of :func:`_wtile4` (``p`` nb * 512 bytes, ``pd`` / ``pz`` nb * 16)."""
        return (types.void(w, wb0, wb1, ws, d, dz, db0, zb0, db1, zb1, ds, nb, p, pd, pz,
                           part),
                _build_codegen(_t.bits_of(w), 16))

    _dpbusd512 = _h.dpbusd512

    def _ptile_codegen(rows, cols=8):
        # cols 8: the ymm tile against _panel_build's panel; 16: the zmm tile
        # (VNNI only) against the wide panel, lane c column c, each lane's
        # float operations those of the 8-column tile's lane c % 8
        pitch = 32 * cols // 8

        def codegen(context, builder, sig, args):
            (pa, pda, pza, xa, sa, ua), (x_off, s_off, nb) = _h.unpack(
                context, builder, sig, args, (0, 1, 2, 3, 5, 6), (4, 7, 8))
            maddubs, maddwd, _ = _h.declare(builder)
            vf, vi, vb = _V(_f32, cols), _V(_i32, cols), _V(_i8, 4 * cols)
            zero = _h.splat(_f32, 0.0, cols)
            ones = _h.splat(_i16, 1, 16)
            fast = ("contract",)

            def bcast(value):  # a scalar in every lane
                vt = _V(value.type, cols)
                return builder.shuffle_vector(
                    builder.insert_element(ir.Constant(vt, None), value, _i32(0)),
                    ir.Constant(vt, None), ir.Constant(_V(_i32, cols), [0] * cols))

            row_x = builder.mul(nb, _i64(_t.BLOCK))
            entry, loop, done, b = _h.block_loop(builder, nb, "i8ptile")
            accs = [[builder.phi(vf) for _ in range(rows)] for _ in range(2)]
            for half in accs:
                for phi in half:
                    phi.add_incoming(zero, entry)
            bc = builder.mul(b, _i64(cols))
            dv = _h.load_vec(builder, pda, bc, vf)
            pbase = builder.mul(b, _i64(8 * pitch))
            x_at = builder.add(x_off, builder.mul(b, _i64(_t.BLOCK)))
            s_at = builder.add(s_off, b)
            svs = []
            for r in range(rows):
                s_r = builder.add(s_at, builder.mul(nb, _i64(r)))
                sxv = bcast(builder.load(builder.gep(sa, [s_r])))
                svs.append(builder.fmul(dv, sxv, flags=fast))
            new = [[], []]
            for h, steps in enumerate(((0, 2, 4, 6), (1, 3, 5, 7))):
                ws = [_h.load_vec(builder, pa, builder.add(pbase, _i64(pitch * s)), vb)
                      for s in steps]
                for r in range(rows):
                    x_row = builder.add(x_at, builder.mul(row_x, _i64(r)))
                    prods = []
                    for wv, s in zip(ws, steps):
                        a4 = builder.load(builder.bitcast(
                            builder.gep(xa, [builder.add(x_row, _i64(4 * s))]),
                            _i32.as_pointer()), align=1)
                        prods.append((wv, builder.bitcast(bcast(a4), vb)))
                    if cols == 16:
                        isum = builder.add(
                            _dpbusd512(builder, _dpbusd512(builder, None, *prods[0]), *prods[1]),
                            _dpbusd512(builder, _dpbusd512(builder, None, *prods[2]), *prods[3]))
                    elif _t.USE_VNNI:
                        # two chains of two vpdpbusd, added: lane c is the
                        # int16 sums' pair below, exactly (no overflow there)
                        isum = builder.add(_h.dpbusd(builder, _h.dpbusd(builder, None, *prods[0]),
                                                     *prods[1]),
                                           _h.dpbusd(builder, _h.dpbusd(builder, None, *prods[2]),
                                                     *prods[3]))
                    else:
                        prods = [builder.call(maddubs, list(op)) for op in prods]
                        s16 = builder.add(builder.add(prods[0], prods[1]),
                                          builder.add(prods[2], prods[3]))
                        isum = builder.call(maddwd, [s16, ones])
                    new[h].append(builder.fadd(accs[h][r], builder.fmul(
                        builder.sitofp(isum, vf), svs[r], flags=fast), flags=fast))
            finals = _h.close_loop(builder, b, nb, entry, loop, done, accs, new, zero)
            # the zero-point terms in a loop of their own, as the paired tile
            zentry, zloop, zdone, b2 = _h.block_loop(builder, nb, "i8ptilez")
            zaccs = [builder.phi(vf) for _ in range(rows)]
            for phi in zaccs:
                phi.add_incoming(zero, zentry)
            zv = _h.load_vec(builder, pza, builder.mul(b2, _i64(cols)), vf)
            znew = []
            for r in range(rows):
                s_r = builder.add(builder.add(s_off, b2), builder.mul(nb, _i64(r)))
                xsv = bcast(builder.load(builder.gep(ua, [s_r])))
                znew.append(builder.fadd(zaccs[r], builder.fmul(zv, xsv, flags=fast),
                                         flags=fast))
            (zs,) = _h.close_loop(builder, b2, nb, zentry, zloop, zdone, [zaccs], [znew], zero)
            outs = []
            for r in range(rows):
                tot = builder.fsub(builder.fadd(finals[0][r], finals[1][r]), zs[r])
                outs.extend(builder.extract_element(tot, _i32(c)) for c in range(cols))
            return context.make_tuple(builder, sig.return_type, outs)
        return codegen

    def _ptile_intrinsic(rows, cols=8):
        def typer(typingctx, p, pd, pz, xq, x_off, sx, xsum, s_off, nb):
            return (types.UniTuple(types.float32, cols * rows)(p, pd, pz, xq, x_off, sx, xsum,
                                                               s_off, nb),
                    _ptile_codegen(rows, cols))
        typer.__name__ = f"_ptile_i8_x{rows}" + ("_w" if cols == 16 else "")
        return intrinsic(typer)

    _ptile4, _ptile3, _ptile2, _ptile1 = (_ptile_intrinsic(r) for r in (4, 3, 2, 1))
    # the zmm tiles of the wide (16-column) panel (compiled only where
    # WIDE_PANEL holds: AVX-512 VNNI)
    _wtile4, _wtile3, _wtile2, _wtile1 = (_ptile_intrinsic(r, 16) for r in (4, 3, 2, 1))

    @njit(fastmath=True, nogil=True, cache=True)
    def _panel_cols(xq, sx, xsum, w, d, dz, out, lo, full):  # pragma: no cover - compiled
        # columns lo.. (lo a multiple of 4) of every row in chunks of eight
        # (two column groups, both below ``full``); returns the first column
        # not done (the caller's tiles take the rest)
        m_rows = xq.shape[0]
        n_all = w.shape[0]
        kp = xq.shape[1]
        nb = kp // 32
        emb = _t.embedded_scales(d)
        per = _t.block_bytes(w)
        wf = w.reshape(-1)
        df = d.reshape(-1)
        zf = dz.reshape(-1)
        xf = xq.reshape(-1)
        sf = sx.reshape(-1)
        uf = xsum.reshape(-1)
        p = np.empty(nb * 512, np.uint8)
        pd = np.empty(nb * 16, np.float32)
        pz = np.empty(nb * 16, np.float32)
        stop = lo + (full - lo) // 8 * 8
        wide = lo + (full - lo) // 16 * 16 if WIDE_PANEL else lo
        r0 = 0
        while r0 < m_rows:
            r1 = min(m_rows, r0 + PANEL_ROWS)
            n = lo
            if WIDE_PANEL:  # (a constant: the zmm tiles compile only where they run)
                while n < wide:  # sixteen columns (zmm), then at most one chunk of eight
                    for part in range(2):
                        c0 = n + 8 * part
                        wb0, ws, db0, zb0, ds = _t.column_layout(c0, n_all, nb, per, emb, False)
                        wb1, _, db1, zb1, _ = _t.column_layout(c0 + 4, n_all, nb, per, emb,
                                                               False)
                        _panel_build_wide(wf, wb0, wb1, ws, df, zf, db0, zb0, db1, zb1, ds, nb,
                                          p, pd, pz, part)
                    m = r0
                    while m + 4 <= r1:
                        w4 = _wtile4(p, pd, pz, xf, m * kp, sf, uf, m * nb, nb)
                        for i in range(64):
                            out[m + i // 16, n + i % 16] = w4[i]
                        m += 4
                    if r1 - m == 3:
                        w3 = _wtile3(p, pd, pz, xf, m * kp, sf, uf, m * nb, nb)
                        for i in range(48):
                            out[m + i // 16, n + i % 16] = w3[i]
                    elif r1 - m == 2:
                        w2 = _wtile2(p, pd, pz, xf, m * kp, sf, uf, m * nb, nb)
                        for i in range(32):
                            out[m + i // 16, n + i % 16] = w2[i]
                    elif r1 - m == 1:
                        w1 = _wtile1(p, pd, pz, xf, m * kp, sf, uf, m * nb, nb)
                        for i in range(16):
                            out[m, n + i] = w1[i]
                    n += 16
            while n < stop:
                wb0, ws, db0, zb0, ds = _t.column_layout(n, n_all, nb, per, emb, False)
                wb1, _, db1, zb1, _ = _t.column_layout(n + 4, n_all, nb, per, emb, False)
                _panel_build(wf, wb0, wb1, ws, df, zf, db0, zb0, db1, zb1, ds, nb, p, pd, pz, 0)
                m = r0
                while m + 4 <= r1:
                    t = _ptile4(p, pd, pz, xf, m * kp, sf, uf, m * nb, nb)
                    for i in range(32):
                        out[m + i // 8, n + i % 8] = t[i]
                    m += 4
                if r1 - m == 3:
                    t3 = _ptile3(p, pd, pz, xf, m * kp, sf, uf, m * nb, nb)
                    for i in range(24):
                        out[m + i // 8, n + i % 8] = t3[i]
                elif r1 - m == 2:
                    t2 = _ptile2(p, pd, pz, xf, m * kp, sf, uf, m * nb, nb)
                    for i in range(16):
                        out[m + i // 8, n + i % 8] = t2[i]
                elif r1 - m == 1:
                    t1 = _ptile1(p, pd, pz, xf, m * kp, sf, uf, m * nb, nb)
                    for i in range(8):
                        out[m, n + i] = t1[i]
                n += 8
            r0 = r1
        return stop
