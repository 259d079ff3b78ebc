"""Gather / scatter / selection kernels.

Indices follow the ONNX rules: negative values count from the end of their
dimension; anything outside ``[-dim, dim)`` raises ``IndexError``. NonZero,
Unique and Compress have data-dependent output shapes and return
:class:`~actorrt.providers.KernelSizedOutput`.

Spec: ONNX Gather, GatherElements, GatherND, Scatter, ScatterElements,
ScatterND, OneHot, NonZero, Unique, TopK, Compress, TensorScatter (every
since-version up to opset 28).
"""

from __future__ import annotations

import math

import numpy as np

from .._contract import KernelSizedOutput
from ._index_util import as_int, as_scalar, norm_axis, norm_indices
from .registry import cpu_kernel

_NO_FLOPS = {"flops": lambda node: 0.0}


def _sized(a: np.ndarray) -> KernelSizedOutput:
    a = np.ascontiguousarray(a)
    return KernelSizedOutput(data=a.reshape(-1), shape=tuple(a.shape), dtype=a.dtype)


# ------------------------------------------------------------------- gathers

@cpu_kernel("Gather", since=(1, 11, 13), **_NO_FLOPS)
def Gather(data, indices, *, axis=0):
    """ONNX Gather (opsets 1-13): ``np.take`` along ``axis``; output shape
    ``data.shape[:axis] + indices.shape + data.shape[axis+1:]``."""
    ax = norm_axis(axis, data.ndim, what="Gather axis")
    if isinstance(indices, np.ndarray) and indices.dtype.kind == "i":
        # np.take's bounds rule is ONNX's ([-dim, dim), negatives from the end): one
        # call instead of an index pass first (an embedding row in ~1 instead of ~3 µs)
        try:
            return np.asarray(np.take(data, indices, axis=ax))
        except IndexError:
            # raises the IndexError naming the bad index and the valid range
            norm_indices(indices, data.shape[ax], what="Gather indices")
            raise
    idx = norm_indices(indices, data.shape[ax], what="Gather indices")
    return np.asarray(np.take(data, idx, axis=ax))


@cpu_kernel("GatherElements", since=(11, 13), **_NO_FLOPS)
def GatherElements(data, indices, *, axis=0):
    """ONNX GatherElements (opsets 11, 13): ``out[i][j] = data[indices[i][j]][j]``
    (for axis 0); output shaped like ``indices``."""
    ax = norm_axis(axis, data.ndim, what="GatherElements axis")
    idx = norm_indices(indices, data.shape[ax], what="GatherElements indices")
    if idx.ndim != data.ndim:
        raise ValueError(f"GatherElements: indices rank {idx.ndim} != data rank {data.ndim}")
    if any(i != ax and s > d for i, (s, d) in enumerate(zip(idx.shape, data.shape))):
        raise IndexError(f"GatherElements: indices shape {idx.shape} exceeds data {data.shape}")
    key = tuple(slice(None) if i == ax else slice(0, s) for i, s in enumerate(idx.shape))
    return np.take_along_axis(data[key], idx, axis=ax)


@cpu_kernel("GatherND", since=(11, 12, 13), **_NO_FLOPS)
def GatherND(data, indices, *, batch_dims=0):
    """ONNX GatherND (opsets 11-13): gathers slices of ``data`` addressed by the
    last axis of ``indices`` (length ``k``), after ``batch_dims`` shared leading
    axes. Output ``indices.shape[:-1] + data.shape[batch_dims + k:]``."""
    b = int(batch_dims)
    idx = np.asarray(indices)
    if idx.ndim < 1 or idx.ndim <= b or data.ndim <= b:
        raise ValueError(f"GatherND: ranks data {data.ndim}, indices {idx.ndim} too small "
                         f"for batch_dims {b}")
    k = idx.shape[-1]
    bshape = tuple(data.shape[:b])
    if tuple(idx.shape[:b]) != bshape:
        raise ValueError(f"GatherND: batch dims differ: data {data.shape}, indices {idx.shape}")
    if k > data.ndim - b:
        raise ValueError(f"GatherND: index depth {k} exceeds data rank {data.ndim} - {b}")
    nb = math.prod(bshape)
    d = data.reshape((nb,) + tuple(data.shape[b:]))
    q = tuple(idx.shape[b:-1])
    ii = idx.reshape(nb, math.prod(q), k)
    cols = [norm_indices(ii[..., j], d.shape[1 + j], what="GatherND indices") for j in range(k)]
    out = d[(np.arange(nb)[:, None], *cols)]
    return out.reshape(bshape + q + tuple(data.shape[b + k:]))


# ------------------------------------------------------------------ scatters

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_into(out: np.ndarray, key: tuple, updates: np.ndarray, reduction: str) -> None:
    if reduction == "none":
        out[key] = updates
    elif reduction in _REDUCE:
        _REDUCE[reduction].at(out, key, updates)
    else:
        raise ValueError(f"unsupported reduction {reduction!r}")


