"""Segments: which steps of a plan run back to back on one provider.

:func:`build_segments` chains the steps (a step extends the chain whose
tail it consumes first), merges cheap chains into a neighbour, condenses
cycles (Tarjan) so the segments form a DAG, and works out each segment's
cost estimate (infinite when unbounded: control flow, data-sized outputs,
unknown sizes; then :func:`_dim_refs` says how to bound it from the graph
inputs' dims at run time), its loads, stores and the values' release counts.
"""

from __future__ import annotations

import itertools
import math
from typing import Container

import onnx_ir as ir

from ..providers._contract import ValueType
from .plan import Plan, PlanOptions, Segment, Step

__all__ = ["build_segments"]


def build_segments(plan: Plan, steps: list[Step], options: PlanOptions, graph_out: set[int],
                   const_names: Container[str]) -> None:
    """Group ``steps`` (placed and instantiated) into ``plan.segments``: runs
    of steps on one provider, independent heavy chains apart when
    ``options.parallel`` (cheaper than ``options.segment_threshold_us``
    merged into a neighbour), cycles condensed so segments form a DAG in
    topological order; each segment's costs, loads and stores, and
    ``plan.release_counts``. ``graph_out``: the graph outputs' slots;
    ``const_names``: values folded to constants (never loaded)."""
    producer: dict[int, int] = {}  # slot -> step index
    for s in steps:
        for o in s.outputs:
            if o >= 0:
                producer[o] = s.index

    def deps(s: Step) -> set[int]:
        out = set()
        for i in itertools.chain(s.inputs, (sl for _, sl in s.outer)):
            p = producer.get(i)
            if p is not None:
                out.add(p)
        return out

    step_deps = [deps(s) for s in steps]
    seg_of: list[int] = [-1] * len(steps)
    threshold = options.segment_threshold_us
    heavy = sum(1 for s in steps if s.cost.total_us >= threshold)
    if not options.parallel or heavy < 2:
        # nothing worth running concurrently: one segment per provider run
        for s in steps:
            if s.index == 0 or steps[s.index - 1].provider is not s.provider:
                cur = (seg_of[s.index - 1] + 1) if s.index else 0
            seg_of[s.index] = cur
    else:
        # chains: a step extends the chain whose tail it consumes first
        tails: dict[int, int] = {}  # step index at a chain's tail -> chain id
        n = 0
        for s in steps:
            target = None
            for d in sorted(step_deps[s.index]):
                if d in tails and steps[d].provider is s.provider:
                    target = tails.pop(d)
                    break
            if target is None:
                target, n = n, n + 1
            seg_of[s.index] = target
            tails[s.index] = target
        seg_of = _merge_cheap(steps, seg_of, step_deps, threshold)
    seg_of = _condense(steps, seg_of, step_deps)
    count = max(seg_of) + 1 if seg_of else 0
    segs: list[list[Step]] = [[] for _ in range(count)]
    for s in steps:
        segs[seg_of[s.index]].append(s)
    # build Segment objects
    sym_at: dict[str, tuple[int, int]] = {}  # symbolic dim -> (graph input slot, axis)
    for spec in plan.inputs:
        t = spec.type
        if t is not None and t.kind == "tensor" and t.shape is not None:
            for ax, d in enumerate(t.shape):
                if isinstance(d, str) and d:
                    sym_at.setdefault(d, (spec.slot, ax))
    for i, ss in enumerate(segs):
        seg = Segment(i, ss[0].provider, ss)
        seg.unbounded = any(_cost_unbounded(st) for st in ss)
        seg.iterates = any(_control_flow(st) for st in ss)
        seg.base_cost_us = sum(st.cost.total_us for st in ss)
        seg.cost_us = math.inf if seg.unbounded else seg.base_cost_us
        if seg.unbounded and not seg.iterates:
            seg.dim_refs = _dim_refs(ss, sym_at)
        plan.segments.append(seg)
    for s in steps:
        for d in step_deps[s.index]:
            a, b = seg_of[d], seg_of[s.index]
            if a != b:
                plan.segments[b].preds.add(a)
                plan.segments[a].succs.add(b)
    # loads / stores
    produced_in: dict[int, int] = {}
    for seg in plan.segments:
        for st in seg.steps:
            for o in st.outputs:
                if o >= 0:
                    produced_in[o] = seg.index
    consumers: dict[int, set[int]] = {}
    for seg in plan.segments:
        for st in seg.steps:
            for i in itertools.chain(st.inputs, (sl for _, sl in st.outer)):
                if i >= 0 and plan.slot_names[i] not in const_names:
                    consumers.setdefault(i, set()).add(seg.index)
    for seg in plan.segments:
        loads = sorted(i for i, cs in consumers.items()
                       if seg.index in cs and produced_in.get(i) != seg.index)
        stores = sorted(o for o, p in produced_in.items() if p == seg.index and (
            o in graph_out or any(c != seg.index for c in consumers.get(o, ()))))
        seg.loads, seg.stores = tuple(loads), tuple(stores)
    # cross-segment values released once their last consumer segment finished
    for slot, cs in consumers.items():
        if slot not in graph_out:
            plan.release_counts[slot] = len(cs)
    for slot in graph_out:
        plan.release_counts.pop(slot, None)
    for name, slot in plan.outer_inputs:
        plan.release_counts.pop(slot, None)
    for spec in plan.inputs:
        plan.release_counts.pop(spec.slot, None)


