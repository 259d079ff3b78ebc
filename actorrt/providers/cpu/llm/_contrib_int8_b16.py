"""MatMulNBits with int8 activations for weights in 16-value blocks
(``block_size=16``: GGUF's Q2_K, Q3_K and Q6_K, whose sub-block scales cover
16 values).

A is quantized exactly as for block-32 weights (:mod:`._contrib_int8`: one
symmetric int8 scale ``sx`` per 32 values of a row, the block's values
stored even values first, then odd); a 32-value activation block then meets
two weight sub-blocks, ``A`` (values 0-15) and ``B`` (values 16-31), each
with its own scale and zero point, and contributes

    sx[m, b] * (scale[n, 2b] * isum_A + scale[n, 2b+1] * isum_B)
        - scale[n, 2b] * zp[n, 2b] * xsum_A[m, b] - (the same for B)

with ``isum_A = sum over A of q * xq`` in integers and ``xsum_A = sx[m, b] *
sum over A of xq`` (:func:`sub_block_sums`). Exact: the same int8
activations and integer products as a block-32 weight, only the float
scaling is per sub-block.

The kernel is :mod:`._contrib_int8`'s rows x four-columns tile with another
reduction: the 32 bytes of an activation block hold values 0, 2, ..., 30
then 1, 3, ..., 31, so ``vpmaddwd``'s eight int32 lanes are (even values of
A, even of B, odd of A, odd of B) two lanes each; one pairwise add gives
each column's A and B sums of even and of odd values, a second (across the
two column pairs) each column's A and B sums, which one <8 x float> FMA
scales by the group's eight sub-block scales.

Layouts (:func:`pack_b16`; C-contiguous, float32 scales only):
    weights: two consecutive 16-value blocks as one 32-value block of
    :func:`._contrib_int8.pack_i8` (4-bit: the MatMulNBits bytes of the two
    blocks, which are exactly a 32-value block's; 8-bit: ``q - 128`` even
    values first), columns interleaved by four; N padded with zero columns
    to a multiple of 4 (the kernels write only the first N).
    ``d`` / ``dz``: (N4, n_blocks32 * 2) float32 sub-block scales and scale *
    zero point (8-bit: scale * (zero point - 128)) in the interleaved column
    order: per group of four columns and 32-value block, (c0 A, c0 B, c1 A,
    c1 B, c2 A, c2 B, c3 A, c3 B). An odd number of 16-value blocks is
    padded with a zero block.
    ``xs16``: (M, n_blocks32 * 2) float32 ``sx * sum(xq)`` over A and over B.
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from . import _contrib_int8 as _i8
from . import _contrib_numba as _nb
from . import _int8_tiles as _tiles

__all__ = ["BLOCK", "gemm_b16", "pack_b16", "sub_block_sums", "warm_up"]

#: values per weight block served here (MatMulNBits block_size)
BLOCK = 16
_WARM = False

if _i8.HAVE_INT8_DOT:
    from llvmlite import ir
    from numba import njit, prange, types
    from numba.extending import intrinsic

    _f32 = ir.FloatType()
    _i32, _i64 = ir.IntType(32), ir.IntType(64)
    _V = ir.VectorType

    def _tile16_codegen(bits, rows):
        """IR of ``rows`` rows of A times one interleaved group of four
        columns of 16-value-block weights (module docstring): per 32-value
        block the four columns' weights are loaded and unpacked once for all
        rows; per row one <8 x float> accumulator holding (column, sub-block)
        lanes. Every row runs the same float operations whatever the tile
        size, so a row's outputs do not depend on the batch."""
        per = 16 if bits == 4 else 32

        def codegen(context, builder, sig, args):
            (wa, xa, sa, ua, da, za), (w_off, wstride, x_off, s_off, d_off, z_off, dstride,
                                       nb) = _tiles.IR.unpack(context, builder, sig, args,
                                                              (0, 3, 5, 6, 8, 9),
                                                              (1, 2, 4, 7, 10, 11, 12, 13))
            ops = _tiles.IR.declare(builder)
            v32, v8f, v2f = _V(ir.IntType(8), 32), _V(_f32, 8), _V(_f32, 2)
            zero = _tiles.IR.splat(_f32, 0.0, 8)
            fast = ("contract",)
            row_x = builder.mul(nb, _i64(32))  # in the entry block, before the phis
            entry, loop, done, b = _tiles.IR.block_loop(builder, nb, "i8b16")
            accs = [builder.phi(v8f) for _ in range(rows)]
            for phi in accs:
                phi.add_incoming(zero, entry)
            step = builder.mul(b, dstride)
            d8 = _tiles.IR.load_vec(builder, da, builder.add(d_off, step), v8f)
            z8 = _tiles.IR.load_vec(builder, za, builder.add(z_off, step), v8f)
            wts = [_tiles.IR.weight_block(builder, bits, wa, builder.add(w_off, _i64(c * per)),
                                          b, ops[2], wstride) for c in range(4)]
            x_at = builder.add(x_off, builder.mul(b, _i64(32)))
            s_at = builder.add(s_off, b)

            def pairs(a, c):  # per 128-bit half: a0+a1, a2+a3, c0+c1, c2+c3
                return builder.add(
                    builder.shuffle_vector(a, c, ir.Constant(_V(_i32, 8),
                                                             [0, 2, 8, 10, 4, 6, 12, 14])),
                    builder.shuffle_vector(a, c, ir.Constant(_V(_i32, 8),
                                                             [1, 3, 9, 11, 5, 7, 13, 15])))

            even = ir.Constant(_V(_i32, 8), [0, 1, 2, 3, 8, 9, 10, 11])
            odd = ir.Constant(_V(_i32, 8), [4, 5, 6, 7, 12, 13, 14, 15])
            ab = ir.Constant(_V(_i32, 8), [0, 1, 0, 1, 0, 1, 0, 1])
            new = []
            for r in range(rows):
                xv = _tiles.IR.load_vec(builder, xa,
                                        builder.add(x_at, builder.mul(row_x, _i64(r))), v32)
                sums = [_tiles.IR.block_isum(builder, ops, wv, ws, xv) for wv, ws in wts]
                p01, p23 = pairs(sums[0], sums[1]), pairs(sums[2], sums[3])
                isum = builder.add(builder.shuffle_vector(p01, p23, even),
                                   builder.shuffle_vector(p01, p23, odd))
                s_r = builder.add(s_at, builder.mul(nb, _i64(r)))
                sxv = _tiles.IR.broadcast(builder, builder.load(builder.gep(sa, [s_r])))
                xs2 = _tiles.IR.load_vec(builder, ua, builder.mul(s_r, _i64(2)), v2f)
                xs8 = builder.shuffle_vector(xs2, xs2, ab)
                acc = builder.fadd(accs[r], builder.fmul(builder.sitofp(isum, v8f),
                                                         builder.fmul(d8, sxv, flags=fast),
                                                         flags=fast), flags=fast)
                new.append(builder.fsub(acc, builder.fmul(z8, xs8, flags=fast), flags=fast))
            (finals,) = _tiles.IR.close_loop(builder, b, nb, entry, loop, done, [accs], [new],
                                             zero)
            outs = []
            for r in range(rows):
                a4 = builder.shuffle_vector(finals[r], finals[r],
                                            ir.Constant(_V(_i32, 4), [0, 2, 4, 6]))
                b4 = builder.shuffle_vector(finals[r], finals[r],
                                            ir.Constant(_V(_i32, 4), [1, 3, 5, 7]))
                tot = builder.fadd(a4, b4)
                outs.extend(builder.extract_element(tot, _i32(c)) for c in range(4))
            return context.make_tuple(builder, sig.return_type, outs)

        return codegen

    def _tile16_intrinsic(rows):
        def typer(typingctx, w, w_off, wstride, xq, x_off, sx, xs16, s_off, d, dz, d_off,
                  z_off, dstride, nb):
            return (types.UniTuple(types.float32, 4 * rows)(
                w, w_off, wstride, xq, x_off, sx, xs16, s_off, d, dz, d_off, z_off, dstride,
                nb), _tile16_codegen(_tiles.bits_of(w), rows))
        typer.__name__ = f"_tile16_i8_x{rows}"
        return intrinsic(typer)

    _t4, _t3, _t2, _t1 = (_tile16_intrinsic(r) for r in (4, 3, 2, 1))

    @njit(nogil=True, cache=True)
    def _sub_sums(xq, sx, xs16):  # pragma: no cover - compiled
        # xs16[m, 2b] / [m, 2b + 1] = sx[m, b] * sum of xq over values 0-15 /
        # 16-31 of block b (positions 0-7 and 16-23 / 8-15 and 24-31)
        for m in range(xq.shape[0]):
            for b in range(sx.shape[1]):
                base = b * 32
                sa = 0
                sb = 0
                for j in range(8):
                    sa += np.int32(xq[m, base + j]) + np.int32(xq[m, base + 16 + j])
                    sb += np.int32(xq[m, base + 8 + j]) + np.int32(xq[m, base + 24 + j])
                xs16[m, 2 * b] = sx[m, b] * np.float32(sa)
                xs16[m, 2 * b + 1] = sx[m, b] * np.float32(sb)

    @njit(nogil=True, cache=True)
    def _quantized16(a):  # pragma: no cover - compiled
        m, kp = a.shape
        nb = kp // 32
        xq = np.empty((m, kp), np.int8)
        sx = np.empty((m, nb), np.float32)
        xsum = np.empty((m, nb), np.float32)
        xs16 = np.empty((m, 2 * nb), np.float32)
        _i8._quantize_rows(a, xq, sx, xsum)
        _sub_sums(xq, sx, xs16)
        return xq, sx, xs16

    @njit(fastmath=True, nogil=True, cache=True)
    def _cols16(xq, sx, xs16, w, d, dz, out, lo, hi):  # pragma: no cover - compiled
        # output columns lo..hi (multiples of 4, at most the padded N) of every
        # row, tiles of up to four rows x one group of four columns, rows in
        # blocks of ROW_BLOCK (as _contrib_int8._cols); columns past out's
        # width (the padding) are not written
        m_rows = xq.shape[0]
        n_out = out.shape[1]
        kp = xq.shape[1]
        nb = kp // 32
        per = _tiles.block_bytes(w)
        wf = w.reshape(-1)
        df = d.reshape(-1)
        zf = dz.reshape(-1)
        xf = xq.reshape(-1)
        sf = sx.reshape(-1)
        uf = xs16.reshape(-1)
        r0 = 0
        while r0 < m_rows:
            r1 = min(m_rows, r0 + _i8.ROW_BLOCK)
            n = lo
            while n + 4 <= hi:
                wb = (n // 4) * nb * 4 * per
                db = (n // 4) * nb * 8
                ws = 4 * per
                m = r0
                while m + 4 <= r1:
                    t = _t4(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, db, 8, nb)
                    for i in range(16):
                        if n + i % 4 < n_out:
                            out[m + i // 4, n + i % 4] = t[i]
                    m += 4
                if r1 - m == 3:
                    t3 = _t3(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, db, 8, nb)
                    for i in range(12):
                        if n + i % 4 < n_out:
                            out[m + i // 4, n + i % 4] = t3[i]
                elif r1 - m == 2:
                    t2 = _t2(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, db, 8, nb)
                    for i in range(8):
                        if n + i % 4 < n_out:
                            out[m + i // 4, n + i % 4] = t2[i]
                elif r1 - m == 1:
                    t1 = _t1(wf, wb, ws, xf, m * kp, sf, uf, m * nb, df, zf, db, db, 8, nb)
                    for i in range(4):
                        if n + i < n_out:
                            out[m, n + i] = t1[i]
                n += 4
            r0 = r1

    @njit(fastmath=True, nogil=True, cache=True)
    def _serial16(a, w, d, dz, out):  # pragma: no cover - compiled
        xq, sx, xs16 = _quantized16(a)
        _cols16(xq, sx, xs16, w, d, dz, out, 0, w.shape[0])

    @njit(parallel=True, fastmath=True, nogil=True, cache=True)
    def _par16(a, w, d, dz, out, chunks):  # pragma: no cover - compiled
        xq, sx, xs16 = _quantized16(a)
        n_cols = w.shape[0]
        per = ((n_cols + chunks - 1) // chunks + 3) // 4 * 4  # whole column groups
        for c in prange(chunks):
            _cols16(xq, sx, xs16, w, d, dz, out, c * per, min(n_cols, (c + 1) * per))


def sub_block_sums(xq: np.ndarray, sx: np.ndarray) -> np.ndarray:
    """``sx * sum(xq)`` over each 16-value half of every 32-value block.

    Args:
        xq: (M, n_blocks * 32) int8 from :func:`._contrib_int8.quantize_rows`
            (per block even values, then odd); sx: (M, n_blocks) float32.

    Returns:
        (M, n_blocks * 2) float32: per block the sums over values 0-15, 16-31.
    """
    out = np.empty((xq.shape[0], 2 * sx.shape[1]), np.float32)
    _sub_sums(np.ascontiguousarray(xq), np.ascontiguousarray(sx, np.float32), out)
    return out


def pack_b16(q: np.ndarray, scales: np.ndarray, zps: np.ndarray, bits: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights of a block-16 MatMulNBits for :func:`gemm_b16`.

    Args:
        q: (N, n_blocks, 8) uint8 (4-bit, as MatMulNBits packs them) or (N,
            n_blocks, 16) uint8 (8-bit); n_blocks 16-value blocks.
        scales / zps: (N, n_blocks) float32 scales and zero points.
        bits: 4 or 8.

    Returns:
        ``(w, d, dz)`` in the module docstring's layouts: (N4, nb32 * 16 or
        32) uint8 / int8 and (N4, nb32 * 2) float32, N4 = N rounded up to a
        multiple of 4, nb32 = ceil(n_blocks / 2); fresh copies in huge-page
        backed memory (:func:`._contrib_int8.pack_i8`).

    Raises:
        ValueError: bits is not 4 or 8, or the shapes disagree.
    """
    if bits not in (4, 8):
        raise ValueError(f"MatMulNBits block 16 with int8 activations: bits={bits}, expected 4 or 8")
    n, nb = scales.shape
    blob = 8 if bits == 4 else 16
    q = np.ascontiguousarray(q, np.uint8).reshape(n, nb, blob)
    if zps.shape != (n, nb):
        raise ValueError(f"MatMulNBits block 16: zero points {zps.shape}, expected {(n, nb)}")
    n4, nb2 = -(-n // 4) * 4, -(-nb // 2) * 2
    qp = np.zeros((n4, nb2, blob), np.uint8)
    qp[:n, :nb] = q
    d = np.zeros((n4, nb2), np.float32)
    d[:n, :nb] = scales
    z = np.zeros((n4, nb2), np.float32)
    z[:n, :nb] = zps
    if bits == 8:
        z -= np.float32(128)  # padding (columns, a block) has scale 0: contributes 0
    nb32 = nb2 // 2
    pair = qp.reshape(n4, nb32, 2 * blob)  # two 16-value blocks = one 32-value block
    if bits == 4:
        w = pair
    else:
        s = (pair.astype(np.int16) - 128).astype(np.int8).reshape(n4, nb32, 16, 2)
        w = np.ascontiguousarray(s.transpose(0, 1, 3, 2)).reshape(n4, nb32, 32)
    dz = d * z
    inter = _i8.interleave_columns
    return _i8._in_slab((inter(w).reshape(n4, -1),
                         inter(d.reshape(n4, nb32, 2)).reshape(n4, -1),
                         inter(dz.reshape(n4, nb32, 2)).reshape(n4, -1)))


def gemm_b16(a: np.ndarray, w: np.ndarray, d: np.ndarray, dz: np.ndarray,
             out: np.ndarray) -> None:
    """out = A @ dequant(B)^T, A quantized to int8 per 32 values, B in 16-value
    blocks (:func:`pack_b16`).

    Args:
        a: (M, nb32 * 32) float32, C-contiguous, zero-padded past K.
        w, d, dz: from :func:`pack_b16` (w's dtype picks 4-bit: uint8, or
            8-bit: int8).
        out: (M, N) float32, written (N <= the packed, padded N).

    Parallel over column chunks from the same amounts of work as
    :func:`._contrib_int8.gemm_i8`.
    """
    n = w.shape[0]
    work = a.shape[0] * n * a.shape[1]
    least = _i8.GEMV_PARALLEL_MIN_WEIGHTS if a.shape[0] == 1 else _i8.GEMM_PARALLEL_MIN_WORK
    if work < least or n <= 4:
        _serial16(a, w, d, dz, out)
        return
    chunks = max(1, min(n // 4, 2 * _nb.num_threads()))
    _nb._parallel(_par16, a, w, d, dz, out, chunks)


def warm_up() -> None:
    """Compile (or load from numba's disk cache) the block-16 kernels once."""
    global _WARM
    if _WARM or not _i8.HAVE_INT8_DOT:
        return
    a = np.zeros((1, 32), np.float32)
    out = np.zeros((1, 4), np.float32)
    for bits in (4, 8):
        w, d, dz = pack_b16(np.zeros((4, 2, 8 if bits == 4 else 16), np.uint8),
                            np.ones((4, 2), np.float32), np.zeros((4, 2), np.float32), bits)
        _serial16(a, w, d, dz, out)
        _par16(a, w, d, dz, out, 1)
    _WARM = True
