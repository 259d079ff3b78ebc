"""Reductions and arg-reductions.

Spec: ONNX ReduceSum (1, 11, 13), ReduceMean / ReduceProd / ReduceL1 / ReduceL2 /
ReduceSumSquare (1, 11, 13, 18), ReduceMax / ReduceMin (1, 11, 12, 13, 18, 20),
ReduceLogSum / ReduceLogSumExp (1, 11, 13, 18, 28), ArgMax / ArgMin (1, 11, 12, 13).

``axes`` is an attribute before ReduceSum-13 / the others' opset 18 and an
optional int64 input from then on; absent or empty axes reduce every axis unless
``noop_with_empty_axes`` is set (then nothing is reduced: the op's elementwise
part alone applies, e.g. ``|x|`` for ReduceL1, as onnxruntime does). Reductions over an
empty set give the op's identity element (0 for sums, 1 for products, -inf for
max / log-sums, +inf for min, NaN for the mean). float16 / bfloat16 accumulate
in float32; the output keeps the input dtype.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ._reduce_util import norm_axes, norm_axis, upcast
from .registry import cpu_kernel


def _extreme(dtype: np.dtype, largest: bool):
    """The identity of max (``largest=False``) or min (``largest=True``) for ``dtype``."""
    if dtype == np.bool_:
        return bool(largest)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.max if largest else info.min
    return np.inf if largest else -np.inf


def _max(x, axes, keepdims):
    if x.size == 0:
        return np.max(x, axis=axes, keepdims=keepdims, initial=_extreme(x.dtype, False))
    return np.max(x, axis=axes, keepdims=keepdims)


def _min(x, axes, keepdims):
    if x.size == 0:
        return np.min(x, axis=axes, keepdims=keepdims, initial=_extreme(x.dtype, True))
    return np.min(x, axis=axes, keepdims=keepdims)


def _sum(x, axes, keepdims):
    return np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


#: ReduceMean over trailing axes of a C-contiguous float32 / float64 tensor
#: (a global average pool) as one matrix-vector product with a ones vector
#: (BLAS) instead of ``np.mean``'s reduction loop
MEAN_DOT = True
_ONES: dict = {}


def _mean_dot(x: np.ndarray, axes: tuple, keepdims: bool):
    """``x``'s mean over ``axes`` when they are its last ones (``x`` C-contiguous
    float32 / float64, non-empty, at least one axis kept) by ``x.reshape(-1,
    k) @ ones(k) / k``, else None. Within float rounding of ``np.mean``
    (another summation order)."""
    nd = x.ndim
    r = len(axes)
    if not MEAN_DOT or r == 0 or r >= nd or x.dtype not in (np.float32, np.float64) \
            or not x.flags.c_contiguous or tuple(axes) != tuple(range(nd - r, nd)):
        return None
    k = 1
    for a in axes:
        k *= x.shape[a]
    if k < 2 or x.size == 0:
        return None
    ones = _ONES.get((k, x.dtype))
    if ones is None:
        ones = _ONES[(k, x.dtype)] = np.ones(k, x.dtype)
        if len(_ONES) > 64:
            _ONES.clear()
    y = x.reshape(-1, k) @ ones
    y /= x.dtype.type(k)
    keep = x.shape[:nd - r]
    return y.reshape(keep + (1,) * r if keepdims else keep)


def _mean(x, axes, keepdims):
    y = _mean_dot(x, axes, keepdims)
    if y is not None:
        return y
    if x.size == 0:  # 0 / 0: NaN for floats, without numpy's empty-slice warning
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype) / x.dtype.type(0)
    return np.mean(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _prod(x, axes, keepdims):
    return np.prod(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _l1(x, axes, keepdims):
    return np.sum(np.abs(x), axis=axes, keepdims=keepdims, dtype=x.dtype)


def _sum_square(x, axes, keepdims):
    return np.sum(np.square(x), axis=axes, keepdims=keepdims, dtype=x.dtype)


def _l2(x, axes, keepdims):
    s = np.sum(np.square(x), axis=axes, keepdims=keepdims, dtype=x.dtype)
    if x.dtype.kind in "iu":
        return np.sqrt(s.astype(np.float64))
    return np.sqrt(s)


def _log_sum(x, axes, keepdims):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype))


def _log_sum_exp(x, axes, keepdims):
    m = _max(x, axes, True)
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True))
    out = s + m
    if not keepdims:
        out = np.squeeze(out, axis=axes)
    return out


def _reduce(compute: Callable, data: np.ndarray, axes_input, axes_attr, keepdims: int,
            noop_with_empty_axes: int) -> np.ndarray:
    if axes_input is not None:
        axes = [int(a) for a in np.asarray(axes_input).reshape(-1)]
    elif axes_attr is not None:
        axes = list(axes_attr)
    else:
        axes = []
    if not axes:
        # noop: reduce over no axis (the identity for Sum/Mean/Max..., |x| for L1, x^2 ...)
        ax = () if noop_with_empty_axes else tuple(range(data.ndim))
    else:
        ax = norm_axes(axes, data.ndim)
    x = upcast(data)
    out = compute(x, ax, bool(keepdims))
    return np.asarray(out).astype(data.dtype, copy=False)


def _register(name: str, compute: Callable, since: tuple[int, ...], input_since: int) -> None:
    def kernel(data, axes_input=None, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        return _reduce(compute, data, axes_input, axes, keepdims, noop_with_empty_axes)

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = (f"ONNX {name} (opsets {', '.join(map(str, since))}); axes is an "
                      f"input from opset {input_since} on.")
    cpu_kernel(name, since=since)(kernel)


_register("ReduceSum", _sum, (1, 11, 13), 13)
_register("ReduceMean", _mean, (1, 11, 13, 18), 18)
_register("ReduceProd", _prod, (1, 11, 13, 18), 18)
_register("ReduceL1", _l1, (1, 11, 13, 18), 18)
_register("ReduceL2", _l2, (1, 11, 13, 18), 18)
_register("ReduceSumSquare", _sum_square, (1, 11, 13, 18), 18)
_register("ReduceMax", _max, (1, 11, 12, 13, 18, 20), 18)
_register("ReduceMin", _min, (1, 11, 12, 13, 18, 20), 18)
_register("ReduceLogSum", _log_sum, (1, 11, 13, 18, 28), 18)
_register("ReduceLogSumExp", _log_sum_exp, (1, 11, 13, 18, 28), 18)


# ------------------------------------------------------------------- arg-reductions

def _arg(fn: Callable, data: np.ndarray, axis: int, keepdims: int,
         select_last_index: int) -> np.ndarray:
    ax = norm_axis(axis, data.ndim)
    if data.shape[ax] == 0:
        raise ValueError(f"cannot take an arg-reduction over empty axis {ax} of shape "
                         f"{data.shape}")
    x = upcast(data) if data.dtype.kind == "V" else data
    if select_last_index:
        n = data.shape[ax]
        idx = (n - 1) - fn(np.flip(x, axis=ax), axis=ax)
    else:
        idx = fn(x, axis=ax)
    if keepdims:
        idx = np.expand_dims(idx, ax)
    return np.asarray(idx, dtype=np.int64)


@cpu_kernel("ArgMax", since=(1, 11, 12, 13))
def ArgMax(data, *, axis=0, keepdims=1, select_last_index=0):
    """ONNX ArgMax (opsets 1, 11, 12, 13): int64 indices of the first (or last) maximum."""
    return _arg(np.argmax, data, axis, keepdims, select_last_index)


@cpu_kernel("ArgMin", since=(1, 11, 12, 13))
def ArgMin(data, *, axis=0, keepdims=1, select_last_index=0):
    """ONNX ArgMin (opsets 1, 11, 12, 13): int64 indices of the first (or last) minimum."""
    return _arg(np.argmin, data, axis, keepdims, select_last_index)
