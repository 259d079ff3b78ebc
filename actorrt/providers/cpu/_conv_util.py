"""Shared geometry and window helpers for the convolution, pooling and image
kernels (``conv.py``, ``pool.py``, ``image.py``).

Layouts are ONNX's: ``(N, C, D1, ..., Dn)`` with the spatial axes last. Pads are
given ONNX-style as ``[b1, ..., bn, e1, ..., en]`` and handled here as two
tuples ``(begin, end)``.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

from ... import tracing

__all__ = [
    "compute_dtype", "spatial_params", "conv_geometry", "pad_spatial", "sliding_view",
    "tap_slices", "scatter_taps", "conv_core", "reflect", "decode_str",
]

def decode_str(v, default: str = "") -> str:
    """An attribute string (ONNX attributes may arrive as bytes)."""
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype arithmetic runs in: float64 stays, everything else float32."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def spatial_params(nd: int, kernel: Sequence[int], strides, dilations, pads):
    """Normalise the usual attributes for ``nd`` spatial axes.

    Returns:
        ``(kernel, strides, dilations, pads_begin, pads_end)`` as int tuples.

    Raises:
        ValueError: an attribute has the wrong length.
    """
    kernel = tuple(int(k) for k in kernel)
    strides = tuple(int(s) for s in strides) if strides else (1,) * nd
    dilations = tuple(int(d) for d in dilations) if dilations else (1,) * nd
    pads = tuple(int(p) for p in pads) if pads else (0,) * (2 * nd)
    if len(kernel) != nd or len(strides) != nd or len(dilations) != nd or len(pads) != 2 * nd:
        raise ValueError(f"attribute lengths do not match {nd} spatial axes: kernel_shape="
                         f"{kernel}, strides={strides}, dilations={dilations}, pads={pads}")
    return kernel, strides, dilations, pads[:nd], pads[nd:]


def conv_geometry(in_shape: Sequence[int], kernel, strides, dilations, pb, pe,
                  auto_pad: str = "NOTSET", ceil_mode: bool = False):
    """Output size and effective pads of a sliding window (Conv / pooling rules).

    ``auto_pad`` SAME_UPPER / SAME_LOWER give ``ceil(in / stride)`` outputs with
    the odd pad at the end / beginning; VALID no padding. ``ceil_mode`` rounds
    the output count up but drops a last window that would start in the end pad.

    Returns:
        ``(out_shape, pads_begin, pads_end)``; ``pads_end`` may exceed the
        declared end pad in ceil mode so every window fits.

    Raises:
        ValueError: an output size would be < 1.
    """
    out, b_out, e_out = [], [], []
    for i, n in enumerate(in_shape):
        k, s, d = kernel[i], strides[i], dilations[i]
        dk = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-n // s)
            total = max(0, (o - 1) * s + dk - n)
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            e = total - b
        elif auto_pad == "VALID":
            o = (n - dk) // s + 1
            b = e = 0
        else:
            b, e = pb[i], pe[i]
            span = n + b + e - dk
            if ceil_mode:
                o = -(-span // s) + 1
                if (o - 1) * s >= n + b:
                    o -= 1
            else:
                o = span // s + 1
        if o < 1:
            raise ValueError(f"spatial axis {i}: input {n}, kernel {k}, dilation {d}, stride "
                             f"{s}, pads ({b}, {e}) give an empty output")
        e = max(e, (o - 1) * s + dk - n - b)  # ceil mode may need more room at the end
        out.append(o)
        b_out.append(b)
        e_out.append(e)
    return tuple(out), tuple(b_out), tuple(e_out)


def pad_spatial(x: np.ndarray, pb, pe, value=0) -> np.ndarray:
    """``x`` padded with ``value`` on its trailing spatial axes (no copy when no pads)."""
    if not any(pb) and not any(pe):
        return x
    lead = [(0, 0)] * (x.ndim - len(pb))
    return np.pad(x, lead + list(zip(pb, pe)), mode="constant", constant_values=value)


def sliding_view(xp: np.ndarray, out_shape, kernel, strides, dilations) -> np.ndarray:
    """A read-only strided view ``(*lead, *kernel, *out)`` of the padded input
    ``xp`` ``(*lead, *spatial)``: element ``[..., k, o]`` is
    ``xp[..., o * stride + k * dilation]``."""
    nd = len(kernel)
    lead_shape, lead_strides = xp.shape[:-nd], xp.strides[:-nd]
    sp = xp.strides[-nd:]
    shape = (*lead_shape, *kernel, *out_shape)
    strides = (*lead_strides, *(sp[i] * dilations[i] for i in range(nd)),
               *(sp[i] * strides[i] for i in range(nd)))
    return np.lib.stride_tricks.as_strided(xp, shape, strides, writeable=False)


def tap_slices(kernel, out_shape, strides, dilations):
    """Yield ``(tap_index, flat_tap, slices)``: the spatial slices of a padded
    input that kernel tap ``tap_index`` reads for every output position."""
    for t, kk in enumerate(itertools.product(*(range(k) for k in kernel))):
        sl = tuple(slice(kk[i] * dilations[i],
                         kk[i] * dilations[i] + (out_shape[i] - 1) * strides[i] + 1, strides[i])
                   for i in range(len(kernel)))
        yield kk, t, sl


def scatter_taps(cols: np.ndarray, out: np.ndarray, kernel, in_shape, strides, dilations,
                 pb) -> None:
    """Col2im: add ``cols`` ``(*lead, *kernel, *in_shape)`` into ``out``
    ``(*lead, *out_spatial)`` where tap ``k`` of input position ``i`` lands on
    ``i * stride + k * dilation - pad_begin`` (positions outside are dropped)."""
    nd = len(kernel)
    out_sp = out.shape[-nd:]
    for kk in itertools.product(*(range(k) for k in kernel)):
        src, dst = [], []
        empty = False
        for a in range(nd):
            off = kk[a] * dilations[a] - pb[a]
            s = strides[a]
            i0 = -(off // s) if off < 0 else 0  # first i with i * s + off >= 0
            i1 = min(in_shape[a], (out_sp[a] - 1 - off) // s + 1)
            if i1 <= i0:
                empty = True
                break
            src.append(slice(i0, i1))
            o0 = i0 * s + off
            dst.append(slice(o0, o0 + (i1 - i0 - 1) * s + 1, s))
        if empty:
            continue
        out[(Ellipsis, *dst)] += cols[(Ellipsis, *kk, *src)]


def choose_path(kernel, pb, pe, cg: int, group: int) -> str:
    """``"1x1"``, ``"depthwise"`` or ``"im2col"`` (see :func:`conv_core`)."""
    if math.prod(kernel) == 1 and not any(pb) and not any(pe):
        return "1x1"
    if cg == 1 and group > 1:
        return "depthwise"
    return "im2col"


def im2col_chunk(n: int, c: int, K: int, P: int, itemsize: int) -> int:
    """Images per patch-matrix chunk (bounds it to ~64 MB)."""
    per_image = c * K * P * itemsize
    return min(n, max(1, (64 << 20) // max(per_image, 1)))


def conv_workspace(x_shape, kernel, pb, pe, out_shape, group: int, itemsize: int) -> list[int]:
    """Exact scratch bytes of the im2col path: ``[padded input, patch matrix]``
    (the padded input only when there are pads); ``[]`` for the other paths."""
    n, c = x_shape[:2]
    if choose_path(kernel, pb, pe, c // group, group) != "im2col":
        return []
    K, P = math.prod(kernel), math.prod(out_shape)
    sizes = []
    if any(pb) or any(pe):
        padded = [d + b + e for d, b, e in zip(x_shape[2:], pb, pe)]
        sizes.append(n * c * math.prod(padded) * itemsize)
    sizes.append(im2col_chunk(n, c, K, P, itemsize) * c * K * P * itemsize)
    return sizes


def conv_core(x: np.ndarray, wpack: np.ndarray, group: int, kernel, strides, dilations,
              pb, pe, out_shape, *, pad_value=0, path: str | None = None,
              workspace: Sequence[np.ndarray] = ()) -> tuple[np.ndarray, str]:
    """Grouped N-D convolution in ``x``'s dtype (already the compute dtype).

    Args:
        x: ``(N, C, *spatial)``.
        wpack: ``(G, M/G, C/G * prod(kernel))``, the GEMM layout of the weight.
        out_shape: output spatial shape (from :func:`conv_geometry`).

    Returns:
        ``(y, path)`` with ``y`` ``(N, M, *out_shape)`` and the chosen path:
        ``"1x1"`` (plain GEMM), ``"depthwise"`` (one multiply-add per kernel tap)
        or ``"im2col"`` (one GEMM per group over a patch matrix).

    ``workspace``: the buffers :func:`conv_workspace` sized, handed over by the
    executor; the padded input and the patch matrix are built in them (numpy
    allocates privately only when none are given or they are too small).
    """
    n, c = x.shape[:2]
    g, mg, ck = wpack.shape
    cg = c // group
    K = math.prod(kernel)
    P = math.prod(out_shape)
    if path is None:
        path = choose_path(kernel, pb, pe, cg, group)
    if len(kernel) == 2 and path != "1x1" and pad_value == 0 and COMPILED and \
            x.dtype in (np.float32, np.float64):
        y = _compiled_2d(x, wpack, group, kernel, strides, dilations, pb, out_shape, path, workspace)
        if y is not None:
            tracing.kernel_variant("conv_impl", "compiled")
            return y, path
    if path == "1x1":
        xs = x[(Ellipsis, *(slice(0, (o - 1) * s + 1, s) for o, s in zip(out_shape, strides)))]
        y = np.empty((n, g, mg, P), dtype=x.dtype)
        conv_gemm(wpack, xs.reshape(n, g, cg, P), y)
        return y.reshape(n, g * mg, *out_shape), path
    ws = list(workspace) if path == "im2col" else []
    padded = any(pb) or any(pe)
    if padded and ws and ws[0].nbytes >= _padded_bytes(x, pb, pe):
        shape = (*x.shape[:2], *(d + b + e for d, b, e in zip(x.shape[2:], pb, pe)))
        xp = ws.pop(0)[:math.prod(shape) * x.dtype.itemsize].view(x.dtype).reshape(shape)
        xp.fill(pad_value)
        xp[(Ellipsis, *(slice(b, b + d) for b, d in zip(pb, x.shape[2:])))] = x
    else:
        if padded and ws:
            ws.pop(0)
        xp = pad_spatial(x, pb, pe, pad_value)
    if path == "depthwise":
        w = wpack.reshape(g, mg, K)
        acc = np.zeros((n, g, mg, *out_shape), dtype=x.dtype)
        bshape = (g, mg) + (1,) * len(out_shape)
        for _, t, sl in tap_slices(kernel, out_shape, strides, dilations):
            acc += xp[(slice(None), slice(None), *sl)][:, :, None] * w[:, :, t].reshape(bshape)
        return acc.reshape(n, g * mg, *out_shape), path
    view = sliding_view(xp, out_shape, kernel, strides, dilations)  # (N, C, *k, *out)
    y = np.empty((n, g, mg, P), dtype=x.dtype)
    step = im2col_chunk(n, c, K, P, x.dtype.itemsize)
    need = step * c * K * P * x.dtype.itemsize
    colbuf = ws[0][:need].view(x.dtype) if ws and ws[0].nbytes >= need else None
    for n0 in range(0, n, step):
        k = min(step, n - n0)
        if colbuf is not None:  # patch matrix built in the handed-over workspace
            cols = colbuf[:k * c * K * P].reshape(k, c, *kernel, *out_shape)
            np.copyto(cols, view[n0:n0 + k])
            cols = cols.reshape(k, g, cg * K, P)
        else:
            cols = view[n0:n0 + k].reshape(-1, g, cg * K, P)
        conv_gemm(wpack, cols, y[n0:n0 + k])
    return y.reshape(n, g * mg, *out_shape), path


#: use the compiled (numba) 2-D im2col / depthwise paths when numba is there
COMPILED = True
#: a convolution's GEMMs below this many flops (all images and groups
#: together) run on the calling thread alone; larger ones are split into
#: column blocks run by :func:`._parallel.run_chunks` on the session's
#: intra-op threads. Either way each BLAS call runs on one BLAS thread
#: (:class:`._threads.serial_blas`): OpenBLAS's own threaded calls, each a
#: wake-up and a barrier with spinning workers, made resnetish at 2 threads
#: take 55 ms a run vs 5.5 ms at 1 on this 2-core machine
GEMM_PARALLEL_MIN_FLOPS = 1 << 22
#: column-block width of the parallel GEMM (a multiple of the BLAS tile width)
GEMM_BLOCK_MIN = 128
#: where the column blocks are fewer than the chunks wanted (planes under
#: ``threads x GEMM_BLOCK_MIN`` pixels: the late layers, 7x7 / 14x14), the
#: output channels are split too, in blocks of at least this many rows (before,
#: a 7x7 plane's GEMM was one block: resnet50's 512-channel 3x3 convs and its
#: 1x1 on the GEMM path ran 1.04-1.07x faster at two threads than at one)
GEMM_ROW_BLOCK_MIN = 32
#: the compiled patch building only pays when it runs on several threads: at
#: one thread it measured 2-3x slower than numpy's strided copy here (numba
#: 0.61, round 3), and split over 2 threads still slower than numpy on one, so
#: by default im2col stays numpy (the tests set this to 1 to check the kernel)
IM2COL_MIN_THREADS = 1 << 30
#: ... and only for patch matrices of at least this many elements (smaller
#: ones would build serially, where numpy's copy is faster)
IM2COL_MIN_WORK = 1 << 18


def conv_gemm(wpack: np.ndarray, cols: np.ndarray, out: np.ndarray) -> None:
    """``out[i, j] = wpack[j] @ cols[i, j]`` for a convolution.

    Args:
        wpack: ``(G, Mg, Ck)``; cols: ``(k, G, Ck, P)``; out: ``(k, G, Mg, P)``,
            all one float dtype, ``out`` with unit inner stride.
    """
    from . import _parallel, _threads
    k, g, ck, P = cols.shape
    mg = wpack.shape[1]
    threads = _threads.current()
    flops = 2 * k * g * mg * ck * P
    with _threads.serial_blas():
        if threads <= 1 or flops < GEMM_PARALLEL_MIN_FLOPS:
            np.matmul(wpack, cols, out=out)
            return
        want = _parallel.CHUNKS_PER_THREAD * threads
        per_product = max(1, -(-want // (k * g)))
        bw = max(GEMM_BLOCK_MIN, -(-P // per_product))
        bw = -(-bw // 16) * 16
        nb = -(-P // bw)
        nr = max(1, min(-(-want // (k * g * nb)), mg // GEMM_ROW_BLOCK_MIN))
        rh = -(-mg // nr)
        nr = -(-mg // rh)
        blocks = nr * nb
        total = k * g * blocks

        def chunk(t: int) -> None:
            i, rest = divmod(t, g * blocks)
            j, rest = divmod(rest, blocks)
            r, b = divmod(rest, nb)
            p0, r0 = b * bw, r * rh
            np.matmul(wpack[j, r0:r0 + rh], cols[i, j, :, p0:p0 + bw],
                      out=out[i, j, r0:r0 + rh, p0:p0 + bw])

        if total > 8 * want:  # many small products (grouped convs): runs of them per chunk
            per = -(-total // want)

            def chunk_run(t: int, _one=chunk) -> None:
                for u in range(t * per, min(total, (t + 1) * per)):
                    _one(u)
            _parallel.run_chunks(chunk_run, -(-total // per), threads)
        else:
            _parallel.run_chunks(chunk, total, threads)


def _compiled_2d(x, wpack, group, kernel, strides, dilations, pb, out_shape, path, workspace):
    """The 2-D ``im2col`` / ``depthwise`` paths with the patch matrix or the
    direct depthwise sum compiled (:mod:`._conv_numba`); ``None`` without numba
    (and for im2col on fewer than :data:`IM2COL_MIN_THREADS` threads)."""
    from . import _conv_numba as cn
    if not cn.HAVE_NUMBA:
        return None
    n, c = x.shape[:2]
    g, mg, ck = wpack.shape
    if path == "im2col" and (cn.num_threads() < IM2COL_MIN_THREADS or
                             n * c * math.prod(kernel) * math.prod(out_shape) < IM2COL_MIN_WORK):
        return None  # numpy's strided copy is the faster serial patch building
    if path == "depthwise":
        w = wpack.reshape(g * mg, 1, *kernel)
        return cn.depthwise2d(x, w, strides, dilations, pb, out_shape)
    K, P = math.prod(kernel), math.prod(out_shape)
    step = im2col_chunk(n, c, K, P, x.dtype.itemsize)
    need = step * c * K * P * x.dtype.itemsize
    ws = [b for b in workspace if b.nbytes >= need]
    colbuf = ws[-1][:need].view(x.dtype) if ws else np.empty(step * c * K * P, x.dtype)
    y = np.empty((n, g, mg, P), dtype=x.dtype)
    for n0 in range(0, n, step):
        k = min(step, n - n0)
        cols = cn.im2col2d(x[n0:n0 + k], kernel, strides, dilations, pb, out_shape,
                           colbuf[:k * c * K * P])
        conv_gemm(wpack, cols.reshape(k, g, (c // g) * K, P), y[n0:n0 + k])
    return y.reshape(n, g * mg, *out_shape)


def _padded_bytes(x: np.ndarray, pb, pe) -> int:
    return math.prod((*x.shape[:2], *(d + b + e for d, b, e in zip(x.shape[2:], pb, pe)))) \
        * x.dtype.itemsize


def reflect(x: np.ndarray, lo: np.ndarray | float, hi: np.ndarray | float) -> np.ndarray:
    """Reflect coordinates into ``[lo, hi]`` by the nearer border, repeatedly
    (GridSample's reflection padding)."""
    rng = hi - lo
    below = x < lo
    above = x > hi
    dx = np.where(below, lo - x, x - hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(rng > 0, np.trunc(dx / np.where(rng > 0, rng, 1)), 0)
    r = dx - k * rng
    even = (k % 2) == 0
    res = np.where(below, np.where(even, lo + r, hi - r), np.where(even, hi - r, lo + r))
    return np.where(below | above, res, x)
