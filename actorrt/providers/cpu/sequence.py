"""Sequence ops. A sequence is a Python list of numpy arrays; every op returns
a new list and never changes its input list.

Spec: ONNX SequenceConstruct, SequenceEmpty, SequenceInsert, SequenceAt,
SequenceErase, SequenceLength, ConcatFromSequence (opset 11), SplitToSequence
(11, 24), SequenceMap (17).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._dtypes import to_numpy_dtype
from .registry import cpu_kernel
from ._control_flow_util import SubgraphKernel


def _position(seq: list, position: Any, *, insert: bool) -> int:
    """A non-negative index from an int tensor ``position`` (negative counts
    from the back; for insertion ``len(seq)`` is valid too).

    Raises:
        IndexError: ``position`` is out of range.
    """
    n = len(seq)
    p = int(np.asarray(position).reshape(-1)[0])
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise IndexError(f"position {p} is out of range for a sequence of length {n}")
    return p + n if p < 0 else p


@cpu_kernel("SequenceConstruct", since=11)
def SequenceConstruct(*inputs):
    """ONNX SequenceConstruct (11): the inputs, in order, as a sequence."""
    return list(inputs)


@cpu_kernel("SequenceEmpty", since=11)
def SequenceEmpty(*, dtype=1):
    """ONNX SequenceEmpty (11): an empty sequence (``dtype`` is the element
    type it declares; an empty list carries none)."""
    to_numpy_dtype(dtype)  # reject an unknown element type
    return []


@cpu_kernel("SequenceInsert", since=11)
def SequenceInsert(input_sequence, tensor, position=None):
    """ONNX SequenceInsert (11): a copy of the sequence with ``tensor`` inserted
    at ``position`` (default: appended)."""
    out = list(input_sequence)
    if position is None:
        out.append(tensor)
    else:
        out.insert(_position(out, position, insert=True), tensor)
    return out


@cpu_kernel("SequenceAt", since=11)
def SequenceAt(input_sequence, position):
    """ONNX SequenceAt (11): element ``position`` (negative from the back)."""
    return input_sequence[_position(input_sequence, position, insert=False)]


@cpu_kernel("SequenceErase", since=11)
def SequenceErase(input_sequence, position=None):
    """ONNX SequenceErase (11): a copy without element ``position`` (default:
    the last)."""
    out = list(input_sequence)
    if position is None:
        if not out:
            raise IndexError("SequenceErase on an empty sequence")
        out.pop()
    else:
        del out[_position(out, position, insert=False)]
    return out


@cpu_kernel("SequenceLength", since=11)
def SequenceLength(input_sequence):
    """ONNX SequenceLength (11): the number of elements as an int64 scalar."""
    return np.array(len(input_sequence), dtype=np.int64)


@cpu_kernel("SplitToSequence", since=(11, 24))
def SplitToSequence(input, split=None, *, axis=0, keepdims=1):
    """ONNX SplitToSequence (11, 24): split ``input`` along ``axis`` into a
    sequence. ``split`` absent: pieces of size 1 (squeezed unless ``keepdims``);
    a scalar: pieces of that size (the last may be smaller); a 1-D tensor: the
    piece sizes."""
    x = np.asarray(input)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for rank {x.ndim}")
    axis %= x.ndim
    n = x.shape[axis]
    if split is None:
        pieces = np.split(x, n, axis=axis) if n else []
        return [np.squeeze(p, axis=axis) for p in pieces] if not keepdims else pieces
    s = np.asarray(split)
    if s.ndim == 0:
        size = int(s)
        if size <= 0:
            raise ValueError(f"split must be positive, got {size}")
        bounds = list(range(size, n, size))
    else:
        sizes = s.astype(np.int64)
        if (sizes < 0).any() or int(sizes.sum()) != n:
            raise ValueError(f"split sizes {sizes.tolist()} do not add up to dim {n}")
        bounds = np.cumsum(sizes)[:-1].tolist()
    return np.split(x, bounds, axis=axis)


@cpu_kernel("ConcatFromSequence", since=11)
def ConcatFromSequence(input_sequence, *, axis, new_axis=0):
    """ONNX ConcatFromSequence (11): concatenate the elements along ``axis``
    (stack along a new ``axis`` when ``new_axis`` is 1)."""
    if not input_sequence:
        raise ValueError("ConcatFromSequence needs a non-empty sequence")
    arrs = [np.asarray(a) for a in input_sequence]
    rank = arrs[0].ndim + (1 if new_axis else 0)
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    if new_axis:
        return np.stack(arrs, axis=axis % rank)
    return np.concatenate(arrs, axis=axis % rank)


@cpu_kernel("SequenceMap", since=17)
class SequenceMap(SubgraphKernel):
    """ONNX SequenceMap (17): run ``body`` once per position of the input
    sequence; additional inputs that are sequences are indexed at the same
    position, tensors are passed whole. Each body output becomes a sequence."""

    def run(self, input_sequence, *additional, outer: dict | None = None):
        n = len(input_sequence)
        for a in additional:
            if isinstance(a, list) and len(a) != n:
                raise ValueError(f"SequenceMap sequences differ in length: {n} and {len(a)}")
        results: list[list[Any]] = [[] for _ in self.body.output_names]
        for i in range(n):
            args = [input_sequence[i], *(a[i] if isinstance(a, list) else a for a in additional)]
            for r, o in zip(results, self.body(args, outer)):
                r.append(o)
        return tuple(results)
