"""Tiled causal prompt attention (flash-attention style) for the prompt rows
of a prefill or a prefill chunk: the fused decoder stack's attention stage
(:mod:`._block_kernels`), GroupQueryAttention's numba paths on a contiguous
cache (:mod:`._contrib_numba`) and on a paged one (:mod:`._paged_kernels`).

A work item is one (batch row b, KV head kh, query tile): the query
positions of batch row b in one tile of TQ absolute positions (tiles start
at multiples of TQ, so a chunk after cached positions may straddle one more
tile: :func:`n_tiles`) and the g query heads that share KV head kh, TQ * g
query rows. The item walks the key positions in tiles of ``TK`` (absolute
too), loads each K and V tile once for all its query rows (V transposed,
``(D, TK)``; converted to float32 once, from a float16 pool too), computes
the ``(TQ * g, TK)`` scores and the tile's P.V with a 4-row x 2-column
register-blocked product (``_abt``), and folds them into a running max /
running sum / rescaled output per query row (online softmax, float32).
Tiles wholly above the causal diagonal (or below a sliding window) are
skipped; in the diagonal tile each row masks the keys it may not see.
Nothing is ever sequence x sequence: the scratch is a few tiles per thread
(:func:`scratch`: ~80 KiB for SmolLM2's 3 x 16 query rows, 64 keys, 64
values), whatever the prompt length.

A row is computed by the same code at the same place of its tile whatever
the chunk, the item and the thread (the products always run over the whole
tile's rows): within one compiled caller a prompt computed whole or in
chunks after cached positions, on a contiguous or a paged cache, gives the
same bits. Two callers compiled apart (the level-0 float32 blocks'
contiguous and paged functions) may order the vectorized sums differently
(last bits). Results differ from the two-pass kernel
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
#: query positions a work item (its rows are TQ x the group's query heads)
TQ = 16
#: keys a K/V tile
TK = 64
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
    from numba import njit

    _rotate, _expf = _nb._rotate, _nb._expf
    kv_get = _half.kv_get

    @njit(nogil=True, cache=True)
    def scratch(g, d):  # pragma: no cover - compiled
        """One thread's tiles: (qt (TQ*g, D), kt (TK, D), vt (D, TK),
        sc (TQ*g, TK), mx (TQ*g,), den (TQ*g,), acc (TQ*g, D + D)),
        float32 (acc: the running output, then a tile's P.V)."""
        r = (TQ * g + 3) // 4 * 4
        f32 = np.float32
        return (np.zeros((r, d), f32), np.empty((TK, d), f32), np.empty((d, TK), f32),
                np.zeros((r, TK), f32), np.empty(r, f32), np.empty(r, f32),
                np.empty((r, 2 * d), f32))

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _abt(a, b, nr, nc, kl, out, o0):  # pragma: no cover - compiled
        # out[r, o0 + c] = sum over k < kl of a[r, k] * b[c, k] (r < nr,
        # c < nc): 4 rows x 2 columns at a time, each a float32 reduction
        # over contiguous k held in registers (8 vector accumulators)
        r = 0
        while r + 4 <= nr:
            a0, a1, a2, a3 = a[r], a[r + 1], a[r + 2], a[r + 3]
            c = 0
            while c + 2 <= nc:
                b0, b1 = b[c], b[c + 1]
                s00 = s01 = s10 = s11 = s20 = s21 = s30 = s31 = np.float32(0.0)
                for k in range(kl):
                    x0 = b0[k]
                    x1 = b1[k]
                    s00 += a0[k] * x0
                    s01 += a0[k] * x1
                    s10 += a1[k] * x0
                    s11 += a1[k] * x1
                    s20 += a2[k] * x0
                    s21 += a2[k] * x1
                    s30 += a3[k] * x0
                    s31 += a3[k] * x1
                out[r, o0 + c] = s00
                out[r, o0 + c + 1] = s01
                out[r + 1, o0 + c] = s10
                out[r + 1, o0 + c + 1] = s11
                out[r + 2, o0 + c] = s20
                out[r + 2, o0 + c + 1] = s21
                out[r + 3, o0 + c] = s30
                out[r + 3, o0 + c + 1] = s31
                c += 2
            while c < nc:
                b0 = b[c]
                s00 = s10 = s20 = s30 = np.float32(0.0)
                for k in range(kl):
                    x0 = b0[k]
                    s00 += a0[k] * x0
                    s10 += a1[k] * x0
                    s20 += a2[k] * x0
                    s30 += a3[k] * x0
                out[r, o0 + c] = s00
                out[r + 1, o0 + c] = s10
                out[r + 2, o0 + c] = s20
                out[r + 3, o0 + c] = s30
                c += 1
            r += 4
        while r < nr:
            a0 = a[r]
            for c in range(nc):
                b0 = b[c]
                s00 = np.float32(0.0)
                for k in range(kl):
                    s00 += a0[k] * b0[k]
                out[r, o0 + c] = s00
            r += 1

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _load_tile(kpool, vpool, bt, b, kh, d, t0, n, kt, vt):  # pragma: no cover - compiled
        # keys [t0, t0 + n) of (b, kh) into kt and vt (transposed), float32;
        # rows / columns n .. TK zero (their weights are set to 0, and a
        # zero value keeps 0 * v finite)
        bs = kpool.shape[2]
        paged = bt.shape[0] > 0
        vrow = np.empty(d, np.float32)
        for j in range(TK):
            if j < n:
                t = t0 + j
                jb = t // bs
                o = t - jb * bs
                blk = bt[b, jb] if paged else b
                kr = kpool[blk, kh, o]
                vr = vpool[blk, kh, o]
                kj = kt[j]
                # converted in a contiguous loop (vectorized: vcvtph2ps from a
                # float16 pool), then V transposed (measured: one loop with
                # the strided store ran scalar, a float16 prefill 1.5x slower)
                for e in range(d):
                    kj[e] = kv_get(kr, e)
                    vrow[e] = kv_get(vr, e)
                for e in range(d):
                    vt[e, j] = vrow[e]
            else:
                for e in range(d):
                    kt[j, e] = 0.0
                    vt[e, j] = 0.0

    @njit(fastmath=True, nogil=True, cache=True)
    def attend_tile(query, kpool, vpool, bt, cos, sin, pos, past, tot, b, kh, g, d, r2,
                    rotary, interleaved, alpha, window, base, q0, q1, qt, kt, vt, sc, mx, den,
                    acc, out):  # pragma: no cover - compiled
        """Query rows [q0, q1) of batch row b (absolute positions P_b + s in
        the tile of TQ positions from ``base``), the g heads of KV head kh:
        out[b, s, heads of kh] = causal (windowed) softmax(alpha q.K^T) V over
        the cached rows (already appended: positions < T_b). query (B, S, *)
        with the query heads at columns [0, H*D) (packed or not); scratch from
        :func:`scratch`. The products always run over the whole tile's
        TQ * g rows (those of positions outside [q0, q1) hold a previous
        item's finite values and are ignored): every row is computed by the
        same code at the same place whatever the chunk and the item."""
        n4 = (TQ * g + 3) // 4 * 4
        sh = past[b] - base  # row of query position s: (s + sh) * g + i
        # the rows: r = (s - q0) * g + i, alpha * the rotated queries; the
        # key range of the whole item
        lo_min = tot[b]
        hi_max = 0
        for s in range(q0, q1):
            causal = past[b] + s + 1
            hi = min(causal, tot[b])
            lo = max(0, causal - window) if window > 0 else 0
            lo_min = min(lo_min, lo)
            hi_max = max(hi_max, hi)
            for i in range(g):
                r = (s + sh) * g + i
                hh = kh * g + i
                for e in range(d):
                    qt[r, e] = query[b, s, hh * d + e] * alpha
                if rotary:
                    # rotation is linear: rotating alpha * q is alpha * rot(q)
                    _rotate(qt[r], cos[pos[b, s]], sin[pos[b, s]], r2, interleaved)
                mx[r] = _NEG
                den[r] = 0.0
                for e in range(d):
                    acc[r, e] = 0.0
        t0 = (lo_min // TK) * TK
        while t0 < hi_max:
            n = min(TK, hi_max - t0)
            _load_tile(kpool, vpool, bt, b, kh, d, t0, n, kt, vt)
            # scores of every row over the tile (all TK columns: the same
            # code whatever the row's range)
            _abt(qt, kt, n4, TK, d, sc, 0)
            for s in range(q0, q1):
                causal = past[b] + s + 1
                hi = min(causal, tot[b])
                lo = max(0, causal - window) if window > 0 else 0
                live = hi > t0 and lo < t0 + TK and hi > lo
                for i in range(g):
                    r = (s + sh) * g + i
                    sr = sc[r]
                    if not live:  # weighs nothing this tile
                        for j in range(TK):
                            sr[j] = 0.0
                        continue
                    tm = _NEG
                    for j in range(TK):
                        t = t0 + j
                        v = sr[j] if (t >= lo and t < hi) else _NEG
                        sr[j] = v
                        tm = max(tm, v)
                    m_new = max(mx[r], tm)
                    corr = _expf(mx[r] - m_new)
                    tsum = np.float32(0.0)
                    for j in range(TK):
                        t = t0 + j
                        p = _expf(sr[j] - m_new)
                        p = p if (t >= lo and t < hi) else np.float32(0.0)
                        sr[j] = p
                        tsum += p
                    den[r] = den[r] * corr + tsum
                    mx[r] = m_new
                    for e in range(d):
                        acc[r, e] *= corr
            # this tile's P.V, added to the rescaled running output
            _abt(sc, vt, n4, d, TK, acc, d)
            for s in range(q0, q1):
                for i in range(g):
                    r = (s + sh) * g + i
                    for e in range(d):
                        acc[r, e] += acc[r, d + e]
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
