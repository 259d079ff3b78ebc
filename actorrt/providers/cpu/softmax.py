"""Softmax, LogSoftmax and Hardmax.

Spec: ONNX Softmax / LogSoftmax / Hardmax (opsets 1, 11, 13). Before opset 13 the
input is coerced to 2-D ``(prod(shape[:axis]), prod(shape[axis:]))`` (``axis``
default 1) and the op runs over the second dim; from 13 it runs over the single
``axis`` (default -1). float16 / bfloat16 compute in float32; the output keeps
the input dtype and shape. float32 over the last axis is one compiled pass
per row when numba is installed (:mod:`._softmax_numba`), else numpy.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ._reduce_util import norm_axis, upcast
from .registry import cpu_kernel


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    if x.dtype == np.float32 and (axis == x.ndim - 1 or axis == -1):
        from . import _softmax_numba, _threads  # numba loads on first use, not at import
        out = np.array(x, order="C")  # the fresh output, normalized in place
        # rows split over the compiled partners at 2+ threads (large enough)
        if _softmax_numba.softmax_rows_f32(out, threads=_threads.current()):
            return out
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    s = x - np.max(x, axis=axis, keepdims=True)
    s -= np.log(np.sum(np.exp(s), axis=axis, keepdims=True))
    return s


def _hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    out = np.zeros(x.shape, dtype=x.dtype)
    np.put_along_axis(out, idx, 1, axis=axis)
    return out


def _apply(fn: Callable, x: np.ndarray, axis: int | None, opset: int) -> np.ndarray:
    if x.size == 0:
        return np.empty(x.shape, dtype=x.dtype)
    xa = upcast(x)
    if opset < 13:
        ax = norm_axis(1 if axis is None else axis, max(x.ndim, 1))
        rows = int(np.prod(x.shape[:ax], dtype=np.int64))
        out = fn(xa.reshape(rows, -1), 1).reshape(x.shape)
    else:
        ax = norm_axis(-1 if axis is None else axis, x.ndim)
        if ax < x.ndim - 1 and all(d == 1 for d in x.shape[ax + 1:]):
            # only size-1 dims after the axis: the same rows as the last axis
            # (a classifier's (N, C, 1, 1)), so the compiled row pass applies
            out = fn(xa.reshape(x.shape[:ax + 1]), ax).reshape(x.shape)
        else:
            out = fn(xa, ax)
    return out.astype(x.dtype, copy=False)


@cpu_kernel("Softmax", since=(1, 11, 13))
def Softmax(input, *, axis=None, node=None):
    """ONNX Softmax (opsets 1, 11, 13)."""
    return _apply(_softmax, input, axis, node.opset)


@cpu_kernel("LogSoftmax", since=(1, 11, 13))
def LogSoftmax(input, *, axis=None, node=None):
    """ONNX LogSoftmax (opsets 1, 11, 13)."""
    return _apply(_log_softmax, input, axis, node.opset)


@cpu_kernel("Hardmax", since=(1, 11, 13))
def Hardmax(input, *, axis=None, node=None):
    """ONNX Hardmax (opsets 1, 11, 13): 1 at the first maximum along the axis, else 0."""
    return _apply(_hardmax, input, axis, node.opset)
