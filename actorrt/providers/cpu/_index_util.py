"""Helpers shared by the tensor / indexing / NMS kernels: axis and index
normalisation with the ONNX rules, scalar reads of small shape-like inputs."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["norm_axis", "norm_axes", "norm_indices", "as_int", "as_ints", "as_scalar"]


def norm_axis(axis: int, rank: int, *, what: str = "axis") -> int:
    """``axis`` in ``[-rank, rank)`` mapped to ``[0, rank)``.

    Raises:
        ValueError: ``axis`` is out of range.
    """
    axis = int(axis)
    if not -rank <= axis < rank:
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int, *, what: str = "axes") -> tuple[int, ...]:
    """Every axis normalised with :func:`norm_axis`; duplicates refused.

    Raises:
        ValueError: an axis is out of range or repeated.
    """
    out = tuple(norm_axis(a, rank, what=what) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"{what} {list(axes)} repeat an axis")
    return out


def norm_indices(indices: np.ndarray, dim: int, *, what: str = "indices") -> np.ndarray:
    """Integer ``indices`` into a dim of size ``dim`` as int64, negative ones
    counted from the end (``i + dim``).

    Raises:
        IndexError: an index lies outside ``[-dim, dim)``.
    """
    idx = np.asarray(indices)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, got {idx.dtype}")
    idx = idx.astype(np.int64, copy=False)
    if idx.size == 0:
        return idx
    lo, hi = int(idx.min()), int(idx.max())
    if lo < -dim or hi >= dim:
        bad = lo if lo < -dim else hi
        raise IndexError(f"{what} value {bad} is out of range for a dimension of size {dim} "
                         f"(valid: [{-dim}, {dim - 1}])")
    if lo < 0:
        idx = np.where(idx < 0, idx + dim, idx)
    return idx


def as_int(x: Any) -> int:
    """A one-element tensor (or Python number) as a Python int."""
    a = np.asarray(x)
    if a.size != 1:
        raise ValueError(f"expected a single value, got shape {a.shape}")
    return int(a.reshape(-1)[0])


def as_ints(x: Any) -> list[int]:
    """A 0-d or 1-d integer tensor (or list) as a list of Python ints."""
    return [int(v) for v in np.asarray(x).reshape(-1).tolist()]


def as_scalar(x: Any) -> Any:
    """A one-element tensor as a numpy scalar of its own dtype."""
    a = np.asarray(x)
    if a.size != 1:
        raise ValueError(f"expected a single value, got shape {a.shape}")
    return a.reshape(-1)[0]
