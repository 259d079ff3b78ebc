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
"""

from __future__ import annotations

import functools
import itertools
import keyword
import math
import operator
import sys
import threading
import traceback
from typing import Any, Callable, Sequence

import attrs
import numpy as np
import onnx_ir as ir

from . import _dtypes, _runstate
from ._errors import (ActorRTError, InvalidArgumentError, KernelError, OutOfMemoryError,
                      UnsupportedOperatorError)
from .providers._contract import (Cost, Kernel, KernelSizedOutput, NodeSpec, Supported,
                                  Unsupported, ValueType)

__all__ = ["Plan", "Step", "Segment", "PlanOptions", "compile_plan", "NodePlacement",
           "value_type_of"]

#: Ops never folded at plan time (their outputs differ between runs).
NONDETERMINISTIC = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
    "Multinomial", "Bernoulli", "Dropout",
})

#: Largest constant (elements) folding may create.
FOLD_LIMIT_ELEMENTS = 1 << 22


@attrs.frozen
class PlanOptions:
    """Compile-time knobs.

    Attributes:
        fold_constants: evaluate all-constant nodes at plan time.
        parallel: allow several segments per provider so independent branches
            run concurrently (False: one segment per provider run).
        segment_threshold_us: a branch estimated cheaper than this (µs) is merged
            into a neighbour rather than paying a message to run alone.
        tracer: a tracing collector; ``None`` compiles code with no trace hooks.
        track_memory: account every owned intermediate (not views) as
            ``activations`` on its provider; off compiles no accounting code.
        fuse: let providers fuse known subgraphs of the main graph
            (:meth:`ExecutionProvider.fuse_steps`).
        graph_optimization_level: :mod:`actorrt.optimizer` level run on the
            main graph after folding (0 none, 1 basic, 2 extended, 99 all).
        specialise_defaults: compile the main graph with its overridable
            initializers (graph inputs with an initializer) as the constants
            they are by default, so folding and the optimizer see them; a run
            that feeds one of them uses a generic plan compiled on first need
            (:meth:`Plan.generic_plan`). onnxruntime folds them only for IR < 4
            (where it refuses to let them be fed); results are the same.
    """

    fold_constants: bool = True
    parallel: bool = True
    segment_threshold_us: float = 200.0
    tracer: Any = None
    track_memory: bool = False
    fuse: bool = True
    graph_optimization_level: int = 99
    specialise_defaults: bool = True


@attrs.define(eq=False)
class Step:
    """One node in a compiled plan."""

    index: int
    node: NodeSpec
    provider: Any
    kernel: Kernel | None = None
    fn: Callable | None = None
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    outer: tuple[tuple[str, int], ...] = ()
    cost: Cost = Cost()


@attrs.define(eq=False)
class Segment:
    """Nodes that run back to back on one provider.

    Attributes:
        loads: slots read from the run's environment (graph inputs and values
            other segments produced).
        stores: slots written to the environment (graph outputs and values other
            segments read).
        fn: the compiled function ``fn(env) -> None``.
        cost_us: summed estimate of the steps (µs); infinite when
            ``unbounded``.
    """

    index: int
    provider: Any
    steps: list[Step]
    preds: set[int] = attrs.Factory(set)
    succs: set[int] = attrs.Factory(set)
    loads: tuple[int, ...] = ()
    stores: tuple[int, ...] = ()
    fn: Callable | None = None
    cost_us: float = 0.0
    #: some step's cost is unknown (control flow, data-dependent sizes):
    #: ``cost_us`` is infinite and the segment runs in a worker thread
    unbounded: bool = False
    #: some step runs subgraphs (control flow): may run for as long as its
    #: trip count says, so it runs in a thread outside the worker pool and
    #: stops between body calls when its run is cancelled
    iterates: bool = False
    #: the summed estimate with each symbolic dim counted as 1 (µs)
    base_cost_us: float = 0.0
    #: for an unbounded segment whose sizes all come from graph-input dims:
    #: how to bound its cost at run time (see :meth:`runtime_cost_us`)
    dim_refs: tuple | None = None

    def runtime_cost_us(self, env: list) -> float:
        """An upper bound of the segment's cost (µs) for this run's input
        sizes: :attr:`cost_us` when known at plan time, else from
        :attr:`dim_refs` (infinite when the graph inputs do not give the
        sizes)."""
        cost = self.cost_us
        if cost != math.inf or self.dim_refs is None:
            return cost
        scale = 1.0
        try:
            for slot, axis, exp in self.dim_refs:
                scale *= float(env[slot].shape[axis]) ** exp
        except (AttributeError, IndexError, TypeError):
            return math.inf
        return self.base_cost_us * scale
    source: str = ""
    line_map: dict[int, Step] = attrs.Factory(dict)


@attrs.frozen
class NodePlacement:
    """Where one node runs and why.

    Attributes:
        node: the node's name.
        op_type: its operator type.
        provider: the chosen provider's name (``"constant"`` when folded).
        candidates: provider name -> estimated total µs (float) or decline reason (str).
    """

    node: str
    op_type: str
    provider: str
    candidates: dict[str, float | str]


@attrs.frozen
class IOSpec:
    """A graph input or output as a session reports it."""

    name: str
    slot: int
    type: ValueType
    default: Any = None  # initializer value for overridable inputs
    has_default: bool = False

    @property
    def shape(self) -> list[int | str | None]:
        return list(self.type.shape) if self.type.shape is not None else []

    @property
    def type_str(self) -> str:
        return type_string(self.type)


def type_string(vt: ValueType) -> str:
    """onnxruntime-style type string, e.g. ``'tensor(float)'``, ``'seq(tensor(int64))'``."""
    if vt.kind == "tensor":
        return f"tensor({_dtypes.type_string(vt.dtype)})" if vt.dtype else "tensor(undefined)"
    if vt.kind == "sequence":
        return f"seq({type_string(vt.elem)})" if vt.elem else "seq(undefined)"
    if vt.kind == "optional":
        return f"optional({type_string(vt.elem)})" if vt.elem else "optional(undefined)"
    return vt.kind


def value_type_of(t: ir.TypeProtocol | None, shape: ir.Shape | None) -> ValueType:
    """The :class:`ValueType` of an onnx-ir type and shape."""
    if t is None:
        return ValueType(kind="unknown")
    if isinstance(t, ir.TensorType):
        dims = None
        if shape is not None:
            dims = tuple(d if isinstance(d, int) else (d.value if d.value is not None else None)
                         for d in shape.dims)
        return ValueType("tensor", int(t.dtype), dims)
    if isinstance(t, ir.SequenceType):
        return ValueType("sequence", int(t.dtype) if t.dtype is not None else None, None,
                         value_type_of(t.elem_type, None))
    if isinstance(t, ir.OptionalType):
        return ValueType("optional", int(t.dtype) if t.dtype is not None else None, None,
                         value_type_of(t.elem_type, None))
    if isinstance(t, ir.SparseTensorType):
        return ValueType("sparse", int(t.dtype), None)
    return ValueType(kind="unknown")


def tensor_to_numpy(t: ir.TensorProtocol) -> np.ndarray:
    """An onnx-ir tensor as numpy (strings as an object array of ``str``)."""
    arr = t.numpy()
    if t.dtype == ir.DataType.STRING:
        flat = [x.decode("utf-8") if isinstance(x, bytes) else x for x in arr.reshape(-1)]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(arr.shape)
    return arr


def attr_value(a: ir.Attr) -> Any:
    """Python value of an onnx-ir attribute."""
    T = ir.AttributeType
    v = a.value
    if a.type == T.TENSOR:
        return tensor_to_numpy(v)
    if a.type == T.TENSORS:
        return [tensor_to_numpy(x) for x in v]
    if a.type in (T.INTS, T.FLOATS):
        return list(v)
    if a.type == T.STRINGS:
        return [x.decode("utf-8") if isinstance(x, bytes) else x for x in v]
    if a.type == T.STRING:
        return v.decode("utf-8") if isinstance(v, bytes) else v
    if a.type == T.GRAPHS:
        return list(v)
    return v


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


class Plan:
    """A compiled graph. Built by :func:`compile_plan`; run by the scheduler
    (``actorrt._executor``) or synchronously with :meth:`run_sync`.

    Attributes:
        model_name: the model's display name (errors name it).
        inputs / outputs: :class:`IOSpec` lists in graph order.
        steps: every non-folded node.
        segments: the segment DAG.
        placement: one :class:`NodePlacement` per node (folded ones included).
        nslots: size of a run's value environment.
    """

    def __init__(self) -> None:
        self.model_name = ""
        self.inputs: list[IOSpec] = []
        self.outputs: list[IOSpec] = []
        self.output_consts: dict[int, Any] = {}
        self.steps: list[Step] = []
        self.segments: list[Segment] = []
        self.placement: list[NodePlacement] = []
        self.nslots = 0
        self.slot_names: list[str] = []
        self.outer_inputs: list[tuple[str, int]] = []
        self.release_counts: dict[int, int] = {}
        self.tracker_release: Any = None  # set when intermediates are accounted
        #: some segment runs on a device provider: values cross memories
        self.mixed = False
        self.trackers: dict[str, ActivationTracker] = {}
        #: graph-input slots a kernel may overwrite in place when donated
        self.donatable: frozenset[int] = frozenset()
        self.tracer = None
        self._input_index = {}
        self._fast_checks: dict | None = None
        self._gather_outputs: Callable | None = None
        #: (fused node name, names of the nodes it replaced), one per fusion
        self.fusions: list[tuple[str, tuple[str, ...]]] = []
        #: (node name, reason) of each candidate a provider declined to fuse
        #: (e.g. an LLM decoder block of another shape than its fused kernel's)
        self.fusion_declines: list[tuple[str, str]] = []
        #: overridable initializers compiled in as constants
        #: (:attr:`PlanOptions.specialise_defaults`); a run feeding one of them
        #: takes :meth:`generic_plan`
        self.specialised: frozenset[str] = frozenset()
        self._generic_compile: Callable[[], "Plan"] | None = None
        self._generic: "Plan | None" = None
        self._generic_lock = threading.Lock()

    # ------------------------------------------------- specialised defaults
    def overrides_default(self, feeds: dict) -> bool:
        """Whether ``feeds`` names an input this plan compiled in as its
        default value (then :meth:`generic_plan` must run it)."""
        return bool(self.specialised) and not self.specialised.isdisjoint(feeds)

    def generic_plan(self) -> "Plan":
        """The plan with every overridable initializer read from the run's
        feeds, compiled on the first call (blocking: call it from a worker
        thread) and kept; ``self`` when nothing was specialised.

        Raises:
            UnsupportedOperatorError, KernelError: as :func:`compile_plan`.
        """
        if self._generic_compile is None:
            return self
        with self._generic_lock:
            if self._generic is None:
                self._generic = self._generic_compile()
            return self._generic

    # ------------------------------------------------------------ running
    def new_env(self) -> list:
        return [None] * self.nslots

    def collect_outputs(self, env: list, indices: Sequence[int] | None = None) -> list:
        if indices is None and not self.output_consts and not self.mixed:
            # every output: one C-level gather (an LLM's 60 KV outputs a step)
            get = self._gather_outputs
            if get is None:
                slots = [o.slot for o in self.outputs]
                get = self._gather_outputs = (
                    (lambda env: [env[slots[0]]]) if len(slots) == 1 else
                    (lambda env, _g=operator.itemgetter(*slots): list(_g(env))) if slots
                    else (lambda env: []))
            res = get(env)
            if not any(issubclass(t, np.generic) for t in set(map(type, res))):
                return res
            return [np.asarray(v) if isinstance(v, np.generic) else v for v in res]
        outs = self.outputs if indices is None else [self.outputs[i] for i in indices]
        res = []
        for o in outs:
            if o.slot in self.output_consts:
                res.append(self.output_consts[o.slot])
            else:
                v = env[o.slot]
                if self.mixed:
                    v = _to_host(v)
                res.append(np.asarray(v) if isinstance(v, np.generic) else v)
        return res

    def run_segment(self, seg: Segment, env: list) -> None:
        """Run one segment in the calling thread, mapping failures to typed errors."""
        try:
            seg.fn(env)
        except BaseException as exc:  # noqa: BLE001 - re-raised typed
            raise self.translate_error(seg, exc) from exc

    def run_sync(self, env: list) -> None:
        """Run every segment in order in this thread (subgraphs, folding)."""
        for seg in self.segments:
            self.run_segment(seg, env)

    def translate_error(self, seg: Segment, exc: BaseException) -> BaseException:
        """A typed error naming the failing node of ``seg``."""
        if not isinstance(exc, Exception):
            return exc
        step = None
        tb = exc.__traceback__
        fname = f"<actorrt segment {id(seg)}>"
        for frame, lineno in traceback.walk_tb(tb):
            if frame.f_code.co_filename == fname:
                step = seg.line_map.get(lineno)
        node = step.node if step is not None else None
        if isinstance(exc, ActorRTError):
            if exc.node is None and node is not None:
                exc.node = node.name
            if exc.model is None:
                exc.model = self.model_name
            return exc
        if isinstance(exc, MemoryError):
            return OutOfMemoryError(f"{node.op_type if node else 'a kernel'} could not allocate: "
                                    f"{exc}", requested=int(getattr(exc, "_total_size", -1)),
                                    in_use=seg.provider.memory.statistics().live_bytes,
                                    limit=seg.provider.memory.limit,
                                    role="activations", provider=seg.provider.name,
                                    model=self.model_name, node=node.name if node else None)
        op = node.op_type if node else "?"
        return KernelError(f"{op} kernel on provider {seg.provider.name} failed: "
                           f"{type(exc).__name__}: {exc}", op_type=op, model=self.model_name,
                           node=node.name if node else None)

    # ------------------------------------------------------------ feeds
    def carry_slots(self, pairs: Sequence[tuple[str, str]]) -> tuple:
        """``(input name, input slot, output position)`` for each ``(input
        name, output name)`` pair of a run loop's ``carry``.

        Raises:
            InvalidArgumentError: an unknown input or output name.
        """
        outputs = {o.name: i for i, o in enumerate(self.outputs)}
        res = []
        for name, out in pairs:
            spec = self._input_index.get(name)
            if spec is None:
                raise InvalidArgumentError(
                    f"carry names unknown input {name!r}", input=name,
                    expected=f"one of {[i.name for i in self.inputs]}", got=repr(name),
                    model=self.model_name)
            if out not in outputs:
                raise InvalidArgumentError(
                    f"carry names unknown output {out!r} (for input {name!r})", input=name,
                    expected=f"one of {list(outputs)}", got=repr(out), model=self.model_name)
            res.append((name, spec.slot, outputs[out]))
        return tuple(res)

    def bind_carried(self, carry: tuple, outputs: list, feeds: dict, env: list,
                     donate: frozenset, last: dict) -> dict:
        """Store the previous run's outputs in ``env`` as the carried inputs
        (``carry`` from :meth:`carry_slots`) that ``feeds`` does not name. A
        value is checked as a feed unless it is the object ``last`` (this
        method's previous result: input name -> value) holds for its input.

        Returns:
            input name -> the value bound.

        Raises:
            InvalidArgumentError: as :meth:`bind_feeds`.
        """
        bound = {}
        donatable = self.donatable
        for name, slot, at in carry:
            if name in feeds:
                continue
            value = outputs[at]
            bound[name] = value
            if value is not last.get(name):
                value = _check_value(self._input_index[name], value, self.model_name)
            if slot in donatable and name not in donate and isinstance(value, np.ndarray):
                value = value.view()  # kernels writing in place see it read-only
                value.flags.writeable = False
            env[slot] = value
        return bound

    def bind_feeds(self, feeds: dict, env: list, donate: frozenset = frozenset(),
                   preset: Sequence[str] = ()) -> None:
        """Validate ``feeds`` against the graph inputs and store them in ``env``.

        ``donate`` names inputs whose buffers in-place kernels may overwrite
        (others are passed read-only to such kernels); ``preset`` names inputs
        already stored (:meth:`bind_carried`), not missing.

        Raises:
            InvalidArgumentError: unknown or missing input, wrong type, dtype, rank
                or static dim.
        """
        if not isinstance(feeds, dict):
            raise InvalidArgumentError("feeds must be a dict of input name -> value",
                                       expected="dict", got=type(feeds).__name__,
                                       model=self.model_name)
        index = self._input_index
        fast = self._fast_checks
        if fast is None:
            fast = self._fast_checks = _fast_checks(self.inputs)
        donatable = self.donatable
        ndarray = np.ndarray
        for name, value in feeds.items():
            check = fast.get(name)
            if check is not None and type(value) is ndarray:
                # the common case, checked without building messages: a numpy
                # array of the input's dtype, rank and static dims
                slot, want, rank, static = check
                if value.dtype == want and value.ndim == rank:
                    shape = value.shape
                    for axis, d in static:
                        if shape[axis] != d:
                            break
                    else:
                        if slot in donatable and name not in donate:
                            value = value.view()  # kernels writing in place see it read-only
                            value.flags.writeable = False
                        env[slot] = value
                        continue
            spec = index.get(name)
            if spec is None:
                raise InvalidArgumentError(
                    f"unknown input {name!r}", input=name,
                    expected=f"one of {[i.name for i in self.inputs]}", got=repr(name),
                    model=self.model_name)
            value = _check_value(spec, value, self.model_name)
            if spec.slot in self.donatable and name not in donate and isinstance(value, np.ndarray):
                value = value.view()  # kernels that write in place see it read-only
                value.flags.writeable = False
            env[spec.slot] = value
        if len(feeds) + len(preset) != len(self.inputs):
            for spec in self.inputs:
                if spec.name not in feeds and spec.name not in preset:
                    if spec.has_default:
                        env[spec.slot] = spec.default
                    elif spec.type.kind == "optional":
                        env[spec.slot] = None
                    else:
                        raise InvalidArgumentError(
                            f"missing input {spec.name!r}", input=spec.name,
                            expected=f"a {type_string(spec.type)} of shape {spec.shape}",
                            got="nothing", model=self.model_name)


def _fast_checks(inputs: Sequence[IOSpec]) -> dict[str, tuple]:
    """name -> (slot, numpy dtype, rank, ((axis, static dim), ...)) of the
    tensor inputs with a known dtype and rank (:meth:`Plan.bind_feeds`'s
    fast path; anything else takes :func:`_check_value`)."""
    out = {}
    for spec in inputs:
        vt = spec.type
        if vt.kind != "tensor" or vt.dtype is None or vt.shape is None:
            continue
        want = _dtypes.to_numpy_dtype(vt.dtype)
        if want == np.dtype(object):
            continue
        static = tuple((a, d) for a, d in enumerate(vt.shape) if isinstance(d, int))
        out[spec.name] = (spec.slot, want, len(vt.shape), static)
    return out


def _check_value(spec: IOSpec, value: Any, model: str) -> Any:
    vt = spec.type
    if vt.kind == "tensor":
        if not isinstance(value, np.ndarray):
            if isinstance(value, (np.generic, int, float, bool, list, tuple)):
                value = np.asarray(value)
            elif hasattr(value, "__array__"):
                value = np.asarray(value)
            else:
                raise InvalidArgumentError(
                    f"input {spec.name!r} must be a numpy array", input=spec.name,
                    expected=type_string(vt), got=type(value).__name__, model=model)
        if vt.dtype is not None:
            want = _dtypes.to_numpy_dtype(vt.dtype)
            # a stand-in (a paged KV pool) names the element type it is fed as
            got = getattr(value, "feed_dtype", value.dtype)
            if got != want and not (want == np.dtype(object) and got.kind in "OUS"):
                raise InvalidArgumentError(
                    f"input {spec.name!r} has the wrong element type", input=spec.name,
                    expected=type_string(vt), got=f"tensor({_np_name(got)})", model=model)
            if want == np.dtype(object) and got.kind in "US":
                value = value.astype(object)
        if vt.shape is not None:
            if value.ndim != len(vt.shape):
                raise InvalidArgumentError(
                    f"input {spec.name!r} has the wrong rank", input=spec.name,
                    expected=f"rank {len(vt.shape)} {list(vt.shape)}",
                    got=f"rank {value.ndim} {list(value.shape)}", model=model)
            for axis, (d, g) in enumerate(zip(vt.shape, value.shape)):
                if isinstance(d, int) and d != g:
                    raise InvalidArgumentError(
                        f"input {spec.name!r} has an incompatible dimension {axis}",
                        input=spec.name, expected=f"shape {list(vt.shape)}",
                        got=f"shape {list(value.shape)}", model=model)
        return value
    if vt.kind == "sequence":
        if not isinstance(value, (list, tuple)):
            raise InvalidArgumentError(f"input {spec.name!r} must be a list (an ONNX sequence)",
                                       input=spec.name, expected=type_string(vt),
                                       got=type(value).__name__, model=model)
        return list(value)
    return value


def _np_name(dt: np.dtype) -> str:
    try:
        return _dtypes.type_string(_dtypes.from_numpy_dtype(dt))
    except Exception:
        return str(dt)


# ======================================================================== compile

class _Compiler:
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
        plan._input_index = {i.name: i for i in plan.inputs}

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
        self.segment(pending)
        plan.mixed = any(not st.provider.host_accessible for st in pending)
        for seg in plan.segments:
            _codegen(plan, seg, self.consts, self.slots, options=self.options)
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
        sub = _Compiler(graph, self.opsets, self.providers,
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
        try:
            kernel = cpu.create_kernel(spec)
            kernel.prepare(spec.constant_inputs, {})
            fn = kernel.compile()
            args = [self.consts[n] if n else None for n in spec.inputs]
            res = fn(*args)
        except Exception:
            return False  # the error surfaces at run time, on the node
        outs = res if kernel.multi_output else (res,)
        outs = [_materialise_sized(o) if isinstance(o, KernelSizedOutput) else o for o in outs]
        for o in outs:
            if isinstance(o, np.ndarray) and o.size > FOLD_LIMIT_ELEMENTS:
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
        from .optimizer import optimize

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

    # ----------------------------------------------------------- segments
    def segment(self, steps: list[Step]) -> None:
        plan = self.plan
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
        threshold = self.options.segment_threshold_us
        heavy = sum(1 for s in steps if s.cost.total_us >= threshold)
        if not self.options.parallel or heavy < 2:
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
        graph_out = {self.slot(v.name) for v in self.graph.outputs}
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
                    if i >= 0 and self.plan.slot_names[i] not in self.consts:
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


def _workspace_fn(step: Step, arena: Any) -> Callable:
    """``fn(inputs) -> buffers``: the kernel's exact requests for these input
    shapes, served from the provider's workspace arena."""
    kernel = step.kernel
    key = step.node.name

    def workspace(inputs: tuple) -> list:
        shapes = [getattr(x, "shape", None) for x in inputs]
        requests = kernel.workspace(shapes)
        return arena.buffers(key, requests) if requests else []

    return workspace


def _to_host(v: Any) -> Any:
    """A device array (cupy) as numpy; anything else unchanged."""
    if isinstance(v, list):
        return [_to_host(x) for x in v]
    if not isinstance(v, np.ndarray) and hasattr(v, "__cuda_array_interface__"):
        return v.get()
    return v


def _read_only(v: Any) -> Any:
    """A read-only view, so an in-place kernel cannot overwrite a shared value."""
    if isinstance(v, np.ndarray) and v.flags.writeable:
        v = v.view()
        v.flags.writeable = False
    return v


def _materialise_sized(o: KernelSizedOutput) -> np.ndarray:
    """Check a kernel-sized output's dtype, shape and byte length, then wrap it
    as an array (no copy for a numpy buffer).

    Raises:
        TypeError / ValueError: the buffer disagrees with its declared shape/dtype.
    """
    dtype = np.dtype(o.dtype)
    shape = tuple(int(d) for d in o.shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"kernel-sized output has a negative dim: {shape}")
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    data = o.data
    if isinstance(data, np.ndarray):
        if data.dtype != dtype:
            raise TypeError(f"kernel-sized output is {data.dtype}, declared {dtype}")
        if data.size != n:
            raise ValueError(f"kernel-sized output holds {data.size} elements, shape {shape} "
                             f"needs {n}")
        return data.reshape(shape)
    buf = memoryview(data)
    if buf.nbytes != n * dtype.itemsize:
        raise ValueError(f"kernel-sized output holds {buf.nbytes} bytes, shape {shape} of "
                         f"{dtype} needs {n * dtype.itemsize}")
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


class ActivationTracker:
    """Accounts owned intermediates as ``activations`` on a provider's memory
    accountant. An output that shares memory with one of its step's inputs (a
    view) costs nothing; each buffer is counted once however many values hold it.

    Values are recorded in the ledger of the run the calling thread works for
    (:func:`actorrt._runstate.current`), so whatever a failed or cancelled run
    still holds is released with it; outside a run (plan time) in the
    tracker's own ledger."""

    def __init__(self, accountant: Any):
        self.acc = accountant
        self.live: dict[int, tuple[Any, Any]] = {}

    def _ledger(self) -> dict:
        s = _runstate.current()
        return self.live if s is None else s.ledger

    def alloc(self, v: Any, *inputs: Any) -> None:
        if type(v) is not np.ndarray or not v.nbytes:
            return
        live = self._ledger()
        if id(v) in live:
            return
        for x in inputs:
            if type(x) is np.ndarray and np.may_share_memory(v, x):
                return
        self.acc.reserve(v.nbytes, "activations", what="an intermediate")
        live[id(v)] = (self.acc, v)

    def free(self, v: Any) -> None:
        held = self._ledger().pop(id(v), None)
        if held is not None:
            held[0].release(held[1].nbytes, "activations")


class SubgraphRunner:
    """A compiled control-flow body: ``runner(inputs, outer) -> list of outputs``.

    Attributes:
        input_names / output_names: the body's formal inputs and outputs.
        outer_names: outer-scope names the body reads (pass them in ``outer``).
    """

    def __init__(self, plan: Plan):
        self.plan = plan
        self.input_names = [i.name for i in plan.inputs]
        self.output_names = [o.name for o in plan.outputs]
        self.outer_names = [n for n, _ in plan.outer_inputs]

    def __call__(self, inputs: Sequence[Any], outer: dict | None = None) -> list:
        """Run the body once.

        Raises:
            RunCancelledError: the run this body call works for was cancelled
                (checked before each call: a long Loop stops between
                iterations).
            KernelError, OutOfMemoryError: as for a run.
        """
        _runstate.check_cancelled("a control-flow body")
        plan = self.plan
        env = plan.new_env()
        for spec, v in zip(plan.inputs, inputs):
            env[spec.slot] = v
        if outer:
            for name, slot in plan.outer_inputs:
                if name in outer:
                    env[slot] = outer[name]
        try:
            plan.run_sync(env)
            return plan.collect_outputs(env)
        finally:
            # the body's outputs now belong to the kernel that called it (the
            # enclosing node's outputs are accounted there): released here,
            # or a long Loop would hold each iteration's accounted
            if plan.tracker_release is not None:
                plan.tracker_release(env)


# ======================================================================== codegen

def _codegen(plan: Plan, seg: Segment, consts: dict[str, Any], slots: dict[str, int], *,
             options: PlanOptions) -> None:
    """Compile ``seg`` to ``fn(env)``: values are locals ``v<slot>``, kernels and
    constants are default arguments, intermediates are deleted after their last
    use in the segment."""
    const_slots = {slots[n]: v for n, v in consts.items() if n in slots}
    tracer = options.tracer
    defaults: dict[str, Any] = {"_sized": _materialise_sized, "_contig": np.ascontiguousarray,
                                "_ro": _read_only}
    track = options.track_memory
    if track:
        tracker = plan.trackers.setdefault(seg.provider.name, ActivationTracker(seg.provider.memory))
        defaults["_alloc"] = tracker.alloc
        defaults["_free"] = tracker.free
    lines: list[str] = []
    line_steps: list[Step | None] = []

    def emit(text: str, step: Step | None = None) -> None:
        lines.append("    " + text)
        line_steps.append(step)

    device = plan.mixed
    def ref(slot: int) -> str:
        if slot < 0:
            return "None"
        if slot in const_slots:
            if f"c{slot}" not in defaults:
                value = const_slots[slot]
                # constants move to the segment's memory once, at compile time
                defaults[f"c{slot}"] = seg.provider.import_value(value) if device else value
            return f"c{slot}"
        return f"v{slot}"

    if device:
        defaults["_imp"] = seg.provider.import_value
    for slot in seg.loads:
        emit(f"v{slot} = _imp(env[{slot}])" if device else f"v{slot} = env[{slot}]")
    # last use of each local inside the segment
    last_use: dict[int, int] = {}
    for k, st in enumerate(seg.steps):
        for i in itertools.chain(st.inputs, (sl for _, sl in st.outer)):
            if i >= 0:
                last_use[i] = k
    stores = set(seg.stores)
    loads = set(seg.loads)
    if tracer is not None:
        from .tracing import _set_active
        defaults["_span"] = tracer.op_span
        defaults["_clock"] = tracer.clock
        defaults["_act"] = _set_active
        emit("_act(True)")
    for k, st in enumerate(seg.steps):
        kname = f"k{st.index}"
        fn, kwargs = st.fn, {}
        if type(fn) is functools.partial and not fn.args and fn.keywords and \
                all(n.isidentifier() and not keyword.iskeyword(n) for n in fn.keywords):
            # a function kernel's attributes as keywords of the call itself: no
            # partial object merging its keyword dict on every call
            fn, kwargs = fn.func, fn.keywords
        defaults[kname] = fn
        args = []
        strided_ok = st.kernel.accepts_strided
        inplace_pos = set(st.kernel.inplace.values())
        input_slots = {spec.slot for spec in plan.inputs}
        out_rank = st.node.output_types[0].rank if st.node.output_types and \
            st.node.output_types[0] is not None else None
        for pos, i in enumerate(st.inputs):
            r = ref(i)
            if (isinstance(st.fn, np.ufunc) and out_rank and i in const_slots
                    and isinstance(const_slots[i], np.ndarray) and const_slots[i].ndim < out_rank):
                # align a constant's rank with the output once: numpy's same-rank
                # loop is about twice as fast as broadcasting a lower rank per call
                value = const_slots[i]
                r = f"c{i}r{out_rank}"
                if r not in defaults:
                    value = value.reshape((1,) * (out_rank - value.ndim) + value.shape)
                    defaults[r] = seg.provider.import_value(value) if device else value
            if not strided_ok and r != "None":
                r = f"_contig({r})"
            if pos in inplace_pos and r != "None" and i not in input_slots:
                r = f"_ro({r})"  # only donated graph inputs may be overwritten
            args.append(r)
        for n, value in kwargs.items():
            defaults[f"a{st.index}_{n}"] = value
            args.append(f"{n}=a{st.index}_{n}")
        if st.outer:
            args.append("outer={" + ", ".join(f"{n!r}: {ref(sl)}" for n, sl in st.outer) + "}")
        if st.kernel.uses_workspace:
            # exact scratch for these input shapes, handed over by the executor
            defaults[f"w{st.index}"] = _workspace_fn(st, seg.provider.workspace)
            ins_ = ", ".join(ref(i) for i in st.inputs)
            args.append(f"workspace=w{st.index}(({ins_}{',' if ins_ else ''}))")
        call = f"{kname}({', '.join(args)})"
        outs = [o for o in st.outputs]
        if tracer is not None:
            emit("_t0 = _clock()", st)
        if st.kernel.multi_output:
            emit(f"_r = {call}", st)
            for j, o in enumerate(outs):
                if o >= 0:
                    val = f"_r[{j}]"
                    if st.kernel.kernel_sized_outputs:
                        val = f"_sized({val})"
                    emit(f"v{o} = {val}", st)
        else:
            o = outs[0] if outs else -1
            target = f"v{o}" if o >= 0 else "_"
            if st.kernel.kernel_sized_outputs:
                call = f"_sized({call})"
            emit(f"{target} = {call}", st)
        if tracer is not None:
            defaults[f"s{st.index}"] = st
            ins = ", ".join(ref(i) for i in st.inputs)
            outs_ = ", ".join(f"v{o}" for o in outs if o >= 0)
            emit(f"_span(s{st.index}, _t0, ({ins}{',' if ins else ''}), ({outs_}{',' if outs_ else ''}))", st)
        if track:
            ins = "".join(f", {ref(i)}" for i in st.inputs if i >= 0)
            for o in outs:
                if o >= 0:
                    emit(f"_alloc(v{o}{ins})", st)
        for o in outs:
            if o >= 0 and o in stores:
                emit(f"env[{o}] = v{o}", st)
        # drop locals whose last use was this step
        dead = [i for i in set(itertools.chain(st.inputs, (sl for _, sl in st.outer)))
                if i >= 0 and last_use.get(i) == k and i not in const_slots]
        for o in outs:
            if o >= 0 and o not in last_use and o not in stores:
                dead.append(o)
        if dead:
            if track:
                for i in sorted(set(dead)):
                    if i not in loads and i not in stores:
                        emit(f"_free(v{i})", None)
            emit("del " + ", ".join(f"v{i}" for i in sorted(set(dead))), None)
    if tracer is not None:
        emit("_act(False)")
    if not lines:
        emit("pass")
    params = ", ".join(f"{n}={n}" for n in defaults)
    header = f"def segment(env, {params}):" if params else "def segment(env):"
    src = header + "\n" + "\n".join(lines) + "\n"
    filename = f"<actorrt segment {id(seg)}>"
    ns: dict[str, Any] = dict(defaults)
    exec(compile(src, filename, "exec"), ns)
    pad = _frame_padding(ns["segment"].__code__)
    if pad:
        src += "    if 0:  # frame padding, see _frame_padding\n        " + " = ".join(
            f"_pad{i}" for i in range(pad)) + " = None\n"
        ns = dict(defaults)
        exec(compile(src, filename, "exec"), ns)
    seg.fn = ns["segment"]
    seg.source = src
    seg.line_map = {n + 2: s for n, s in enumerate(line_steps) if s is not None}


#: CPython (3.11+) keeps frames on a per-thread stack of 16 KiB chunks and
#: frees a chunk (munmap) as soon as the frame that opened it returns
_CHUNK_BYTES = 16 * 1024


def _frame_padding(code: Any) -> int:
    """Unused local slots to add to a generated segment so that its frame is
    larger than one data-stack chunk.

    A segment of a big graph has one local per value: SmolLM2's decode segment
    has ~1,800 (a ~15 KiB frame). Such a frame nearly fills the 16 KiB chunk it
    lands in, so each kernel it calls opens and frees a new chunk: an
    mmap/munmap pair and fresh page faults per node (measured here: ~270 per
    decode step, a third of the step's time when run from a worker thread).
    A frame above one chunk always gets a chunk of its own sized with at least
    8,000 bytes (CPython's MINIMUM_OVERHEAD) to spare for the kernels' frames.
    Frames under 4 KiB are left alone. The slots are never assigned (dead code),
    so they cost nothing per call."""
    words = code.co_nlocals + len(code.co_cellvars) + len(code.co_freevars) + code.co_stacksize
    size = 8 * (words + 12)  # + the frame's fixed header
    if size < 4096 or size > _CHUNK_BYTES:
        return 0
    return (_CHUNK_BYTES - size) // 8 + 64


def compile_plan(graph: ir.Graph, opsets: dict[str, int], providers: Sequence[Any],
                 options: PlanOptions = PlanOptions(), model_name: str = "") -> Plan:
    """Compile ``graph`` for ``providers`` (first = preferred on ties).

    Raises:
        UnsupportedOperatorError: a node no provider supports (every provider's
            reason included).
        KernelError: a kernel could not be built or prepacked.
    """
    plan = _Compiler(graph, opsets, providers, options, model_name).compile()
    if plan.specialised:
        generic = attrs.evolve(options, specialise_defaults=False)
        plan._generic_compile = lambda: _Compiler(graph, opsets, providers, generic,
                                                  model_name).compile()
    return plan