def _scatter_elements(data, indices, updates, axis, reduction, op):
    ax = norm_axis(axis, data.ndim, what=f"{op} axis")
    idx = norm_indices(indices, data.shape[ax], what=f"{op} indices")
    if idx.shape != updates.shape or idx.ndim != data.ndim:
        raise ValueError(f"{op}: indices {idx.shape} and updates {updates.shape} must have "
                         f"the same shape and data's rank {data.ndim}")
    if any(i != ax and s > d for i, (s, d) in enumerate(zip(idx.shape, data.shape))):
        raise IndexError(f"{op}: indices shape {idx.shape} exceeds data {data.shape}")
    key = list(np.indices(idx.shape, sparse=True))
    key[ax] = idx
    out = data.copy()
    _scatter_into(out, tuple(key), updates, reduction)
    return out


@cpu_kernel("Scatter", since=(9, 11), **_NO_FLOPS)
def Scatter(data, indices, updates, *, axis=0):
    """ONNX Scatter (opsets 9, 11; deprecated): ScatterElements without reduction."""
    return _scatter_elements(data, indices, updates, axis, "none", "Scatter")


@cpu_kernel("ScatterElements", since=(11, 13, 16, 18), **_NO_FLOPS)
def ScatterElements(data, indices, updates, *, axis=0, reduction="none"):
    """ONNX ScatterElements (opsets 11-18): a copy of ``data`` with
    ``out[indices[i][j]][j] (op)= updates[i][j]`` (axis 0), reduction
    none/add/mul/max/min."""
    return _scatter_elements(data, indices, updates, axis, reduction, "ScatterElements")


@cpu_kernel("ScatterND", since=(11, 13, 16, 18), **_NO_FLOPS)
def ScatterND(data, indices, updates, *, reduction="none"):
    """ONNX ScatterND (opsets 11-18): a copy of ``data`` with the slices addressed
    by ``indices[..., :k]`` set (or reduced) from ``updates`` of shape
    ``indices.shape[:-1] + data.shape[k:]``."""
    idx = np.asarray(indices)
    k = idx.shape[-1] if idx.ndim else 0
    if idx.ndim < 1 or k > data.ndim:
        raise ValueError(f"ScatterND: indices {idx.shape} do not fit data {data.shape}")
    want = tuple(idx.shape[:-1]) + tuple(data.shape[k:])
    if tuple(updates.shape) != want:
        raise ValueError(f"ScatterND: updates shape {updates.shape}, expected {want}")
    key = tuple(norm_indices(idx[..., j], data.shape[j], what="ScatterND indices")
                for j in range(k))
    out = data.copy()
    _scatter_into(out, key, updates, reduction)
    return out


@cpu_kernel("TensorScatter", since=24, **_NO_FLOPS)
def TensorScatter(past_cache, update, write_indices=None, *, mode="linear", axis=-2):
    """ONNX TensorScatter (opset 24): a copy of ``past_cache`` with ``update``
    written along ``axis`` from ``write_indices[b]`` (0 by default) for each batch
    ``b``; ``mode="circular"`` wraps modulo the cache length."""
    ax = norm_axis(axis, past_cache.ndim, what="TensorScatter axis")
    if ax == 0:
        raise ValueError("TensorScatter: axis must not be the batch axis 0")
    if update.ndim != past_cache.ndim or any(
            i != ax and u != p for i, (u, p) in enumerate(zip(update.shape, past_cache.shape))):
        raise ValueError(f"TensorScatter: update {update.shape} does not fit cache "
                         f"{past_cache.shape} outside axis {ax}")
    nb, m, s = past_cache.shape[0], past_cache.shape[ax], update.shape[ax]
    if write_indices is None:
        start = np.zeros(nb, dtype=np.int64)
    else:
        start = np.asarray(write_indices, dtype=np.int64).reshape(-1)
        if start.shape[0] != nb:
            raise ValueError(f"TensorScatter: {start.shape[0]} write_indices for batch {nb}")
    pos = start[:, None] + np.arange(s, dtype=np.int64)[None, :]
    if mode == "circular":
        pos = pos % m if m else pos
    elif mode == "linear":
        if pos.size and (pos.min() < 0 or pos.max() >= m):
            raise IndexError(f"TensorScatter: writes reach index {int(pos.max())} of a cache "
                             f"of length {m} (linear mode)")
    else:
        raise ValueError(f"TensorScatter: unknown mode {mode!r}")
    out = past_cache.copy()
    view = np.moveaxis(out, ax, 1)
    view[np.arange(nb)[:, None], pos] = np.moveaxis(update, ax, 1)
    return out


# ------------------------------------------------------------------ creators

