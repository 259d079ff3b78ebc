"""Attention over a block-paged KV cache (:mod:`.paged`): the numba pieces
the fused decoder stack's attention stage calls (:mod:`._block_kernels`)
and GroupQueryAttention's paged entry point (:func:`gqa_paged`).

Pools are ``(num_blocks, kv_heads, block_size, head_dim)`` float32, or
float16 passed as its uint16 bits (:mod:`._half`: every pool value is read
with ``kv_get`` and written with ``kv_put``, converted to and from float32;
the arithmetic stays float32); ``bt``
is the int32 ``(batch, max_blocks)`` block table. Each function is the
contiguous kernel of :mod:`._contrib_numba` (``_append_pair``,
``_attend_rows``, ``_attend_group``, ``_attend_span``) with every row read
or written through the table, walking a block at a time, in the same
order and with the same arithmetic: a paged run's results equal the
contiguous cache's bit for bit. A contiguous ``(B, KVH, L, D)`` buffer is
itself such a pool (B blocks of L rows, the table ``arange(B)[:, None]``),
which the tests use to check one against the other.

Scratch: the scores of one (batch row, KV head) pair's query heads over
the attended rows, ``(g, t_max)`` float32 per thread (3 x 4,096 x 4 B =
48 KiB for SmolLM2 at 4,096 positions): never sequence x sequence.
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _contrib_numba as _nb
from . import _flash as _fl
from . import _half

__all__ = ["HAVE_PAGED", "gqa_paged"]

HAVE_PAGED = _nb.HAVE_NUMBA

#: decode attention prefetches the K (then V) rows this many positions ahead
#: (software prefetch: a pool's block of one KV head is a short run of
#: block_size rows, 4 KiB for SmolLM2 in float32, at a place of its own, so
#: the hardware prefetcher restarts at every block); 0: none (for comparisons)
PREFETCH_ROWS = 16

if HAVE_PAGED:
    from numba import njit, prange

    from .._atomics import prefetch_line as _prefetch_line

    _rotate, _expf = _nb._rotate, _nb._expf
    kv_get, kv_put = _half.kv_get, _half.kv_put

    @njit(nogil=True, cache=True, inline="always")
    def _prefetch_row(row):  # pragma: no cover - compiled
        # every cache line of a contiguous pool row (16 values a step: a
        # float32 line; a float16 row's lines twice)
        for e in range(0, row.shape[0], 16):
            _prefetch_line(row, e * row.itemsize)

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def append_paged(key, value, kpool, vpool, bt, cos, sin, pos, past, tot, b, kh, d, s_len,
                     r2, koff, voff, rotary, interleaved):  # pragma: no cover - compiled
        # KV head kh of batch row b: rotate the new keys, write them and the
        # values at positions P_b + s < T_b (a batched prompt's padding rows
        # have no block and are not written)
        # (rotated in a float32 row, then stored: a float16 pool rounds once)
        bs = kpool.shape[2]
        tmp = np.empty(d, np.float32)
        for s in range(s_len):
            t = past[b] + s
            if t >= tot[b]:
                break
            j = t // bs
            o = t - j * bs
            blk = bt[b, j]
            row = kpool[blk, kh, o]
            vrow = vpool[blk, kh, o]
            for e in range(d):
                tmp[e] = key[b, s, koff + kh * d + e]
                kv_put(vrow, e, value[b, s, voff + kh * d + e])
            if rotary:
                _rotate(tmp, cos[pos[b, s]], sin[pos[b, s]], r2, interleaved)
            for e in range(d):
                kv_put(row, e, tmp[e])

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _dots4(qi, k0, k1, k2, k3, d):  # pragma: no cover - compiled
        # _nb._dots4 on pool rows (float32, or half bits converted on read)
        s0 = s1 = s2 = s3 = np.float32(0.0)
        for e in range(d):
            x = qi[e]
            s0 += x * kv_get(k0, e)
            s1 += x * kv_get(k1, e)
            s2 += x * kv_get(k2, e)
            s3 += x * kv_get(k3, e)
        return s0, s1, s2, s3

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _axpy4(ai, w0, w1, w2, w3, v0, v1, v2, v3, d):  # pragma: no cover - compiled
        # _nb._axpy4 on pool rows
        for e in range(d):
            a = ai[e]
            a += w0 * kv_get(v0, e)
            a += w1 * kv_get(v1, e)
            a += w2 * kv_get(v2, e)
            a += w3 * kv_get(v3, e)
            ai[e] = a

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _row(pool, bt, b, kh, t, lo, hi, bs):  # pragma: no cover - compiled
        # the row of position t of batch row b (t clamped into [lo, hi))
        t = min(max(t, lo), hi - 1)
        j = t // bs
        return pool[bt[b, j], kh, t - j * bs]

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _prefetch_group(pool, bt, b, kh, t, lo, hi, bs):  # pragma: no cover - compiled
        # every cache line of the rows of positions t .. t + 3 (t < hi): where
        # they lie in one block (t % bs + 4 <= bs), one contiguous run of the
        # pool read from one table lookup (rows past hi are still the
        # block's memory; a prefetch is a hint); else row by row, clamped
        # into [lo, hi) as the rows read. (Four lookups and row views a group
        # were ~half of a cache-hot attention pass.)
        j = t // bs
        o = t - j * bs
        if o + 4 <= bs:
            row = pool[bt[b, j], kh, o]
            for off in range(0, 4 * row.shape[0] * row.itemsize, 64):
                _prefetch_line(row, off)
        else:
            for i in range(4):
                _prefetch_row(_row(pool, bt, b, kh, t + i, lo, hi, bs))

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def rows_paged(qg, kpool, vpool, bt, b, kh, g, d, alpha, lo, hi, sc, mx, den,
                   acc):  # pragma: no cover - compiled
        # _nb._attend_rows over rows [lo, hi) of batch row b read through bt
        # (the same groups of four positions, the same arithmetic)
        bs = kpool.shape[2]
        g0 = lo - lo % 4
        # (PREFETCH_ROWS: the rows that many positions ahead, four a group,
        # clamped into [lo, hi) as the rows read: hints, the bits unchanged)
        ahead = PREFETCH_ROWS
        if ahead > 0:
            for t in range(g0, min(hi, g0 + ahead)):
                _prefetch_row(_row(kpool, bt, b, kh, t, lo, hi, bs))
        t0 = g0
        while t0 < hi:
            if ahead > 0 and t0 + ahead < hi:
                _prefetch_group(kpool, bt, b, kh, t0 + ahead, lo, hi, bs)
            k0 = _row(kpool, bt, b, kh, t0, lo, hi, bs)
            k1 = _row(kpool, bt, b, kh, t0 + 1, lo, hi, bs)
            k2 = _row(kpool, bt, b, kh, t0 + 2, lo, hi, bs)
            k3 = _row(kpool, bt, b, kh, t0 + 3, lo, hi, bs)
            for i in range(g):
                s0, s1, s2, s3 = _dots4(qg[i], k0, k1, k2, k3, d)
                _nb._group_scores(sc, i, t0, lo, hi, alpha, s0, s1, s2, s3)
            t0 += 4
        _nb._max_rows(sc, mx, g, hi - lo)
        _nb._exp_rows(sc, mx, den, g, hi - lo)
        t0 = g0
        if ahead > 0:  # the first V rows while the exponentials run
            for t in range(g0, min(hi, g0 + ahead)):
                _prefetch_row(_row(vpool, bt, b, kh, t, lo, hi, bs))
        while t0 < hi:
            if ahead > 0 and t0 + ahead < hi:
                _prefetch_group(vpool, bt, b, kh, t0 + ahead, lo, hi, bs)
            v0 = _row(vpool, bt, b, kh, t0, lo, hi, bs)
            v1 = _row(vpool, bt, b, kh, t0 + 1, lo, hi, bs)
            v2 = _row(vpool, bt, b, kh, t0 + 2, lo, hi, bs)
            v3 = _row(vpool, bt, b, kh, t0 + 3, lo, hi, bs)
            for i in range(g):
                w0, w1, w2, w3 = _nb._group_weights(sc[i], t0, lo, hi)
                _axpy4(acc[i], w0, w1, w2, w3, v0, v1, v2, v3, d)
            t0 += 4

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def attend_group_paged(query, kpool, vpool, bt, cos, sin, pos, past, tot, b, kh, g, d,
                           s_len, r2, rotary, interleaved, alpha, window, qg, acc, sc, mx, den,
                           out):  # pragma: no cover - compiled
        # _nb._attend_group through the block table
        for s in range(s_len):
            for i in range(g):
                hh = kh * g + i
                for e in range(d):
                    qg[i, e] = query[b, s, hh * d + e]
                if rotary:
                    _rotate(qg[i], cos[pos[b, s]], sin[pos[b, s]], r2, interleaved)
            causal = past[b] + s + 1
            hi = min(causal, tot[b])
            lo = max(0, causal - window) if window > 0 else 0
            for i in range(g):
                for e in range(d):
                    acc[i, e] = 0.0
            if hi > lo:
                rows_paged(qg, kpool, vpool, bt, b, kh, g, d, alpha, lo, hi, sc, mx, den, acc)
                for i in range(g):
                    w = np.float32(1.0) / den[i]
                    for e in range(d):
                        acc[i, e] *= w
            for i in range(g):
                hh = kh * g + i
                for e in range(d):
                    out[b, s, hh * d + e] = acc[i, e]

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def attend_span_paged(query, kpool, vpool, bt, cos, sin, pos, b, kh, g, d, r2, rotary,
                          interleaved, alpha, lo, hi, qg, sc, mx, den,
                          part):  # pragma: no cover - compiled
        # _nb._attend_span (one span of a decode step's attention, for
        # _nb._merge_spans) through the block table
        p = pos[b, 0]
        for i in range(g):
            hh = kh * g + i
            for e in range(d):
                qg[i, e] = query[b, 0, hh * d + e]
                part[i, e] = 0.0
            if rotary:
                _rotate(qg[i], cos[p], sin[p], r2, interleaved)
        rows_paged(qg, kpool, vpool, bt, b, kh, g, d, alpha, lo, hi, sc, mx, den, part)
        for i in range(g):
            part[i, d] = mx[i]
            part[i, d + 1] = den[i]

    @njit(nogil=True, cache=True)
    def check_table(bt, tot, n_blocks, block_size):  # pragma: no cover - compiled
        # 0 when every position [0, T_b) of every row has a block in range
        # (and the table has a row per batch row), else 5
        if bt.shape[0] != tot.shape[0]:
            return 5
        for b in range(tot.shape[0]):
            need = (tot[b] + block_size - 1) // block_size
            if need > bt.shape[1]:
                return 5
            for j in range(need):
                if bt[b, j] < 0 or bt[b, j] >= n_blocks:
                    return 5
        return 0

    def _gqa_paged_body(query, key, value, kpool, vpool, bt, seqlens, total, cos, sin,
                        pos_ids, h, kvh, packed, rotary, has_pos, interleaved, alpha, window,
                        out, chunks):  # pragma: no cover - compiled
        # _nb._gqa_body on a paged cache
        bsz, s_len, width = query.shape
        d = width // (h + 2 * kvh) if packed else width // h
        g = h // kvh
        r2 = cos.shape[1]
        bs = kpool.shape[2]
        status, past, tot, pos, t_max = _nb._gqa_lengths(
            seqlens, total, bsz, s_len, bt.shape[1] * bs, False, 0, pos_ids, has_pos, rotary,
            cos.shape[0])
        if status != 0:
            return status
        if check_table(bt, tot, kpool.shape[0], bs) != 0:
            return 5
        koff = h * d if packed else 0
        voff = (h + kvh) * d if packed else 0
        for b in range(bsz):
            for kh in range(kvh):
                append_paged(key, value, kpool, vpool, bt, cos, sin, pos, past, tot, b, kh, d,
                             s_len, r2, koff, voff, rotary, interleaved)
        pairs = bsz * kvh
        if s_len > 1:  # prompt rows: tiled, per (batch row, KV head, query tile)
            items = pairs * ((s_len + _fl.TQ - 1) // _fl.TQ + 1)
            for c in prange(chunks):
                qt, kt, vt, st, mt, dt, at = _fl.scratch(g, d)
                for it in range(c, items, chunks):
                    b, kh, q0b, q0, q1 = _fl.item(it, pairs, s_len, kvh, past)
                    _fl.attend_tile(query, kpool, vpool, bt, cos, sin, pos, past, tot, b, kh,
                                    g, d, r2, rotary, interleaved, alpha, window, q0b, q0, q1, qt,
                                    kt, vt, st, mt, dt, at, out)
            return 0
        per = (pairs + chunks - 1) // chunks
        for c in prange(chunks):
            qg = np.empty((g, d), np.float32)
            acc = np.empty((g, d), np.float32)
            sc = np.empty((g, t_max), np.float32)
            mx = np.empty(g, np.float32)
            den = np.empty(g, np.float32)
            for bk in range(c * per, min(pairs, (c + 1) * per)):
                attend_group_paged(query, kpool, vpool, bt, cos, sin, pos, past, tot,
                                   bk // kvh, bk % kvh, g, d, s_len, r2, rotary, interleaved,
                                   alpha, window, qg, acc, sc, mx, den, out)
        return 0

    _gqa_paged = njit(parallel=True, fastmath=True, nogil=True, cache=True)(_gqa_paged_body)
    _gqa_paged_serial = njit(fastmath=True, nogil=True, cache=True)(_gqa_paged_body)


def gqa_paged(query, key, value, kpool, vpool, table, seqlens, total, cos, sin, pos_ids, *,
              num_heads: int, kv_num_heads: int, alpha: float, window: int,
              interleaved: bool) -> tuple[np.ndarray, int]:
    """GroupQueryAttention (float32, semantics of :mod:`._contrib_gqa`) on a
    paged cache: rotate q/k (when ``cos`` is given), write k/v at positions
    ``[P_b, T_b)`` through ``table``, causal (windowed) softmax attention.

    Shapes: query (B, S, H*D) or packed (B, S, (H + 2*KVH)*D) with key/value
    ``None``; key/value (B, S, KVH*D); kpool/vpool (NB, KVH, BS, D) float32
    or float16 (both one dtype);
    table (B, W) int32; seqlens (B,) int64; cos/sin (P, rot/2) float32 or
    ``None``; pos_ids (B, S) int64 or ``None``.

    Returns ``(output (B, S, H*D), status)``: 0; 1 when seqlens do not fit
    ``W * BS`` positions; 3 a rotary position outside cos; 4 a seqlens entry
    outside [0, total); 5 a needed table entry outside the pool (nothing
    was written on a non-zero status).
    """
    bsz, s_len, width = query.shape
    packed = key is None
    d = width // (num_heads + 2 * kv_num_heads) if packed else width // num_heads
    out = np.empty((bsz, s_len, num_heads * d), np.float32)
    rotary = cos is not None
    kpool, vpool = _half.kernel_view(kpool), _half.kernel_view(vpool)
    args = (query, query if packed else key, query if packed else value, kpool, vpool, table,
            seqlens, int(total), cos if rotary else _nb._ONE, sin if rotary else _nb._ONE,
            _nb._NO_POS if pos_ids is None else pos_ids, num_heads, kv_num_heads, packed,
            rotary, pos_ids is not None, interleaved, np.float32(alpha), int(window), out)
    work = bsz * num_heads * s_len * (int(seqlens.max(initial=0)) + 1) * d
    pairs = bsz * kv_num_heads * (_fl.n_tiles(s_len) if s_len > 1 else 1)
    if work < _nb.GQA_PARALLEL_MIN_WORK or pairs < 2:
        status = _gqa_paged_serial(*args, 1)
    else:
        status = _nb._parallel(_gqa_paged, *args, min(pairs, 4 * _nb.num_threads()))
    return out, status
