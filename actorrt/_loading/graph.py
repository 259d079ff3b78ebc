"""Structural validity of a model, checked at load.

:func:`check_graph_protos` runs our own checks first (they name the node and
the value precisely), over the main graph, every subgraph (scoped: a
subgraph sees its outer graphs' values) and every model-local function:

* every value is assigned once (graph inputs, initializers, node outputs);
* every node input is a graph input, an initializer, a node output or a
  value of an outer scope;
* every graph output is one of those;
* control flow binds: ``If`` branches take no inputs and give as many
  outputs as the node has; a ``Loop`` body takes ``2 + N`` inputs for ``N``
  carried values and gives at least ``1 + N`` outputs, as many as the node
  uses; a ``Scan`` body takes one input per node input (``sequence_lens``
  aside before opset 9) and gives at least as many outputs as the node has.

Then :func:`run_onnx_checker` runs ``onnx.checker.check_model`` (not
``full_check``: strict shape inference refuses models real exporters make)
for the rest: attribute types, input/output counts against the schema,
missing opset imports, unknown attributes, scoping. Its findings are fatal
except those another stage reports better or that do not make a model
wrong for us (onnxruntime loads them too): nodes merely out of topological
order (the loader sorts them), declared value types without a shape or
element type (inferred), com.microsoft nodes without that domain's opset
import (imported implicitly at version 1), an operator onnx has no schema
for (the compiler raises :class:`~actorrt.UnsupportedOperatorError` naming
the node, or a kernel runs it), a deprecated operator, and a model newer
than the installed checker. As the checker stops at its first finding, a
repairable one makes it check a repaired copy for the rest.
"""

from __future__ import annotations

import os
import re

import onnx

from .._errors import ModelLoadError

__all__ = ["check_graph_protos", "run_onnx_checker"]

_ONNX_DOMAINS = ("", "ai.onnx")
_MS = "com.microsoft"


def _label(node: onnx.NodeProto, index: int) -> str:
    if node.name:
        return f"node {node.name!r} ({node.op_type})"
    return f"the {node.op_type} node #{index}"


