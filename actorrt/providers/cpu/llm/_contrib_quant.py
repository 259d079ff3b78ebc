"""Block-quantized contrib kernels: com.microsoft MatMulNBits and
GatherBlockQuantized (onnxruntime semantics).

MatMulNBits prepacks its constant weight once (:meth:`MatMulNBits.prepare`):

* numba present: B is kept as one byte per quantized value (N, n_blocks,
  block_size) uint8 (4- and 2-bit weights unpacked once) next to float32
  scales and zero points (N, n_blocks); the kernels read those bytes for any
  number of rows of A (a GEMV for decode, a GEMM that dequantizes one column
  at a time into L1 for batched decode and prefill). No float32 copy of B.
* ``accuracy_level=4``, block_size 32, 4- or 8-bit, AVX2 and numba: A is
  quantized to int8 per 32-value block and the kernels of :mod:`._contrib_int8`
  take integer dot products over the packed weights (4-bit: still two values
  per byte, 0.75 bytes per weight with the scales), as onnxruntime's CompInt8
  path does.
* ``accuracy_level=4``, block_size 16 (GGUF Q2_K, Q3_K, Q6_K), 4- or 8-bit:
  the same int8 activations, the integer sums and scales taken per 16-value
  sub-block (:mod:`._contrib_int8_b16`).
* numba absent: B is dequantized once to a float32 (N, K) matrix and every call
  is one BLAS product.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
import ml_dtypes
import numpy as np

from ..._contract import Kernel, NodeSpec, deny, require
from .... import tracing
from actorrt._lazy import lazy_module
from ..registry import cpu_kernel

_nb = lazy_module(f"{__package__}._contrib_numba", globals(), "_nb")  # numba on first use
_i8 = lazy_module(f"{__package__}._contrib_int8", globals(), "_i8")  # numba on first use
_b16 = lazy_module(f"{__package__}._contrib_int8_b16", globals(), "_b16")

MS = "com.microsoft"
_LOW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) if x.dtype in _LOW else x


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Unpack the last axis of a uint8 array holding ``bits``-bit values, low
    bits first, into ``count`` uint8 values along that axis."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    if bits == 8:
        return packed[..., :count]
    if bits == 4:
        out = np.stack([packed & 0x0F, packed >> 4], axis=-1)
    elif bits == 2:
        out = np.stack([(packed >> s) & 0x03 for s in (0, 2, 4, 6)], axis=-1)
    else:  # generic bit stream
        b = np.unpackbits(packed, axis=-1, bitorder="little")
        n = b.shape[-1] // bits
        b = b[..., :n * bits].reshape(*b.shape[:-1], n, bits)
        out = (b.astype(np.uint16) << np.arange(bits, dtype=np.uint16)).sum(-1).astype(np.uint8)
        return out[..., :count]
    return out.reshape(*packed.shape[:-1], -1)[..., :count]


# ----------------------------------------------------------------- MatMulNBits

@attrs.frozen
class PackedNBits:
    """A MatMulNBits weight prepacked for the kernels.

    Attributes:
        k: input features K; ``n``: output features N.
        bits: quantized bit width; ``block_size``: values per block.
        q: numba layout: (N, n_blocks, block_size) uint8, one quantized value
            per byte (4- and 2-bit weights are unpacked once at prepare time: the
            GEMV then streams one byte per weight at ~8 G weights/s on one core
            here, memory-bound; extracting nibbles in the loop measured ~3.5 G
            weights/s, compute-bound, so half the bytes came out slower);
            ``None`` on the numpy path.
        scales / zps: (N, n_blocks) float32 (``None`` on the numpy path).
        w: (N, K) float32 dequantized weight on the numpy path, else ``None``.
        empty: the projection is omitted (zero-sized B): Y is zeros (+ bias).
        qi / dz: the int8-activation layout (:func:`._contrib_int8.pack_i8`:
            packed weights and scale * zero point, with ``scales``; all three
            the same uint8/int8 array when float16 scales are embedded in the
            weight stream; ``dz`` the empty ``NO_ZERO_POINTS`` when 8-bit
            blocks have no zero-point terms), else ``None``.
        i16: the int8-activation layout of 16-value blocks
            (:func:`._contrib_int8_b16.pack_b16`: ``(w, d, dz)``), else ``None``.
            Kept apart from ``qi``: the fused blocks read ``qi`` as the
            block-32 layout.
    """

    k: int
    n: int
    bits: int
    block_size: int
    q: np.ndarray | None = None
    scales: np.ndarray | None = None
    zps: np.ndarray | None = None
    w: np.ndarray | None = None
    empty: bool = False
    qi: np.ndarray | None = None
    dz: np.ndarray | None = None
    i16: tuple | None = None

    @property
    def n_blocks(self) -> int:
        return -(-self.k // self.block_size)

def _zero_points(zp: np.ndarray | None, *, n: int, nb: int, bits: int) -> np.ndarray:
    """(N, n_blocks) float32 zero points from packed uint8, float or none."""
    if zp is None:
        return np.full((n, nb), float(1 << (bits - 1)), np.float32)
    if zp.dtype == np.uint8:
        return unpack_bits(zp.reshape(n, -1), bits, nb).astype(np.float32)
    return _f32(zp).astype(np.float32).reshape(n, nb)


def int8_eligible(bits: int, block_size: int) -> bool:
    """Whether the int8-activation kernels can run a MatMulNBits with these
    attributes on this machine (4/8 bits, block_size 32 or 16, AVX2 + numba)."""
    return _i8.HAVE_INT8_DOT and bits in (4, 8) and block_size in (_i8.BLOCK, _b16.BLOCK)


def pack_nbits(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, *, k: int,
               n: int, bits: int, block_size: int, use_numba: bool,
               int8: bool = False) -> PackedNBits:
    """Prepack MatMulNBits constants (see :class:`PackedNBits`); ``int8`` selects
    the int8-activation layout (only where :func:`int8_eligible`).

    Raises:
        ValueError: B, scales or zero points do not match K, N, bits, block_size.
    """
    nb = -(-k // block_size)
    blob = block_size * bits // 8
    if b.size == 0:
        return PackedNBits(k, n, bits, block_size, empty=True)
    if b.size != n * nb * blob:
        raise ValueError(f"MatMulNBits: B has shape {b.shape}, expected ({n}, {nb}, {blob})")
    if scales.size != n * nb:
        raise ValueError(f"MatMulNBits: scales has {scales.size} values, expected {n * nb}")
    b = np.ascontiguousarray(b, np.uint8).reshape(n, nb, blob)
    sc = _f32(scales).astype(np.float32).reshape(n, nb)
    zps = _zero_points(zero_points, n=n, nb=nb, bits=bits)
    if int8 and use_numba and int8_eligible(bits, block_size) and block_size == _b16.BLOCK:
        return PackedNBits(k, n, bits, block_size, i16=_b16.pack_b16(b, sc, zps, bits))
    if int8 and use_numba and int8_eligible(bits, block_size):
        qi, d, dz = _i8.pack_i8(b, sc, zps, bits)
        return PackedNBits(k, n, bits, block_size, scales=d, qi=qi, dz=dz)
    if use_numba and _nb.HAVE_NUMBA:
        q = b if bits == 8 else unpack_bits(b, bits, block_size)
        return PackedNBits(k, n, bits, block_size, q=np.ascontiguousarray(q),
                           scales=np.ascontiguousarray(sc), zps=np.ascontiguousarray(zps))
    vals = unpack_bits(b, bits, block_size).astype(np.float32)  # (N, nb, bs)
    vals -= zps[:, :, None]
    vals *= sc[:, :, None]
    w = np.ascontiguousarray(vals.reshape(n, nb * block_size)[:, :k])
    return PackedNBits(k, n, bits, block_size, w=w)


def _pad_k(a: np.ndarray, p: PackedNBits) -> np.ndarray:
    """(M, K) float32 -> C-contiguous (M, n_blocks * block_size), zero-padded past K
    (the block-16 int8 layout: to a multiple of 32)."""
    kp = p.n_blocks * p.block_size
    if p.i16 is not None:
        kp = -(-p.k // 32) * 32
    if kp != p.k:
        a = np.concatenate([a, np.zeros((a.shape[0], kp - p.k), np.float32)], axis=1)
    return np.ascontiguousarray(a)


def matmul_nbits_numba(a: np.ndarray, p: PackedNBits) -> np.ndarray:
    """(M, K) float32 @ packed B -> (M, N) float32 with the numba kernels: the
    fused GEMV for one row, the column-dequantizing GEMM for more. Neither keeps
    a float copy of B."""
    m = a.shape[0]
    out = np.empty((m, p.n), np.float32)
    ap = _pad_k(a, p)
    if p.qi is not None:
        _i8.gemm_i8(ap, p.qi, p.scales, p.dz, p.bits, out)
    elif p.i16 is not None:
        _b16.gemm_b16(ap, *p.i16, out)
    elif m == 1:
        _nb.gemv_q8(ap, p.q, p.scales, p.zps, out)
    else:
        _nb.gemm_q8(ap, p.q, p.scales, p.zps, out)
    return out


def matmul_nbits_numpy(a: np.ndarray, p: PackedNBits) -> np.ndarray:
    """(M, K) float32 @ dequantized B -> (M, N) float32."""
    return a @ p.w.T


@cpu_kernel("MatMulNBits", domain=MS)
class MatMulNBits(Kernel):
    """com.microsoft MatMulNBits: Y = A @ dequant(B)^T (+ bias), B (N, n_blocks,
    blob) uint8 block-quantized along K; A float32/float16/bfloat16 (..., K).

    ``accuracy_level=4`` (onnxruntime: A "can be quantized with the same
    block_size to int8") selects the int8-activation kernels where
    :func:`int8_eligible`; other levels keep A in float32."""

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        bits = node.attr("bits", 4)
        bs = node.attr("block_size")
        require(bits in (2, 4, 8), "MatMulNBits: bits=%s is not supported (2, 4 or 8)", bits)
        require(bs is not None and bs >= 16 and bs & (bs - 1) == 0,
                "MatMulNBits: block_size must be a power of two >= 16, got %s", bs)
        require(node.attr("K") is not None and node.attr("N") is not None,
                "MatMulNBits: attributes K and N are required")
        if node.has_input(4):
            deny("MatMulNBits: the deprecated g_idx input is not supported")
        if node.attr("weight_prepacked", 0):
            deny("MatMulNBits: weight_prepacked=%s is a CUDA-specific layout",
                 node.attr("weight_prepacked"))

    @classmethod
    def estimate_flops(cls, node: NodeSpec) -> float:
        m = 1
        t = node.input_type(0)
        if t is not None and t.shape:
            for d in t.shape[:-1]:
                m *= d if isinstance(d, int) and d > 0 else 1
        return 2.0 * m * node.attr("K") * node.attr("N")

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self.k = int(node.attr("K"))
        self.n = int(node.attr("N"))
        self.bits = int(node.attr("bits", 4))
        self.block_size = int(node.attr("block_size"))
        self.use_numba = _nb.HAVE_NUMBA
        self.int8 = (int(node.attr("accuracy_level", 0)) == 4
                     and int8_eligible(self.bits, self.block_size))
        self.packed: PackedNBits | None = None

    def _pack(self, b, scales, zp) -> PackedNBits:
        return pack_nbits(b, scales, zp, k=self.k, n=self.n, bits=self.bits,
                          block_size=self.block_size, use_numba=self.use_numba,
                          int8=self.int8)

    def _variant(self, p: PackedNBits) -> None:
        if p.qi is not None or p.i16 is not None:
            tracing.kernel_variant("matmul", "int8-dot", "accuracy_level=4, %d-bit, block %d",
                                   p.bits, p.block_size)
        elif p.q is not None:
            tracing.kernel_variant("matmul", "f32-numba", "%d-bit bytes", p.bits)
        elif not p.empty:
            tracing.kernel_variant("matmul", "f32-dequantized", "BLAS on a float32 copy")

    def prepare(self, constants: Mapping[int, Any], shared: dict) -> None:
        if 1 not in constants or 2 not in constants:
            return
        if self.node.has_input(3) and 3 not in constants:
            return
        key = ("MatMulNBits", self.use_numba, self.int8)
        p = shared.get(key)
        if p is None:
            p = self._pack(constants[1], constants[2], constants.get(3))
            shared[key] = p
        if p.q is not None:
            _nb.warm_up()
        if p.qi is not None:
            _i8.warm_up()
        if p.i16 is not None:
            _b16.warm_up()
        self.packed = p

    def compile(self):
        """With the weight prepacked for numba, no padding and no bias: a closure
        that checks A and calls the GEMV/GEMM directly (about 4 µs of Python per
        call instead of ~25); anything else goes through :meth:`run`."""
        p = self.packed
        if (p is not None and p.i16 is not None and not p.empty and p.k % 32 == 0
                and not self.node.has_input(5)):
            return self._compile_b16(p)
        if (p is None or (p.q is None and p.qi is None) or p.empty
                or p.n_blocks * p.block_size != p.k or self.node.has_input(5)):
            return self.run
        k, n, sc = self.k, self.n, p.scales
        f32 = np.dtype(np.float32)
        empty, run, variant = np.empty, self.run, self._variant

        q, zp, qi, dz, bits = p.q, p.zps, p.qi, p.dz, p.bits
        gemv, gemm, gemm_i8, int8 = _nb.gemv_q8, _nb.gemm_q8, _i8.gemm_i8, p.qi is not None

        def matmul_nbits(A, *rest):
            shape = A.shape
            if A.dtype != f32 or not shape or shape[-1] != k or not A.flags.c_contiguous:
                return run(A, *rest)
            variant(p)
            a = A.reshape(-1, k)
            m = a.shape[0]
            out = empty(shape[:-1] + (n,), f32)
            if int8:
                if m:
                    gemm_i8(a, qi, sc, dz, bits, out.reshape(m, n))
            elif m == 1:
                gemv(a, q, sc, zp, out.reshape(1, n))
            elif m:
                gemm(a, q, sc, zp, out.reshape(m, n))
            return out

        return matmul_nbits

    def _compile_b16(self, p: PackedNBits):
        """:meth:`compile`'s closure for the block-16 int8 layout (K a multiple of 32)."""
        k, n, (w, d, dz) = self.k, self.n, p.i16
        f32 = np.dtype(np.float32)
        empty, run, variant, gemm = np.empty, self.run, self._variant, _b16.gemm_b16

        def matmul_nbits_b16(A, *rest):
            shape = A.shape
            if A.dtype != f32 or not shape or shape[-1] != k or not A.flags.c_contiguous:
                return run(A, *rest)
            variant(p)
            a = A.reshape(-1, k)
            out = empty(shape[:-1] + (n,), f32)
            if a.shape[0]:
                gemm(a, w, d, dz, out.reshape(a.shape[0], n))
            return out

        return matmul_nbits_b16

    def run(self, A, B, scales, zero_points=None, g_idx=None, bias=None):
        p = self.packed if self.packed is not None else self._pack(B, scales, zero_points)
        if A.shape[-1] != self.k:
            raise ValueError(f"MatMulNBits: A has {A.shape[-1]} features, K={self.k}")
        lead = A.shape[:-1]
        self._variant(p)
        if p.empty:
            y = np.zeros(lead + (self.n,), np.float32)
        else:
            a = np.ascontiguousarray(_f32(A).reshape(-1, self.k), dtype=np.float32)
            y = (matmul_nbits_numba(a, p)
                 if p.q is not None or p.qi is not None or p.i16 is not None
                 else matmul_nbits_numpy(a, p))
            y = y.reshape(lead + (self.n,))
        if bias is not None:
            y = y + _f32(bias)
        return y.astype(A.dtype, copy=False)


# -------------------------------------------------------- GatherBlockQuantized

_FLOAT_CODES = tuple(np.dtype(t) for t in (
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e5m2fnuz, ml_dtypes.float4_e2m1fn))
_INT4 = (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4))