@cpu_kernel("OneHot", since=(9, 11, 28), **_NO_FLOPS)
def OneHot(indices, depth, values, *, axis=-1):
    """ONNX OneHot (opsets 9-28): ``values[1]`` where ``index == position`` on a new
    axis of size ``depth`` at ``axis``, ``values[0]`` elsewhere (indices outside
    ``[-depth, depth)`` give an all-off row). Output dtype of ``values``."""
    dep = as_scalar(depth)
    dep = int(np.floor(dep)) if np.asarray(dep).dtype.kind == "f" else int(dep)
    if dep < 1:
        raise ValueError(f"OneHot: depth must be positive, got {dep}")
    vals = np.asarray(values).reshape(-1)
    if vals.size != 2:
        raise ValueError(f"OneHot: values needs [off, on], got {vals.size} elements")
    idx = np.asarray(indices)
    idx = (np.trunc(idx) if idx.dtype.kind == "f" else idx).astype(np.int64)
    idx = np.where(idx < 0, idx + dep, idx)
    ax = norm_axis(axis, idx.ndim + 1, what="OneHot axis")
    hot = np.moveaxis(idx[..., None] == np.arange(dep, dtype=np.int64), -1, ax)
    return np.where(hot, vals[1:2], vals[0:1]).astype(vals.dtype, copy=False)


# ----------------------------------------------------------- data-dependent

@cpu_kernel("NonZero", since=(9, 13), kernel_sized_outputs=True, **_NO_FLOPS)
def NonZero(X):
    """ONNX NonZero (opsets 9, 13): int64 ``(rank, n)`` coordinates of the non-zero
    elements in row-major order (a scalar counts as rank 1)."""
    x = X.reshape(1) if X.ndim == 0 else X
    nz = np.nonzero(x)
    out = np.empty((x.ndim, nz[0].size), dtype=np.int64)
    for i, c in enumerate(nz):
        out[i] = c
    return _sized(out)


@cpu_kernel("Compress", since=(9, 11, 28), kernel_sized_outputs=True, **_NO_FLOPS)
def Compress(input, condition, *, axis=None):
    """ONNX Compress (opsets 9-28): the slices along ``axis`` (of the flattened
    input without one) whose ``condition`` is true; a shorter condition selects
    nothing beyond its length."""
    x = input.reshape(-1) if axis is None else input
    ax = 0 if axis is None else norm_axis(axis, input.ndim, what="Compress axis")
    cond = np.asarray(condition).astype(bool, copy=False).reshape(-1)
    if cond.size > x.shape[ax]:
        if cond[x.shape[ax]:].any():
            raise IndexError(f"Compress: condition selects index beyond dim {x.shape[ax]}")
        cond = cond[:x.shape[ax]]
    return _sized(np.compress(cond, x, axis=ax))


def _sort_key(x: np.ndarray) -> np.ndarray:
    """An order-preserving numpy-sortable version of ``x`` (low-precision floats
    widened to float32)."""
    if x.dtype.kind not in "biufcOUSM" or x.dtype == np.float16:
        return x.astype(np.float32)
    return x


@cpu_kernel("Unique", since=(11, 28), multi_output=True, kernel_sized_outputs=True, **_NO_FLOPS)
def Unique(X, *, axis=None, sorted=1):
    """ONNX Unique (opsets 11, 28): unique values (or sub-tensors along ``axis``),
    sorted or in first-occurrence order; returns ``Y``, first ``indices``,
    ``inverse_indices`` and ``counts`` (int64)."""
    if axis is None:
        flat = X.reshape(-1)
        _, first, inv, counts = np.unique(_sort_key(flat), return_index=True,
                                          return_inverse=True, return_counts=True)
    else:
        ax = norm_axis(axis, X.ndim, what="Unique axis")
        key = np.moveaxis(_sort_key(X), ax, 0)
        key = np.ascontiguousarray(key).reshape(X.shape[ax], -1)
        _, first, inv, counts = np.unique(key, axis=0, return_index=True,
                                          return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    if not sorted:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inv = first[order], counts[order], rank[inv]
    y = flat[first] if axis is None else np.take(X, first, axis=ax)
    i64 = lambda a: np.asarray(a, dtype=np.int64)  # noqa: E731
    return _sized(y), _sized(i64(first)), _sized(i64(inv)), _sized(i64(counts))


@cpu_kernel("TopK", since=(1, 10, 11, 24), multi_output=True)
def TopK(X, K=None, *, axis=-1, largest=1, sorted=1, node=None):
    """ONNX TopK (opsets 1-24): the ``k`` largest (or smallest) values along
    ``axis`` and their int64 indices; equal values keep the lower index first.
    ``k`` is an attribute at opset 1."""
    k = node.attrs["k"] if node is not None and node.opset < 10 else as_int(K)
    ax = norm_axis(axis, X.ndim, what="TopK axis")
    n = X.shape[ax]
    if not 0 <= k <= n:
        raise ValueError(f"TopK: k={k} out of range for axis of size {n}")
    key = _sort_key(X)
    if largest:
        # stable descending with ties in ascending index: sort the reversed axis
        order = np.argsort(np.flip(key, ax), axis=ax, kind="stable")
        order = (n - 1) - np.flip(order, ax)
    else:
        order = np.argsort(key, axis=ax, kind="stable")
    idx = np.take(order, np.arange(k), axis=ax).astype(np.int64, copy=False)
    return np.take_along_axis(X, idx, axis=ax), idx
