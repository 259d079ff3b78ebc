"""Multi-threaded float products by our own partitioning over one-thread BLAS
calls (as onnxruntime's MLAS tiles), for MatMul / Gemm / MatMulEpilogue.

OpenBLAS's own threaded sgemm / sgemv waits at internal barriers for every
pool thread; on a busy machine a descheduled pool thread stalls each call
for a time slice (a 2-thread 64 x 1024 x 1024 sgemm measured 156 ms against
10 ms on one thread). Here a product of at least :data:`PARALLEL_MIN_FLOPS`
is cut into one block per intra-op thread (``_threads.current()``) and each
block is one single-threaded BLAS call on the help-first chunk loop
(:func:`._parallel.run_chunks`: the caller claims blocks too, so a helper not
yet scheduled never holds it up):

* 2-D ``b`` ``(K, N)`` with ``a`` ``(..., M, K)``: the ``R = prod(...) * M``
  rows as one matrix; row blocks when ``R >= N`` (contiguous views), else
  column blocks of ``b`` and of the output (strided views BLAS takes as
  they are); a single row is a GEMV split by columns;
* batched (both operands at least 2-D, batch dims broadcast as numpy does):
  blocks along the output's largest batch axis.

A constant ``(K, N)`` right operand with ``K > N`` (a transformer's FFN
down-projection) is wrapped in :class:`ConstantOperand`: a one-row product
(a decode step) reads a transposed ``(N, K)`` copy made on the first such
call, as OpenBLAS's GEMV streams that layout faster when K > N (measured
here, weights out of cache: 1024 x 256 84 -> 44 us, 3072 x 768 972 -> 716
us; the other way round the original layout wins: 256 x 1024 66 vs 123 us);
multi-row products keep the original layout (a GEMM on the transposed
view measured 10-15 % slower). The copy exists only for models that run
one-row products, and only for those weights.

Below the threshold, and for products OpenBLAS itself runs on one thread,
the product is one plain call; between the two, inside
:class:`._threads.serial_blas` (one BLAS thread). At one intra-op thread
nothing here adds work beyond :func:`matmul_rows`.
"""

from __future__ import annotations

import numpy as np

from . import _parallel, _threads

__all__ = ["matmul", "matmul_rows", "run_batched", "PARALLEL_MIN_FLOPS", "ConstantOperand",
           "GEMV_T_MIN_ELEMENTS"]

#: products below this many flops (2 * M * N * K summed over the batch) run as
#: one call; at 2 threads on this machine a split 4 MFLOP GEMM broke even
PARALLEL_MIN_FLOPS = 1 << 22

# OpenBLAS (interface/gemm.c, gemv.c; GEMM_MULTITHREAD_THRESHOLD 4) runs a
# GEMM with M * N * K <= 262144 and a GEMV with M * N < 9216 on one thread
# whatever its pool size: no pool switch needed for those
_OPENBLAS_SERIAL_MNK = 262144
_OPENBLAS_SERIAL_GEMV = 9216

#: constant operands of at least this many elements (and K > N) get the
#: transposed copy for one-row products (:class:`ConstantOperand`)
GEMV_T_MIN_ELEMENTS = 1 << 15