class _Checker:
    def __init__(self, proto: onnx.ModelProto, model: str):
        self.model = model
        self.opset = {("" if o.domain == "ai.onnx" else o.domain): o.version
                      for o in proto.opset_import}

    def fail(self, msg: str, node: onnx.NodeProto | None = None):
        raise ModelLoadError(msg, model=self.model, node=(node.name or None) if node else None)

    # -- one scope: a graph or a function body
    def _define(self, defined: dict, name: str, what: str, where: str, node=None):
        if name in defined:
            self.fail(f"value {name!r}{where} is assigned twice: by {defined[name]} and by "
                      f"{what} (a graph must be in single static assignment form)", node)
        defined[name] = what

    def _nodes(self, nodes, defined: dict, outer, where: str):
        for k, node in enumerate(nodes):
            for o in node.output:
                if o:
                    self._define(defined, o, _label(node, k), where, node)
        scope = set(outer) | defined.keys()
        for k, node in enumerate(nodes):
            label = _label(node, k)
            for i in node.input:
                if i and i not in scope:
                    self.fail(f"input {i!r} of {label}{where} is not defined: no graph input, "
                              "initializer, outer-scope value or node output has that name",
                              node)
            self._control_flow(node, label, where)
            for a in node.attribute:
                sub_where = f" in graph {{}} of attribute {a.name!r} of {label}{where}"
                if a.HasField("g"):
                    self.graph(a.g, scope, sub_where.format(repr(a.g.name)))
                for j, g in enumerate(a.graphs):
                    self.graph(g, scope, sub_where.format(f"{g.name!r} (item {j})"))
        return scope

    def graph(self, g: onnx.GraphProto, outer, where: str = ""):
        defined: dict[str, str] = {}
        for vi in g.input:
            if not vi.name:
                self.fail(f"a graph input{where} has no name")
            self._define(defined, vi.name, "a graph input", where)
        for t in g.initializer:
            if defined.get(t.name) == "a graph input":
                continue  # an initializer may give a graph input its default
            self._define(defined, t.name, "an initializer", where)
        for s in g.sparse_initializer:
            if defined.get(s.values.name) != "a graph input":
                self._define(defined, s.values.name, "a sparse initializer", where)
        scope = self._nodes(g.node, defined, outer, where)
        for o in g.output:
            if not o.name:
                self.fail(f"a graph output{where} has no name")
            if o.name not in scope:
                self.fail(f"graph output {o.name!r}{where} is not produced by any node (nor a "
                          "graph input, an initializer or an outer-scope value)")

    def function(self, f: onnx.FunctionProto):
        where = f" in function '{f.domain}:{f.name}'"
        defined: dict[str, str] = {}
        for name in f.input:
            self._define(defined, name, "a function input", where)
        scope = self._nodes(f.node, defined, (), where)
        for o in f.output:
            if o not in scope:
                self.fail(f"function output {o!r}{where} is not produced by any node (nor a "
                          "function input)")

    # -- control flow bodies must bind to the node
    def _control_flow(self, node: onnx.NodeProto, label: str, where: str):
        if node.domain not in _ONNX_DOMAINS or node.op_type not in ("If", "Loop", "Scan"):
            return
        graphs = {a.name: a.g for a in node.attribute if a.HasField("g")}
        n_in, n_out = len(node.input), len(node.output)
        if node.op_type == "If":
            for branch in ("then_branch", "else_branch"):
                g = graphs.get(branch)
                if g is None:
                    continue  # a missing attribute: the checker names it
                if len(g.input):
                    self.fail(f"{label}{where}: its {branch} takes {len(g.input)} inputs; an If "
                              "branch takes none", node)
                if len(g.output) != n_out:
                    self.fail(f"{label}{where}: its {branch} gives {len(g.output)} outputs, "
                              f"but the node has {n_out}", node)
        elif node.op_type == "Loop":
            body = graphs.get("body")
            if body is None or n_in < 2:
                return
            carried = n_in - 2
            if len(body.input) != 2 + carried:
                self.fail(f"{label}{where}: its body takes {len(body.input)} inputs, but the "
                          f"node passes {carried} loop-carried values, so it must take "
                          f"{2 + carried} (iteration number, condition, carried values)", node)
            if len(body.output) < 1 + carried:
                self.fail(f"{label}{where}: its body gives {len(body.output)} outputs; it must "
                          f"give at least {1 + carried} (condition and {carried} carried "
                          "values)", node)
            if n_out > len(body.output) - 1:
                self.fail(f"{label}{where}: the node has {n_out} outputs, but its body gives "
                          f"only {len(body.output) - 1} besides the condition", node)
        else:  # Scan
            body = graphs.get("body")
            if body is None:
                return
            want = n_in - 1 if self.opset.get("", 0) < 9 else n_in  # Scan-8: sequence_lens
            if len(body.input) != want:
                self.fail(f"{label}{where}: its body takes {len(body.input)} inputs, but the "
                          f"node binds {want}", node)
            if n_out > len(body.output):
                self.fail(f"{label}{where}: the node has {n_out} outputs, but its body gives "
                          f"only {len(body.output)}", node)


def check_graph_protos(proto: onnx.ModelProto, model: str) -> None:
    """Our structural checks (see the module docstring) over ``proto``.

    Raises:
        ModelLoadError: naming the node and the value that is wrong.
    """
    c = _Checker(proto, model)
    c.graph(proto.graph, ())
    for f in proto.functions:
        c.function(f)


#: checker findings a repaired copy of the model is checked again for: nodes out
#: of topological order (the loader sorts them), declared types without a
#: shape or an element type (the engine infers them; onnxruntime accepts
#: them), and com.microsoft nodes without its opset import (onnxruntime
#: imports that domain implicitly, at version 1, as the compiler does), and
#: an IR version 3 model whose initializers are not all graph inputs (IR 3
#: wants every initializer listed as an input; onnxruntime's optimizer writes
#: new initializers without listing them and keeps the model's IR version,
#: and onnxruntime loads such a file: an initializer is a constant either way)
_REPAIRABLE = re.compile(r"topologically sorted|No opset import for domain 'com\.microsoft'|"
                         r"Field '(shape|type|elem_type)' of '\w+' is required but missing|"
                         r"in initializer but not in graph input")
#: checker findings that are not fatal (see the module docstring)
_TOLERATED = re.compile(r"No Op registered for|deprecated|higher than the checker's|"
                        + _REPAIRABLE.pattern)
