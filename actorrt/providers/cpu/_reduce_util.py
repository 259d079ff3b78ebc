"""Shared helpers of the reduction, normalization and softmax kernels: axis
normalization and the accumulation dtype of low-precision floats."""

from __future__ import annotations

from typing import Iterable

import ml_dtypes
import numpy as np

__all__ = ["LOW_PRECISION_FLOATS", "acc_dtype", "norm_axis", "norm_axes", "upcast"]

#: Float dtypes numpy reduces poorly (or slowly): accumulate them in float32.
LOW_PRECISION_FLOATS = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})


def acc_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype to compute in for inputs of ``dtype``: float32 for float16 and
    bfloat16, the dtype itself otherwise."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in LOW_PRECISION_FLOATS else dtype


def upcast(x: np.ndarray) -> np.ndarray:
    """``x`` in its accumulation dtype (no copy when it already is)."""
    return x.astype(acc_dtype(x.dtype), copy=False)


def norm_axis(axis: int, rank: int) -> int:
    """``axis`` in ``[0, rank)``.

    Raises:
        ValueError: ``axis`` is outside ``[-rank, rank)``.
    """
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for a tensor of rank {rank}")
    return axis % rank if rank else 0


def norm_axes(axes: Iterable[int], rank: int) -> tuple[int, ...]:
    """Sorted, deduplicated non-negative axes.

    Raises:
        ValueError: an axis outside ``[-rank, rank)``.
    """
    out = set()
    for a in axes:
        a = int(a)
        if not -rank <= a < rank:
            raise ValueError(f"axis {a} is out of range for a tensor of rank {rank}")
        out.add(a % rank)
    return tuple(sorted(out))
