"""Shape subgraphs (extended level): the ``Shape -> Gather -> Unsqueeze ->
Concat -> Reshape-target`` arithmetic PyTorch exports emit for dynamic
dimensions, evaluated once per input signature.

* :func:`cache_shape_subgraphs` -- every connected group of nodes whose values
  depend only on tensors' *shapes* (``Shape`` / ``Size`` of any tensor, then
  :data:`SHAPE_OPS` over those results and constants) -> one
  ``ai.actorrt:ShapeSubgraph`` node. Its inputs are the tensors whose shapes
  the group reads; its outputs the group's values read outside it (or graph
  outputs); attribute ``members``: the replaced nodes, in order. The kernel
  (:mod:`actorrt.providers.cpu.shape_cache`) runs the members once per tuple
  of input shapes and answers later runs with copies of the cached results.
  The new node runs just before the first outside reader of any group value
  (or where the last member was). Pre: at least two members, one of them a
  ``Shape`` / ``Size``; no member with a subgraph; every tensor whose shape
  the group reads produced before that point; every outside reader an op of
  the default domain (the LLM decoder-block fusion and prologue match the
  shape nodes feeding com.microsoft attention ops); else the group is left
  as it is. Graphs the CPU provider's LLM fusions may match (a
  GroupQueryAttention, the mask-length ops, a quantized embedding table) are
  not touched. Post: the same values.
"""

from __future__ import annotations

from ._graph import OptContext

__all__ = ["cache_shape_subgraphs", "SHAPE_OPS", "ENGINE"]

ENGINE = "ai.actorrt"

#: ops (default domain) whose result is a function of their inputs' values
#: alone and stays small when those are shape vectors; ConstantOfShape /
#: Expand / Tile are not here (their results can be as large as a tensor)
SHAPE_OPS = frozenset({
    "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Reshape", "Identity",
    "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Min", "Max", "Equal", "Less",
    "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Where", "Range",
    "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin", "Flatten", "Sqrt", "Ceil", "Floor",
})
_ROOTS = frozenset({"Shape", "Size"})


#: the CPU provider's LLM fusions (decoder blocks from a com.microsoft
#: GroupQueryAttention; the decode prologue: attention-mask lengths from
#: ReduceSum / Sub / Cast / Shape / Gather, a Gather of a 3-D int8 / uint8
#: block table) match shape nodes themselves: graphs that may hold them are
#: left to those (kept in step with ``providers.cpu.provider``'s own check)
_LLM_MASK_OPS = frozenset({("", "ReduceSum"), ("", "Sub"), ("", "Cast"), ("", "Shape"), ("", "Gather")})


def _llm_graph(ctx: OptContext) -> bool:
    ops = {(s.domain or "", s.op_type) for s in ctx.specs}
    if ("com.microsoft", "GroupQueryAttention") in ops or _LLM_MASK_OPS <= ops:
        return True
    for s in ctx.specs:
        if s.op_type == "Gather" and not s.domain:
            t = s.constant_inputs.get(0)
            if t is not None and getattr(t, "ndim", 0) == 3 and str(t.dtype) in ("uint8", "int8"):
                return True
    return False


def cache_shape_subgraphs(ctx: OptContext) -> None:
    """Shape-only node groups -> ``ai.actorrt:ShapeSubgraph`` (module docstring)."""
    if _llm_graph(ctx):
        return
    derived: set[str] = set()
    members: list = []
    for s in ctx.specs:
        if s.domain != "" or s.outer_scope or _has_graph(s):
            continue
        if s.op_type in _ROOTS:
            ok = True
        elif s.op_type in SHAPE_OPS:
            present = [n for n in s.inputs if n]
            ok = bool(present) and all(n in derived or ctx.const(n) is not None for n in present) \
                and any(n in derived for n in present)
        else:
            ok = False
        if ok:
            members.append(s)
            derived.update(n for n in s.outputs if n)
    if not members:
        return
    # connected groups (members linked by a value one produces and another reads)
    parent = {id(m): id(m) for m in members}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    by_id = {id(m): m for m in members}
    for m in members:
        for n in m.inputs:
            p = ctx.producer.get(n) if n else None
            if p is not None and id(p) in parent:
                parent[find(id(m))] = find(id(p))
    groups: dict[int, list] = {}
    for m in members:  # members are in execution order
        groups.setdefault(find(id(m)), []).append(m)
    for k, group in enumerate(groups.values()):
        if len(group) < 2:
            continue
        _replace_group(ctx, group, k)
    del by_id


def _has_graph(s) -> bool:
    return any(type(v).__name__ == "Graph" for v in s.attrs.values())


def _replace_group(ctx: OptContext, group: list, k: int) -> None:
    ids = {id(m) for m in group}
    order = {id(s): i for i, s in enumerate(ctx.specs)}
    at = max(order[i] for i in ids) + 1  # just after the last member, or earlier:
    produced = {n for m in group for n in m.outputs if n}
    outputs: list[str] = []
    for m in group:
        for n in m.outputs:
            if not n:
                continue
            readers = [r for r in ctx.consumers.get(n, []) if id(r) not in ids]
            if any(r.domain != "" for r in readers):
                return  # a contrib / engine op's shape operand (an LLM attention's
                # total sequence length): the CPU provider's block fusion matches those
            for r in readers:  # before the first outside reader of a group value
                at = min(at, order[id(r)])
            if readers or n in ctx.protected:
                outputs.append(n)
    inputs: list[str] = []
    for m in group:
        for n in m.inputs:
            if n and n not in produced and ctx.const(n) is None and n not in inputs:
                p = ctx.producer.get(n)
                if p is not None and order[id(p)] >= at:
                    return  # a tensor whose shape is read is not there yet at ``at``
                inputs.append(n)
    if not outputs or not inputs:
        return
    head = group[0]
    new = ctx.make(head, "ShapeSubgraph", ENGINE, inputs, outputs,
                   {"members": tuple(group)}, name=f"{head.name}/shapes{k}", opset=1)
    ctx.replace(group, new, at=at)
