"""The compiled plan: its options, steps, segments and placement, and running it.

:class:`Plan` holds what :func:`~actorrt._plan.compile_plan` built and runs
it: binding feeds (:meth:`Plan.bind_feeds`), running segments with typed
errors naming the failing node (:meth:`Plan.run_segment`), gathering outputs;
:class:`SubgraphRunner` runs a compiled control-flow body.
"""

from __future__ import annotations

import math
import operator
import threading
import traceback
from typing import TYPE_CHECKING, Any, Callable, Sequence

import attrs
import numpy as np

from .. import _runstate
from .._errors import ActorRTError, InvalidArgumentError, KernelError, OutOfMemoryError
from ..providers._contract import Cost, Kernel, NodeSpec
from .values import IOSpec, check_value, fast_checks, to_host, type_string

if TYPE_CHECKING:
    from .codegen import ActivationTracker

__all__ = ["NodePlacement", "Plan", "PlanOptions", "Segment", "Step", "SubgraphRunner"]


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
        input_index: input name -> its :class:`IOSpec`.
        generic_compile: compiles :meth:`generic_plan` (set by
            :func:`~actorrt._plan.compile_plan` when defaults were
            specialised; ``None`` otherwise).
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
        self.input_index: dict[str, IOSpec] = {}
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
        self.generic_compile: Callable[[], "Plan"] | None = None
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
        if self.generic_compile is None:
            return self
        with self._generic_lock:
            if self._generic is None:
                self._generic = self.generic_compile()
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
                    v = to_host(v)
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
            spec = self.input_index.get(name)
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
                value = check_value(self.input_index[name], value, self.model_name)
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
        index = self.input_index
        fast = self._fast_checks
        if fast is None:
            fast = self._fast_checks = fast_checks(self.inputs)
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
            value = check_value(spec, value, self.model_name)
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
