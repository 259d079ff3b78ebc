"""``ai.actorrt:ShapeSubgraph`` (engine op from the optimizer's
:func:`~actorrt.optimizer.shapes.cache_shape_subgraphs`): a group of nodes that
compute only from tensors' shapes, run once per input signature.

Inputs: the tensors whose shapes the group reads (any dtype; only their
shapes are used). Outputs: the group's values read elsewhere. Attribute
``members``: the group's :class:`~actorrt.providers.NodeSpec` list in
execution order. Each member runs on this registry's own kernel for it; the
results for a tuple of input shapes are cached (up to :data:`CACHE_SIZE`
signatures, least recently used evicted, values up to
:data:`CACHE_MAX_ELEMENTS` elements each) and returned as fresh copies, so a
consumer that writes into its input cannot change the cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from .._contract import Kernel, NodeSpec, require
from .registry import CPU_KERNELS, cpu_kernel

__all__ = ["ShapeSubgraph", "CACHE_SIZE", "CACHE_MAX_ELEMENTS"]

#: input signatures remembered per node
CACHE_SIZE = 64
#: results larger than this many elements are recomputed, never cached
CACHE_MAX_ELEMENTS = 1 << 16


def _readonly(v):
    """A read-only view of a constant (a member never writes the plan's copy)."""
    if isinstance(v, np.ndarray):
        v = v.view()
        v.flags.writeable = False
    return v


@cpu_kernel("ShapeSubgraph", domain="ai.actorrt")
class ShapeSubgraph(Kernel):
    """Run the ``members`` once per tuple of input shapes (module docstring)."""

    multi_output = True

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        members = node.attr("members") or ()
        require(len(members) > 0, "ShapeSubgraph: no members")
        for m in members:
            k = CPU_KERNELS.lookup(m.domain, m.op_type, m.opset)
            require(k is not None, "ShapeSubgraph: no CPU kernel for member %s", m.op_type)
            require(not (k.uses_workspace or k.wants_outer_scope or k.kernel_sized_outputs),
                    "ShapeSubgraph: member %s needs the executor", m.op_type)
            k.check(m)

    @classmethod
    def estimate_flops(cls, node: NodeSpec) -> float:
        return 1.0

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self._members = []
        for m in node.attr("members"):
            k = CPU_KERNELS.lookup(m.domain, m.op_type, m.opset)(m)
            k.prepare(m.constant_inputs, {})
            consts = {i: _readonly(v) for i, v in m.constant_inputs.items()}
            self._members.append((m, k.compile(), k.multi_output, consts))
        self._cache: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def evaluate(self, *tensors) -> tuple:
        """The members' results for these inputs, uncached (the reference path)."""
        env = dict(zip(self.node.inputs, tensors))
        for m, fn, multi, consts in self._members:
            args = [consts[i] if i in consts else (env[n] if n else None)
                    for i, n in enumerate(m.inputs)]
            res = fn(*args)
            outs = res if multi else (res,)
            for n, v in zip(m.outputs, outs):
                if n:
                    env[n] = v
        return tuple(env[n] for n in self.node.outputs)

    def run(self, *tensors):
        key = tuple(np.shape(t) for t in tensors)
        hit = self._cache.get(key)
        if hit is not None:
            return tuple(v.copy() for v in hit)
        outs = self.evaluate(*tensors)
        if all(isinstance(v, np.ndarray) and v.size <= CACHE_MAX_ELEMENTS for v in outs):
            with self._lock:
                self._cache[key] = tuple(v.copy() for v in outs)
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        return outs
