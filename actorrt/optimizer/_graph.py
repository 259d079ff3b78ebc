"""The view of a node list the passes match on, and the one way they edit it.

:class:`OptContext` keeps producer / consumer maps by value name over the
current list of :class:`~actorrt.providers.NodeSpec`; :meth:`OptContext.replace`
swaps a group of nodes for one new node, placed where the group's last member
was (valid because every pass replaces a chain whose intermediates are read
only inside the chain, so all the new node's inputs exist by then).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs
import numpy as np

from .. import _dtypes
from ..providers._contract import NodeSpec, ValueType

__all__ = ["OptContext", "FLOATS"]

#: element types the passes rewrite (others are left alone)
FLOATS = frozenset({int(_dtypes.from_numpy_dtype(np.dtype(np.float32))),
                    int(_dtypes.from_numpy_dtype(np.dtype(np.float64)))})


class OptContext:
    """Nodes, constants and the maps between them, for the passes.

    Attributes:
        specs: the current nodes, in execution order.
        protected: value names read outside ``specs`` (graph outputs); never removed.
        consts: value name -> constant array.
        fusions: ``(new node name, replaced node names)`` per rewrite.
    """

    def __init__(self, specs: list, protected: set[str], consts: dict[str, Any],
                 add_const: Callable[[str, Any], str]):
        self.specs = specs
        self.protected = protected
        self.consts = consts
        self._add_const = add_const
        self.fusions: list[tuple[str, tuple[str, ...]]] = []
        self.types: dict[str, ValueType | None] = {}
        self.reindex()

    def reindex(self) -> None:
        """Rebuild the producer / consumer maps from :attr:`specs`."""
        self.producer: dict[str, NodeSpec] = {}
        self.consumers: dict[str, list[NodeSpec]] = {}
        for s in self.specs:
            for n, t in zip(s.inputs, s.input_types):
                if n:
                    self.consumers.setdefault(n, []).append(s)
                    self.types.setdefault(n, t)
            for n in s.outer_scope:
                self.consumers.setdefault(n, []).append(s)
            for n, t in zip(s.outputs, s.output_types):
                if n:
                    self.producer[n] = s
                    self.types[n] = t

    # ------------------------------------------------------------ queries
    def const(self, name: str) -> np.ndarray | None:
        """The constant array named ``name``, or ``None``."""
        v = self.consts.get(name) if name else None
        return v if isinstance(v, np.ndarray) else None

    def sole_reader(self, name: str) -> NodeSpec | None:
        """The one node reading ``name`` (once), when no graph output is ``name``."""
        if not name or name in self.protected:
            return None
        rs = self.consumers.get(name, [])
        if len(rs) != 1 or rs[0].inputs.count(name) != 1 or name in rs[0].outer_scope:
            return None
        return rs[0]

    def used(self, name: str) -> bool:
        """Whether anything reads ``name`` (a node or the graph's outputs)."""
        return bool(name) and (name in self.protected or bool(self.consumers.get(name)))

    def only_first_output_used(self, s: NodeSpec) -> bool:
        return not any(self.used(n) for n in s.outputs[1:])

    def is_float(self, name: str) -> bool:
        t = self.types.get(name)
        return t is not None and t.kind == "tensor" and t.dtype in FLOATS

    def rank(self, name: str) -> int | None:
        t = self.types.get(name)
        return None if t is None else t.rank

    # ------------------------------------------------------------- edits
    def add_const(self, hint: str, arr: np.ndarray) -> str:
        """Register ``arr`` as a new constant; its (fresh) name."""
        name = self._add_const(hint, arr)
        self.consts[name] = arr
        self.types[name] = ValueType("tensor", int(_dtypes.from_numpy_dtype(arr.dtype)),
                                     tuple(arr.shape))
        return name

    def make(self, base: NodeSpec, op_type: str, domain: str, inputs: Sequence[str],
             outputs: Sequence[str], attrs_: dict[str, Any], name: str | None = None,
             opset: int | None = None) -> NodeSpec:
        """A new node like ``base`` (model, callbacks) with these fields; input
        and output types come from the values' known types."""
        inputs, outputs = tuple(inputs), tuple(outputs)
        return attrs.evolve(
            base, name=name or base.name, op_type=op_type, domain=domain,
            opset=base.opset if opset is None else opset, attrs=dict(attrs_),
            inputs=inputs, outputs=outputs,
            input_types=tuple(self.types.get(n) if n else None for n in inputs),
            output_types=tuple(self.types.get(n) if n else None for n in outputs),
            constant_inputs={i: self.consts[n] for i, n in enumerate(inputs)
                             if n and isinstance(self.consts.get(n), np.ndarray)},
            outer_scope=())

    def replace(self, members: Sequence[NodeSpec], new: NodeSpec, at: int | None = None) -> None:
        """Replace ``members`` (a chain whose intermediates nothing else reads)
        with ``new``, at the last member's position (or just before the node
        now at index ``at`` of :attr:`specs`, when given); logs the fusion."""
        ids = {id(m) for m in members}
        last = max(i for i, s in enumerate(self.specs) if id(s) in ids)
        out = []
        for i, s in enumerate(self.specs):
            if at is not None and i == at:
                out.append(new)
            if at is None and i == last:
                out.append(new)
            elif id(s) not in ids:
                out.append(s)
        if at is not None and at >= len(self.specs):
            out.append(new)
        order = {id(s): i for i, s in enumerate(self.specs)}
        names = tuple(m.name for m in sorted(members, key=lambda m: order[id(m)]))
        self.specs = out
        self.fusions.append((new.name, names))
        self.reindex()
