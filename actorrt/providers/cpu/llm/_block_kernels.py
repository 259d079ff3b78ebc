"""Compiled kernels of the decoder-block fusion (:mod:`._fusion`): the
float32-activation block, the int8 block's parallel region (atomic stage
counters, the per-stage work claims, the stage program) and the decoder
stack's region over many layers.

Public names (used by :mod:`._fusion` only): ``block_f32``, ``region_block``,
``region_stack``: ``block_f32`` exists when numba is importable
(``_nb.HAVE_NUMBA``), the other two when the int8 dot kernels are
(``_i8.HAVE_INT8_DOT``).
The tuning constants stay in :mod:`._fusion` (its tests patch them there);
the one this file reads at compile time is :data:`PARALLEL_MIN_WORK`.
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _contrib_int8 as _i8
from . import _contrib_numba as _nb
from . import _flash as _fl
from . import _paged_kernels as _pk
from . import _spin

#: a projection splits over the threads from this many multiply-adds (M x N x K)
PARALLEL_MIN_WORK = 1 << 16
#: the LM head in the stack's region: column chunks of about this many
#: columns (a vocabulary of 49,152: 48 chunks, not ``parts``), so that a
#: thread that starts late or is preempted leaves little of it to the other
HEAD_CHUNK_COLUMNS = 1024
#: rows a chunk of the row-wise stages (quantize, residual add + RMS norm,
#: SiLU-mul): a decode batch of 8-16 rows is 2-4 chunks, so both threads
#: work in them (each row's bits are the same whatever its chunk)
ROW_CHUNK = 4
#: a projection stage's work item (a row tile x a column chunk) has about
#: this many multiply-adds or fewer (~10-15 us at the tiles' rate), at least
#: ``parts`` chunks and ``cw`` columns a chunk: the thread that finishes
#: last in a stage waits for at most one item
ITEM_MACS = 1 << 19
#: a stage counter row of this many slots is a profiled one (the stack's
#: ``prof`` argument): per stage s, the team's summed cycles waiting at its
#: barrier in slot PROFILE_WAIT + s and the summed cycle counts at which the
#: threads left it in PROFILE_EXIT + s (slots 0-23: the counters of stages
#: 0-11, the variants' blocks included)
PROFILE_WAIT = 24
PROFILE_EXIT = 36
PROFILE_SLOTS = 48

if _nb.HAVE_NUMBA:
    from numba import njit

    # the float32-activation block (weights one byte a value): every projection
    # a parallel launch of its own
    @njit(fastmath=True, nogil=True, cache=True)
    def _mm_f32(a, w, d, z, chunks):  # pragma: no cover - compiled
        m = a.shape[0]
        out = np.empty((m, w.shape[0]), np.float32)
        if m == 0:
            return out
        if chunks > 1 and m * w.shape[0] * a.shape[1] >= PARALLEL_MIN_WORK:
            if m == 1:
                _nb._gemv_q8(a, w, d, z, out, chunks)
            else:
                _nb._gemm_q8(a, w, d, z, out, chunks)
        elif m == 1:
            _nb._gemv_q8_serial(a, w, d, z, out)
        else:
            _nb._gemm_q8_serial(a, w, d, z, out)
        return out


    @njit(fastmath=True, nogil=True, cache=True)
    def _block_f32(h, res, qw, qd, qz, kw, kd, kz, vw, vd, vz, packed, past_k, past_v, pk, pv,
              seqlens, total, cos, sin, pos, heads, kv_heads, copy_past, rotary,
              interleaved, alpha, window, gqa_chunks, ow, od, oz, g2, eps2, gw, gd, gz,
              uw, ud, uz, dw, dd, dz, g3, eps3, chunks):  # pragma: no cover - compiled
        bsz, s_len, hidden = h.shape
        m = bsz * s_len
        x = h.reshape(m, hidden)
        q = _mm_f32(x, qw, qd, qz, chunks)
        nq = q.shape[1]
        if packed:
            k = q
            v = q
            d = nq // (heads + 2 * kv_heads)
        else:
            k = _mm_f32(x, kw, kd, kz, chunks)
            v = _mm_f32(x, vw, vd, vz, chunks)
            d = nq // heads
        q3 = q.reshape(bsz, s_len, nq)
        k3 = k.reshape(bsz, s_len, k.shape[1])
        v3 = v.reshape(bsz, s_len, v.shape[1])
        attn = np.empty((bsz, s_len, heads * d), np.float32)
        if gqa_chunks > 1:
            status = _nb._gqa(q3, k3, v3, past_k, past_v, pk, pv, seqlens, total, cos, sin,
                              pos, heads, kv_heads, packed, copy_past, rotary, False,
                              interleaved, alpha, window, attn, gqa_chunks)
        else:
            status = _nb._gqa_serial(q3, k3, v3, past_k, past_v, pk, pv, seqlens, total,
                                     cos, sin, pos, heads, kv_heads, packed, copy_past,
                                     rotary, False, interleaved, alpha, window, attn, 1)
        if status != 0:  # nothing was written
            return status, h, h, 1
        o = _mm_f32(attn.reshape(m, heads * d), ow, od, oz, chunks)
        res2 = np.empty((m, hidden), np.float32)
        y2 = np.empty((m, hidden), np.float32)
        inv = np.empty(m, np.float32)
        _nb._skip_rms_norm(o, res.reshape(m, hidden), g2, g2, False, eps2, y2, inv, res2)
        gate = _mm_f32(y2, gw, gd, gz, chunks)
        up = _mm_f32(y2, uw, ud, uz, chunks)
        _nb._silu_mul(gate, up, 0, m)  # SiLU(gate) * up, as Sigmoid, Mul, Mul compute it
        down = _mm_f32(gate, dw, dd, dz, chunks)
        res3 = np.empty((m, hidden), np.float32)
        y3 = np.empty((m, hidden), np.float32)
        _nb._skip_rms_norm(down, res2, g3, g3, False, eps3, y3, inv, res3)
        return 0, y3.reshape(bsz, s_len, hidden), res3.reshape(bsz, s_len, hidden), 1


    block_f32 = _block_f32


if _i8.HAVE_INT8_DOT:
    from numba import carray, prange, types
    from numba.extending import intrinsic

    # the shared intrinsics (atomic add, acquire load, cycle counter, prefetch)
    from .._atomics import atomic_add as _atomic_add
    from .._atomics import cycles as _cycles
    from .._atomics import load_acquire as _atomic_get
    from .._atomics import prefetch_line as _prefetch_line

    @njit(nogil=True, cache=True, inline="always")
    def _claim(ctr, stage):  # pragma: no cover - compiled
        return _atomic_add(ctr, 2 * stage, 1)

    @njit(nogil=True, cache=True, inline="always")
    def _done(ctr, stage):  # pragma: no cover - compiled
        _atomic_add(ctr, 2 * stage + 1, 1)

    @njit(nogil=True, cache=True)
    def cycles():  # pragma: no cover - compiled
        """The cycle counter the stage timings count in (calibrate it against
        ``time.perf_counter``): int64."""
        return _cycles()

    @njit(nogil=True, cache=True, inline="always")
    def _timed(ctr, stage, t1):  # pragma: no cover - compiled
        # a profiled region (ctr of PROFILE_SLOTS): this thread waited from
        # t1 to now at the end of ``stage``; sums over the team
        if ctr.shape[0] >= PROFILE_SLOTS:
            t2 = _cycles()
            _atomic_add(ctr, PROFILE_WAIT + stage, t2 - t1)
            _atomic_add(ctr, PROFILE_EXIT + stage, t2)

    @njit(nogil=True, cache=True, inline="always")
    def _wait(ctr, stage, n):  # pragma: no cover - compiled
        # every chunk of the stage finished. Only chunks a running thread
        # claimed are waited for: a thread that never started claims none, so
        # one thread alone finishes the region (no barrier, no deadlock); a
        # long wait yields the core (_spin: an oversubscribed machine)
        t1 = _cycles() if ctr.shape[0] >= PROFILE_SLOTS else 0
        spins = 0
        while _atomic_get(ctr, 2 * stage + 1) < n:
            spins = _spin.backoff(spins)
        _timed(ctr, stage, t1)

    @njit(nogil=True, cache=True, inline="always")
    def _wait_warm(ctr, stage, n, w0, w1, pf):  # pragma: no cover - compiled
        # _wait; with pf & 2, meanwhile prefetching the next stage's weights
        # (w0 then w1 from their first byte: the order their chunks are
        # claimed in), so a thread left without work in a small stage keeps
        # the memory bus busy
        t1 = _cycles() if ctr.shape[0] >= PROFILE_SLOTS else 0
        limit = w0.nbytes + w1.nbytes if pf & 2 else 0
        pos = 0
        spins = 0
        while _atomic_get(ctr, 2 * stage + 1) < n:
            if pos < limit:
                for _ in range(8):
                    if pos < w0.nbytes:
                        _prefetch_line(w0, pos)
                    elif pos < limit:
                        _prefetch_line(w1, pos - w0.nbytes)
                    pos += 64
            else:
                spins = _spin.backoff(spins)
        _timed(ctr, stage, t1)

    @njit(fastmath=True, nogil=True, cache=True)
    def prompt_attention(stage, ctr, query, pk, pv, bt, cos, sin, pos, past, tot, pairs,
                         kv_heads, g, d, r2, rotary, interleaved, alpha, window,
                         attn):  # pragma: no cover - compiled
        """A stage program's prompt-attention stage (S > 1, the new keys already
        appended): this thread claims (batch row, KV head, query tile) items of
        ``stage`` (:func:`._flash.item`) and attends them tiled
        (:func:`._flash.attend_tile`) into attn (B, S, H * D) float32; bt is
        the block table (empty: a contiguous cache). Returns the stage's item
        count (what its barrier waits for). Shared by this module's block and
        :mod:`._block_variants`'."""
        s_len = attn.shape[1]
        f_q, f_k, f_v, f_s, f_m, f_d, f_a = _fl.scratch(g, d)
        items = pairs * ((s_len + _fl.TQ - 1) // _fl.TQ + 1)
        while True:
            c = _claim(ctr, stage)
            if c >= items:
                break
            b, kh, q0b, q0, q1 = _fl.item(c, pairs, s_len, kv_heads, past)
            _fl.attend_tile(query, pk, pv, bt, cos, sin, pos, past, tot, b, kh, g, d, r2,
                            rotary, interleaved, alpha, window, q0b, q0, q1, f_q, f_k, f_v,
                            f_s, f_m, f_d, f_a, attn)
            _done(ctr, stage)
        return items

    # The int8 decoder block as one parallel region: every thread runs the
    # same stage program (_program) and claims chunks of each stage (column
    # ranges of the projections, (batch row, KV head) pairs of attention, the
    # whole of a small serial step) with an atomic counter, then waits until
    # the stage's chunks are finished. Module-level functions, not closures:
    # numba's disk cache keys a closure by its cell contents, which differ
    # per process.

    @njit(nogil=True, cache=True)
    def _quantize_stage(stage, ctr, a, xq, sx, xsum, sx_t, xs_t, row_chunks, w0, w1,
                        pf):  # pragma: no cover - compiled
        # a stage quantizing the rows of a, ROW_CHUNK rows a chunk (the next
        # stage's weights w0, w1 warmed while waiting)
        m = a.shape[0]
        while True:
            c = _claim(ctr, stage)
            if c >= row_chunks:
                break
            r0 = c * ROW_CHUNK
            _i8._quantize_into(a, xq, sx, xsum, sx_t, xs_t, r0, min(m, r0 + ROW_CHUNK))
            _done(ctr, stage)
        _wait_warm(ctr, stage, row_chunks, w0, w1, pf)

    @njit(nogil=True, cache=True)
    def _gather_stage(stage, ctr, a, rows, out):  # pragma: no cover - compiled
        # a stage copying row rows[i] of a into row i of out, a row a chunk
        n = rows.shape[0]
        while True:
            c = _claim(ctr, stage)
            if c >= n:
                break
            out[c, :] = a[rows[c], :]
            _done(ctr, stage)
        _wait(ctr, stage, n)

    @njit(fastmath=True, nogil=True, cache=True)
    def _project(stage, ctr, xb, mats, outs, cw, parts, pf):  # pragma: no cover - compiled
        # up to three projections of the same quantized activation, their
        # column chunks numbered one after another: each projection in at
        # least ``parts`` chunks of at least cw columns, of about ITEM_MACS
        # multiply-adds a row tile where that is more (a claimed chunk costs about
        # a microsecond), each chunk in row tiles of ROW_BLOCK rows (one for
        # a decode batch); an item runs in _i8._cols' row x column tiles
        # (each weight block unpacked once per four rows)
        xq, sx, xsum, sx_t, xs_t = xb
        n0, n1, n2 = mats[0][0].shape[0], mats[1][0].shape[0], mats[2][0].shape[0]
        # more chunks where a row tile's work is large (ITEM_MACS an item)
        tile = min(xq.shape[0], _i8.ROW_BLOCK) * xq.shape[1]
        p0 = max(parts, tile * n0 // ITEM_MACS)
        p1 = max(parts, tile * n1 // ITEM_MACS)
        p2 = max(parts, tile * n2 // ITEM_MACS)
        # (chunk widths: multiples of four columns, one group; of sixteen from
        # two rows, the wide decode tiles' and the panel's chunk)
        g = 16 if xq.shape[0] >= 2 else 4
        w0 = max(cw, ((n0 + p0 - 1) // p0 + g - 1) // g * g)
        w1 = max(cw, ((n1 + p1 - 1) // p1 + g - 1) // g * g)
        w2 = max(cw, ((n2 + p2 - 1) // p2 + g - 1) // g * g)
        c0 = (n0 + w0 - 1) // w0
        c1 = (n1 + w1 - 1) // w1
        # (row tile, column chunk) work items: a chunk's row tiles one after
        # another (its weights stay in cache), ROW_BLOCK rows a tile
        rb = _i8.ROW_BLOCK
        rt = max(1, (xq.shape[0] + rb - 1) // rb)
        total = (c0 + c1 + (n2 + w2 - 1) // w2) * rt
        while True:
            item = _claim(ctr, stage)
            if item >= total:
                break
            c = item // rt
            r0 = (item % rt) * rb
            r1 = min(xq.shape[0], r0 + rb)
            if c < c0:
                _i8._cols_rows(xq, sx, xsum, sx_t, xs_t, mats[0][0], mats[0][1], mats[0][2],
                               outs[0], r0, r1, c * w0, min(n0, (c + 1) * w0), pf)
            elif c < c0 + c1:
                c -= c0
                _i8._cols_rows(xq, sx, xsum, sx_t, xs_t, mats[1][0], mats[1][1], mats[1][2],
                               outs[1], r0, r1, c * w1, min(n1, (c + 1) * w1), pf)
            else:
                c -= c0 + c1
                _i8._cols_rows(xq, sx, xsum, sx_t, xs_t, mats[2][0], mats[2][1], mats[2][2],
                               outs[2], r0, r1, c * w2, min(n2, (c + 1) * w2), pf)
            _done(ctr, stage)
        _wait(ctr, stage, total)

    @njit(fastmath=True, nogil=True, cache=True)
    def _program(x, res, qw, qd, qz, kw, kd, kz, vw, vd, vz, oq, ok, ov, packed, past_k,
                past_v, pk, pv, cos, sin, pos, past, tot, t_max, heads, kv_heads, copy_past,
                rotary, interleaved, alpha, window, ow, od, oz, g2, eps2, gw, gd, gz, uw, ud,
                uz, dw, dd, dz, g3, eps3, hq, hs, hx, ht, hu, aq, as_, ax, at, au, yq, ys, yx,
                yt, yu, fq, fs, fx, ft, fu, attn, o, y2, res2, gate, up, down, y3, res3, inv,
                ctr, cw, nw, nd, parts, pf, pa, spans, bt):  # pragma: no cover - compiled
        # (flat arguments: a parallel region takes arrays and scalars only;
        # bt: a paged cache's block table (_paged_kernels), pk/pv its pools,
        # or (0, 1) for a contiguous cache)
        bsz, s_len = attn.shape[0], attn.shape[1]
        m = x.shape[0]
        none = (nw, nd, nd)
        # the row-wise steps are claimed ROW_CHUNK rows at a time
        row_chunks = (m + ROW_CHUNK - 1) // ROW_CHUNK
        # 0. quantize h
        _quantize_stage(0, ctr, x, hq, hs, hx, ht, hu, row_chunks, qw, kw, pf)
        # 1. q, k, v projections (k and v empty when packed)
        _project(1, ctr, (hq, hs, hx, ht, hu), ((qw, qd, qz), (kw, kd, kz), (vw, vd, vz)),
                (oq, ok, ov), cw, parts, pf)
        nq = oq.shape[1]
        query = oq.reshape(bsz, s_len, nq)
        if packed:
            d = nq // (heads + 2 * kv_heads)
            key = query
            value = query
            koff = heads * d
            voff = (heads + kv_heads) * d
        else:
            d = nq // heads
            key = ok.reshape(bsz, s_len, ok.shape[1])
            value = ov.reshape(bsz, s_len, ov.shape[1])
            koff = 0
            voff = 0
        # 2. per (batch row, KV head): append the new keys/values, attend;
        # a decode step (spans > 1) splits each pair's cached rows into spans
        # (the units of the stage: a few pairs on more threads balance), the
        # last span appending the new row, and stage 3 merges them
        g = heads // kv_heads
        r2 = cos.shape[1]
        pairs = bsz * kv_heads
        units = pairs * spans
        qg = np.empty((g, d), np.float32)
        acc = np.empty((g, d), np.float32)
        sc = np.empty((g, t_max), np.float32)
        mx = np.empty(g, np.float32)
        den = np.empty(g, np.float32)
        paged = bt.shape[0] > 0
        while True:
            c = _claim(ctr, 2)
            if c >= units:
                break
            pr = c // spans
            k = c % spans
            b = pr // kv_heads
            kh = pr % kv_heads
            if k == spans - 1:
                if paged:
                    _pk.append_paged(key, value, pk, pv, bt, cos, sin, pos, past, tot, b, kh,
                                     d, s_len, r2, koff, voff, rotary, interleaved)
                else:
                    _nb._append_pair(key, value, past_k, past_v, pk, pv, cos, sin, pos, past,
                                     b, kh, d, s_len, r2, koff, voff, copy_past, rotary,
                                     interleaved)
            if s_len > 1:  # prompt rows: attended in stage 10, tiled (_flash)
                pass
            elif spans == 1 and paged:
                _pk.attend_group_paged(query, pk, pv, bt, cos, sin, pos, past, tot, b, kh, g, d,
                                       s_len, r2, rotary, interleaved, alpha, window, qg, acc,
                                       sc, mx, den, attn)
            elif spans == 1:
                _nb._attend_group(query, pk, pv, cos, sin, pos, past, tot, b, kh, g, d, s_len,
                                  r2, rotary, interleaved, alpha, window, qg, acc, sc, mx, den,
                                  attn)
            else:
                hi = tot[b]
                lo = max(0, hi - window) if window > 0 else 0
                a0 = lo + (k * (hi - lo)) // spans
                a1 = lo + ((k + 1) * (hi - lo)) // spans
                part = pa[c]
                if a1 > a0 and paged:
                    _pk.attend_span_paged(query, pk, pv, bt, cos, sin, pos, b, kh, g, d, r2,
                                          rotary, interleaved, alpha, a0, a1, qg, sc, mx, den,
                                          part)
                elif a1 > a0:
                    _nb._attend_span(query, pk, pv, cos, sin, pos, b, kh, g, d, r2, rotary,
                                     interleaved, alpha, a0, a1, qg, sc, mx, den, part)
                else:  # an empty span weighs nothing in the merge
                    part[:, :] = 0.0
                    part[:, d] = np.float32(-np.inf)
            _done(ctr, 2)
        _wait_warm(ctr, 2, units, ow, nw, pf)
        if s_len > 1:  # 2b. per (batch row, KV head, query tile), the new keys appended
            items = prompt_attention(10, ctr, query, pk, pv, bt, cos, sin, pos, past, tot,
                                     pairs, kv_heads, g, d, r2, rotary, interleaved, alpha,
                                     window, attn)
            _wait_warm(ctr, 10, items, ow, nw, pf)
        # 3. (merge the spans,) quantize the attention output; 4. o projection
        a2 = attn.reshape(m, attn.shape[2])
        while True:
            c = _claim(ctr, 3)
            if c >= row_chunks:
                break
            r0, r1 = c * ROW_CHUNK, min(m, (c + 1) * ROW_CHUNK)
            if spans > 1:  # one query row per batch row
                for b in range(r0, r1):
                    for kh in range(kv_heads):
                        pr = b * kv_heads + kh
                        _nb._merge_spans(pa[pr * spans:(pr + 1) * spans], b, kh, g, d, attn)
            _i8._quantize_into(a2, aq, as_, ax, at, au, r0, r1)
            _done(ctr, 3)
        _wait_warm(ctr, 3, row_chunks, ow, nw, pf)
        _project(4, ctr, (aq, as_, ax, at, au), ((ow, od, oz), none, none), (o, o, o), cw,
                 parts, pf)
        # 5. residual add + RMS norm, quantize
        while True:
            c = _claim(ctr, 5)
            if c >= row_chunks:
                break
            r0, r1 = c * ROW_CHUNK, min(m, (c + 1) * ROW_CHUNK)
            _nb._skip_rms_norm(o[r0:r1], res[r0:r1], g2, g2, False, eps2, y2[r0:r1],
                               inv[r0:r1], res2[r0:r1])
            _i8._quantize_into(y2, yq, ys, yx, yt, yu, r0, r1)
            _done(ctr, 5)
        _wait_warm(ctr, 5, row_chunks, gw, uw, pf)
        # 6. gate and up projections
        _project(6, ctr, (yq, ys, yx, yt, yu), ((gw, gd, gz), (uw, ud, uz), none),
                 (gate, up, up), cw, parts, pf)
        # 7. SiLU(gate) * up (as Sigmoid, Mul, Mul compute it), quantize
        while True:
            c = _claim(ctr, 7)
            if c >= row_chunks:
                break
            r0, r1 = c * ROW_CHUNK, min(m, (c + 1) * ROW_CHUNK)
            _nb._silu_mul(gate, up, r0, r1)
            _i8._quantize_into(gate, fq, fs, fx, ft, fu, r0, r1)
            _done(ctr, 7)
        _wait_warm(ctr, 7, row_chunks, dw, nw, pf)
        # 8. down projection; 9. residual add + RMS norm
        _project(8, ctr, (fq, fs, fx, ft, fu), ((dw, dd, dz), none, none), (down, down, down),
                 cw, parts, pf)
        while True:
            c = _claim(ctr, 9)
            if c >= row_chunks:
                break
            r0, r1 = c * ROW_CHUNK, min(m, (c + 1) * ROW_CHUNK)
            _nb._skip_rms_norm(down[r0:r1], res2[r0:r1], g3, g3, False, eps3, y3[r0:r1],
                               inv[r0:r1], res3[r0:r1])
            _done(ctr, 9)
        _wait(ctr, 9, row_chunks)


    @njit(parallel=True, fastmath=True, nogil=True, cache=True)
    def _region(x, res, qw, qd, qz, kw, kd, kz, vw, vd, vz, oq, ok, ov, packed, past_k,
               past_v, pk, pv, cos, sin, pos, past, tot, t_max, heads, kv_heads, copy_past,
               rotary, interleaved, alpha, window, ow, od, oz, g2, eps2, gw, gd, gz, uw, ud,
               uz, dw, dd, dz, g3, eps3, hq, hs, hx, ht, hu, aq, as_, ax, at, au, yq, ys, yx,
               yt, yu, fq, fs, fx, ft, fu, attn, o, y2, res2, gate, up, down, y3, res3, inv,
               ctr, cw, nw, nd, threads, parts, pf, pa, spans, bt):  # pragma: no cover - compiled
        for _ in prange(threads):
            _program(x, res, qw, qd, qz, kw, kd, kz, vw, vd, vz, oq, ok, ov, packed, past_k,
                    past_v, pk, pv, cos, sin, pos, past, tot, t_max, heads, kv_heads,
                    copy_past, rotary, interleaved, alpha, window, ow, od, oz, g2, eps2, gw,
                    gd, gz, uw, ud, uz, dw, dd, dz, g3, eps3, hq, hs, hx, ht, hu, aq, as_, ax,
                    at, au, yq, ys, yx, yt, yu, fq, fs, fx, ft, fu, attn, o, y2, res2, gate,
                    up, down, y3, res3, inv, ctr, cw, nw, nd, parts, pf, pa, spans, bt)


    @njit(nogil=True, cache=True)
    def _scratch(bsz, s_len, hidden, nq, nk, nv, width, nf):  # pragma: no cover - compiled
        # the stage program's intermediates for m = bsz * s_len rows: the
        # q/k/v projections, attention output (bsz, s_len, width), o, y2,
        # res2, gate, up, down, 1/rms, then the int8 buffers of the four
        # quantized activations (h, attention, y2, SiLU product)
        m = bsz * s_len
        f32 = np.float32
        return ((np.empty((m, nq), f32), np.empty((m, nk), f32), np.empty((m, nv), f32),
                 np.empty((bsz, s_len, width), f32), np.empty((m, hidden), f32),
                 np.empty((m, hidden), f32), np.empty((m, hidden), f32), np.empty((m, nf), f32),
                 np.empty((m, nf), f32), np.empty((m, hidden), f32), np.empty(m, f32))
                + _i8._act_buffers(m, hidden) + _i8._act_buffers(m, width)
                + _i8._act_buffers(m, hidden) + _i8._act_buffers(m, nf))

    @njit(nogil=True, cache=True)
    def _spans(bsz, kv_heads, s_len, t_max, copy_past, g, d, span_units,
               span_rows):  # pragma: no cover - compiled
        # (spans, their buffer): a decode step's attention splits each (batch
        # row, KV head) pair's cached rows into spans, span_units units in
        # all, at least span_rows rows a span (a prefill, or past rows copied
        # into the present buffer, keep one span). Not a function of the
        # thread count: a team computes the bits one thread does
        pairs = bsz * kv_heads
        n = 1
        if s_len == 1 and not copy_past:
            n = max(1, min((span_units + pairs - 1) // pairs, t_max // span_rows))
        return n, np.empty((pairs * n if n > 1 else 0, g, d + 2), np.float32)

    @njit(nogil=True, cache=True)
    def _region_block(h, res, qw, qd, qz, kw, kd, kz, vw, vd, vz, packed, past_k, past_v, pk, pv,
              seqlens, total, cos, sin, pos_ids, heads, kv_heads, copy_past, rotary,
              interleaved, alpha, window, ow, od, oz, g2, eps2, gw, gd, gz, uw, ud, uz, dw,
              dd, dz, g3, eps3, threads, cw, parts, pf, span_units,
              span_rows):  # pragma: no cover - compiled
        bsz, s_len, hidden = h.shape
        m = bsz * s_len
        status, past, tot, pos, t_max = _nb._gqa_lengths(
            seqlens, total, bsz, s_len, pk.shape[2], copy_past, past_k.shape[2], pos_ids,
            False, rotary, cos.shape[0])
        if status != 0:  # nothing was written
            return status, h, h, 1
        nq = qw.shape[0]
        d = nq // (heads + 2 * kv_heads) if packed else nq // heads
        nf = gw.shape[0]
        nw = qw[:0]
        nd = qd[:0]
        if packed:
            kw, kd, kz, vw, vd, vz = nw, nd, nd, nw, nd, nd
        (oq, ok, ov, attn, o, y2, res2, gate, up, down, inv, hq, hs, hx, ht, hu, aq, as_, ax, at,
         au, yq, ys, yx, yt, yu, fq, fs, fx, ft, fu) = _scratch(
            bsz, s_len, hidden, nq, kw.shape[0], vw.shape[0], heads * d, nf)
        y3 = np.empty((m, hidden), np.float32)
        res3 = np.empty((m, hidden), np.float32)
        ctr = np.zeros(22, np.int64)
        spans, pa = _spans(bsz, kv_heads, s_len, t_max, copy_past, heads // kv_heads, d,
                           span_units, span_rows)
        _region(h.reshape(m, hidden), res.reshape(m, hidden), qw, qd, qz, kw, kd, kz, vw, vd,
               vz, oq, ok, ov, packed, past_k, past_v, pk, pv, cos, sin, pos, past, tot,
               t_max, heads, kv_heads, copy_past, rotary, interleaved, alpha, window, ow, od,
               oz, g2, eps2, gw, gd, gz, uw, ud, uz, dw, dd, dz, g3, eps3, hq, hs, hx, ht, hu,
               aq, as_, ax, at, au, yq, ys, yx, yt, yu, fq, fs, fx, ft, fu, attn, o, y2, res2,
               gate, up, down, y3, res3, inv, ctr, cw, nw, nd, threads, parts, pf, pa, spans,
               np.zeros((0, 1), np.int32))
        return 0, y3.reshape(bsz, s_len, hidden), res3.reshape(bsz, s_len, hidden), spans


    # A stack of int8 decoder blocks (consecutive layers, each reading the
    # previous one's outputs) as one parallel region: every thread runs the
    # stage program of layer 0, then layer 1, ..., each layer with counters of
    # its own, so no thread waits at a layer boundary for the team to finish
    # and the stack costs one dispatch instead of one per layer. A parallel
    # region takes arrays and scalars only: each layer's weights are read
    # through a table of their addresses (the arrays are the kernels'
    # prepacked ones, kept alive by the plan), typed and shaped like layer 0's.

    @intrinsic
    def _pointer_like(typingctx, addr, like):
        """A pointer to ``like``'s dtype at address ``addr`` (int64)."""
        sig = types.CPointer(like.dtype)(types.int64, like)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(sig.return_type))
        return sig, codegen

    @njit(nogil=True, cache=True, inline="always")
    def _at(addr, like):  # pragma: no cover - compiled
        # the array at ``addr`` with ``like``'s dtype and shape (borrowed)
        return carray(_pointer_like(addr, like), like.shape)

    @njit(parallel=True, fastmath=True, nogil=True, cache=True)
    def _stack_region(x, res, wt, qw, qd, qz, kw, kd, kz, vw, vd, vz, ow, od, oz, gw, gd, gz,
                      uw, ud, uz, dw, dd, dz, g2s, eps2s, g3s, eps3s, kvt, kv0, oq, ok, ov,
                      packed, cos, sin, pos, past, tot, t_max, heads, kv_heads, rotary,
                      interleaved, alpha, window, hq, hs, hx, ht, hu, aq, as_, ax, at, au, yq,
                      ys, yx, yt, yu, fq, fs, fx, ft, fu, attn, o, y2, res2, gate, up, down,
                      inv, ctrs, cw, nw, nd, threads, parts, pf, pa, spans, hw, hd, hz, head,
                      logits, head_rows, hsrc, gq, gs, gx, gt, gu,
                      bt):  # pragma: no cover - compiled
        for _ in prange(threads):
            n_layers = wt.shape[0]
            for l in range(n_layers):
                a = wt[l]
                pk = _at(kvt[l, 0], kv0)
                pv = _at(kvt[l, 1], kv0)
                # each layer reads x/res and writes its outputs over them: x is
                # read only by stage 0 and res by stage 5, both long finished
                # when stage 9 writes
                _program(x, res, _at(a[0], qw), _at(a[1], qd), _at(a[2], qz), _at(a[3], kw),
                         _at(a[4], kd), _at(a[5], kz), _at(a[6], vw), _at(a[7], vd),
                         _at(a[8], vz), oq, ok, ov, packed, pk, pv, pk, pv, cos, sin, pos,
                         past, tot, t_max, heads, kv_heads, False, rotary, interleaved, alpha,
                         window, _at(a[9], ow), _at(a[10], od), _at(a[11], oz), g2s[l],
                         eps2s[l], _at(a[12], gw), _at(a[13], gd), _at(a[14], gz),
                         _at(a[15], uw), _at(a[16], ud), _at(a[17], uz), _at(a[18], dw),
                         _at(a[19], dd), _at(a[20], dz), g3s[l], eps3s[l], hq, hs, hx, ht, hu,
                         aq, as_, ax, at, au, yq, ys, yx, yt, yu, fq, fs, fx, ft, fu, attn, o,
                         y2, res2, gate, up, down, x, res, inv, ctrs[l], cw, nw, nd, parts, pf, pa,
                         spans, bt)
            if head:  # the LM head on the last layer's output, counters of its own
                hc = ctrs[n_layers]
                if head_rows.shape[0]:  # the rows it reads, gathered into hsrc
                    _gather_stage(0, hc, x, head_rows, hsrc)
                    _quantize_stage(1, hc, hsrc, gq, gs, gx, gt, gu,
                                    (hsrc.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK, hw, hw, 0)
                    _project(2, hc, (gq, gs, gx, gt, gu),
                             ((hw, hd, hz), (nw, nd, nd), (nw, nd, nd)),
                             (logits, logits, logits), cw,
                             max(parts, hw.shape[0] // HEAD_CHUNK_COLUMNS), 0)
                else:
                    _quantize_stage(1, hc, x, hq, hs, hx, ht, hu,
                                    (x.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK, hw, hw, 0)
                    _project(2, hc, (hq, hs, hx, ht, hu),
                             ((hw, hd, hz), (nw, nd, nd), (nw, nd, nd)),
                             (logits, logits, logits), cw,
                             max(parts, hw.shape[0] // HEAD_CHUNK_COLUMNS), 0)

    @njit(nogil=True, cache=True)
    def _region_stack(h, res, wt, qw, qd, qz, kw, kd, kz, vw, vd, vz, ow, od, oz, gw, gd, gz,
                      uw, ud, uz, dw, dd, dz, g2s, eps2s, g3s, eps3s, kvt, kv0, seqlens, total,
                      cos, sin, pos_ids, packed, heads, kv_heads, rotary, interleaved, alpha,
                      window, threads, cw, parts, pf, span_units, span_rows, hw, hd, hz,
                      head, head_rows, prof, bt):  # pragma: no cover - compiled
        # kvt: (layers, 2) addresses of each layer's key and value buffers,
        # (B, KVH, L, D) float32 like kv0 (layer 0's key), written in place
        # (the caller checked them: see _kv_table). head: also the LM head,
        # an int8 MatMulNBits (hw, hd, hz: its prepacked weight, K = hidden),
        # on the last layer's output, into the returned (B * S, N) logits;
        # with head_rows (int64, not empty), on those rows of it only: (R, N).
        # bt (B, W) not empty: the buffers are a paged cache's pools (blocks,
        # KVH, block size, D) read and written through that block table.
        # prof (layers + 1, PROFILE_SLOTS) int64 zeros: the stage timings
        # (see PROFILE_SLOTS) are added into it; any other shape: none
        bsz, s_len, hidden = h.shape
        m = bsz * s_len
        n_layers = wt.shape[0]
        paged = bt.shape[0] > 0
        cap = bt.shape[1] * kv0.shape[2] if paged else kv0.shape[2]
        status, past, tot, pos, t_max = _nb._gqa_lengths(
            seqlens, total, bsz, s_len, cap, False, cap, pos_ids, False, rotary, cos.shape[0])
        if status == 0 and paged:
            status = _pk.check_table(bt, tot, kv0.shape[0], kv0.shape[2])
        if status != 0:  # nothing was written
            return status, h, res, 1, np.empty((0, 0), np.float32)
        nq = qw.shape[0]
        d = nq // (heads + 2 * kv_heads) if packed else nq // heads
        nf = gw.shape[0]
        x = h.reshape(m, hidden).copy()
        r = res.reshape(m, hidden).copy()
        (oq, ok, ov, attn, o, y2, res2, gate, up, down, inv, hq, hs, hx, ht, hu, aq, as_, ax, at,
         au, yq, ys, yx, yt, yu, fq, fs, fx, ft, fu) = _scratch(
            bsz, s_len, hidden, nq, kw.shape[0], vw.shape[0], heads * d, nf)
        profiled = prof.shape[0] == n_layers + 1 and prof.shape[1] == PROFILE_SLOTS
        ctrs = np.zeros((n_layers + 1, PROFILE_SLOTS if profiled else 22), np.int64)
        n_rows = head_rows.shape[0] if head_rows.shape[0] else m
        logits = np.empty((n_rows, hw.shape[0]) if head else (0, 0), np.float32)
        hsrc = np.empty((head_rows.shape[0], hidden), np.float32)
        gq, gs, gx, gt, gu = _i8._act_buffers(head_rows.shape[0], hidden)
        spans, pa = _spans(bsz, kv_heads, s_len, t_max, False, heads // kv_heads, d,
                           span_units, span_rows)
        _stack_region(x, r, wt, qw, qd, qz, kw, kd, kz, vw, vd, vz, ow, od, oz, gw, gd, gz, uw,
                      ud, uz, dw, dd, dz, g2s, eps2s, g3s, eps3s, kvt, kv0, oq, ok, ov,
                      packed, cos, sin, pos, past, tot, t_max, heads, kv_heads,
                      rotary, interleaved, alpha, window, hq, hs, hx, ht, hu, aq, as_, ax, at,
                      au, yq, ys, yx, yt, yu, fq, fs, fx, ft, fu, attn, o, y2, res2, gate, up,
                      down, inv, ctrs, cw, qw[:0], qd[:0], threads, parts, pf, pa, spans, hw,
                      hd, hz, head, logits, head_rows, hsrc, gq, gs, gx, gt, gu, bt)
        if profiled:  # the timings, not the counters (fresh each call)
            prof[:, PROFILE_WAIT:] += ctrs[:, PROFILE_WAIT:]
        return 0, x.reshape(bsz, s_len, hidden), r.reshape(bsz, s_len, hidden), spans, logits


# ------------------------------------------------------------------- matching


    region_block, region_stack = _region_block, _region_stack
