"""Compiling a graph into an execution plan.

A plan is built once per session (and once per control-flow subgraph):

1. every node becomes a :class:`~actorrt.providers.NodeSpec`; nodes whose inputs
   are all constants are folded now, with the engine's own kernels;
2. placement: each node goes to the provider with the lowest estimated cost
   (compute + transfer at boundaries); every decline is recorded;
3. kernels are instantiated and prepack their constant inputs;
4. nodes are grouped into *segments*, runs of nodes on one provider that execute
   back to back; independent heavy branches become separate segments that the
   scheduler may run concurrently;
5. each segment is compiled to a Python function whose locals are the values:
   a node costs one call of its kernel and nothing else.

The stages, one module each:

* :mod:`.compiler` — :func:`compile_plan` and its :class:`~.compiler.Compiler`
  (steps 1-3, fusion, and the calls into the next two);
* :mod:`.segments` — step 4 (:func:`~.segments.build_segments`);
* :mod:`.codegen` — step 5 (:func:`~.codegen.generate_segment`), activation
  accounting, kernel-sized outputs;
* :mod:`.plan` — what they build and run: :class:`Plan`, :class:`Step`,
  :class:`Segment`, :class:`PlanOptions`, :class:`NodePlacement`,
  :class:`SubgraphRunner`;
* :mod:`.values` — value types, :class:`IOSpec` and the feed checks.
"""

from .compiler import compile_plan
from .plan import NodePlacement, Plan, PlanOptions, Segment, Step, SubgraphRunner
from .values import IOSpec, type_string, value_type_of

__all__ = ["Plan", "Step", "Segment", "PlanOptions", "compile_plan", "NodePlacement",
           "value_type_of", "IOSpec", "type_string", "SubgraphRunner"]
