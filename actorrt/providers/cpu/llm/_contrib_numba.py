"""Optional numba fast paths of the com.microsoft LLM kernels: MatMulNBits,
GroupQueryAttention and SkipSimplifiedLayerNormalization.

The kernels read the quantized values of B (one byte per value) directly, so
a step streams ~1 byte per weight instead of a float32 copy (4 bytes per
weight): :func:`gemv_q8` for one row of A (decode), :func:`gemm_q8` for more
(batched decode, prefill), which dequantizes each output column once into an
L1-resident buffer and reuses it for every row. Without numba,
:data:`HAVE_NUMBA` is False and callers use numpy.

Shapes (all C-contiguous):
    ``b8``: (N, n_blocks, block_size) uint8 (one quantized value per byte).
    ``scales`` / ``zps``: (N, n_blocks) float32 (zero points as floats).
    ``a``: (M, n_blocks * block_size) float32, zero-padded past K.
    ``out``: (M, N) float32.
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import threading

import numpy as np

from .. import _threads

__all__ = ["HAVE_NUMBA", "gemv_q8", "gemm_q8", "gqa_attention", "rms_norm", "skip_rms_norm",
           "num_threads", "set_num_threads", "warm_up"]

try:  # numba is optional (the ``genai`` extra)
    import numba
    from numba import njit, prange
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

# The workqueue threading layer aborts on concurrent parallel launches from
# several Python threads; one launch at a time also avoids oversubscribing cores.
_LOCK = threading.Lock()
#: threads for the parallel kernels (None: numba's default, every core)
_THREADS: int | None = None
_WARM = False

if HAVE_NUMBA:

    _jit = njit(parallel=True, fastmath=True, nogil=True, cache=True)

    from .._numba_math import expf as _expf  # float32 e^x, no libm call: loops vectorize

    @njit(fastmath=True, nogil=True, cache=True, error_model="numpy")
    def _silu_mul(gate, up, r0, r1):  # pragma: no cover - compiled
        # rows r0..r1 of gate <- gate * sigmoid(gate) * up (ONNX Sigmoid, Mul,
        # Mul of a SiLU-gated MLP), vectorized: numpy's error model (no
        # ZeroDivisionError branch) and _expf (no libm call)
        one = np.float32(1.0)
        for r in range(r0, r1):
            g = gate[r]
            u = up[r]
            for j in range(g.shape[0]):
                v = g[j]
                g[j] = v * (one / (one + _expf(-v))) * u[j]

    @njit(fastmath=True, nogil=True, cache=True)
    def _block_sums(a, nb, bs):  # pragma: no cover - compiled
        # (M, n_blocks) sums of A's blocks (for the zero-point term)
        asum = np.empty((a.shape[0], nb), np.float32)
        for m in range(a.shape[0]):
            for blk in range(nb):
                t = np.float32(0.0)
                for j in range(blk * bs, (blk + 1) * bs):
                    t += a[m, j]
                asum[m, blk] = t
        return asum

    @njit(fastmath=True, nogil=True, cache=True)
    def _gemv_q8_cols(a, asum, b8, scales, zps, out, lo, hi):  # pragma: no cover - compiled
        # output columns lo..hi; flat rows: contiguous 1-D inner loops vectorize
        # (u8 -> f32 FMA). A separate function (not inlined into a prange body):
        # numba's parallel lowering vectorized this loop about half as well.
        n_cols, nb, bs = b8.shape
        bflat = b8.reshape(n_cols, nb * bs)
        for n in range(lo, hi):
            brow = bflat[n]
            for m in range(a.shape[0]):
                am = a[m]
                acc = np.float32(0.0)
                for blk in range(nb):
                    s = np.float32(0.0)
                    base = blk * bs
                    for j in range(bs):
                        s += np.float32(brow[base + j]) * am[base + j]
                    acc += scales[n, blk] * (s - zps[n, blk] * asum[m, blk])
                out[m, n] = acc

    @njit(fastmath=True, nogil=True, cache=True)
    def _gemv_q8_serial(a, b8, scales, zps, out):  # pragma: no cover - compiled
        _gemv_q8_cols(a, _block_sums(a, b8.shape[1], b8.shape[2]), b8, scales, zps, out, 0,
                      b8.shape[0])

    @_jit
    def _gemv_q8(a, b8, scales, zps, out, chunks):  # pragma: no cover - compiled
        asum = _block_sums(a, b8.shape[1], b8.shape[2])
        n_cols = b8.shape[0]
        per = (n_cols + chunks - 1) // chunks
        for c in prange(chunks):
            _gemv_q8_cols(a, asum, b8, scales, zps, out, c * per, min(n_cols, (c + 1) * per))

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _dequant_row(brow, scales, zps, w, bs):  # pragma: no cover - compiled
        # w[k] = (q[k] - zp) * scale for one output column (vectorizes: u8 -> f32)
        for blk in range(scales.shape[0]):
            s = scales[blk]
            z = zps[blk] * s
            base = blk * bs
            for j in range(bs):
                w[base + j] = np.float32(brow[base + j]) * s - z

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _dot(w, x):  # pragma: no cover - compiled
        acc = np.float32(0.0)
        for k in range(w.shape[0]):
            acc += w[k] * x[k]
        return acc

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _dot_4x2(w0, w1, w2, w3, x0, x1):  # pragma: no cover - compiled
        # four columns x two rows: 8 accumulators, 6 loads per 8 FMAs
        c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = np.float32(0.0)
        for k in range(w0.shape[0]):
            a0 = x0[k]
            a1 = x1[k]
            u0 = w0[k]
            u1 = w1[k]
            u2 = w2[k]
            u3 = w3[k]
            c0 += u0 * a0
            c1 += u1 * a0
            c2 += u2 * a0
            c3 += u3 * a0
            d0 += u0 * a1
            d1 += u1 * a1
            d2 += u2 * a1
            d3 += u3 * a1
        return c0, c1, c2, c3, d0, d1, d2, d3

    @njit(fastmath=True, nogil=True, cache=True)
    def _gemm_q8_cols(a, b8, scales, zps, out, lo, hi):  # pragma: no cover - compiled
        # Output columns lo..hi: dequantize four columns (K floats each, L1) at a
        # time and reuse them for every row of A, so the quantized weight is read
        # once per call whatever M is and no float copy of B is kept. Compiled on
        # its own (the prange body only calls it): see _gemv_q8_cols.
        m_rows = a.shape[0]
        n_cols = b8.shape[0]
        bs = b8.shape[2]
        kp = b8.shape[1] * bs
        bflat = b8.reshape(n_cols, kp)
        w0 = np.empty(kp, np.float32)
        w1 = np.empty(kp, np.float32)
        w2 = np.empty(kp, np.float32)
        w3 = np.empty(kp, np.float32)
        n = lo
        while n + 4 <= hi:
            _dequant_row(bflat[n], scales[n], zps[n], w0, bs)
            _dequant_row(bflat[n + 1], scales[n + 1], zps[n + 1], w1, bs)
            _dequant_row(bflat[n + 2], scales[n + 2], zps[n + 2], w2, bs)
            _dequant_row(bflat[n + 3], scales[n + 3], zps[n + 3], w3, bs)
            m = 0
            while m + 2 <= m_rows:
                r = _dot_4x2(w0, w1, w2, w3, a[m], a[m + 1])
                for i in range(4):
                    out[m, n + i] = r[i]
                    out[m + 1, n + i] = r[4 + i]
                m += 2
            if m < m_rows:
                out[m, n] = _dot(w0, a[m])
                out[m, n + 1] = _dot(w1, a[m])
                out[m, n + 2] = _dot(w2, a[m])
                out[m, n + 3] = _dot(w3, a[m])
            n += 4
        while n < hi:
            _dequant_row(bflat[n], scales[n], zps[n], w0, bs)
            for m in range(m_rows):
                out[m, n] = _dot(w0, a[m])
            n += 1

    @njit(fastmath=True, nogil=True, cache=True)
    def _gemm_q8_serial(a, b8, scales, zps, out):  # pragma: no cover - compiled
        _gemm_q8_cols(a, b8, scales, zps, out, 0, b8.shape[0])

    @_jit
    def _gemm_q8(a, b8, scales, zps, out, chunks):  # pragma: no cover - compiled
        n_cols = b8.shape[0]
        per = (n_cols + chunks - 1) // chunks
        for c in prange(chunks):
            _gemm_q8_cols(a, b8, scales, zps, out, c * per, min(n_cols, (c + 1) * per))

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _rotate(x, cos, sin, r2, interleaved):  # pragma: no cover - compiled
        # rotary embedding of x[:2*r2] in place (cos/sin rows of length r2)
        if interleaved:
            for i in range(r2):
                x1 = x[2 * i]
                x2 = x[2 * i + 1]
                x[2 * i] = x1 * cos[i] - x2 * sin[i]
                x[2 * i + 1] = x2 * cos[i] + x1 * sin[i]
        else:
            for i in range(r2):
                x1 = x[i]
                x2 = x[i + r2]
                x[i] = x1 * cos[i] - x2 * sin[i]
                x[i + r2] = x2 * cos[i] + x1 * sin[i]

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _dots4(qi, k0, k1, k2, k3, d):  # pragma: no cover - compiled
        # qi . k0 .. qi . k3 (float32 reductions over d; one load of qi[e]
        # for the four rows): every score of the decode kernels is computed
        # by this code, whatever its place in a group
        s0 = s1 = s2 = s3 = np.float32(0.0)
        for e in range(d):
            x = qi[e]
            s0 += x * k0[e]
            s1 += x * k1[e]
            s2 += x * k2[e]
            s3 += x * k3[e]
        return s0, s1, s2, s3

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _axpy4(ai, w0, w1, w2, w3, v0, v1, v2, v3, d):  # pragma: no cover - compiled
        # ai += w0 v0, then w1 v1, w2 v2, w3 v3 (one load and store of ai a
        # group; the additions in position order, as one row at a time)
        for e in range(d):
            a = ai[e]
            a += w0 * v0[e]
            a += w1 * v1[e]
            a += w2 * v2[e]
            a += w3 * v3[e]
            ai[e] = a

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _group_scores(sc, i, t0, lo, hi, alpha, s0, s1, s2, s3):  # pragma: no cover
        # the scores of positions t0 .. t0 + 3 that lie in [lo, hi) into
        # sc[i, t - lo] (their largest is taken afterwards, _max_rows: a
        # running max here was a serial chain of four dependent max a group,
        # ~3/4 of the whole QK pass)
        si = sc[i]
        if t0 >= lo and t0 + 3 < hi:  # (every group but the two edges)
            si[t0 - lo] = s0 * alpha
            si[t0 + 1 - lo] = s1 * alpha
            si[t0 + 2 - lo] = s2 * alpha
            si[t0 + 3 - lo] = s3 * alpha
            return
        if t0 >= lo:
            si[t0 - lo] = s0 * alpha
        if t0 + 1 >= lo and t0 + 1 < hi:
            si[t0 + 1 - lo] = s1 * alpha
        if t0 + 2 >= lo and t0 + 2 < hi:
            si[t0 + 2 - lo] = s2 * alpha
        if t0 + 3 < hi:
            si[t0 + 3 - lo] = s3 * alpha

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _max_rows(sc, mx, g, n):  # pragma: no cover - compiled
        # mx[i] = max(sc[i, :n]) (exact: the same value in any order, so one
        # vectorized reduction)
        for i in range(g):
            m = np.float32(-np.inf)
            si = sc[i]
            for t in range(n):
                m = max(m, si[t])
            mx[i] = m

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _group_weights(si, t0, lo, hi):  # pragma: no cover - compiled
        # the softmax weights of positions t0 .. t0 + 3 (0 outside [lo, hi))
        z = np.float32(0.0)
        return (si[t0 - lo] if t0 >= lo else z,
                si[t0 + 1 - lo] if (t0 + 1 >= lo and t0 + 1 < hi) else z,
                si[t0 + 2 - lo] if (t0 + 2 >= lo and t0 + 2 < hi) else z,
                si[t0 + 3 - lo] if t0 + 3 < hi else z)

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _exp_rows(sc, mx, den, g, n):  # pragma: no cover - compiled
        # sc[i, :n] = e^(sc[i, :n] - mx[i]), den[i] their sum
        for i in range(g):
            m_i = mx[i]
            tot_e = np.float32(0.0)
            for t in range(n):
                e = _expf(sc[i, t] - m_i)  # vectorizes (no libm call)
                sc[i, t] = e
                tot_e += e
            den[i] = tot_e

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _attend_rows(qg, pk, pv, b, kh, g, d, alpha, lo, hi, sc, mx, den,
                     acc):  # pragma: no cover - compiled
        # the g query heads qg (g, d) that share KV head kh of batch row b over
        # cached rows [lo, hi), hi > lo, each K/V row read once for all g
        # heads: mx[i] the largest score alpha * q_i.k_t, den[i] the sum of
        # e^(score - mx[i]), acc[i, :d] (zeroed by the caller) +=
        # e^(score - mx[i]) v_t; sc (g, >= hi - lo). Rows go in groups of four
        # aligned to absolute positions (t0 = multiples of 4; a group's rows
        # outside [lo, hi) read a row inside it and weigh 0), so a position's
        # score and its group's sum are the same whatever lo, hi and the
        # cache layout (``_paged_kernels.rows_paged`` is this code through a
        # block table)
        last = hi - 1
        g0 = lo - lo % 4
        t0 = g0
        while t0 < hi:
            k0 = pk[b, kh, max(t0, lo)]
            k1 = pk[b, kh, min(max(t0 + 1, lo), last)]
            k2 = pk[b, kh, min(max(t0 + 2, lo), last)]
            k3 = pk[b, kh, min(t0 + 3, last)]
            for i in range(g):
                s0, s1, s2, s3 = _dots4(qg[i], k0, k1, k2, k3, d)
                _group_scores(sc, i, t0, lo, hi, alpha, s0, s1, s2, s3)
            t0 += 4
        _max_rows(sc, mx, g, hi - lo)
        _exp_rows(sc, mx, den, g, hi - lo)
        t0 = g0
        while t0 < hi:
            v0 = pv[b, kh, max(t0, lo)]
            v1 = pv[b, kh, min(max(t0 + 1, lo), last)]
            v2 = pv[b, kh, min(max(t0 + 2, lo), last)]
            v3 = pv[b, kh, min(t0 + 3, last)]
            for i in range(g):
                w0, w1, w2, w3 = _group_weights(sc[i], t0, lo, hi)
                _axpy4(acc[i], w0, w1, w2, w3, v0, v1, v2, v3, d)
            t0 += 4

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _attend_group(query, pk, pv, cos, sin, pos, past, tot, b, kh, g, d, s_len, r2, rotary,
                      interleaved, alpha, window, qg, acc, sc, mx, den, out):  # pragma: no cover
        # causal (windowed) softmax(alpha * q.K^T) V for the g query heads that
        # share KV head kh of batch row b
        for s in range(s_len):
            for i in range(g):
                hh = kh * g + i
                for j in range(d):
                    qg[i, j] = query[b, s, hh * d + j]
                if rotary:
                    _rotate(qg[i], cos[pos[b, s]], sin[pos[b, s]], r2, interleaved)
            causal = past[b] + s + 1
            hi = min(causal, tot[b])
            lo = max(0, causal - window) if window > 0 else 0
            for i in range(g):
                for j in range(d):
                    acc[i, j] = 0.0
            if hi > lo:
                _attend_rows(qg, pk, pv, b, kh, g, d, alpha, lo, hi, sc, mx, den, acc)
                for i in range(g):
                    w = np.float32(1.0) / den[i]
                    for j in range(d):
                        acc[i, j] *= w
            for i in range(g):
                hh = kh * g + i
                for j in range(d):
                    out[b, s, hh * d + j] = acc[i, j]

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _attend_span(query, pk, pv, cos, sin, pos, b, kh, g, d, r2, rotary, interleaved, alpha,
                     lo, hi, qg, sc, mx, den, part):  # pragma: no cover - compiled
        # one span of a decode step's attention (query position 0 of batch
        # row b, the g heads sharing KV head kh) over cached rows [lo, hi),
        # hi > lo, unnormalised, for _merge_spans: part[i, :d] = sum over t of
        # e^(s_t - m) v_t, part[i, d] = m (the span's largest score),
        # part[i, d + 1] = sum over t of e^(s_t - m). Spans of one (b, kh) on
        # different threads split a long cache (flash-decoding)
        p = pos[b, 0]
        for i in range(g):
            hh = kh * g + i
            for j in range(d):
                qg[i, j] = query[b, 0, hh * d + j]
                part[i, j] = 0.0
            if rotary:
                _rotate(qg[i], cos[p], sin[p], r2, interleaved)
        _attend_rows(qg, pk, pv, b, kh, g, d, alpha, lo, hi, sc, mx, den, part)
        for i in range(g):
            part[i, d] = mx[i]
            part[i, d + 1] = den[i]

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _merge_spans(parts, b, kh, g, d, out):  # pragma: no cover - compiled
        # out[b, 0, heads of kh] from the _attend_span results parts[k]
        # (k = 0 .. n-1, each (g, d + 2)): softmax over the union of the spans
        n = parts.shape[0]
        for i in range(g):
            m = parts[0, i, d]
            for k in range(1, n):
                m = max(m, parts[k, i, d])
            den = np.float32(0.0)
            for k in range(n):
                den += np.float32(np.exp(parts[k, i, d] - m)) * parts[k, i, d + 1]
            o = out[b, 0, (kh * g + i) * d:(kh * g + i + 1) * d]
            for j in range(d):
                o[j] = 0.0
            for k in range(n):
                w = np.float32(np.exp(parts[k, i, d] - m)) / den
                for j in range(d):
                    o[j] += w * parts[k, i, j]

    @njit(fastmath=True, nogil=True, cache=True, inline="always")
    def _append_pair(key, value, past_k, past_v, pk, pv, cos, sin, pos, past, b, kh, d, s_len,
                     r2, koff, voff, copy_past, rotary, interleaved):  # pragma: no cover
        # KV head kh of batch row b: copy its cached rows (unless the past
        # buffer is the present one), rotate the new keys and append them and
        # the values at rows P_b + s
        if copy_past:
            for t in range(past[b]):
                for j in range(d):
                    pk[b, kh, t, j] = past_k[b, kh, t, j]
                    pv[b, kh, t, j] = past_v[b, kh, t, j]
        for s in range(s_len):
            t = past[b] + s
            row = pk[b, kh, t]
            for j in range(d):
                row[j] = key[b, s, koff + kh * d + j]
                pv[b, kh, t, j] = value[b, s, voff + kh * d + j]
            if rotary:
                _rotate(row, cos[pos[b, s]], sin[pos[b, s]], r2, interleaved)

    @njit(nogil=True, cache=True)
    def _gqa_lengths(seqlens, total, bsz, s_len, cap, copy_past, past_rows, pos_ids, has_pos,
                     rotary, n_pos):  # pragma: no cover - compiled
        # (status, past (B,), tot (B,), pos (B, S), t_max): per batch row the
        # cached length P_b and attended length T_b, the rotary positions; a
        # non-zero status (see gqa_attention) before anything is written
        past = np.empty(bsz, np.int64)
        tot = np.empty(bsz, np.int64)
        pos = np.empty((bsz, s_len), np.int64)
        first = s_len == total
        t_max = 1
        for b in range(bsz):
            if seqlens[b] < 0 or seqlens[b] >= total:
                return 4, past, tot, pos, t_max
            tot[b] = seqlens[b] + 1
            past[b] = 0 if first else tot[b] - s_len
            if past[b] < 0 or past[b] + s_len > cap:
                return 1, past, tot, pos, t_max
            if copy_past and past[b] > past_rows:
                return 2, past, tot, pos, t_max
            t_max = max(t_max, tot[b])
        for b in range(bsz):
            for s in range(s_len):
                p = pos_ids[b, s] if has_pos else (s if first else past[b] + s)
                if rotary and (p < 0 or p >= n_pos):
                    return 3, past, tot, pos, t_max
                pos[b, s] = p
        return 0, past, tot, pos, t_max

    def _gqa_body(query, key, value, past_k, past_v, pk, pv, seqlens, total, cos, sin, pos_ids,
                  h, kvh, packed, copy_past, rotary, has_pos, interleaved, alpha, window,
                  out, chunks):  # pragma: no cover - compiled
        bsz, s_len, width = query.shape
        d = width // (h + 2 * kvh) if packed else width // h
        g = h // kvh
        r2 = cos.shape[1]
        status, past, tot, pos, t_max = _gqa_lengths(
            seqlens, total, bsz, s_len, pk.shape[2], copy_past, past_k.shape[2], pos_ids,
            has_pos, rotary, cos.shape[0])
        if status != 0:
            return status
        koff = h * d if packed else 0
        voff = (h + kvh) * d if packed else 0
        # 1. copy the cached rows (unless the past buffer is the present one),
        # rotate the new keys and append them and the values. Element loops,
        # not slice assignments: numba copies a slice through a temporary array
        # when it cannot prove the operands apart (measured: 15x slower).
        for b in range(bsz):
            for kh in range(kvh):
                _append_pair(key, value, past_k, past_v, pk, pv, cos, sin, pos, past, b, kh, d,
                             s_len, r2, koff, voff, copy_past, rotary, interleaved)
        # 2. causal (windowed) softmax(alpha * q.K^T) V per (batch row, KV head)
        pairs = bsz * kvh
        if s_len > 1:  # prompt rows: tiled, per (batch row, KV head, query tile)
            items = pairs * ((s_len + _fl.TQ - 1) // _fl.TQ + 1)
            for c in prange(chunks):
                qt, kt, vt, st, mt, dt, at = _fl.scratch(g, d)
                for it in range(c, items, chunks):
                    b, kh, q0b, q0, q1 = _fl.item(it, pairs, s_len, kvh, past)
                    _fl.attend_tile(query, pk, pv, _fl.NO_TABLE, cos, sin, pos, past, tot, b,
                                    kh, g, d, r2, rotary, interleaved, alpha, window, q0b, q0, q1,
                                    qt, kt, vt, st, mt, dt, at, out)
            return 0
        per = (pairs + chunks - 1) // chunks
        for c in prange(chunks):
            qg = np.empty((g, d), np.float32)
            acc = np.empty((g, d), np.float32)
            sc = np.empty((g, t_max), np.float32)
            mx = np.empty(g, np.float32)
            den = np.empty(g, np.float32)
            for bk in range(c * per, min(pairs, (c + 1) * per)):
                _attend_group(query, pk, pv, cos, sin, pos, past, tot, bk // kvh, bk % kvh, g,
                              d, s_len, r2, rotary, interleaved, alpha, window, qg, acc, sc, mx,
                              den, out)
        return 0

    _gqa = _jit(_gqa_body)
    _gqa_serial = njit(fastmath=True, nogil=True, cache=True)(_gqa_body)

    @njit(fastmath=True, nogil=True, cache=True)
    def _skip_rms_norm(x, skip, gamma, bias, has_bias, eps, y, inv, ssum):  # pragma: no cover
        rows, hidden = x.shape
        for r in range(rows):
            acc = np.float32(0.0)
            for j in range(hidden):
                v = x[r, j] + skip[r, j]
                if has_bias:
                    v += bias[j]
                ssum[r, j] = v
                acc += v * v
            iv = np.float32(1.0) / np.sqrt(acc / np.float32(hidden) + eps)
            inv[r] = iv
            for j in range(hidden):
                y[r, j] = ssum[r, j] * iv * gamma[j]


    @njit(fastmath=True, nogil=True, cache=True, error_model="numpy")
    def _rms_norm(x, gamma, eps, y, inv):  # pragma: no cover - compiled
        rows, hidden = x.shape
        for r in range(rows):
            acc = np.float32(0.0)
            for j in range(hidden):
                acc += x[r, j] * x[r, j]
            iv = np.float32(1.0) / np.sqrt(acc / np.float32(hidden) + eps)
            inv[r] = iv
            for j in range(hidden):
                y[r, j] = x[r, j] * iv * gamma[j]


#: below this many weights (M x N x K for the GEMM) a kernel runs on one thread:
#: waking the thread team costs more than it saves. Measured on SmolLM2 decode:
#: the 576x576 projections (331,776 weights) gain from two threads, the 192x576
#: ones do not.
PARALLEL_MIN_WEIGHTS = 1 << 18
#: below this many multiply-adds (batch x heads x rows x keys x head size)
#: attention runs on one thread
GQA_PARALLEL_MIN_WORK = 1 << 16


def gemv_q8(a, b8, scales, zps, out) -> None:
    """out[m, n] = sum over blocks of scale * (q . a - zp * sum(a)), one byte per
    q; ``a`` (M, n_blocks * block_size) float32, zero-padded past K."""
    if b8.size < PARALLEL_MIN_WEIGHTS:
        _gemv_q8_serial(a, b8, scales, zps, out)
        return
    _parallel(_gemv_q8, a, b8, scales, zps, out, max(1, min(b8.shape[0], 2 * num_threads())))


def gemm_q8(a, b8, scales, zps, out) -> None:
    """out = a @ dequant(B)^T: a (M, n_blocks * block_size) float32 (zero-padded
    past K), one byte per q in ``b8``. Used for M >= 2 (:func:`gemv_q8` is
    faster for one row). Parallel over column chunks when M x N x K is large."""
    work = a.shape[0] * b8.size
    if work < PARALLEL_MIN_WEIGHTS or b8.shape[0] < 4:
        _gemm_q8_serial(a, b8, scales, zps, out)
        return
    # two column chunks per thread: each chunk sets up four L1 buffers, and
    # more chunks measured slower on the 576-column projections
    chunks = max(1, min(b8.shape[0] // 4, 2 * num_threads()))
    _parallel(_gemm_q8, a, b8, scales, zps, out, chunks)


def gqa_attention(query, key, value, past_k, past_v, present_k, present_v, seqlens, total,
                  cos, sin, pos_ids, *, num_heads: int, kv_num_heads: int, copy_past: bool,
                  alpha: float, window: int, interleaved: bool) -> tuple[np.ndarray, int]:
    """Fused com.microsoft GroupQueryAttention (float32; no attention bias,
    softcap or sink): copy the cached rows when ``present_k`` is not the past
    buffer, rotate q/k (when ``cos`` is given), append k/v at rows ``P_b + s``,
    then causal (windowed) softmax attention. Semantics as in
    :mod:`._contrib_gqa`.

    Shapes: query (B, S, H*D) or packed (B, S, (H + 2*KVH)*D) with key/value
    ``None``; key/value (B, S, KVH*D); past_k/past_v and present_k/present_v
    (B, KVH, L, D); seqlens (B,) int; cos/sin (P, rot/2) float32 or ``None``;
    pos_ids (B, S) int64 or ``None``.

    Returns ``(output (B, S, H*D), status)``: status 0, or 1 when seqlens do
    not fit the present buffer, 2 when past_k is shorter than seqlens say, 3
    when a rotary position is outside cos, 4 when a seqlens entry is outside
    [0, total) (the caller raises; nothing was written then).
    """
    bsz, s_len, width = query.shape
    packed = key is None
    d = width // (num_heads + 2 * kv_num_heads) if packed else width // num_heads
    out = np.empty((bsz, s_len, num_heads * d), np.float32)
    rotary = cos is not None
    args = (query, query if packed else key, query if packed else value, past_k, past_v,
            present_k, present_v, seqlens, int(total), cos if rotary else _ONE,
            sin if rotary else _ONE, _NO_POS if pos_ids is None else pos_ids, num_heads,
            kv_num_heads, packed, copy_past, rotary, pos_ids is not None, interleaved,
            np.float32(alpha), int(window), out)
    work = bsz * num_heads * s_len * (int(seqlens.max(initial=0)) + 1) * d
    # the kernel splits over (batch row, KV head) pairs, prompt rows over
    # their query tiles too
    pairs = bsz * kv_num_heads * (_fl.n_tiles(s_len) if s_len > 1 else 1)
    if work < GQA_PARALLEL_MIN_WORK or pairs < 2:
        status = _gqa_serial(*args, 1)
    else:
        status = _parallel(_gqa, *args, min(pairs, 4 * num_threads()))
    return out, status


_ONE = np.ones((1, 1), np.float32)
_NO_POS = np.zeros((1, 1), np.int64)


def rms_norm(x, gamma, eps: float):
    """RMSNorm of the rows of x (M, H) float32 (C-contiguous) scaled by gamma
    (H,) float32: ``(y (M, H), inv_std_var (M,))``, float32 accumulation
    (onnxruntime's SimplifiedLayerNormalization with stash_type 1)."""
    rows, hidden = x.shape
    y = np.empty((rows, hidden), np.float32)
    inv = np.empty(rows, np.float32)
    _rms_norm(x, gamma, np.float32(eps), y, inv)
    return y, inv


def skip_rms_norm(x, skip, gamma, bias, eps: float):
    """com.microsoft SkipSimplifiedLayerNormalization in one pass (float32):
    x/skip (rows, hidden), gamma/bias (hidden,) float32 (bias may be None).
    Returns (y, inv_std_var (rows,), s = x + skip (+ bias))."""
    rows, hidden = x.shape
    y = np.empty((rows, hidden), np.float32)
    ssum = np.empty((rows, hidden), np.float32)
    inv = np.empty(rows, np.float32)
    _skip_rms_norm(x, skip, gamma, gamma if bias is None else bias, bias is not None,
                   np.float32(eps), y, inv, ssum)
    return y, inv, ssum


def num_threads() -> int:
    """Threads the parallel kernels use (1 without numba)."""
    if not HAVE_NUMBA:
        return 1
    return _THREADS if _THREADS is not None else numba.config.NUMBA_NUM_THREADS


def set_num_threads(n: int | None) -> int:
    """Set the thread count of the parallel kernels for every calling thread
    (numba's own setting is per thread), capped at the cores numba may use;
    ``None`` restores the default. Returns the count in effect."""
    global _THREADS
    if not HAVE_NUMBA:
        return 1
    _THREADS = None if n is None else max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    return num_threads()


def _parallel(fn, *args):
    """Run a parallel kernel: one launch at a time, with the configured threads."""
    with _LOCK:
        # numba's setting is per calling thread; changing it costs, so only on change
        if _THREADS is not None and numba.get_num_threads() != _THREADS:
            numba.set_num_threads(_THREADS)
            _threads.numba_threads_set()
        return fn(*args)


def warm_up() -> None:
    """Compile (or load from the on-disk cache) every kernel once, so the first
    decode step does not pay the JIT."""
    global _WARM
    if _WARM or not HAVE_NUMBA:
        return
    f32 = np.float32
    b8 = np.zeros((2, 1, 16), np.uint8)
    sc = np.ones((2, 1), f32)
    zp = np.zeros((2, 1), f32)
    out = np.zeros((1, 2), f32)
    a1 = np.zeros((1, 16), f32)
    _gemv_q8(a1, b8, sc, zp, out, 1)
    _gemv_q8_serial(a1, b8, sc, zp, out)
    a5 = np.zeros((5, 16), f32)
    out5 = np.zeros((5, 2), f32)
    _gemm_q8(a5, b8, sc, zp, out5, 1)
    _gemm_q8_serial(a5, b8, sc, zp, out5)
    q = np.zeros((1, 1, 16), f32)
    cache = np.zeros((1, 1, 2, 4), f32)
    cs = np.ones((2, 2), f32)
    r = np.ones((1, 4), f32)
    skip_rms_norm(r, r, r[0], None, 1e-5)
    for fn in (_gqa, _gqa_serial):  # packed QKV, rotary, shared past/present buffer
        fn(q, q, q, cache, cache, cache, cache, np.zeros(1, np.int64), 1, cs, cs, _NO_POS, 2, 1,
           True, False, True, False, False, f32(1.0), 0, np.zeros((1, 1, 8), f32), 1)
    _WARM = True

from . import _flash as _fl  # noqa: E402 (it imports this module)
