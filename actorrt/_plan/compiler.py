"""Compiling a graph into a :class:`~.plan.Plan`.

:class:`Compiler` turns every node into a
:class:`~actorrt.providers.NodeSpec`, folds all-constant nodes with the CPU
provider's kernels, runs the graph optimizer, places each node on the
provider with the lowest estimated cost (recording every decline),
instantiates and prepacks the kernels, lets providers fuse subgraphs, then
hands the steps to :func:`.segments.build_segments` and each segment to
:func:`.codegen.generate_segment`. :func:`compile_plan` is the entry point.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import attrs
import numpy as np
import onnx_ir as ir

from .. import _dtypes
from .._errors import ActorRTError, KernelError, UnsupportedOperatorError
from ..providers._contract import KernelSizedOutput, NodeSpec, Supported, Unsupported, ValueType
from .codegen import generate_segment, materialise_sized
from .plan import NodePlacement, Plan, PlanOptions, Step, SubgraphRunner
from .segments import build_segments
from .values import IOSpec, attr_value, tensor_to_numpy, value_type_of

__all__ = ["FOLD_FILL_LIMIT_ELEMENTS", "FOLD_LIMIT_ELEMENTS", "NONDETERMINISTIC", "Compiler",
           "compile_plan"]

#: Ops never folded at plan time (their outputs differ between runs).
NONDETERMINISTIC = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
    "Multinomial", "Bernoulli", "Dropout",
})

#: Largest constant (elements) folding may create.
FOLD_LIMIT_ELEMENTS = 1 << 22
#: ... for ``ConstantOfShape`` of a constant shape (a fill: unfolded it
#: allocates and writes its whole output on every run, and the Conv / Gemm
#: weights such a node feeds, as in the onnx wheel's light zoo models, cannot
#: be prepacked). The vgg19 fc6 weight (102.8 M elements) refilled per run took
#: 25 ms and, when its fresh pages faulted in slowly, up to 550 ms of a 330 ms
#: run; onnxruntime folds it too.
FOLD_FILL_LIMIT_ELEMENTS = 1 << 27

def _free_names(graph: ir.Graph) -> set[str]:
    """Names a subgraph reads from enclosing scopes (recursively)."""
    defined = {v.name for v in graph.inputs} | set(graph.initializers)
    used: set[str] = set()
    for node in graph:
        for v in node.inputs:
            if v is not None and v.name:
                used.add(v.name)
        for a in node.attributes.values():
            if a.type == ir.AttributeType.GRAPH:
                used |= _free_names(a.value)
            elif a.type == ir.AttributeType.GRAPHS:
                for g in a.value:
                    used |= _free_names(g)
        for v in node.outputs:
            if v.name:
                defined.add(v.name)
    return used - defined

class Compiler:
    def __init__(self, graph: ir.Graph, opsets: dict[str, int], providers: Sequence[Any],
                 options: PlanOptions, model_name: str, outer: Sequence[str] = (),
                 shared: dict | None = None):
        self.graph = graph
        self.opsets = opsets
        self.providers = list(providers)
        self.options = options
        self.model_name = model_name
        self.outer = list(outer)
        self.plan = Plan()
        self.plan.model_name = model_name
        self.plan.tracer = options.tracer
        self.slots: dict[str, int] = {}
        self.types: dict[str, ValueType] = {}
        self.consts: dict[str, Any] = {}
        self.shared = shared if shared is not None else {}
        self._ir_node: dict[int, ir.Node] = {}
        self._names = itertools.count()
        self.host_provider = next((p for p in self.providers if p.name == "cpu"),
                                  self.providers[0])

    def slot(self, name: str) -> int:
        s = self.slots.get(name)
        if s is None:
            s = self.slots[name] = len(self.slots)
            self.plan.slot_names.append(name)
        return s

    def compile(self) -> Plan:
        g = self.graph
        plan = self.plan
        # scope: outer names, inputs, initializers
        for name in self.outer:
            plan.outer_inputs.append((name, self.slot(name)))
        input_names = set()
        for v in g.inputs:
            vt = value_type_of(v.type, v.shape)
            self.types[v.name] = vt
            input_names.add(v.name)
        specialise = self.options.specialise_defaults and not self.outer
        specialised = []
        for name, v in g.initializers.items():
            if v.const_value is None:
                continue
            arr = tensor_to_numpy(v.const_value)
            self.types[name] = ValueType("tensor", int(v.const_value.dtype), tuple(arr.shape))
            if name not in input_names:
                self.consts[name] = arr
            elif specialise:
                self.consts[name] = arr
                specialised.append(name)
        plan.specialised = frozenset(specialised)
        for v in g.inputs:
            init = g.initializers.get(v.name)
            default = None
            has_default = False
            if init is not None and init.const_value is not None:
                default = tensor_to_numpy(init.const_value)
                has_default = True
            plan.inputs.append(IOSpec(v.name, self.slot(v.name), self.types[v.name], default,
                                      has_default))
        plan.input_index = {i.name: i for i in plan.inputs}

        pending: list[Step] = []
        for node in g:
            spec = self.node_spec(node)
            if self.try_fold(spec):
                continue
            # prepacked state is kept per graph node (the object, not its name:
            # an unnamed node in a subgraph gets the same generated name as one
            # in the main graph, and names may repeat across graphs)
            self._ir_node[id(spec)] = node
            pending.append(Step(len(pending), spec, None))
        if self.options.graph_optimization_level and not self.outer:
            pending = self.optimize(pending)
        self.place(pending)
        self.instantiate(pending)
        if self.options.fuse and not self.outer:
            pending = self.fuse(pending)
        plan.steps = pending
        input_slots = {i.slot for i in plan.inputs}
        plan.donatable = frozenset(
            st.inputs[i] for st in pending for i in st.kernel.inplace.values()
            if i < len(st.inputs) and st.inputs[i] in input_slots)
        # outputs
        for v in g.outputs:
            vt = value_type_of(v.type, v.shape)
            if vt.kind == "unknown" and v.name in self.types:
                vt = self.types[v.name]
            slot = self.slot(v.name)
            if v.name in self.consts:
                plan.output_consts[slot] = self.consts[v.name]
            plan.outputs.append(IOSpec(v.name, slot, vt))
        build_segments(plan, pending, self.options, {self.slot(v.name) for v in g.outputs},
                       self.consts)
        plan.mixed = any(not st.provider.host_accessible for st in pending)
        for seg in plan.segments:
            generate_segment(plan, seg, self.consts, self.slots, options=self.options)
        if self.options.track_memory:
            stores = [(plan.trackers[seg.provider.name], slot) for seg in plan.segments
                      for slot in seg.stores]

            def release(env: list) -> None:
                for tracker, slot in stores:
                    tracker.free(env[slot])

            plan.tracker_release = release
        plan.nslots = len(self.slots)
        return plan

    # ---------------------------------------------------------------- nodes
    def node_spec(self, node: ir.Node) -> NodeSpec:
        name = node.name or f"{node.op_type}_{next(self._names)}"
        domain = node.domain or ""
        opset = node.version or self.opsets.get(domain) or (
            self.opsets.get("ai.onnx", 0) if domain == "" else 1)
        attrs_ = {k: attr_value(a) for k, a in node.attributes.items()}
        inputs = tuple(v.name if v is not None else "" for v in node.inputs)
        outputs = tuple(v.name if v is not None else "" for v in node.outputs)
        in_types = tuple(self.types.get(n) if n else None for n in inputs)
        out_types = []
        for v in node.outputs:
            vt = value_type_of(v.type, v.shape)
            out_types.append(vt)
            if v.name:
                self.types[v.name] = vt
        consts = {i: self.consts[n] for i, n in enumerate(inputs) if n and n in self.consts}
        outer: tuple[str, ...] = ()
        subgraphs = [a.value for a in node.attributes.values() if a.type == ir.AttributeType.GRAPH]
        for a in node.attributes.values():
            if a.type == ir.AttributeType.GRAPHS:
                subgraphs.extend(a.value)
        if subgraphs:
            free: set[str] = set()
            for sg in subgraphs:
                free |= _free_names(sg)
            outer = tuple(sorted(free))
        return NodeSpec(name=name, op_type=node.op_type, domain=domain, opset=int(opset),
                        attrs=attrs_, inputs=inputs, outputs=outputs, input_types=in_types,
                        output_types=tuple(out_types), constant_inputs=consts,
                        model=self.model_name, compile_subgraph=self.compile_subgraph,
                        outer_scope=outer)

    def compile_subgraph(self, graph: ir.Graph) -> "SubgraphRunner":
        outer = sorted(_free_names(graph))
        sub = Compiler(graph, self.opsets, self.providers,
                        attrs.evolve(self.options, parallel=False, tracer=None),
                        self.model_name, outer=outer, shared=self.shared)
        # the parent's constants are visible inside subgraphs
        for n in outer:
            if n in self.types:
                sub.types[n] = self.types[n]
        return SubgraphRunner(sub.compile())

    def try_fold(self, spec: NodeSpec) -> bool:
        if not self.options.fold_constants or spec.op_type in NONDETERMINISTIC:
            return False
        if spec.outer_scope or any(isinstance(v, ir.Graph) for v in spec.attrs.values()):
            return False
        present = [n for n in spec.inputs if n]
        if any(n not in self.consts for n in present):
            return False
        if not present and spec.op_type != "Constant":
            return False  # source ops (SequenceEmpty...) run where they are
        cpu = self.host_provider
        match = cpu.supports_op(spec)
        if not isinstance(match, Supported):
            return False
        limit = FOLD_LIMIT_ELEMENTS
        if spec.op_type == "ConstantOfShape" and spec.domain in ("", "ai.onnx"):
            limit = FOLD_FILL_LIMIT_ELEMENTS
            shape = np.asarray(self.consts[present[0]]).reshape(-1)
            if shape.dtype.kind not in "iu" or np.any(shape < 0) or \
                    math.prod(int(d) for d in shape) > limit:
                return False  # left to run time (its own checks and errors)
        try:
            kernel = cpu.create_kernel(spec)
            kernel.prepare(spec.constant_inputs, {})
            fn = kernel.compile()
            args = [self.consts[n] if n else None for n in spec.inputs]
            res = fn(*args)
        except Exception:
            return False  # the error surfaces at run time, on the node
        outs = res if kernel.multi_output else (res,)
        outs = [materialise_sized(o) if isinstance(o, KernelSizedOutput) else o for o in outs]
        for o in outs:
            if isinstance(o, np.ndarray) and o.size > limit:
                return False
            if not isinstance(o, np.ndarray):
                return False
        if len([n for n in spec.outputs if n]) > len(outs):
            return False
        for name, o in zip(spec.outputs, outs):
            if name:
                self.consts[name] = o
                self.types[name] = ValueType("tensor", int(_dtypes.from_numpy_dtype(o.dtype)),
                                             tuple(o.shape))
        self.plan.placement.append(NodePlacement(spec.name, spec.op_type, "constant",
                                                 {cpu.name: "folded at plan time"}))
        return True

    def optimize(self, steps: list[Step]) -> list[Step]:
        """Run the graph optimizer's passes (:mod:`actorrt.optimizer`) over the
        folded nodes; records what fired in :attr:`Plan.fusions`."""
        from ..optimizer import optimize

        def add_const(hint: str, arr: np.ndarray) -> str:
            name, k = hint, 0
            while name in self.consts or name in self.types or name in self.slots:
                k += 1
                name = f"{hint}.{k}"
            self.consts[name] = arr
            self.types[name] = ValueType("tensor", int(_dtypes.from_numpy_dtype(arr.dtype)),
                                         tuple(arr.shape))
            return name

        protected = {v.name for v in self.graph.outputs}
        specs, fusions = optimize([st.node for st in steps], self.options.graph_optimization_level,
                                  protected, self.consts, add_const)
        self.plan.fusions.extend(fusions)
        return [Step(i, sp, None) for i, sp in enumerate(specs)]

    # ------------------------------------------------------------ placement
    def place(self, steps: list[Step]) -> None:
        where: dict[str, Any] = {}
        for step in steps:
            spec = step.node
            cands: dict[str, float | str] = {}
            best = None
            best_cost = None
            for p in self.providers:
                try:
                    m = p.supports_op(spec)
                except Exception as e:  # a provider's check itself failed
                    m = Unsupported(f"supports_op raised {type(e).__name__}: {e}")
                if isinstance(m, Unsupported):
                    cands[p.name] = m.reason
                    continue
                cost = m.cost
                transfer = 0.0
                for n in spec.inputs:
                    src = where.get(n)
                    if src is not None and src is not p:
                        transfer += p.transfer_us(self.types.get(n))
                    elif src is None and n and n not in self.consts and not p.host_accessible:
                        transfer += p.transfer_us(self.types.get(n))  # a host graph input
                cost = cost.with_transfer(transfer) if transfer else cost
                cands[p.name] = cost.total_us
                if best_cost is None or cost.total_us < best_cost.total_us:
                    best, best_cost = p, cost
            if best is None:
                raise UnsupportedOperatorError(
                    f"no execution provider can run {spec.domain or 'ai.onnx'}:{spec.op_type} "
                    f"(opset {spec.opset})", op_type=spec.op_type, domain=spec.domain,
                    opset=spec.opset, reasons={k: str(v) for k, v in cands.items()},
                    model=self.model_name, node=spec.name)
            step.provider = best
            step.cost = best_cost
            for n in spec.outputs:
                if n:
                    where[n] = best
            self.plan.placement.append(NodePlacement(spec.name, spec.op_type, best.name, cands))

    def instantiate(self, steps: list[Step]) -> None:
        for step in steps:
            spec = step.node
            try:
                k = step.provider.create_kernel(spec)
                shared = self.shared.setdefault(self._ir_node.get(id(spec), spec), {})
                k.prepare(spec.constant_inputs, shared)
            except ActorRTError:
                raise
            except Exception as e:
                raise KernelError(f"building the {spec.op_type} kernel failed: "
                                  f"{type(e).__name__}: {e}", op_type=spec.op_type,
                                  model=self.model_name, node=spec.name) from e
            step.kernel = k
            step.fn = k.compile()
            step.inputs = tuple(self.slot(n) if n else -1 for n in spec.inputs)
            step.outputs = tuple(self.slot(n) if n else -1 for n in spec.outputs)
            step.outer = tuple((n, self.slot(n)) for n in spec.outer_scope)

    def fuse(self, steps: list[Step]) -> list[Step]:
        """Let each provider replace subgraphs of its steps with fused steps;
        records ``(fused node, original nodes)`` in :attr:`Plan.fusions`."""
        protected = {self.slot(v.name) for v in self.graph.outputs}
        consts = {self.slots[n]: v for n, v in self.consts.items() if n in self.slots}

        def make_step(node, provider, kernel, inputs, outputs, cost) -> Step:
            return Step(0, node, provider, kernel, kernel.compile(), tuple(inputs),
                        tuple(outputs), (), cost)

        for p in self.providers:
            steps, fusions = p.fuse_steps(steps, protected, consts, make_step)
            self.plan.fusions.extend(fusions)
            self.plan.fusion_declines.extend(getattr(p, "fusion_declines", ()))
        for i, st in enumerate(steps):
            st.index = i
        return steps


def compile_plan(graph: ir.Graph, opsets: dict[str, int], providers: Sequence[Any],
                 options: PlanOptions = PlanOptions(), model_name: str = "") -> Plan:
    """Compile ``graph`` for ``providers`` (first = preferred on ties).

    Raises:
        UnsupportedOperatorError: a node no provider supports (every provider's
            reason included).
        KernelError: a kernel could not be built or prepacked.
    """
    plan = Compiler(graph, opsets, providers, options, model_name).compile()
    if plan.specialised:
        generic = attrs.evolve(options, specialise_defaults=False)
        plan.generic_compile = lambda: Compiler(graph, opsets, providers, generic,
                                                  model_name).compile()
    return plan