def matmul_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b)`` for float32/float64 ``a`` ``(..., M, K)`` and a 2-D
    ``b`` ``(K, N)``, as one 2-D BLAS product over every row of ``a``; one
    row in all (a decode step's projection) is a GEMV. Shape ``(..., M, N)``,
    a fresh array. numpy's stacked matmul runs a 3-D ``a`` as a loop of GEMMs
    and a one-row GEMM at about half a GEMV's speed (measured 40 vs 22 µs for
    256 x 768 here); other operand ranks go to ``np.matmul`` as they are."""
    if b.ndim != 2 or a.ndim < 2:
        return np.matmul(a, b)
    k = a.shape[-1]
    m = a.size // k if k else 0
    if m == 1:
        return np.dot(a.reshape(k), b).reshape(a.shape[:-1] + (b.shape[1],))
    if a.ndim > 2 and m and a.flags.c_contiguous:
        return np.matmul(a.reshape(m, k), b).reshape(a.shape[:-1] + (b.shape[1],))
    return np.matmul(a, b)


def _blocks(n: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """``parts`` near-equal ``[start, stop)`` ranges covering ``range(n)``,
    block sizes rounded up to ``align``; fewer when ``n`` is small."""
    size = -(-n // parts)
    size = -(-size // align) * align
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def _split_2d(a2: np.ndarray, b: np.ndarray, out: np.ndarray, threads: int) -> None:
    """``out[...] = a2 @ b`` (``(R, K) @ (K, N)``) in per-thread blocks."""
    r, n = out.shape
    if r >= n or r >= 4 * threads * 16:
        parts = _blocks(r, threads)

        def chunk(i: int) -> None:
            s, e = parts[i]
            np.matmul(a2[s:e], b, out=out[s:e])
    else:
        parts = _blocks(n, threads, 16)

        def chunk(i: int) -> None:
            s, e = parts[i]
            np.matmul(a2, b[:, s:e], out=out[:, s:e])
    _parallel.run_chunks(chunk, len(parts), threads)


def _split_gemv(v: np.ndarray, b: np.ndarray, out: np.ndarray, threads: int) -> None:
    """``out[:] = v @ b`` (``(K,) @ (K, N)``) by column blocks."""
    parts = _blocks(out.shape[0], threads, 64)

    def chunk(i: int) -> None:
        s, e = parts[i]
        np.dot(v, b[:, s:e], out=out[s:e])
    _parallel.run_chunks(chunk, len(parts), threads)


def run_batched(fn, operands, out: np.ndarray, threads: int) -> None:
    """``fn(*parts, out=out_part)`` over blocks of ``out``'s largest batch
    axis (all but the last two), one block per thread, on the chunk loop.

    ``operands``: arrays of ``out``'s rank (or ``None``), each batch dim 1 or
    equal to ``out``'s; a block takes a dim-1 operand whole. ``fn`` must fill
    ``out_part`` and release the GIL for the blocks to overlap (BLAS, numpy
    ufuncs on float arrays). Raises what ``fn`` raised."""
    batch = out.shape[:-2]
    ax = max(range(len(batch)), key=lambda d: batch[d])
    parts = _blocks(batch[ax], threads)
    lead = (slice(None),) * ax

    def part(x, s: int, e: int):
        if x is None or x.shape[ax] == 1:
            return x
        return x[lead + (slice(s, e),)]

    def chunk(i: int) -> None:
        s, e = parts[i]
        fn(*(part(x, s, e) for x in operands), out=part(out, s, e))
    _parallel.run_chunks(chunk, len(parts), threads)


def _matmul_out(a, b, *, out):
    if batched_f32(a, b, out) is None:
        np.matmul(a, b, out=out)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b)`` for float32 / float64 operands of one dtype, any
    ranks (1-D operands promoted and squeezed as numpy does), split over the
    intra-op threads (module docstring). A fresh array of the broadcast
    shape; ``ValueError`` (numpy's) on mismatched shapes."""
    threads = _threads.current()
    if threads <= 1 or a.ndim < 1 or b.ndim < 1:
        if b.ndim == 2:
            return matmul_rows(a, b)
        y = batched_f32(a, b)
        return y if y is not None else np.matmul(a, b)
    if a.ndim == 1 or b.ndim == 1:
        if a.ndim == 1 and b.ndim == 2:  # a GEMV (1-D times matrix)
            out = matmul(a.reshape(1, -1), b)
            return out.reshape(out.shape[1:])
        return np.matmul(a, b)
    k = a.shape[-1]
    if b.shape[-2] != k:
        return np.matmul(a, b)  # numpy raises its shape error
    n = b.shape[-1]
    if b.ndim == 2:
        m = a.size // k if k else 0
        mnk = m * n * k
        if mnk == 0 or (mnk <= _OPENBLAS_SERIAL_MNK if m > 1 else k * n < _OPENBLAS_SERIAL_GEMV):
            return matmul_rows(a, b)
        with _threads.serial_blas():
            if 2 * mnk < PARALLEL_MIN_FLOPS:
                return matmul_rows(a, b)
            if m == 1:
                out = np.empty(n, dtype=np.result_type(a, b))
                _split_gemv(a.reshape(k), b, out, threads)
                return out.reshape(a.shape[:-1] + (n,))
            a2 = a.reshape(m, k) if a.ndim == 2 or a.flags.c_contiguous else \
                np.ascontiguousarray(a).reshape(m, k)
            out = np.empty((m, n), dtype=np.result_type(a, b))
            _split_2d(a2, b, out, threads)
            return out.reshape(a.shape[:-1] + (n,))
    # batched: numpy's broadcasting of the batch dims
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m = a.shape[-2]
    count = int(np.prod(batch)) if batch else 1
    mnk = count * m * n * k
    if count == 1 and mnk:  # a batch of one: the 2-D product
        out = matmul(a.reshape(m, k), b.reshape(k, n))
        return out.reshape(batch + (m, n))
    if mnk == 0 or 2 * mnk < PARALLEL_MIN_FLOPS:
        y = batched_f32(a, b) if mnk else None
        if y is not None:
            return y
        if mnk == 0 or m * n * k <= _OPENBLAS_SERIAL_MNK:
            return np.matmul(a, b)
        with _threads.serial_blas():
            return np.matmul(a, b)
    nd = len(batch) + 2
    aa = a.reshape((1,) * (nd - a.ndim) + a.shape)
    bb = b.reshape((1,) * (nd - b.ndim) + b.shape)
    out = np.empty(batch + (m, n), dtype=np.result_type(a, b))
    with _threads.serial_blas():
        run_batched(_matmul_out, (aa, bb), out, threads)
    return out


