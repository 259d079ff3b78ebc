"""Tiled causal prompt attention (flash-attention style) for the prompt rows
of a prefill or a prefill chunk: the fused decoder stack's attention stage
(:mod:`._block_kernels`), GroupQueryAttention's numba paths on a contiguous
cache (:mod:`._contrib_numba`) and on a paged one (:mod:`._paged_kernels`).

A work item is one (batch row b, KV head kh, query tile): the query
positions of batch row b in one tile of TQ absolute positions (tiles start
at multiples of TQ, so a chunk after cached positions may straddle one more
tile: :func:`n_tiles`) and the g query heads that share KV head kh, TQ * g
query rows. The item walks the key positions in tiles of ``TK`` (absolute
too), loads each K and V tile once for all its query rows (a contiguous
converting copy into float32, from a float16 pool too), and computes the
tile with the query rows as vector lanes: the scores transposed,
``S^T (TK, R) = K (TK, D) . Q^T (D, R)`` (Q^T built once an item: alpha *
the rotated queries), the online softmax on them lane-wise (running max /
running sum / rescale per query row, float32, :func:`._numba_math.expf`
vectorized over the query rows), and ``O (R, D) += P (R, TK) . V (TK, D)``
with P read from the transposed weights ``P^T`` where the scores were. Both products run in one LLVM IR
micro-kernel (:func:`_mm`: 4 rows x up to 4 x 16 columns of <16 x float>
accumulators, one broadcast A scalar and one FMA per product, in k order:
zmm with AVX-512, two ymm each without), so nothing is transposed but the
queries. Tiles wholly above the causal diagonal (or below a sliding window)
are skipped; the diagonal tile runs only its first keys up to the item's
last visible one (rounded up to 4), and masks per row only where a row of
the item does not see the whole tile. R and D are padded to multiples of 16
(zeros): any head width and group size run the same kernel.
Nothing is ever sequence x sequence: the scratch is a few tiles per thread
(:func:`scratch`: ~110 KiB for SmolLM2's 3 x 32 query rows, 64 keys, 64
values), whatever the prompt length.

A row is computed by the same code at the same place of its tile whatever
the chunk, the item and the thread (the products always run over the whole
tile's lanes, a sum over keys runs in key order, and the keys an item adds
past a row's range add exact zeros): a prompt computed whole or in chunks
after cached positions, on a contiguous or a paged cache, gives the same
bits. Results differ from the two-pass kernel
(``_contrib_numba._attend_rows``) in the last bits; decode steps (one query
row per batch row) keep that kernel.

Pools: ``(B, KVH, L, D)`` contiguous (``bt`` empty, block = batch row) or
``(NB, KVH, BS, D)`` read through the int32 block table ``bt`` (B, W)
(:mod:`.paged`); float32, or float16 as its uint16 bits (read with
:func:`._half.kv_get`).
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _contrib_numba as _nb
from . import _half

__all__ = ["HAVE_FLASH", "NO_TABLE", "TQ", "TK", "n_tiles"]

HAVE_FLASH = _nb.HAVE_NUMBA
#: query positions a work item (its rows are TQ x the group's query heads):
#: 32, not 16: a K/V tile load and the per-tile softmax steps serve 96 query
#: rows of SmolLM2, not 48 (one layer of a 2,048-token prompt, one thread:
#: 33.5 vs 36.4 ms CPU)
TQ = 32
#: keys a K/V tile
TK = 64
#: float32 lanes of the tile products' vectors (a zmm; two ymm on AVX2)
LANES = 16
# a masked score (finite: the kernels compile with fastmath)
_NEG = np.float32(-3.0e38)
#: the block table of a contiguous cache (none: a pool block is a batch row)
NO_TABLE = np.zeros((0, 1), np.int32)


def n_tiles(s_len: int) -> int:
    """Work items a (batch row, KV head) pair of a prompt or chunk of
    ``s_len`` positions: query tiles are aligned to absolute positions
    (multiples of TQ), so a chunk after cached ones may straddle one more."""
    return (s_len + TQ - 1) // TQ + 1


if HAVE_FLASH:
    from llvmlite import ir as _ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _rotate, _expf = _nb._rotate, _nb._expf
    kv_get = _half.kv_get
    _F32, _I32, _I64 = _ir.FloatType(), _ir.IntType(32), _ir.IntType(64)
    _VF = _ir.VectorType(_F32, LANES)

    def _mm_codegen(nv):
        # C[c_off + i * ldc + 16 v + l] (+)= sum over k < kl of
        # A[a_off + i * a_si + k * a_sk] * B[b_off + k * ldb + 16 v + l]
        # for i < 4, v < nv, l < 16: 4 x nv <16 x float> accumulators, one
        # broadcast of an A scalar per (i, k) and one vector load of B per
        # (k, v), each product an FMA, k in order (so trailing zero terms
        # leave the sums' bits unchanged)
        def codegen(context, builder, sig, args):
            a, b, c = (context.make_array(sig.args[i])(context, builder, args[i]).data
                       for i in (0, 4, 8))
            a_off, a_si, a_sk, b_off, ldb, kl, c_off, ldc, add = (
                args[i] if args[i].type == _I64 else builder.sext(args[i], _I64)
                for i in (1, 2, 3, 5, 6, 7, 9, 10, 11))
            vptr = _VF.as_pointer()
            fma = cgutils.get_or_insert_function(
                builder.module, _ir.FunctionType(_VF, [_VF, _VF, _VF]), f"llvm.fma.v{LANES}f32")

            def at(base, idx):
                return builder.bitcast(builder.gep(base, [idx]), vptr)

            zero = _ir.Constant(_VF, [0.0] * LANES)
            keep = builder.icmp_signed("!=", add, _I64(0))
            init = []
            for i in range(4):
                row = builder.add(c_off, builder.mul(_I64(i), ldc))
                init.append([builder.select(keep, builder.load(at(c, builder.add(
                    row, _I64(LANES * v))), align=4), zero) for v in range(nv)])
            entry = builder.block
            loop = builder.append_basic_block("mm.loop")
            done = builder.append_basic_block("mm.done")
            builder.cbranch(builder.icmp_signed(">", kl, _I64(0)), loop, done)
            builder.position_at_end(loop)
            k = builder.phi(_I64)
            k.add_incoming(_I64(0), entry)
            accs = [[builder.phi(_VF) for _ in range(nv)] for _ in range(4)]
            for i in range(4):
                for v in range(nv):
                    accs[i][v].add_incoming(init[i][v], entry)
            brow = builder.add(b_off, builder.mul(k, ldb))
            bv = [builder.load(at(b, builder.add(brow, _I64(LANES * v))), align=4)
                  for v in range(nv)]
            arow = builder.add(a_off, builder.mul(k, a_sk))
            new = []
            for i in range(4):
                s = builder.load(builder.gep(a, [builder.add(arow, builder.mul(_I64(i), a_si))]))
                sv = builder.shuffle_vector(
                    builder.insert_element(_ir.Constant(_VF, None), s, _I32(0)),
                    _ir.Constant(_VF, None), _ir.Constant(_ir.VectorType(_I32, LANES),
                                                          [0] * LANES))
                new.append([builder.call(fma, [sv, bv[v], accs[i][v]]) for v in range(nv)])
            k1 = builder.add(k, _I64(1))
            k.add_incoming(k1, loop)
            for i in range(4):
                for v in range(nv):
                    accs[i][v].add_incoming(new[i][v], loop)
            builder.cbranch(builder.icmp_signed("<", k1, kl), loop, done)
            builder.position_at_end(done)
            fins = []
            for i in range(4):  # every phi first
                for v in range(nv):
                    fin = builder.phi(_VF)
                    fin.add_incoming(init[i][v], entry)
                    fin.add_incoming(new[i][v], loop)
                    fins.append(fin)
            for i in range(4):
                row = builder.add(c_off, builder.mul(_I64(i), ldc))
                for v in range(nv):
                    builder.store(fins[i * nv + v], at(c, builder.add(row, _I64(LANES * v))),
                                  align=4)
            return context.get_dummy_value()
        return codegen

    def _mm_intrinsic(nv):
        def typer(typingctx, a, a_off, a_si, a_sk, b, b_off, ldb, kl, c, c_off, ldc, add):
            return (types.void(a, a_off, a_si, a_sk, b, b_off, ldb, kl, c, c_off, ldc, add),
                    _mm_codegen(nv))
        typer.__name__ = f"_mm4x{nv}"
        return intrinsic(typer)

    _mm4x1, _mm4x2, _mm4x3, _mm4x4 = (_mm_intrinsic(v) for v in (1, 2, 3, 4))

    @njit(nogil=True, cache=True, inline="always")
    def _mm(a, a_off, a_si, a_sk, b, b_off, ldb, kl, c, c_off, ldc, add,
            ncols):  # pragma: no cover - compiled
        # _mm4x* over ncols (a multiple of 16) columns, 64 at a time
        j = 0
        while j + 4 * LANES <= ncols:
            _mm4x4(a, a_off, a_si, a_sk, b, b_off + j, ldb, kl, c, c_off + j, ldc, add)
            j += 4 * LANES
        left = (ncols - j) // LANES
        if left == 3:
            _mm4x3(a, a_off, a_si, a_sk, b, b_off + j, ldb, kl, c, c_off + j, ldc, add)
        elif left == 2:
            _mm4x2(a, a_off, a_si, a_sk, b, b_off + j, ldb, kl, c, c_off + j, ldc, add)
        elif left == 1:
            _mm4x1(a, a_off, a_si, a_sk, b, b_off + j, ldb, kl, c, c_off + j, ldc, add)

    @njit(nogil=True, cache=True)
    def scratch(g, d):  # pragma: no cover - compiled
        """One thread's tiles, for the g query heads of a KV head of width d
        (R = TQ * g query rows padded to a multiple of 16, Dp = d padded to
        one): (qt (Dp, R) alpha * the rotated queries, transposed; kt, vt
        (TK, Dp) a key and a value tile; sc (TK, R) a tile's scores,
        transposed, then its weights; st (5, R) per row the running max, the
        tile's max, the rescale factor, the tile's sum, the running sum;
        lh (2, R) int32 per row its first and end key; acc (R, Dp) the
        running output), float32 unless said; zeros (the pads stay zero)."""
        r = (TQ * g + LANES - 1) // LANES * LANES
        dp = (d + LANES - 1) // LANES * LANES
        f32 = np.float32
        return (np.zeros((dp, r), f32), np.zeros((TK, dp), f32), np.zeros((TK, dp), f32),
                np.zeros((TK, r), f32), np.zeros((5, r), f32), np.zeros((2, r), np.int32),
                np.zeros((r, dp), f32))

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _load_tile(kpool, vpool, bt, b, kh, d, t0, n, n4, kt, vt):  # pragma: no cover - compiled
        # keys [t0, t0 + n) of (b, kh) into rows 0..n of kt and vt, float32
        # (a contiguous converting copy: vcvtph2ps from a float16 pool); rows
        # n .. n4 zero (their weights are 0, and a zero value keeps 0 * v
        # exact); the pad columns d.. stay zero
        bs = kpool.shape[2]
        paged = bt.shape[0] > 0
        for j in range(n):
            t = t0 + j
            jb = t // bs
            o = t - jb * bs
            blk = bt[b, jb] if paged else b
            kr = kpool[blk, kh, o]
            vr = vpool[blk, kh, o]
            kj = kt[j]
            vj = vt[j]
            for e in range(d):
                kj[e] = kv_get(kr, e)
                vj[e] = kv_get(vr, e)
        for j in range(n, n4):
            for e in range(d):
                kt[j, e] = 0.0
                vt[j, e] = 0.0

    @njit(fastmath=True, nogil=True, cache=True)
    def attend_tile(query, kpool, vpool, bt, cos, sin, pos, past, tot, b, kh, g, d, r2,
                    rotary, interleaved, alpha, window, base, q0, q1, qt, kt, vt, sc, st, lh,
                    acc, out):  # pragma: no cover - compiled
        """Query rows [q0, q1) of batch row b (absolute positions P_b + s in
        the tile of TQ positions from ``base``), the g heads of KV head kh:
        out[b, s, heads of kh] = causal (windowed) softmax(alpha q.K^T) V over
        the cached rows (already appended: positions < T_b). query (B, S, *)
        with the query heads at columns [0, H*D) (packed or not); scratch from
        :func:`scratch`. Row r = (s - base + P_b) * g + i of the tile is lane
        r of the transposed scores: the products and the softmax run over
        all R lanes (those of positions outside [q0, q1) hold a previous
        item's finite values and see no key), so every row is computed by the
        same code in the same lane whatever the chunk and the item."""
        nr = qt.shape[1]
        dp = qt.shape[0]
        mx, tm, corr, tsum, den = st[0], st[1], st[2], st[3], st[4]
        lo_r, hi_r = lh[0], lh[1]
        sh = past[b] - base  # row of query position s: (s + sh) * g + i
        for r in range(nr):
            mx[r] = _NEG
            den[r] = 0.0
            lo_r[r] = 0
            hi_r[r] = 0
        acc[:, :] = 0.0
        # the rows' key ranges; alpha * the rotated queries, transposed (kt[0]
        # a row's buffer: no tile is loaded yet)
        lo_min = tot[b]
        hi_max = 0
        lo_max = 0
        hi_min = tot[b]
        qrow = kt[0]
        for s in range(q0, q1):
            causal = past[b] + s + 1
            hi = min(causal, tot[b])
            lo = max(0, causal - window) if window > 0 else 0
            lo_min = min(lo_min, lo)
            hi_max = max(hi_max, hi)
            lo_max = max(lo_max, lo)
            hi_min = min(hi_min, hi)
            for i in range(g):
                r = (s + sh) * g + i
                hh = kh * g + i
                lo_r[r] = lo
                hi_r[r] = hi
                for e in range(d):
                    qrow[e] = query[b, s, hh * d + e] * alpha
                if rotary:
                    # rotation is linear: rotating alpha * q is alpha * rot(q)
                    _rotate(qrow, cos[pos[b, s]], sin[pos[b, s]], r2, interleaved)
                for e in range(d):
                    qt[e, r] = qrow[e]
        t0 = (lo_min // TK) * TK
        while t0 < hi_max:
            n = min(TK, hi_max - t0)
            n4 = (n + 3) // 4 * 4
            _load_tile(kpool, vpool, bt, b, kh, d, t0, n, n4, kt, vt)
            # the transposed scores sc[j, r] = k_j . q_r of the tile's first n4
            # keys (the later ones are above every row's range)
            for j in range(0, n4, 4):
                _mm(kt, j * dp, dp, 1, qt, 0, nr, d, sc, j * nr, nr, 0, nr)
            # the online softmax, lane-wise (each loop over r vectorized)
            full = lo_max <= t0 and hi_min >= t0 + n4  # no row of [q0, q1) masked
            for r in range(nr):
                tm[r] = _NEG
            if full:
                for j in range(n4):
                    sr = sc[j]
                    for r in range(nr):
                        tm[r] = max(tm[r], sr[r])
            else:
                for j in range(n4):
                    t = t0 + j
                    sr = sc[j]
                    for r in range(nr):
                        v = sr[r] if (t >= lo_r[r] and t < hi_r[r]) else _NEG
                        sr[r] = v
                        tm[r] = max(tm[r], v)
            for r in range(nr):
                m_new = max(mx[r], tm[r])
                corr[r] = _expf(mx[r] - m_new)
                mx[r] = m_new
                tsum[r] = 0.0
            if full:
                for j in range(n4):
                    sr = sc[j]
                    for r in range(nr):
                        p = _expf(sr[r] - mx[r])
                        sr[r] = p
                        tsum[r] += p
            else:
                for j in range(n4):
                    t = t0 + j
                    sr = sc[j]
                    for r in range(nr):
                        p = _expf(sr[r] - mx[r])
                        p = p if (t >= lo_r[r] and t < hi_r[r]) else np.float32(0.0)
                        sr[r] = p
                        tsum[r] += p
            for r in range(nr):
                den[r] = den[r] * corr[r] + tsum[r]
                c = corr[r]
                ar = acc[r]
                for e in range(dp):
                    ar[e] *= c
            # acc[r, :] += sum over j < n4 of p[j, r] * v_j
            for r in range(0, nr, 4):
                _mm(sc, r, 1, nr, vt, 0, dp, n4, acc, r * dp, dp, 1, dp)
            t0 += TK
        for s in range(q0, q1):
            for i in range(g):
                r = (s + sh) * g + i
                hh = kh * g + i
                w = np.float32(1.0) / den[r] if den[r] > 0.0 else np.float32(0.0)
                for e in range(d):
                    out[b, s, hh * d + e] = acc[r, e] * w

    @njit(nogil=True, cache=True, inline="always")
    def item(c, pairs, s_len, kv_heads, past):  # pragma: no cover - compiled
        """Work item c of pairs * n_tiles(s_len): (b, kh, base, q0, q1), the
        query rows [q0, q1) of batch row b in the tile of absolute positions
        [base, base + TQ) (empty when q1 <= q0); the last (costliest,
        causal) tiles first."""
        nt = (s_len + TQ - 1) // TQ + 1
        k = nt - 1 - c // pairs
        pr = c % pairs
        b = pr // kv_heads
        base = (past[b] // TQ + k) * TQ
        return (b, pr % kv_heads, base, max(0, base - past[b]),
                min(s_len, base + TQ - past[b]))