def _static(vt: ValueType | None) -> bool:
    """The value's size is known at plan time (a tensor of static shape)."""
    if vt is None or vt.kind != "tensor" or vt.shape is None:
        return False
    return all(isinstance(d, int) and d >= 0 for d in vt.shape)


def _control_flow(st: Step) -> bool:
    """The step runs subgraphs (If, Loop, Scan, SequenceMap...): its cost is
    its body's once, whatever the trip count or the branch taken."""
    k = st.kernel
    if st.outer or (k is not None and k.wants_outer_scope):
        return True
    return any(isinstance(v, ir.Graph) or (isinstance(v, (list, tuple)) and v
                                           and isinstance(v[0], ir.Graph))
               for v in st.node.attrs.values())


def _cost_unbounded(st: Step) -> bool:
    """The step's cost estimate says nothing about how long it may run:
    control flow, outputs sized by the data, or values whose size is not known
    at plan time (a symbolic dim is estimated as 1). Such steps never run on
    the event loop."""
    k = st.kernel
    if _control_flow(st) or (k is not None and k.kernel_sized_outputs):
        return True
    node = st.node
    for names, types in ((node.inputs, node.input_types), (node.outputs, node.output_types)):
        for n, t in zip(names, types):
            if n and not _static(t):
                return True
    return False


def _dim_refs(steps: list[Step], sym_at: dict[str, tuple[int, int]]
              ) -> tuple[tuple[int, int, int], ...] | None:
    """How a segment whose shapes hold symbolic dims can be costed at run
    time: ``((graph input slot, axis, exponent), ...)`` such that the
    segment's estimate (each symbolic dim counted as 1) times the product of
    ``env[slot].shape[axis] ** exponent`` bounds its cost. A step's work is
    at most the product of its index dims (a MatMul's flops: ``M*K*N``;
    bytes grow with each operand's size), each of which is a dim of some
    operand: the exponent is the most times the symbol occurs in one operand's
    shape (``(B, S, S)`` scores: 2 for ``S``). ``None`` when some size is not
    given by the graph inputs (unknown dims or ranks, data-dependent
    outputs)."""
    exps: dict[str, int] = {}
    for st in steps:
        k = st.kernel
        if k is not None and k.kernel_sized_outputs:
            return None
        node = st.node
        for names, types in ((node.inputs, node.input_types),
                             (node.outputs, node.output_types)):
            for n, t in zip(names, types):
                if not n:
                    continue
                if t is None or t.kind != "tensor" or t.shape is None:
                    return None
                counts: dict[str, int] = {}
                for d in t.shape:
                    if isinstance(d, int) and d >= 0:
                        continue
                    if not isinstance(d, str) or d not in sym_at:
                        return None
                    counts[d] = counts.get(d, 0) + 1
                for d, c in counts.items():
                    exps[d] = max(exps.get(d, 0), c)
    return tuple((*sym_at[d], e) for d, e in sorted(exps.items()))


def _quotient(seg_of: list[int], step_deps: list[set[int]]) -> dict[int, set[int]]:
    preds: dict[int, set[int]] = {g: set() for g in seg_of}
    for i, ds in enumerate(step_deps):
        for d in ds:
            if seg_of[d] != seg_of[i]:
                preds[seg_of[i]].add(seg_of[d])
    return preds


def _merge_cheap(steps, seg_of, step_deps, threshold_us) -> list[int]:
    """Fold cheap chains into a neighbour: a chain estimated under
    ``threshold_us`` joins its only predecessor; cheap chains with no
    predecessor run together. Cycles this may create are removed by
    :func:`_condense`."""
    cost: dict[int, float] = {}
    for s in steps:
        cost[seg_of[s.index]] = cost.get(seg_of[s.index], 0.0) + s.cost.total_us
    preds = _quotient(seg_of, step_deps)
    parent = {g: g for g in preds}

    def find(g):
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    first_source = None
    for g in sorted(preds):  # chain ids grow with their first step
        if cost[g] >= threshold_us:
            continue
        ps = {find(p) for p in preds[g]}
        if len(ps) == 1:
            (p,) = ps
            parent[find(g)] = p
        elif not ps:
            if first_source is None:
                first_source = find(g)
            else:
                parent[find(g)] = find(first_source)
    return [find(g) for g in seg_of]


def _condense(steps, seg_of, step_deps) -> list[int]:
    """Merge every cycle of the segment graph (strongly connected components)
    so segments form a DAG, numbered in topological order."""
    preds = _quotient(seg_of, step_deps)
    succs: dict[int, set[int]] = {g: set() for g in preds}
    for g, ps in preds.items():
        for p in ps:
            succs[p].add(g)
    # Tarjan's algorithm, iterative
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    comp: dict[int, int] = {}
    counter = 0
    ncomp = 0
    for root in preds:
        if root in index:
            continue
        work = [(root, iter(succs[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succs[w])))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp[w] = ncomp
                    if w == v:
                        break
                ncomp += 1
    # Tarjan numbers components in reverse topological order
    return [ncomp - 1 - comp[g] for g in seg_of]