def _sgemm():
    """:mod:`._sgemm_numba` when its kernel can run here and is switched on, else None."""
    global _SGEMM
    if _SGEMM is None:
        try:
            from . import _sgemm_numba as sg
            _SGEMM = sg if sg.HAVE_SGEMM else False
        except ImportError:  # pragma: no cover - numba missing
            _SGEMM = False
    return _SGEMM if _SGEMM is not False and _SGEMM.ENABLED else None


_SGEMM = None


def batched_f32(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
                threads: int = 1) -> np.ndarray | None:
    """``np.matmul(a, b)`` (into ``out`` when given) for float32 batches of
    one batch shape by the compiled GEMM (:func:`._sgemm_numba.bmm`, ``b``
    packed per entry, entries split over ``threads``); None when that kernel
    does not apply (then the caller runs numpy's)."""
    if a.dtype != np.float32 or b.dtype != np.float32 or a.ndim < 3 or a.ndim != b.ndim:
        return None
    sg = _sgemm()
    return None if sg is None else sg.bmm(a, b, out, threads)


class ConstantOperand:
    """A constant float32/float64 right operand ``b`` ``(K, N)`` of
    :func:`matmul`, with the transposed layout for one-row products when that
    streams faster (module docstring: ``K > N``, at least
    :data:`GEMV_T_MIN_ELEMENTS` values).

    ``product(a)`` equals ``matmul(a, b)`` for ``a`` ``(..., M, K)`` of
    ``b``'s dtype (a fresh array ``(..., M, N)``); other operands go to
    :func:`matmul` unchanged. The ``(N, K)`` copy is made on the first
    one-row call (two threads racing build it twice; either copy is right).
    """

    __slots__ = ("b", "transposed", "_bt", "_packed", "_call")

    def __init__(self, b: np.ndarray):
        self.b = b
        k, n = b.shape
        self.transposed = (b.dtype in (np.float32, np.float64) and k > n
                           and k * n >= GEMV_T_MIN_ELEMENTS)
        self._bt: np.ndarray | None = None
        # the compiled sgemm's panels (:mod:`._sgemm_numba`), made on the
        # first float32 call; False: that kernel does not apply
        self._packed = None if b.dtype == np.float32 else False
        # the compiled GEMM prepared for the last shape (_sgemm_numba.GemmCall)
        self._call = None

    def compiled(self, a: np.ndarray, bias: np.ndarray | None = None,
                 act: str = "") -> np.ndarray | None:
        """``act(a @ b + bias)`` by the compiled float32 GEMM
        (:func:`._sgemm_numba.gemm`: ``b`` packed on the first call, the bias
        and activation in its store), a fresh array ``(..., M, N)``; None
        (nothing done) when that kernel does not apply: no AVX-512 / numba,
        switched off (``_sgemm_numba.ENABLED``), ``a`` or ``bias`` not
        float32 (``bias`` must be ``(N,)``), ``a``'s last dim not ``K``, or an
        activation other than ``""`` / ``"Relu"`` / ``"Gelu"``."""
        call = self._call
        if call is not None and call.fits(a, bias, act, _threads.current()):
            return call.run(a)  # this shape's prepared call (the same kernel calls as run)
        packed = self._packed
        if packed is False or a.dtype != np.float32 or a.ndim < 1 or \
                a.shape[-1] != self.b.shape[0] or act not in ("", "Relu", "Gelu"):
            return None
        if bias is not None and (bias.dtype != np.float32 or bias.ndim != 1 or
                                 bias.shape[0] != self.b.shape[1]):
            return None
        sg = _sgemm()
        if sg is None:
            return None
        if packed is None:
            packed = self._packed = sg.PackedB(np.ascontiguousarray(self.b))
        threads = _threads.current()
        self._call = sg.prepare_call(a, packed, bias, act, threads)
        return sg.run(a, packed, bias, sg.ACT_CODES[act], threads)

    @property
    def transposed_copy(self) -> np.ndarray | None:
        """The ``(N, K)`` copy once a one-row product made it, else None."""
        return self._bt

    def product(self, a: np.ndarray) -> np.ndarray:
        y = self.compiled(a)
        if y is not None:
            return y
        b = self.b
        k = b.shape[0]
        if not self.transposed or a.ndim < 2 or a.size != k or a.shape[-1] != k or \
                a.dtype != b.dtype:
            return matmul(a, b)
        bt = self._bt
        if bt is None:
            bt = self._bt = np.ascontiguousarray(b.T)
        n = bt.shape[0]
        v = a.reshape(k)
        threads = _threads.current()
        if threads <= 1:
            out = np.dot(bt, v)
        elif 2 * k * n < PARALLEL_MIN_FLOPS:
            with _threads.serial_blas():
                out = np.dot(bt, v)
        else:
            out = np.empty(n, dtype=b.dtype)
            parts = _blocks(n, threads, 64)

            def chunk(i: int) -> None:
                s, e = parts[i]
                np.dot(bt[s:e], v, out=out[s:e])
            with _threads.serial_blas():
                _parallel.run_chunks(chunk, len(parts), threads)
        return out.reshape(a.shape[:-1] + (n,))
