"""Multi-row attention ``softmax(q @ k * scale + mask) @ v`` split by batch
entry (batch x head) over the compiled partner threads, one hand-off a call.

:func:`.attention.ScaledDotAttention` at more than one intra-op thread split
each of its three passes (the scores' batched product, the softmax rows, the
values' batched product) over the partners: three hand-offs, and each
thread's second pass reading scores the other thread wrote. For a prompt's
attention of a few heads (4 heads x 64 x 64 x 64) that made two threads
slower than one (50 vs 42 µs here). Here every partner and the caller claim
whole entries and run the three passes of an entry back to back on one core
(:func:`._partner.run_items`: one post, no Python between the passes), so
the scores an entry's softmax and second product read are the ones the same
core just wrote.

Each entry runs exactly :func:`._sgemm_numba.bmm_entries` for its scores and
values and :func:`._softmax_numba.rows_range` for its rows, as the one-thread
path does: the result equals the three-pass path bit for bit whichever
thread runs an entry.

:func:`attend_entries` returns False (nothing done) where it does not apply:
no partner threads (:data:`._partner.AVAILABLE`), the compiled GEMM off, or
operands the three-pass path would not give to the compiled kernels
(the caller checks those: :func:`.attention._partner_split`).
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _partner

__all__ = ["HAVE_SPLIT", "attend_entries", "MIN_ENTRIES"]

#: fewer entries than this stay on the three-pass path (its passes split rows)
MIN_ENTRIES = 2

HAVE_SPLIT = bool(_partner.AVAILABLE)

if HAVE_SPLIT:
    from numba import carray, cfunc, njit, types as nbt
    from numba.extending import intrinsic
    from numpy.lib.stride_tricks import as_strided

    from . import _sgemm_numba as _sg
    from . import _softmax_numba as _sm

    _f32p, _i64p = _partner.f32_ptr, _partner.i64_ptr

    @intrinsic
    def _f32_from_bits(typingctx, bits):
        """The float32 whose bit pattern is the low 32 bits of int64 ``bits``."""
        def codegen(context, builder, sig, args):
            from llvmlite import ir
            return builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())
        return nbt.float32(nbt.int64), codegen

    # params: q, k, v, s, mask, out (address each), k strides (3, elements),
    # k extent, v strides (3), v extent, bt, m, d, t, dv, mrows, masked,
    # scale bits, the two products' row blocks
    _N = 24

    @njit(nogil=True, cache=True, inline="always")
    def _strided(addr, extent, shape, s0, s1, s2):  # pragma: no cover - compiled
        return as_strided(carray(_f32p(addr), (extent,)), shape=shape,
                          strides=(s0 * 4, s1 * 4, s2 * 4))

    @cfunc(_partner.ITEMS_SIGNATURE, nogil=True, cache=True)
    def _entries(params, i0, i1):  # pragma: no cover - compiled
        p = carray(_i64p(params), (_N,))
        bt, m, d, t, dv = p[14], p[15], p[16], p[17], p[18]
        mrows = p[19]
        q3 = carray(_f32p(p[0]), (bt, m, d))
        k3 = _strided(p[1], p[9], (bt, d, t), p[6], p[7], p[8])
        v3 = _strided(p[2], p[13], (bt, t, dv), p[10], p[11], p[12])
        s3 = carray(_f32p(p[3]), (bt, m, t))
        m2 = carray(_f32p(p[4]), (mrows, t if p[20] else 1))
        out3 = carray(_f32p(p[5]), (bt, m, dv))
        scale = _f32_from_bits(p[21])
        # the range's three passes in turn (one packing buffer a product a range)
        _sg.bmm_entries(q3, k3, s3, p[22], i0, i1)
        _sm.rows_range(s3.reshape(bt * m, t), scale, m2, mrows, p[20] != 0, i0 * m, i1 * m)
        _sg.bmm_entries(s3, v3, out3, p[23], i0, i1)

    _ADDR = _entries.address


def _elements(x: np.ndarray):
    """``x``'s strides in elements and the extent of its memory (elements from
    its first), or None for negative or partial-element strides."""
    st = x.strides
    if any(s < 0 or s % 4 for s in st):
        return None
    es = tuple(s // 4 for s in st)
    return es, 1 + sum((n - 1) * s for n, s in zip(x.shape, es))


def attend_entries(q: np.ndarray, k: np.ndarray, v: np.ndarray, m2: np.ndarray | None,
                   mrows: int, scale: float, threads: int) -> np.ndarray | None:
    """``softmax(q @ k * scale + mask) @ v`` with the entries over the caller
    and its partners.

    Args:
        q: float32 ``(..., M, D)`` (made C-contiguous).
        k: float32 ``(..., D, T)`` of ``q``'s batch shape, any non-negative
            strides (a transposed view is read as it is).
        v: float32 ``(..., T, Dv)`` likewise.
        m2: the additive mask as rows ``(mrows, T)`` C-contiguous float32,
            score row ``r`` (over every entry's rows in order) adding row
            ``r % mrows`` (:func:`._softmax_numba.mask_rows`); None: no mask.
        mrows: ``m2``'s row count (ignored without a mask).
        scale: multiplies the scores before the mask.
        threads: intra-op threads (at least 2).

    Returns:
        float32 ``(..., M, Dv)`` (C-contiguous, new), or None when the split
        does not apply (module docstring; fewer than :data:`MIN_ENTRIES`
        entries, strides it cannot read).
    """
    if not HAVE_SPLIT or not _sg.ENABLED or threads < 2:
        return None
    lead = q.shape[:-2]
    m, d = q.shape[-2:]
    t, dv = k.shape[-1], v.shape[-1]
    bt = q.size // (m * d) if m * d else 0
    if bt < MIN_ENTRIES or k.shape[-2] != d or v.shape[-2] != t or not t or not dv:
        return None
    k3 = k.reshape(bt, d, t)  # views for the usual operands (a copy otherwise)
    v3 = v.reshape(bt, t, dv)
    ke, ve = _elements(k3), _elements(v3)
    if ke is None or ve is None:
        return None
    team = _partner.team(threads)
    if team is None:
        return None
    q3 = np.ascontiguousarray(q).reshape(bt, m, d)
    s3 = np.empty((bt, m, t), np.float32)
    out = np.empty(lead + (m, dv), np.float32)
    masked = m2 is not None
    if not masked:
        m2, mrows = _ZERO, 1
    params = np.array(
        [q3.ctypes.data, k3.ctypes.data, v3.ctypes.data, s3.ctypes.data, m2.ctypes.data,
         out.ctypes.data, *ke[0], ke[1], *ve[0], ve[1], bt, m, d, t, dv, mrows, int(masked),
         int(np.float32(scale).view(np.int32)) & 0xFFFFFFFF,
         _sg.row_block(d), _sg.row_block(t)], np.int64)
    # every operand stays referenced until run_items returns (the partners read it)
    _partner.run_items(team, _ADDR, params.ctypes.data, bt, min(bt, threads))
    return out


_ZERO = np.zeros((1, 1), np.float32)
