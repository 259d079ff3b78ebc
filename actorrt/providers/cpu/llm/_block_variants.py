"""Compiled int8 decoder blocks of the architectures the plain block
(:mod:`._block_kernels`) does not cover: gemma3 (per-head q/k RMS norms,
the post-attention and post-FFN "sandwich" norms, a GELU-tanh gated MLP,
sliding-window layers) and qwen2 (q/k/v biases), and projections in 16-value
blocks (Q2_K, Q3_K, Q6_K: :mod:`._contrib_int8_b16`) in any block.

One parallel region per block, as :func:`._block_kernels.region_block`: every
thread runs the stage program (:func:`_program_v`) and claims chunks of each
stage from atomic counters. The stages are the plain block's, plus:

* 1b. (biases or q/k norms) per ``ROW_CHUNK`` rows: ``+ bias`` on q, k, v (or on the
  packed qkv), then each q and k head's RMS norm with its ``(head_dim,)``
  gamma (ONNX SimplifiedLayerNormalization over the last axis);
* 5 starts with the post-attention norm of ``o`` (when present), 9 with the
  post-FFN norm of ``down``, both before the residual add;
* 7 computes ``Gelu_tanh(gate) * up`` (ONNX Gelu ``approximate="tanh"``,
  Mul) instead of SiLU;
* 11 (prompt rows, ``S > 1``): causal attention tiled per (batch row, KV
  head, query tile) (:mod:`._flash`, as the plain block's stage 10): both
  threads share even one KV head's prompt, and the scratch stays a few tiles
  a thread whatever the prompt length. Stage 2 then only appends the new
  keys and values; decode rows keep stage 2's attention.

A projection's weights are ``(w, d, dz)`` of :func:`._contrib_int8.pack_i8`
(2-D ``d``) or of :func:`._contrib_int8_b16.pack_b16` with ``d`` / ``dz``
viewed as (N4, n_blocks32, 2): the 3-D view picks the block-16 kernel
(:func:`_cols_any`). Public: ``region_block_v`` (exists when
``_i8.HAVE_INT8_DOT``).
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _block_kernels as _bk
from . import _contrib_int8 as _i8
from . import _contrib_numba as _nb

#: stage counters of one block (the plain block's 0-9 plus 10: biases / q-k norms)
STAGES = 12

if _i8.HAVE_INT8_DOT:
    from numba import njit, prange

    from . import _contrib_int8_b16 as _b16

    _claim, _done, _wait, _wait_warm = _bk._claim, _bk._done, _bk._wait, _bk._wait_warm

    @njit(fastmath=True, nogil=True, cache=True)
    def _cols_any(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, lo, hi, pf):  # pragma: no cover
        # _i8._cols for the block-32 layout (2-D d), _b16._cols16 for the
        # block-16 one (3-D d): its per-half activation sums computed here
        if d.ndim == 3:
            xs16 = np.empty((xq.shape[0], 2 * sx.shape[1]), np.float32)
            _b16._sub_sums(xq, sx, xs16)
            _b16._cols16(xq, sx, xs16, w, d, dz, out, lo, hi)
        else:
            _i8._cols(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, lo, hi, pf)

    @njit(fastmath=True, nogil=True, cache=True)
    def _project_v(stage, ctr, xb, mats, outs, cw, parts, pf):  # pragma: no cover - compiled
        # _block_kernels._project over either layout (see _cols_any)
        xq, sx, xsum, sx_t, xs_t = xb
        n0, n1, n2 = mats[0][0].shape[0], mats[1][0].shape[0], mats[2][0].shape[0]
        w0 = max(cw, ((n0 + parts - 1) // parts + 3) // 4 * 4)
        w1 = max(cw, ((n1 + parts - 1) // parts + 3) // 4 * 4)
        w2 = max(cw, ((n2 + parts - 1) // parts + 3) // 4 * 4)
        c0 = (n0 + w0 - 1) // w0
        c1 = (n1 + w1 - 1) // w1
        total = c0 + c1 + (n2 + w2 - 1) // w2
        while True:
            c = _claim(ctr, stage)
            if c >= total:
                break
            if c < c0:
                _cols_any(xq, sx, xsum, sx_t, xs_t, mats[0][0], mats[0][1], mats[0][2], outs[0],
                          c * w0, min(n0, (c + 1) * w0), pf)
            elif c < c0 + c1:
                c -= c0
                _cols_any(xq, sx, xsum, sx_t, xs_t, mats[1][0], mats[1][1], mats[1][2], outs[1],
                          c * w1, min(n1, (c + 1) * w1), pf)
            else:
                c -= c0 + c1
                _cols_any(xq, sx, xsum, sx_t, xs_t, mats[2][0], mats[2][1], mats[2][2], outs[2],
                          c * w2, min(n2, (c + 1) * w2), pf)
            _done(ctr, stage)
        _wait(ctr, stage, total)

    @njit(fastmath=True, nogil=True, cache=True, error_model="numpy")
    def _head_norms(x, r0, r1, off, n_heads, d, gamma, eps):  # pragma: no cover - compiled
        # rows r0..r1 of x: RMS norm of each of n_heads heads of d values from
        # column off, times gamma (d,) (SimplifiedLayerNormalization, float32)
        for r in range(r0, r1):
            for hh in range(n_heads):
                base = off + hh * d
                acc = np.float32(0.0)
                for j in range(d):
                    v = x[r, base + j]
                    acc += v * v
                iv = np.float32(1.0) / np.sqrt(acc / np.float32(d) + eps)
                for j in range(d):
                    x[r, base + j] = x[r, base + j] * iv * gamma[j]

    @njit(fastmath=True, nogil=True, cache=True)
    def _gelu_tanh_mul(gate, up, r0, r1):  # pragma: no cover - compiled
        # rows r0..r1 of gate <- Gelu_tanh(gate) * up (ONNX Gelu approximate=tanh, Mul)
        c = np.float32(0.7978845608028654)  # sqrt(2 / pi)
        for r in range(r0, r1):
            g = gate[r]
            u = up[r]
            for j in range(g.shape[0]):
                v = g[j]
                t = np.tanh(c * (v * (np.float32(1.0) + np.float32(0.044715) * v * v)))
                g[j] = np.float32(0.5) * v * (np.float32(1.0) + t) * u[j]

    @njit(fastmath=True, nogil=True, cache=True)
    def _program_v(x, res, qw, qd, qz, kw, kd, kz, vw, vd, vz, oq, ok, ov, packed, past_k,
                   past_v, pk, pv, cos, sin, pos, past, tot, t_max, heads, kv_heads, copy_past,
                   rotary, interleaved, alpha, window, ow, od, oz, g2, eps2, gw, gd, gz, uw, ud,
                   uz, dw, dd, dz, g3, eps3, hq, hs, hx, ht, hu, aq, as_, ax, at, au, yq, ys, yx,
                   yt, yu, fq, fs, fx, ft, fu, attn, o, y2, res2, gate, up, down, y3, res3, inv,
                   ctr, cw, nw, nd, parts, pf, pa, spans, bq, bk, bv, has_bias, qn, kn, eps_qk,
                   has_qk_norm, pn2, eps_p2, has_pn2, pn3, eps_p3, has_pn3,
                   gelu):  # pragma: no cover - compiled
        # _block_kernels._program with the stages of the module docstring
        bsz, s_len = attn.shape[0], attn.shape[1]
        m = x.shape[0]
        none = (nw, nd, nd)
        row_chunks = (m + _bk.ROW_CHUNK - 1) // _bk.ROW_CHUNK
        # 0. quantize h; 1. q, k, v projections (k and v empty when packed)
        _bk._quantize_stage(0, ctr, x, hq, hs, hx, ht, hu, row_chunks, qw, kw, pf)
        _project_v(1, ctr, (hq, hs, hx, ht, hu), ((qw, qd, qz), (kw, kd, kz), (vw, vd, vz)),
                   (oq, ok, ov), cw, parts, pf)
        nq = oq.shape[1]
        if packed:
            d = nq // (heads + 2 * kv_heads)
        else:
            d = nq // heads
        # 1b. biases, q/k head norms
        if has_bias or has_qk_norm:
            while True:
                c = _claim(ctr, 10)
                if c >= row_chunks:
                    break
                r0, r1 = c * _bk.ROW_CHUNK, min(m, (c + 1) * _bk.ROW_CHUNK)
                if has_bias:
                    for r in range(r0, r1):
                        for j in range(nq):
                            oq[r, j] += bq[j]
                        if not packed:
                            for j in range(ok.shape[1]):
                                ok[r, j] += bk[j]
                            for j in range(ov.shape[1]):
                                ov[r, j] += bv[j]
                if has_qk_norm:
                    _head_norms(oq, r0, r1, 0, heads, d, qn, eps_qk)
                    if packed:
                        _head_norms(oq, r0, r1, heads * d, kv_heads, d, kn, eps_qk)
                    else:
                        _head_norms(ok, r0, r1, 0, kv_heads, d, kn, eps_qk)
                _done(ctr, 10)
            _wait(ctr, 10, row_chunks)
        query = oq.reshape(bsz, s_len, nq)
        if packed:
            key = query
            value = query
            koff = heads * d
            voff = (heads + kv_heads) * d
        else:
            key = ok.reshape(bsz, s_len, ok.shape[1])
            value = ov.reshape(bsz, s_len, ov.shape[1])
            koff = 0
            voff = 0
        # 2. attention per (batch row, KV head) (or span of its cached rows)
        g = heads // kv_heads
        r2 = cos.shape[1]
        pairs = bsz * kv_heads
        units = pairs * spans
        qg = np.empty((g, d), np.float32)
        acc = np.empty((g, d), np.float32)
        sc = np.empty((g, t_max), np.float32)
        mx = np.empty(g, np.float32)
        den = np.empty(g, np.float32)
        while True:
            c = _claim(ctr, 2)
            if c >= units:
                break
            pr = c // spans
            k = c % spans
            b = pr // kv_heads
            kh = pr % kv_heads
            if k == spans - 1:
                _nb._append_pair(key, value, past_k, past_v, pk, pv, cos, sin, pos, past, b,
                                 kh, d, s_len, r2, koff, voff, copy_past, rotary, interleaved)
            if s_len > 1:  # prompt rows: attended in stage 11, tiled (_flash)
                pass
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
                if a1 > a0:
                    _nb._attend_span(query, pk, pv, cos, sin, pos, b, kh, g, d, r2, rotary,
                                     interleaved, alpha, a0, a1, qg, sc, mx, den, part)
                else:  # an empty span weighs nothing in the merge
                    part[:, :] = 0.0
                    part[:, d] = np.float32(-np.inf)
            _done(ctr, 2)
        _wait_warm(ctr, 2, units, ow, nw, pf)
        if s_len > 1:  # 2b. per (batch row, KV head, query tile), the new keys appended
            no_table = np.zeros((0, 1), np.int32)  # contiguous: a pool block is a batch row
            items = _bk.prompt_attention(11, ctr, query, pk, pv, no_table, cos, sin, pos, past,
                                         tot, pairs, kv_heads, g, d, r2, rotary, interleaved,
                                         alpha, window, attn)
            _wait_warm(ctr, 11, items, ow, nw, pf)
        # 3. (merge the spans,) quantize the attention output; 4. o projection
        a2 = attn.reshape(m, attn.shape[2])
        while True:
            c = _claim(ctr, 3)
            if c >= row_chunks:
                break
            r0, r1 = c * _bk.ROW_CHUNK, min(m, (c + 1) * _bk.ROW_CHUNK)
            if spans > 1:
                for b in range(r0, r1):
                    for kh in range(kv_heads):
                        pr = b * kv_heads + kh
                        _nb._merge_spans(pa[pr * spans:(pr + 1) * spans], b, kh, g, d, attn)
            _i8._quantize_into(a2, aq, as_, ax, at, au, r0, r1)
            _done(ctr, 3)
        _wait_warm(ctr, 3, row_chunks, ow, nw, pf)
        _project_v(4, ctr, (aq, as_, ax, at, au), ((ow, od, oz), none, none), (o, o, o), cw,
                   parts, pf)
        # 5. (post-attention norm,) residual add + RMS norm, quantize
        while True:
            c = _claim(ctr, 5)
            if c >= row_chunks:
                break
            r0, r1 = c * _bk.ROW_CHUNK, min(m, (c + 1) * _bk.ROW_CHUNK)
            if has_pn2:
                _nb._rms_norm(o[r0:r1], pn2, eps_p2, o[r0:r1], inv[r0:r1])
            _nb._skip_rms_norm(o[r0:r1], res[r0:r1], g2, g2, False, eps2, y2[r0:r1],
                               inv[r0:r1], res2[r0:r1])
            _i8._quantize_into(y2, yq, ys, yx, yt, yu, r0, r1)
            _done(ctr, 5)
        _wait_warm(ctr, 5, row_chunks, gw, uw, pf)
        # 6. gate and up projections; 7. the gated activation, quantize
        _project_v(6, ctr, (yq, ys, yx, yt, yu), ((gw, gd, gz), (uw, ud, uz), none),
                   (gate, up, up), cw, parts, pf)
        while True:
            c = _claim(ctr, 7)
            if c >= row_chunks:
                break
            r0, r1 = c * _bk.ROW_CHUNK, min(m, (c + 1) * _bk.ROW_CHUNK)
            if gelu:
                _gelu_tanh_mul(gate, up, r0, r1)
            else:
                _nb._silu_mul(gate, up, r0, r1)
            _i8._quantize_into(gate, fq, fs, fx, ft, fu, r0, r1)
            _done(ctr, 7)
        _wait_warm(ctr, 7, row_chunks, dw, nw, pf)
        # 8. down projection; 9. (post-FFN norm,) residual add + RMS norm
        _project_v(8, ctr, (fq, fs, fx, ft, fu), ((dw, dd, dz), none, none),
                   (down, down, down), cw, parts, pf)
        while True:
            c = _claim(ctr, 9)
            if c >= row_chunks:
                break
            r0, r1 = c * _bk.ROW_CHUNK, min(m, (c + 1) * _bk.ROW_CHUNK)
            if has_pn3:
                _nb._rms_norm(down[r0:r1], pn3, eps_p3, down[r0:r1], inv[r0:r1])
            _nb._skip_rms_norm(down[r0:r1], res2[r0:r1], g3, g3, False, eps3, y3[r0:r1],
                               inv[r0:r1], res3[r0:r1])
            _done(ctr, 9)
        _wait(ctr, 9, row_chunks)

    @njit(parallel=True, fastmath=True, nogil=True, cache=True)
    def _region_v(x, res, qw, qd, qz, kw, kd, kz, vw, vd, vz, oq, ok, ov, packed, past_k,
                  past_v, pk, pv, cos, sin, pos, past, tot, t_max, heads, kv_heads, copy_past,
                  rotary, interleaved, alpha, window, ow, od, oz, g2, eps2, gw, gd, gz, uw, ud,
                  uz, dw, dd, dz, g3, eps3, hq, hs, hx, ht, hu, aq, as_, ax, at, au, yq, ys, yx,
                  yt, yu, fq, fs, fx, ft, fu, attn, o, y2, res2, gate, up, down, y3, res3, inv,
                  ctr, cw, nw, nd, threads, parts, pf, pa, spans, bq, bk, bv, has_bias, qn, kn,
                  eps_qk, has_qk_norm, pn2, eps_p2, has_pn2, pn3, eps_p3, has_pn3,
                  gelu):  # pragma: no cover - compiled
        for _ in prange(threads):
            _program_v(x, res, qw, qd, qz, kw, kd, kz, vw, vd, vz, oq, ok, ov, packed, past_k,
                       past_v, pk, pv, cos, sin, pos, past, tot, t_max, heads, kv_heads,
                       copy_past, rotary, interleaved, alpha, window, ow, od, oz, g2, eps2, gw,
                       gd, gz, uw, ud, uz, dw, dd, dz, g3, eps3, hq, hs, hx, ht, hu, aq, as_,
                       ax, at, au, yq, ys, yx, yt, yu, fq, fs, fx, ft, fu, attn, o, y2, res2,
                       gate, up, down, y3, res3, inv, ctr, cw, nw, nd, parts, pf, pa, spans,
                       bq, bk, bv, has_bias, qn, kn, eps_qk, has_qk_norm, pn2, eps_p2, has_pn2,
                       pn3, eps_p3, has_pn3, gelu)

    @njit(nogil=True, cache=True)
    def _region_block_v(h, res, qw, qd, qz, kw, kd, kz, vw, vd, vz, packed, past_k, past_v, pk,
                        pv, seqlens, total, cos, sin, pos_ids, heads, kv_heads, copy_past,
                        rotary, interleaved, alpha, window, ow, od, oz, g2, eps2, gw, gd, gz, uw,
                        ud, uz, dw, dd, dz, g3, eps3, threads, cw, parts, pf, span_units,
                        span_rows, bq, bk, bv, has_bias, qn, kn, eps_qk, has_qk_norm, pn2,
                        eps_p2, has_pn2, pn3, eps_p3, has_pn3,
                        gelu):  # pragma: no cover - compiled
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
        nw = np.empty((0, 32), np.int8)
        nd = np.empty((0, 1), np.float32)
        (oq, ok, ov, attn, o, y2, res2, gate, up, down, inv, hq, hs, hx, ht, hu, aq, as_, ax,
         at, au, yq, ys, yx, yt, yu, fq, fs, fx, ft, fu) = _bk._scratch(
            bsz, s_len, hidden, nq, kw.shape[0], vw.shape[0], heads * d, nf)
        y3 = np.empty((m, hidden), np.float32)
        res3 = np.empty((m, hidden), np.float32)
        ctr = np.zeros(2 * STAGES, np.int64)
        spans, pa = _bk._spans(bsz, kv_heads, s_len, t_max, copy_past, heads // kv_heads, d,
                               span_units, span_rows)
        _region_v(h.reshape(m, hidden), res.reshape(m, hidden), qw, qd, qz, kw, kd, kz, vw, vd,
                  vz, oq, ok, ov, packed, past_k, past_v, pk, pv, cos, sin, pos, past, tot,
                  t_max, heads, kv_heads, copy_past, rotary, interleaved, alpha, window, ow, od,
                  oz, g2, eps2, gw, gd, gz, uw, ud, uz, dw, dd, dz, g3, eps3, hq, hs, hx, ht, hu,
                  aq, as_, ax, at, au, yq, ys, yx, yt, yu, fq, fs, fx, ft, fu, attn, o, y2,
                  res2, gate, up, down, y3, res3, inv, ctr, cw, nw, nd, threads, parts, pf, pa,
                  spans, bq, bk, bv, has_bias, qn, kn, eps_qk, has_qk_norm, pn2, eps_p2,
                  has_pn2, pn3, eps_p3, has_pn3, gelu)
        return 0, y3.reshape(bsz, s_len, hidden), res3.reshape(bsz, s_len, hidden), spans

    region_block_v = _region_block_v