#: external data findings, tolerated where the checker cannot see the model's
#: folder (our own check has resolved them against it)
_EXTERNAL = re.compile(r"Data of TensorProto|should be stored in|external data|data_location",
                       re.I)
_CONTEXT = re.compile(r"Name:\s*(\S*)\s+OpType:\s*(\S+)")


def _fill_type(tp: onnx.TypeProto) -> None:
    """Give a declared type the fields the checker requires (checker copy only)."""
    kind = tp.WhichOneof("value")
    if kind is None:
        tp.tensor_type.elem_type = onnx.TensorProto.FLOAT
        kind = "tensor_type"
    if kind in ("tensor_type", "sparse_tensor_type"):
        t = getattr(tp, kind)
        if not t.elem_type:
            t.elem_type = onnx.TensorProto.FLOAT
        if not t.HasField("shape"):
            t.shape.SetInParent()
    elif kind in ("sequence_type", "optional_type"):
        _fill_type(getattr(tp, kind).elem_type)
    elif kind == "map_type":
        _fill_type(tp.map_type.value_type)


def _repaired_copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` for the checker: graphs and functions list their
    nodes in topological order (stable; cycles left in place for the
    checker), declared types have their required fields, and an IR 3 model's
    initializers are all listed as graph inputs."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)

    def sort(nodes, known: set):
        pending = list(nodes)
        order = []
        progress = True
        while pending and progress:
            progress = False
            rest = []
            for n in pending:
                if all((not i) or i in known for i in n.input):
                    order.append(n)
                    known.update(o for o in n.output if o)
                    progress = True
                else:
                    rest.append(n)
            pending = rest
        order += pending
        copies = [onnx.NodeProto() for _ in order]
        for c, n in zip(copies, order):
            c.CopyFrom(n)
        del nodes[:]
        nodes.extend(copies)
        for n in nodes:
            for a in n.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    graph(g, known)

    def graph(g, outer):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            _fill_type(vi.type)
        known = set(outer) | {v.name for v in g.input} | {t.name for t in g.initializer}
        known |= {s.values.name for s in g.sparse_initializer}
        sort(g.node, known)

    graph(out.graph, set())
    if out.ir_version < 4:  # IR 3: every initializer is also a graph input
        listed = {v.name for v in out.graph.input}
        for t in out.graph.initializer:
            if t.name not in listed:
                out.graph.input.append(onnx.helper.make_tensor_value_info(
                    t.name, t.data_type, list(t.dims)))
    if not any(o.domain == _MS for o in out.opset_import):
        out.opset_import.add(domain=_MS, version=1)
    for f in out.functions:
        sort(f.node, set(f.input))
    return out


def run_onnx_checker(source: str | os.PathLike | bytes | onnx.ModelProto,
                     proto: onnx.ModelProto, model: str) -> None:
    """Run ``onnx.checker.check_model`` on ``source`` (the model's path, its
    bytes or the ``ModelProto``; ``proto`` is the parsed model, for a rerun
    when its nodes are merely out of order).

    Raises:
        ModelLoadError: a fatal finding, with the node the checker names.
    """
    def check(src, tolerate_external: bool) -> str | None:
        try:
            onnx.checker.check_model(src)
        except onnx.checker.ValidationError as e:
            msg = str(e).strip()
            if tolerate_external and _EXTERNAL.search(msg):
                return None
            return msg
        except ValueError:
            return None  # over protobuf's 2 GiB: the checker needs a path; skipped
        return None

    msg = check(source, tolerate_external=not isinstance(source, (str, os.PathLike)))
    if msg and _REPAIRABLE.search(msg):
        # e.g. nodes merely out of order (our checks found every input
        # defined): the checker stops at its first finding, so check a
        # repaired copy for what comes after it
        msg = check(_repaired_copy(proto), tolerate_external=True)
    if not msg or _TOLERATED.search(msg):
        return
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    head = lines[0]
    m = _CONTEXT.search(msg)
    node = None
    if m:
        node = m.group(1) or None
        head += f" (a node of type {m.group(2)})" if not node else f" ({m.group(2)})"
    raise ModelLoadError(f"invalid model: {head}", model=model, node=node)
