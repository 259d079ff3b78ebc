"""MatMulNBits with int8 activations (``accuracy_level=4``): integer block dot
products over the packed weights, as onnxruntime's CompInt8 and llama.cpp's
Q4_1 x Q8_1 kernels do.

``accuracy_level=4`` (onnxruntime contrib op MatMulNBits) lets a kernel
quantize A to int8 "with the same block_size". Here each 32-value block of a
row of A gets a symmetric scale ``sx = max|a| / 127`` and values
``xq = round_half_even(a * (1 / sx))`` in [-127, 127] (float32, as onnxruntime
rounds; a block holding NaN or infinity makes its outputs NaN); a block's
contribution to ``y[m, n]`` is then

    scale[n, b] * sx[m, b] * sum_i(q[n, b, i] * xq[m, b, i])
        - scale[n, b] * zp[n, b] * sx[m, b] * sum_i(xq[m, b, i])

(the first sum in integers). The weight values stay as the file packs them:
4-bit values two per byte (16 bytes per block, as MatMulNBits packs them),
8-bit values one signed byte per value. Per block the kernel streams 16 (or
32) bytes of weights plus ``scale`` and ``scale * zp``: as float16 inside the
weight stream when every scale is a float16 value and every ``scale * zp``
one up to float32 rounding (GGUF Q4_0/Q4_1/Q8_0 weights: 0.625 bytes per
4-bit weight, as llama.cpp streams them), else as two float32 arrays (0.75
bytes per 4-bit weight). The float32-activation kernels of
:mod:`._contrib_numba` stream 1.25.

The block dot product is written in LLVM IR with the AVX2 byte
multiply-add instructions (``vpmaddubsw``, ``vpmaddwd``): numba's own loops
vectorize a 32-value integer dot product with a horizontal reduction per
block, ~4x slower. Every M runs tiles of up to four rows of A times one
interleaved group of four output columns (``_int8_tiles._tile_codegen``): the
group's weight blocks are adjacent in memory (one sequential stream), loaded
and unpacked once for all rows of the tile, with one accumulator per row;
rows run in blocks of :data:`ROW_BLOCK` so their activations stay in L2
while a column chunk passes over them. Each row's float operations are the
same whatever the tile, so a row's outputs are bit for bit the same at batch
1, in a decode batch and in a prompt. :data:`HAVE_INT8_DOT` is False without
numba, off x86-64, without AVX2, or when numba compiles for another CPU than
the host (``NUMBA_CPU_NAME``); MatMulNBits then keeps float32 activations.

Layouts (C-contiguous; :func:`pack_i8`):
    weight values: 4-bit 16 bytes per block, value ``2i`` in the low nibble
    of byte ``i`` (MatMulNBits' own layout); 8-bit 32 int8 bytes per block
    holding ``q - 128``, reordered as values 0, 2, ..., 30, 1, 3, ..., 31.
    Columns are interleaved by four: for each group of four output columns,
    block by block, the four columns' blocks (the last N % 4 columns follow,
    one after another).
    ``w`` (N, n_blocks * 16 or 32) and ``d`` / ``dz`` (N, n_blocks) float32
    scale and scale * zero point (8-bit: scale * (zero point - 128)), each in
    that column order; or, with float16 scales, ``w = d = dz``: (N, n_blocks
    * 20 or 36) bytes where a group's block is its four scales, four scale *
    zero points (float16) and four weight blocks, a last column's block its
    scale, scale * zero point and weight block. 8-bit weights whose every
    scale * (zero point - 128) is zero (GGUF Q8_0) leave those terms out:
    (N, n_blocks * 34) bytes, and ``dz`` is :data:`NO_ZERO_POINTS`.
    ``xq``: (M, n_blocks * 32) int8, each block reordered even values first,
    then odd (the order the 4-bit bytes unpack to); ``sx`` / ``xsum``:
    (M, n_blocks) float32 block scales and ``sx * sum(xq)``.

By stage (this module is the entry point; the others are its parts):

* :mod:`._int8_quant` -- the activations' per-block quantization;
* :mod:`._int8_tiles` -- the CPU check (:data:`HAVE_INT8_DOT`), the LLVM IR
  tile kernels and the column-chunk driver ``_cols``;
* :mod:`._int8_panel` -- from 32 rows, 4-bit: a chunk's weights unpacked once
  into an int8 panel, 4 x 8 tiles against it (the tiles' bits);
* here -- the weight layouts (:func:`pack_i8`, in huge-page slabs) and the
  dispatch (:func:`gemm_i8`: one thread or column chunks over the team).
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import threading
import weakref

import numpy as np

from . import _contrib_numba as _nb
# the stages, re-exported: callers (the fused decoder stack, MatMulNBits, the
# tests) read them here
from ._int8_tiles import (BLOCK, HAVE_INT8_DOT, PREFETCH_BLOCKS, ROW_BLOCK,  # noqa: F401
                          TILE_MIN_ROWS)
from ._int8_quant import quantize_rows  # noqa: F401

__all__ = ["HAVE_INT8_DOT", "BLOCK", "gemm_i8", "pack_i8", "quantize_rows", "warm_up"]

#: one row of A (decode at batch 1) runs on one thread below this many weights
GEMV_PARALLEL_MIN_WEIGHTS = 1 << 22
#: more rows run on one thread below this many multiply-adds (M x N x K)
GEMM_PARALLEL_MIN_WORK = 1 << 22
_WARM = False

if HAVE_INT8_DOT:
    from numba import njit, prange

    from ._int8_quant import _act_buffers, _quantize_into, _quantize_rows, _quantized  # noqa: F401
    from ._int8_tiles import _cols, _cols_rows, _group_pf  # noqa: F401

    # one compiled entry per call (quantize A, then the columns): each numba
    # dispatch costs microseconds. Module-level functions, not closures over
    # the kernels: numba's disk cache keys a closure by its cell contents,
    # which differ per process, so closures were compiled again in every one.
    @njit(fastmath=True, nogil=True, cache=True)
    def _serial_i8(a, w, d, dz, out):  # pragma: no cover - compiled
        xq, sx, xsum, sx_t, xs_t = _quantized(a)
        _cols(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, 0, w.shape[0], 0)

    @njit(parallel=True, fastmath=True, nogil=True, cache=True)
    def _par_i8(a, w, d, dz, out, chunks):  # pragma: no cover - compiled
        xq, sx, xsum, sx_t, xs_t = _quantized(a)
        n_cols = w.shape[0]
        per = ((n_cols + chunks - 1) // chunks + 3) // 4 * 4  # whole column groups
        for c in prange(chunks):
            _cols(xq, sx, xsum, sx_t, xs_t, w, d, dz, out, c * per, min(n_cols, (c + 1) * per),
                  0)

    # the 4- and 8-bit kernels are the same functions typed by the weight
    # dtype (uint8: 4-bit, int8: 8-bit)
    _serial_q4 = _serial_q8 = _serial_i8
    _par_q4 = _par_q8 = _par_i8


def interleave_columns(x: np.ndarray) -> np.ndarray:
    """(N, n_blocks, ...) -> the same shape holding the pack_i8 column order:
    the first N - N % 4 columns in groups of four, block-major within a group
    ((N // 4, n_blocks, 4, ...)), then the last N % 4 columns as they were."""
    n, nb = x.shape[:2]
    g4 = n - n % 4
    head = x[:g4].reshape(g4 // 4, 4, nb, *x.shape[2:]).swapaxes(1, 2)
    return np.concatenate([head.reshape(-1), x[g4:].reshape(-1)]).reshape(x.shape)


#: prepacked weights smaller than this are carved from shared buffers of
#: SLAB_BYTES (see :func:`_in_slab`); larger ones get an allocation of their own
SLAB_BYTES = 64 << 20
_HUGE_PAGE = 2 << 20
_slab_lock = threading.Lock()
_slab: list = [None, 0]  # weak reference to the current buffer, next free byte


def _in_slab(arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Copies of ``arrays`` (an array listed twice copied once) in a shared,
    2 MiB-aligned buffer of :data:`SLAB_BYTES`, which numpy asks the kernel
    to back with transparent huge pages (it does so for allocations of 4 MiB
    and more): one projection's weights are 0.1-1 MB, so each would sit in
    4 KiB pages of its own, and decode streams every one of them each token
    (a TLB walk and a hardware-prefetcher stop every 4 KiB). SmolLM2 level 4,
    the 30 decoder blocks' 66 MB copied into one huge-page buffer,
    interleaved A/B of streamed decode: +2 to +4 %. A buffer lives as long as
    one of its arrays."""
    out: dict[int, np.ndarray] = {}
    for a in arrays:
        if id(a) in out:
            continue
        size = (a.nbytes + 63) // 64 * 64
        if size == 0 or size > SLAB_BYTES // 4:
            out[id(a)] = a
            continue
        with _slab_lock:
            ref, off = _slab
            buf = ref() if ref is not None else None
            if buf is None or off + size > buf.nbytes:
                buf = np.empty(SLAB_BYTES + _HUGE_PAGE, np.uint8)
                off = (-buf.ctypes.data) % _HUGE_PAGE
            _slab[0], _slab[1] = weakref.ref(buf), off + size
        v = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
        v[...] = a
        out[id(a)] = v
    return tuple(out[id(a)] for a in arrays)


def pack_i8(q: np.ndarray, scales: np.ndarray, zps: np.ndarray, bits: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights of a block-32 MatMulNBits for :func:`gemm_i8`.

    Args:
        q: 4-bit: (N, n_blocks, 16) uint8 as MatMulNBits packs them; 8-bit:
            (N, n_blocks, 32) uint8.
        scales / zps: (N, n_blocks) float32 scales and zero points.
        bits: 4 or 8.

    Returns:
        ``(w, d, dz)``: (N, n_blocks * 16 or 32) and (N, n_blocks) arrays in
        the layouts of the module docstring, columns interleaved by four
        (:func:`interleave_columns`). A fresh copy, not a view of the
        (memory-mapped) initializer, in memory backed by transparent huge
        pages (:func:`_in_slab`): decode streams every weight each token.
    """
    n, nb = scales.shape
    d = np.ascontiguousarray(scales, np.float32)
    if bits == 4:
        w = np.ascontiguousarray(q, np.uint8).reshape(n, nb, 16)
        dz = d * zps
    else:
        s = (q.astype(np.int16) - 128).astype(np.int8).reshape(n, nb, 16, 2)
        w = np.ascontiguousarray(s.transpose(0, 1, 3, 2)).reshape(n, nb, 32)
        dz = d * (zps - np.float32(128))
    dz = np.ascontiguousarray(dz, np.float32)
    halves = _as_halves(d, dz) if EMBED_HALF_SCALES else None
    if halves is None:
        return _in_slab((interleave_columns(w).reshape(n, -1), interleave_columns(d),
                         interleave_columns(dz)))
    if bits == 8 and OMIT_ZERO_ZERO_POINTS and not np.any(dz):
        # every scale * (zero point - 128) is zero (GGUF Q8_0: symmetric
        # blocks): 34 bytes per block, as the file stores them, not 36
        (e,) = _in_slab((_embed(w.view(np.uint8), halves[0], None).view(w.dtype),))
        return e, e, NO_ZERO_POINTS
    (e,) = _in_slab((_embed(w.view(np.uint8), *halves).view(w.dtype),))
    return e, e, e


#: the ``dz`` of an 8-bit layout without zero points (every block symmetric):
#: its float64 type selects the kernels that skip the correction term
NO_ZERO_POINTS = np.zeros(0, np.float64)
NO_ZERO_POINTS.flags.writeable = False


#: store float16-exact scales inside the weight stream (False: always the
#: separate float32 arrays; for comparisons)
EMBED_HALF_SCALES = True
#: with embedded scales, leave out 8-bit blocks' scale * zero point terms when
#: every one is zero (False: always store them; for comparisons)
OMIT_ZERO_ZERO_POINTS = True
#: a scale * zero point is stored as float16 when that changes it by at most
#: this much relative to it (it was a float16 value up to float32 rounding: a
#: GGUF Q4_1 block's minimum, as the builder writes d * zp = -m)
HALF_ZERO_POINT_RTOL = 2.0 ** -20


def _as_halves(d: np.ndarray, dz: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(d, dz) as float16 bit patterns (uint16) when every scale is a float16
    value exactly and every scale * zero point within
    :data:`HALF_ZERO_POINT_RTOL` of one; else None."""
    with np.errstate(over="ignore", invalid="ignore"):
        d16 = d.astype(np.float16)
        z16 = dz.astype(np.float16)
        ok = (np.isfinite(d).all() and np.array_equal(d16.astype(np.float32), d)
              and np.isfinite(z16).all()
              and bool(np.all(np.abs(z16.astype(np.float32) - dz)
                              <= np.float32(HALF_ZERO_POINT_RTOL) * np.abs(dz))))
    return (d16.view(np.uint16), z16.view(np.uint16)) if ok else None


def _embed(w: np.ndarray, d16: np.ndarray, z16: np.ndarray | None) -> np.ndarray:
    """(N, nb, per) uint8 weights and (N, nb) float16 bits -> (N, nb * (per +
    4)) uint8: per group of four columns and block, the four scales, the four
    scale * zero points (float16, little-endian), then the four weight blocks;
    the last N % 4 columns per block: scale, scale * zero point, weights.
    Without ``z16``: (N, nb * (per + 2)), the same without the zero points."""
    n, nb, per = w.shape
    g4 = n - n % 4
    g = g4 // 4

    def grouped(x: np.ndarray) -> np.ndarray:  # (N, nb, k) -> (G, nb, 4 * k) bytes
        k = x.shape[2]
        x = np.ascontiguousarray(x[:g4].reshape(g, 4, nb, k).swapaxes(1, 2))
        if not g:
            return np.zeros((0, nb, 4 * x.itemsize * k), np.uint8)
        return x.view(np.uint8).reshape(g, nb, -1)

    def tail_bytes(x: np.ndarray) -> np.ndarray:  # (N, nb, k) -> (N % 4, nb, k) bytes
        x = np.ascontiguousarray(x[g4:])
        return x.view(np.uint8).reshape(n - g4, nb, -1) if n > g4 else np.zeros(
            (0, nb, x.itemsize * x.shape[2]), np.uint8)

    halves = [d16] if z16 is None else [d16, z16]
    head = np.concatenate([grouped(x[..., None]) for x in halves] + [grouped(w)], axis=2)
    tail = np.concatenate([tail_bytes(x[..., None]) for x in halves] + [tail_bytes(w)], axis=2)
    return np.concatenate([head.reshape(-1), tail.reshape(-1)]).reshape(
        n, nb * (per + 2 * len(halves)))


def gemm_i8(a: np.ndarray, w: np.ndarray, d: np.ndarray, dz: np.ndarray, bits: int,
            out: np.ndarray) -> None:
    """out = A @ dequant(B)^T with A quantized to int8 per 32-value block.

    Args:
        a: (M, n_blocks * 32) float32, C-contiguous, zero-padded past K.
        w, d, dz: from :func:`pack_i8`; bits: 4 or 8.
        out: (M, N) float32, written.

    Parallel over column chunks when M x N x K reaches
    :data:`GEMV_PARALLEL_MIN_WEIGHTS` (one row) or :data:`GEMM_PARALLEL_MIN_WORK`
    (more rows); below, one thread (waking the second costs ~50 µs in a graph).
    """
    n = w.shape[0]
    work = a.shape[0] * n * a.shape[1]
    least = GEMV_PARALLEL_MIN_WEIGHTS if a.shape[0] == 1 else GEMM_PARALLEL_MIN_WORK
    if work < least or n < 4:
        (_serial_q4 if bits == 4 else _serial_q8)(a, w, d, dz, out)
        return
    chunks = max(1, min(n // 4, 2 * _nb.num_threads()))
    _nb._parallel(_par_q4 if bits == 4 else _par_q8, a, w, d, dz, out, chunks)


def warm_up() -> None:
    """Compile (or load from numba's disk cache) the int8 kernels once."""
    global _WARM
    if _WARM or not HAVE_INT8_DOT:
        return
    a = np.zeros((1, BLOCK), np.float32)
    quantize_rows(a)
    out = np.zeros((1, 2), np.float32)
    d = np.ones((2, 1), np.float32)
    for bits, per in ((4, 16), (8, 32)):
        w = np.zeros((2, per), np.uint8 if bits == 4 else np.int8)
        (_serial_q4 if bits == 4 else _serial_q8)(a, w, d, d, out)
        (_par_q4 if bits == 4 else _par_q8)(a, w, d, d, out, 1)
    _WARM = True
