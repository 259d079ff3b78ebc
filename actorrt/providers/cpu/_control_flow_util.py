"""Helpers shared by the control-flow kernels (Loop, Scan, SequenceMap)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..._dtypes import to_numpy_dtype
from .._contract import Kernel, NodeSpec, ValueType, require


class SubgraphKernel(Kernel):
    """A kernel that runs graph attributes (If, Loop, Scan, SequenceMap): each
    name in :attr:`graphs` is compiled once with ``node.compile_subgraph`` and
    stored as the attribute of that name; outer-scope values are passed in."""

    multi_output = True
    wants_outer_scope = True
    #: graph attributes compiled into attributes of the same name
    graphs: tuple[str, ...] = ("body",)
    #: further attributes the op cannot run without
    required: tuple[str, ...] = ()

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        require(node.compile_subgraph is not None, "%s needs a subgraph compiler",
                node.op_type)
        missing = [a for a in cls.graphs + cls.required if a not in node.attrs]
        require(not missing, "%s needs attribute(s) %s", node.op_type, ", ".join(missing))

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        for name in self.graphs:
            setattr(self, name, node.compile_subgraph(node.attrs[name]))


def stack_scan_output(items: Sequence[np.ndarray], axis: int, *, reverse: bool) -> np.ndarray:
    """Stack per-iteration outputs along a new ``axis`` (last iteration first
    when ``reverse``).

    Raises:
        ValueError: the iterations produced different shapes.
    """
    arrs = [np.asarray(x) for x in (reversed(items) if reverse else items)]
    shapes = {a.shape for a in arrs}
    if len(shapes) > 1:
        raise ValueError(f"scan output shapes differ between iterations: {sorted(shapes)}")
    return np.stack(arrs, axis=axis)


def empty_scan_output(vt: ValueType | None, axis: int) -> np.ndarray:
    """A scan output of zero iterations: the body output's declared shape with a
    0-length axis inserted at ``axis`` (unknown dims count as 0, an unknown rank
    as a scalar; an unknown dtype as float32)."""
    dtype = np.dtype(np.float32)
    dims: tuple[int, ...] = ()
    if vt is not None:
        if vt.dtype is not None:
            dtype = to_numpy_dtype(vt.dtype)
        if vt.shape is not None:
            dims = tuple(d if isinstance(d, int) and d >= 0 else 0 for d in vt.shape)
    rank = len(dims) + 1
    ax = axis % rank if -rank <= axis < rank else 0
    return np.zeros(dims[:ax] + (0,) + dims[ax:], dtype)
