"""The float32-activation decoder block (:func:`._block_kernels.block_f32`)
on a block-paged KV cache (:mod:`.paged`): the same projections, norms and
SiLU gate, attention through the block table (:mod:`._paged_kernels`).
:class:`._fusion.DecoderBlock` runs it (:func:`f32_block_runner`) when its
past inputs are a paged cache's pools; the int8 blocks get the paged path
from the decoder stack (or, unstacked, from their original kernels)."""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

from typing import Any, Callable

import numpy as np

from . import _contrib_numba as _nb
from . import _flash as _fl
from . import _paged_kernels as _pk
from ._half import kernel_view
from .paged import paged_lengths, table_of

__all__ = ["f32_block_runner"]

if _pk.HAVE_PAGED:
    from numba import njit

    from . import _block_kernels as _bk

    @njit(fastmath=True, nogil=True, cache=True)
    def _block_f32_paged(h, res, qw, qd, qz, kw, kd, kz, vw, vd, vz, packed, kpool, vpool, bt,
                         seqlens, total, cos, sin, pos, heads, kv_heads, rotary, interleaved,
                         alpha, window, gqa_chunks, ow, od, oz, g2, eps2, gw, gd, gz, uw, ud, uz,
                         dw, dd, dz, g3, eps3, chunks):  # pragma: no cover - compiled
        # _bk._block_f32 with the attention of _pk._gqa_paged
        bsz, s_len, hidden = h.shape
        m = bsz * s_len
        x = h.reshape(m, hidden)
        q = _bk._mm_f32(x, qw, qd, qz, chunks)
        nq = q.shape[1]
        if packed:
            k = q
            v = q
            d = nq // (heads + 2 * kv_heads)
        else:
            k = _bk._mm_f32(x, kw, kd, kz, chunks)
            v = _bk._mm_f32(x, vw, vd, vz, chunks)
            d = nq // heads
        q3 = q.reshape(bsz, s_len, nq)
        k3 = k.reshape(bsz, s_len, k.shape[1])
        v3 = v.reshape(bsz, s_len, v.shape[1])
        attn = np.empty((bsz, s_len, heads * d), np.float32)
        if gqa_chunks > 1:
            status = _pk._gqa_paged(q3, k3, v3, kpool, vpool, bt, seqlens, total, cos, sin,
                                    pos, heads, kv_heads, packed, rotary, False, interleaved,
                                    alpha, window, attn, gqa_chunks)
        else:
            status = _pk._gqa_paged_serial(q3, k3, v3, kpool, vpool, bt, seqlens, total, cos,
                                           sin, pos, heads, kv_heads, packed, rotary, False,
                                           interleaved, alpha, window, attn, 1)
        if status != 0:  # nothing was written
            return status, h, h
        o = _bk._mm_f32(attn.reshape(m, heads * d), ow, od, oz, chunks)
        res2 = np.empty((m, hidden), np.float32)
        y2 = np.empty((m, hidden), np.float32)
        inv = np.empty(m, np.float32)
        _nb._skip_rms_norm(o, res.reshape(m, hidden), g2, g2, False, eps2, y2, inv, res2)
        gate = _bk._mm_f32(y2, gw, gd, gz, chunks)
        up = _bk._mm_f32(y2, uw, ud, uz, chunks)
        _nb._silu_mul(gate, up, 0, m)
        down = _bk._mm_f32(gate, dw, dd, dz, chunks)
        res3 = np.empty((m, hidden), np.float32)
        y3 = np.empty((m, hidden), np.float32)
        _nb._skip_rms_norm(down, res2, g3, g3, False, eps3, y3, inv, res3)
        return 0, y3.reshape(bsz, s_len, hidden), res3.reshape(bsz, s_len, hidden)


def f32_block_runner(st: dict, fallback: Callable) -> Callable | None:
    """A float32 :class:`._fusion.DecoderBlock`'s paged path: ``run(h,
    residual, past_key, past_value, seqlens_k, total_sequence_length,
    cos_cache, sin_cache)`` with the pools as past (outputs ``(h3, r3, pools)``),
    ``fallback`` (the original kernels, which name any problem) where the
    values leave the compiled path; None without numba."""
    if not _pk.HAVE_PAGED:
        return None
    (qw, qd, qz, kw, kd, kz, vw, vd, vz, ow, od, oz, gw, gd, gz, uw, ud, uz, dw, dd,
     dz) = st["mats"]
    packed, width, heads, kv_heads = st["packed"], st["width"], st["heads"], st["kv_heads"]
    rotary, window, interleaved = st["rotary"], st["window"], st["interleaved"]
    g2, g3, eps2, eps3, scale = st["g2"], st["g3"], st["eps2"], st["eps3"], st["scale"]
    d = width // (heads + 2 * kv_heads) if packed else width // heads
    one, no_pos = _nb._ONE, _nb._NO_POS

    def run(h: Any, residual: Any, past_key: Any, past_value: Any, seqlens_k: Any,
            total_sequence_length: Any, cos_cache: Any = None, sin_cache: Any = None) -> tuple:
        bsz, s = h.shape[0], h.shape[1]
        bt = table_of((past_key, past_value), bsz)
        ready = None if bt is None else paged_lengths(
            seqlens_k, total_sequence_length, bsz, s, cos_cache, sin_cache, rotary, kv_heads,
            d, scale)
        if ready is None:
            return fallback(h, residual, past_key, past_value, seqlens_k,
                            total_sequence_length, cos_cache, sin_cache)
        seqlens, total, alpha = ready[3], ready[4], ready[5]
        threads = _nb.num_threads()
        work = bsz * heads * s * (int(seqlens.max(initial=0)) + 1) * d
        units = bsz * kv_heads * (_fl.n_tiles(s) if s > 1 else 1)  # prompt rows: query tiles
        gqa_chunks = (min(units, 4 * threads)
                      if work >= _nb.GQA_PARALLEL_MIN_WORK and units > 1 else 1)
        status, y, r = _nb._parallel(
            _block_f32_paged, h, residual, qw, qd, qz, kw, kd, kz, vw, vd, vz, packed,
            kernel_view(past_key), kernel_view(past_value), bt, seqlens, total, cos_cache if rotary else one,
            sin_cache if rotary else one, no_pos, heads, kv_heads, rotary, interleaved,
            np.float32(alpha), window, gqa_chunks, ow, od, oz, g2, eps2, gw, gd, gz, uw, ud,
            uz, dw, dd, dz, g3, eps3, 2 * threads)
        if status:  # nothing was written: the original kernels name the problem
            return fallback(h, residual, past_key, past_value, seqlens_k,
                            total_sequence_length, cos_cache, sin_cache)
        return y, r, past_key, past_value

    return run