def _values(data: np.ndarray, bits: int) -> tuple[np.ndarray, int]:
    """Integer values of quantized ``data`` (unpacking uint8 along the last
    axis) and the default zero point."""
    if data.dtype in _INT4:
        return data.astype(np.int32), 0
    if bits == 8:
        return data.astype(np.int32), 128
    per = 8 // bits
    vals = unpack_bits(data, bits, data.shape[-1] * per).astype(np.int32)
    return vals, 1 << (bits - 1)


def _take_blocks(t: np.ndarray, safe: np.ndarray, ga: int, qa: int, bsz: int,
                 full: int, idx_ndim: int) -> np.ndarray:
    """Gather per-block ``t`` (scales or zero points, data's rank) along the
    gather axis and expand its block axis to ``full`` elements (output layout)."""
    if ga == qa:
        return np.take(t, safe // bsz, axis=ga)
    if t.shape[ga] == 1:  # shared along the gather axis (FP8 per-tensor scales)
        g = t.reshape(t.shape[:ga] + (1,) * idx_ndim + t.shape[ga + 1:])
    else:
        g = np.take(t, safe, axis=ga)
    qa_out = qa + idx_ndim - 1 if qa > ga else qa
    if g.shape[qa_out] == 1:
        return g  # one block covers the whole axis: broadcasts
    g = np.repeat(g, bsz, axis=qa_out)
    return np.take(g, np.arange(full), axis=qa_out)


@cpu_kernel("GatherBlockQuantized", domain=MS)
def GatherBlockQuantized(data, indices, scales, zero_points=None, *, bits=4, block_size=128,
                         gather_axis=0, quantize_axis=1):
    """com.microsoft GatherBlockQuantized: Gather of block-quantized ``data``
    (int4/uint4, uint8 holding ``bits``-bit values packed along the last axis,
    or float8/float4) dequantized as (q - zero_point) * scale; out-of-range
    indices give zero slices. Output dtype is the scales' dtype."""
    is_float = data.dtype in _FLOAT_CODES
    if is_float:
        vals, default_zp = data.astype(np.float32), 0
    else:
        vals, default_zp = _values(data, bits)
    r = vals.ndim
    ga = gather_axis % r
    qa = quantize_axis % r
    dim = vals.shape[ga]
    bsz = block_size if block_size > 0 else vals.shape[qa]
    idx = np.asarray(indices, np.int64)
    idx = np.where(idx < 0, idx + dim, idx)
    valid = (idx >= 0) & (idx < dim)
    safe = np.where(valid, idx, 0)
    out = np.take(vals, safe, axis=ga).astype(np.float32)
    full = vals.shape[qa]
    if not is_float:
        if zero_points is not None:
            if zero_points.dtype in _INT4:
                zp = zero_points.astype(np.float32)
            else:
                zp = _values(zero_points, bits)[0].astype(np.float32)
                zp = zp[tuple(slice(0, n) for n in scales.shape)]
            out -= _take_blocks(zp, safe, ga, qa, bsz, full, idx.ndim)
        else:
            out -= np.float32(default_zp)
    out *= _take_blocks(_f32(scales).astype(np.float32), safe, ga, qa, bsz, full, idx.ndim)
    mask = valid.reshape((1,) * ga + valid.shape + (1,) * (r - ga - 1))
    out = np.where(mask, out, np.float32(0))
    return out.astype(scales.dtype, copy=False)
