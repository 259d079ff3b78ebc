"""The async session: ``async with actorrt.open_session(model) as session``."""

from __future__ import annotations

import os
import threading
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, AsyncContextManager, AsyncIterator, Callable, Mapping, Sequence

import attrs
import numpy as np
import trio

from ._errors import (ActorRTError, BaseExceptionGroup, InvalidArgumentError, ModelLoadError,
                      RunCancelledError, SessionClosedError, UnwrapGroups)
from . import _fork
from ._runstate import RunState
from ._model import ModelLike, load_model
from ._outputs import own_outputs
from ._plan import IOSpec, NodePlacement, Plan, PlanOptions, compile_plan, type_string
from .providers import resolve_providers
from .providers._memory import keep_freed_heap_memory
from .providers.base import ExecutionProvider, ProviderStatistics, RunLoop, RunSegment

__all__ = ["SessionOptions", "Session", "open_session", "NodeArg"]


@attrs.frozen
class SessionOptions:
    """Options of a session. Every field is checked when the options are made.

    Raises:
        InvalidArgumentError: a field of the wrong type (flags must be
            ``bool``: ``fuse_kernels="yes"`` is refused) or out of range,
            naming the field and its allowed values.

    Attributes:
        workers: worker actors per provider (``None``: up to 4, one per core).
        memory_limit: bytes each provider may hold (``None``: no limit); raises
            :class:`~actorrt.OutOfMemoryError` before allocating over it.
        parallel_execution: let independent heavy branches run concurrently.
            Not where the CPU kernels already take the cores: a plan whose
            providers are all the host CPU, with ``intra_op_num_threads`` set
            to more than half the cores, runs its branches one after another
            (each concurrent segment would run its kernels on that many
            threads, oversubscribing the cores; see :func:`inter_op_parallel`).
        segment_threshold_us: branches estimated cheaper than this (µs) are not
            worth a separate segment.
        fold_constants: evaluate all-constant nodes once at load time.
        trace: ``"off"``, ``"ops"`` or ``"full"`` (see :mod:`actorrt.tracing`).
        trace_path: write a Chrome/Perfetto trace JSON here when the session
            closes (also enabled by the ``ACTORRT_TRACE`` environment variable).
        enable_fallback: register the slow ``reference`` provider after the
            others, for nodes they decline.
        track_memory: account every owned intermediate as ``activations``
            (live/peak bytes per run; views are free). Costs a little per node;
            on by default when ``memory_limit`` is set.
        fuse_kernels: let providers replace known subgraphs with fused
            kernels (the CPU provider: one kernel per LLM decoder block, see
            ``actorrt.providers.cpu.llm._fusion``), as onnxruntime's graph
            optimizations do; same results, fewer dispatches.
        output_views: return outputs as the kernels made them: zero-copy, but
            an output may be a view of a feed (``Identity``, ``Reshape``,
            ``Transpose``...), or a read-only constant shared between runs.
            Off (the default), every returned array owns its memory and is
            writable, as onnxruntime's (only outputs that would alias a feed,
            a constant or another output are copied).
        graph_optimization_level: graph rewrites before placement
            (:mod:`actorrt.optimizer`), as onnxruntime's option: ``0`` /
            ``"ORT_DISABLE_ALL"``, ``1`` / ``"ORT_ENABLE_BASIC"``, ``2`` /
            ``"ORT_ENABLE_EXTENDED"``, ``99`` / ``"ORT_ENABLE_ALL"`` (default);
            onnxruntime's ``GraphOptimizationLevel`` members are accepted too.
            ``plan.fusions`` lists what fired.
        intra_op_num_threads: threads the CPU kernels (BLAS, compiled
            kernels) use; ``None`` or ``0``: every core. BLAS thread pools are
            process-wide: the setting is applied when this session's worker
            runs, so sessions with different counts switch the pool.
        enable_cpu_mem_arena: keep host memory freed between runs for the
            next run instead of giving it back to the system, as
            onnxruntime's option of that name (its default too). With glibc
            this sets the allocator's mmap and trim thresholds, for the whole
            process and once (:func:`actorrt.providers._memory.keep_freed_heap_memory`):
            the next run's arrays reuse the pages, without page faults; the
            process's resident size keeps its peak. ``False`` leaves the
            allocator as it is (a process where an earlier session set it
            keeps the setting).

    """

    def __attrs_post_init__(self) -> None:
        _check_fields(self)

    @classmethod
    def check(cls, options: Any) -> "SessionOptions":
        """``options`` as session options: ``None`` gives the defaults.

        Raises:
            InvalidArgumentError: ``options`` is not a :class:`SessionOptions`
                (a dict, an ``onnxruntime.SessionOptions``...), naming the
                fields it may set.
        """
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        fields = [f.name for f in attrs.fields(cls)]
        hint = ""
        if isinstance(options, Mapping):
            unknown = [k for k in options if k not in fields]
            hint = (f"; unknown fields {unknown}" if unknown else
                    "; pass actorrt.SessionOptions(**options)")
        elif type(options).__module__.split(".")[0] == "onnxruntime":
            hint = "; onnxruntime's options do not apply, build actorrt.SessionOptions(...)"
        raise InvalidArgumentError(f"options must be actorrt.SessionOptions{hint}",
                                   input="options",
                                   expected=f"actorrt.SessionOptions with fields {fields}",
                                   got=type(options).__qualname__)

    workers: int | None = None
    memory_limit: int | None = None
    parallel_execution: bool = True
    segment_threshold_us: float = 200.0
    fold_constants: bool = True
    output_views: bool = False
    trace: str = "off"
    trace_path: str | None = None
    enable_fallback: bool = False
    track_memory: bool = False
    fuse_kernels: bool = True
    graph_optimization_level: Any = "ORT_ENABLE_ALL"
    intra_op_num_threads: int | None = None
    enable_cpu_mem_arena: bool = True


def _field_error(name: str, expected: str, value: Any) -> InvalidArgumentError:
    return InvalidArgumentError(f"SessionOptions.{name} is invalid", input=name,
                                expected=expected, got=repr(value))


def _is_flag(v: Any) -> bool:
    return isinstance(v, (bool, np.bool_))


def _is_count(v: Any, minimum: int) -> bool:
    return v is None or (not _is_flag(v) and isinstance(v, (int, np.integer)) and v >= minimum)


def _is_us(v: Any) -> bool:
    import math
    return (not _is_flag(v) and isinstance(v, (int, float, np.number))
            and math.isfinite(float(v)) and v >= 0)


def _is_level(v: Any) -> bool:
    from .optimizer import parse_level
    try:
        parse_level(v)
    except ValueError:
        return False
    return True


def _check_fields(o: SessionOptions) -> None:
    """Check every field of ``o`` (flags are ``bool``, counts ``int``...).

    Raises:
        InvalidArgumentError: naming the first bad field and its allowed values.
    """
    from .tracing import LEVELS

    if isinstance(o.trace_path, os.PathLike):
        object.__setattr__(o, "trace_path", os.fspath(o.trace_path))
    checks = {
        "workers": (lambda v: _is_count(v, 1), "None or an int >= 1"),
        "memory_limit": (lambda v: _is_count(v, 0), "None or an int >= 0"),
        "segment_threshold_us": (_is_us, "a finite number of µs >= 0"),
        "trace": (lambda v: isinstance(v, str) and v in LEVELS, f"one of {list(LEVELS)}"),
        "trace_path": (lambda v: v is None or isinstance(v, str),
                       "None or a file path (str or os.PathLike)"),
        "graph_optimization_level": (_is_level, "0/1/2/99 or ORT_DISABLE_ALL, "
                                     "ORT_ENABLE_BASIC, ORT_ENABLE_EXTENDED, ORT_ENABLE_ALL"),
        "intra_op_num_threads": (lambda v: _is_count(v, 0), "None or an int >= 0"),
    }
    for f in attrs.fields(type(o)):
        value = getattr(o, f.name)
        if f.name in checks:
            ok, allowed = checks[f.name]
        elif isinstance(f.default, bool):  # every flag: True or False, nothing else
            ok, allowed = _is_flag, "True or False"
        else:
            continue
        if not ok(value):
            raise _field_error(f.name, allowed, value)


@attrs.frozen
class NodeArg:
    """A graph input or output, as onnxruntime's ``NodeArg``.

    Attributes:
        name: the value's name.
        shape: list of dims: ``int``, ``str`` for a symbolic dim, ``None`` if unknown.
        type: e.g. ``'tensor(float)'``.
    """

    name: str
    shape: list
    type: str


def _opt_level(options: SessionOptions) -> int:
    from .optimizer import parse_level
    try:
        return parse_level(options.graph_optimization_level)
    except ValueError as e:
        raise InvalidArgumentError(str(e)) from None


def _node_arg(spec: IOSpec) -> NodeArg:
    return NodeArg(spec.name, spec.shape, type_string(spec.type))


class Session:
    """A loaded model bound to running provider actors. Obtain one from
    :func:`open_session`; many tasks may call :meth:`run` at once."""

    def __init__(self, plan: Plan, providers: list[ExecutionProvider], model_name: str,
                 tracer: Any = None, options: SessionOptions | None = None):
        self._plan = plan
        self._output_views = bool(options is not None and options.output_views)
        self._providers = providers
        self.model_name = model_name
        self._closed = False
        self._tracer = tracer
        self._output_index = {o.name: i for i, o in enumerate(plan.outputs)}
        self._bindings: dict[str, Any] = {}
        #: the runs under way (cancelled when the session closes)
        self._runs: set[RunState] = set()
        #: runs need a RunState: they account activations, or run control
        #: flow (which stops when its run is cancelled)
        self._stateful = plan.tracker_release is not None or any(
            seg.iterates for seg in plan.segments)
        self._forked = False  # set in a child made by fork (see actorrt._fork)
        self._pid = _fork.register(self)
        #: the one segment :meth:`run_blocking` may run in its caller's thread
        #: (``None``: every run goes through the workers)
        segs = plan.segments
        self._direct = (segs[0] if len(segs) == 1 and not self._stateful and not plan.mixed
                        and tracer is None and not segs[0].iterates
                        and segs[0].provider.host_accessible else None)
        #: runs under way in callers' threads (:meth:`run_blocking`); closing
        #: waits for them before the providers release their memory
        self._direct_lock = threading.Condition(threading.Lock())
        self._direct_running = 0

    def _closed_error(self) -> SessionClosedError:
        if self._forked:
            return _fork.forked_error(self._pid, "this session", self.model_name)
        return SessionClosedError("the session is closed", model=self.model_name)

    def _mark_closed(self) -> None:
        with self._direct_lock:
            self._closed = True

    def _wait_direct_runs(self) -> None:
        """Block until no :meth:`run_blocking` call runs a kernel (blocking:
        call it off the event loop)."""
        with self._direct_lock:
            while self._direct_running:
                self._direct_lock.wait()

    def _cancel_runs(self, reason: str) -> None:
        for state in list(self._runs):
            state.cancel(reason)

    # --------------------------------------------------------------- metadata
    def get_inputs(self) -> list[NodeArg]:
        """Graph inputs (initializers with defaults excluded, as onnxruntime)."""
        return [_node_arg(i) for i in self._plan.inputs if not i.has_default]

    def get_overridable_initializers(self) -> list[NodeArg]:
        return [_node_arg(i) for i in self._plan.inputs if i.has_default]

    def get_outputs(self) -> list[NodeArg]:
        return [_node_arg(o) for o in self._plan.outputs]

    def get_providers(self) -> list[str]:
        """Provider names in priority order, e.g. ``['cpu']``."""
        return [p.name for p in self._providers]

    def placement(self) -> list[NodePlacement]:
        """Per node: the chosen provider and every provider's cost (µs) or
        decline reason. Folded nodes show provider ``"constant"``."""
        return list(self._plan.placement)

    def statistics(self) -> dict[str, ProviderStatistics]:
        """Each provider's statistics (memory by role, buffers, copies)."""
        return {p.name: p.statistics() for p in self._providers}

    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def tracer(self):
        return self._tracer

    # ------------------------------------------------------------------- run
    def _output_indices(self, output_names: Sequence[str] | None) -> list[int] | None:
        if output_names is None:
            return None
        if isinstance(output_names, str):
            output_names = [output_names]
        idx = []
        for n in output_names:
            i = self._output_index.get(n)
            if i is None:
                raise InvalidArgumentError(
                    f"unknown output {n!r}", input=n,
                    expected=f"one of {list(self._output_index)}", got=repr(n),
                    model=self.model_name)
            idx.append(i)
        return idx

    async def run(self, output_names: Sequence[str] | None, feeds: dict[str, Any], *,
                  donate: Sequence[str] = ()) -> list:
        """Run the model.

        Args:
            output_names: outputs to return, or ``None`` for all in graph order.
            feeds: input name -> numpy array (a list for a sequence input, ``None``
                for an empty optional).
            donate: inputs whose buffers kernels that declare in-place outputs
                may overwrite (e.g. a KV cache with spare capacity that
                GroupQueryAttention appends to). Inputs bound with an aliased
                output (:meth:`bind_device`) are donated automatically.

        Returns:
            One value per requested output: numpy arrays; lists for ONNX
            sequences; ``None`` for an empty optional. Each array owns its
            memory and is writable: an output that would share memory with
            a feed, a constant of the model or another output is copied
            (outputs on donated buffers are returned as they are); with
            ``SessionOptions(output_views=True)`` outputs are returned as the
            kernels made them (possibly views of the feeds, read-only
            constants shared between runs).

        Raises:
            InvalidArgumentError: unknown/missing input, wrong dtype/rank/dim,
                unknown output name.
            KernelError: a kernel failed (node named).
            OutOfMemoryError: a provider's limit would be exceeded.
            SessionClosedError: the session was closed (before or during the
                run: a run under way when the session closes stops).
            SessionForkedError: used in a process forked from its creator.

        A caller cancelled while the run is under way withdraws the work not
        yet started; work already running finishes, then everything the run
        accounted is released; control flow stops at its next iteration.
        """
        if self._closed:
            raise self._closed_error()
        plan = self._plan
        indices = self._output_indices(output_names)
        env = plan.new_env()
        donated = frozenset(donate)
        if self._bindings:
            feeds = dict(feeds)
            for name, b in self._bindings.items():
                feeds.setdefault(name, b.value())
            donated |= {n for n, b in self._bindings.items() if b.output_name is not None}
        if plan.overrides_default(feeds):  # a compiled-in initializer is fed
            plan = await trio.to_thread.run_sync(plan.generic_plan)
            env = plan.new_env()
        plan.bind_feeds(feeds, env, donated)
        seg = self._direct if plan is self._plan else None  # not the generic plan's
        if seg is not None and seg.provider.runs_inline(seg, env):
            # a cheap segment a worker would run on its trio task anyway: run
            # it on this task (no mailbox round trip)
            await trio.lowlevel.checkpoint_if_cancelled()
            seg.provider.run_segment_direct(plan, seg, env)
            await trio.lowlevel.cancel_shielded_checkpoint()
        elif not self._stateful:
            # nothing to release or to stop: a cancelled caller's queued
            # segments are withdrawn by the workers (see actorrt.actors)
            await execute(plan, env, self._tracer)
        else:
            release = plan.tracker_release
            state = RunState(None if release is None else (lambda: release(env)))
            runs = self._runs
            runs.add(state)
            try:
                await execute(plan, env, self._tracer, state)
                if state.cancelled:  # the session closed while this run was under way
                    raise SessionClosedError("the session closed during the run",
                                             model=self.model_name)
            except RunCancelledError as e:
                raise SessionClosedError(f"the session closed during the run: {e}",
                                         model=self.model_name) from e
            finally:
                runs.discard(state)
                state.finish()
        if self._bindings:
            for b in self._bindings.values():
                if b.output_name is not None:
                    spec = plan.outputs[self._output_index[b.output_name]]
                    value = plan.collect_outputs(env, [self._output_index[b.output_name]])[0]
                    b.store_output(value)
                    env[spec.slot] = b.value()
        outs = plan.collect_outputs(env, indices)
        return outs if self._output_views else own_outputs(outs, feeds, plan, donated)

    @property
    def runs_blocking(self) -> bool:
        """Whether :meth:`run_blocking` runs the model in its caller's thread
        now: the plan is one segment on a host provider without control flow,
        memory accounting or tracing, and no device binding is set."""
        return self._direct is not None and not self._bindings

    def runs_blocking_with(self, feeds: dict[str, Any]) -> bool:
        """:attr:`runs_blocking`, for a run fed ``feeds``: false as well when
        ``feeds`` overrides an initializer the plan compiled in (that run
        takes the generic plan, through :meth:`run`)."""
        return self.runs_blocking and not self._plan.overrides_default(feeds)

    def run_blocking(self, output_names: Sequence[str] | None, feeds: dict[str, Any]) -> list:
        """Run the model in the calling thread, without the event loop and
        the worker actors: what :meth:`run` does, for a plan where
        :attr:`runs_blocking` is true (the synchronous ``InferenceSession``'s
        fast path: no thread hop). Many threads may call it at once. Call it
        from a plain thread, never from the event loop (it blocks).

        A session closed while the call runs waits for it to finish (its
        memory is released after), then the call raises
        :class:`~actorrt.SessionClosedError`.

        Returns:
            As :meth:`run`.

        Raises:
            InvalidArgumentError: :attr:`runs_blocking` is false; and as
                :meth:`run`.
            KernelError, OutOfMemoryError, SessionClosedError,
                SessionForkedError: as :meth:`run`.
        """
        seg = self._direct
        if seg is None or self._bindings or self._plan.overrides_default(feeds):
            raise InvalidArgumentError(
                "run_blocking needs a plan of one host segment without control flow, "
                "memory accounting, tracing or device bindings, and feeds that override "
                "no compiled-in initializer; use run()",
                expected="Session.runs_blocking_with(feeds) true", got="false",
                model=self.model_name)
        plan = self._plan
        indices = self._output_indices(output_names)
        env = plan.new_env()
        plan.bind_feeds(feeds, env)
        lock = self._direct_lock
        with lock:
            if self._closed:
                raise self._closed_error()
            self._direct_running += 1
        try:
            seg.provider.run_segment_direct(plan, seg, env)
        finally:
            with lock:
                self._direct_running -= 1
                if self._closed and not self._direct_running:
                    lock.notify_all()  # a close waits in _wait_direct_runs
        if self._closed:
            if self._forked:
                raise self._closed_error()
            raise SessionClosedError("the session closed during the run", model=self.model_name)
        outs = plan.collect_outputs(env, indices)
        return outs if self._output_views else own_outputs(outs, feeds, plan, frozenset())

    async def run_many(self, next_feeds: Callable[[list | None], dict | None], *,
                       donate: Sequence[str] = (),
                       carry: Mapping[str, str] | None = None) -> int:
        """Run the model again and again, each run's feeds made from the
        previous run's outputs: an LLM decode loop without a round trip
        through the event loop per token.

        ``next_feeds(outputs)`` gets the previous run's outputs (all of them,
        in graph order, owned as :meth:`run`'s are unless
        ``SessionOptions(output_views=True)``; ``None`` before the first run)
        and returns the next
        run's feeds, or ``None`` to stop. When every segment of the plan runs
        on one provider (and no device binding is set), the runs happen back
        to back in one of that provider's worker threads and ``next_feeds``
        is called there, between runs: it must not touch the event loop
        (hand results over with ``trio.lowlevel.TrioToken.run_sync_soon``) and
        should return ``None`` soon when the caller wants to stop (the loop
        cannot be interrupted mid-run). Otherwise each run is a :meth:`run`
        and ``next_feeds`` is called on the event loop. Each :meth:`run`
        hands the work to a thread and back; measured here (2 cores) that
        cost 0.7-1 ms, 7-10 % of a SmolLM2 decode step.

        ``carry`` binds outputs back to inputs, as a KV cache's ``present.*``
        outputs become the next step's ``past_key_values.*``: from the second
        run on, each carried input takes the previous run's output unless
        ``next_feeds`` returns a value for it, so the feeds need only hold
        what changes (the new token ids, the attention mask). A carried value
        is checked against its input like a feed when it is not the object
        the input had in the run before (an output written in place is
        checked once).

        Args:
            next_feeds: see above.
            donate: as for :meth:`run`.
            carry: ``{input name: output name}``.

        Returns:
            The number of runs.

        Raises:
            InvalidArgumentError: an unknown name in ``carry``; a carried
                output that does not fit its input (as for a feed).
            Those of :meth:`run`, and whatever ``next_feeds`` raises.
        """
        if self._closed:
            raise self._closed_error()
        plan = self._plan
        pairs = tuple((carry or {}).items())
        if pairs:
            plan.carry_slots(pairs)  # unknown names fail here, before any run
        if not self._output_views:  # next_feeds sees owned outputs
            next_feeds = _owning(next_feeds, plan, frozenset(donate), pairs, self._output_index)
        providers = {seg.provider for seg in plan.segments}
        # (a plan with compiled-in initializer defaults takes the per-run
        # loop below, where a feed overriding one of them picks the generic plan)
        if len(providers) == 1 and not self._bindings and not plan.mixed and not plan.specialised:
            provider = providers.pop()
            state = RunState()
            self._runs.add(state)
            try:
                runs = await provider.pool.ask(
                    RunLoop(plan, next_feeds, frozenset(donate), pairs, state))
                if runs is None or state.cancelled:
                    raise SessionClosedError("the session closed during run_many",
                                             model=self.model_name)
                return runs
            except RunCancelledError as e:
                raise SessionClosedError(f"the session closed during run_many: {e}",
                                         model=self.model_name) from e
            finally:
                self._runs.discard(state)
                state.finish()
        outputs = None
        runs = 0
        while True:
            feeds = next_feeds(outputs)
            if feeds is None:
                return runs
            if outputs is not None and pairs:
                feeds = {**{i: outputs[self._output_index[o]] for i, o in pairs
                            if i not in feeds}, **feeds}
            outputs = await self.run(None, feeds, donate=donate)
            runs += 1

    # ------------------------------------------------------- tensors, bindings
    async def run_with_tensors(self, output_names: Sequence[str] | None,
                               feeds: dict[str, Any]) -> list:
        """Like :meth:`run`, but feeds may be :class:`~actorrt.Tensor` objects and
        the outputs are Tensors that own the buffers :meth:`run` returned (no
        copy on handoff; an output that would alias a feed or a constant was
        copied by :meth:`run`). Close them (or use ``with``) when done."""
        from ._tensor import Tensor
        from .providers.base import Adopt

        plain = {k: (v.numpy() if isinstance(v, Tensor) else v) for k, v in feeds.items()}
        outs = await self.run(output_names, plain)
        host = next(p for p in self._providers if p.name == "cpu")
        result = []
        for o in outs:
            if isinstance(o, np.ndarray):
                buf = await host.ref.ask(Adopt(o, "tensors"))
                from ._dtypes import from_numpy_dtype
                result.append(Tensor(host, buf, from_numpy_dtype(o.dtype), o.shape))
            else:
                result.append(o)
        return result

    async def bind_device(self, input_name: str, dtype: Any, physical_shape: Sequence[int],
                          output_name: str | None = None,
                          logical_shape: Sequence[int] | None = None,
                          expose_logical_shape: bool = False) -> "DeviceIoBinding":
        """Allocate a persistent buffer (role ``bindings``) for graph input
        ``input_name``; when ``output_name`` is given that output is written into
        the same memory after each run.

        Raises:
            InvalidArgumentError: unknown input/output, dtype mismatch, logical
                shape beyond the capacity.
            OutOfMemoryError: over the provider's limit.
        """
        from ._dtypes import from_numpy_dtype
        from ._tensor import DeviceIoBinding, Tensor

        spec = self._plan.input_index.get(input_name)
        if spec is None:
            raise InvalidArgumentError(f"unknown input {input_name!r}", input=input_name,
                                       expected=f"one of {[i.name for i in self._plan.inputs]}",
                                       got=repr(input_name), model=self.model_name)
        if output_name is not None and output_name not in self._output_index:
            raise InvalidArgumentError(f"unknown output {output_name!r}", input=output_name,
                                       expected=f"one of {list(self._output_index)}",
                                       got=repr(output_name), model=self.model_name)
        dt = from_numpy_dtype(np.dtype(dtype)) if not isinstance(dtype, int) else dtype
        if spec.type.dtype is not None and int(dt) != spec.type.dtype:
            raise InvalidArgumentError(f"binding dtype for {input_name!r} differs from the input",
                                       input=input_name, expected=type_string(spec.type),
                                       got=str(dtype), model=self.model_name)
        host = next(p for p in self._providers if p.name == "cpu")
        t = await Tensor.empty(dt, tuple(physical_shape), host, role="bindings")
        t.numpy()[...] = 0
        b = DeviceIoBinding(t, input_name, output_name, tuple(physical_shape), expose_logical_shape,
                            self)
        if logical_shape is not None:
            b.set_logical_shape(logical_shape)
        self._bindings[input_name] = b
        return b

    def _unbind(self, binding: Any) -> None:
        self._bindings.pop(binding.input_name, None)

    def io_binding(self) -> "IOBinding":
        """An onnxruntime-style :class:`~actorrt.IOBinding` for this session."""
        from ._tensor import IOBinding
        return IOBinding(self)

    async def run_with_iobinding(self, binding: "IOBinding") -> None:
        """Run with ``binding``'s inputs; its outputs become Tensors (written into
        preallocated tensors where bound)."""
        names = list(binding.outputs) or [o.name for o in self._plan.outputs]
        if not binding.outputs:
            binding.outputs = {n: None for n in names}
        outs = await self.run_with_tensors(names, binding.inputs)
        binding._results = {}
        for name, t in zip(names, outs):
            pre = binding.outputs.get(name)
            if pre is not None:
                np.copyto(pre.numpy(), t.numpy())
                t.close()
                t = pre
            binding._results[name] = t


def _owning(next_feeds: Callable, plan: Plan, donated: frozenset, pairs: tuple,
            output_index: dict) -> Callable:
    """``next_feeds`` of :meth:`Session.run_many`, handed outputs that own
    their memory (:func:`~actorrt._outputs.own_outputs`) rather than the run's
    own values (which the loop keeps for ``carry``). A run's feeds, for the
    check, are what the previous call returned plus the inputs carried from
    the run before."""
    last: dict = {"raw": None, "feeds": None}

    def owned_next_feeds(outputs: list | None) -> dict | None:
        shown = outputs
        if outputs is not None:
            feeds = last["feeds"] or {}
            raw = last["raw"]
            if pairs and raw is not None:
                feeds = {**{i: raw[output_index[o]] for i, o in pairs if i not in feeds},
                         **feeds}
            shown = own_outputs(outputs, feeds, plan, donated)
        nxt = next_feeds(shown)
        last["raw"], last["feeds"] = outputs, nxt
        return nxt

    return owned_next_feeds


async def _run_one(plan: Plan, seg: Any, env: list, state: RunState | None) -> None:
    if seg.iterates:
        await seg.provider.run_iterating(plan, seg, env, state)
    else:
        await seg.provider.pool.ask(RunSegment(plan, seg, env, state))


async def execute(plan: Plan, env: list, tracer: Any = None,
                  state: RunState | None = None) -> None:
    """Run ``plan``'s segments over ``env``: ready segments fan out to their
    providers' worker actors (control-flow segments to threads of their own,
    see :meth:`~actorrt.providers.ExecutionProvider.run_iterating`); values
    crossing segments are released once their last consumer segment finished.

    ``state`` is the run's :class:`~actorrt._runstate.RunState`: segments of a
    cancelled run that have not started are withdrawn, running control flow
    stops between iterations."""
    segs = plan.segments
    if len(segs) == 1:
        await _run_one(plan, segs[0], env, state)
        return
    if not segs:
        return
    remaining = [len(s.preds) for s in segs]
    # with accounting on, values are released (and accounted) at the run's end
    counts = dict(plan.release_counts) if plan.tracker_release is None else {}

    async def run(seg, nursery):
        await _run_one(plan, seg, env, state)
        for slot in seg.loads:
            c = counts.get(slot)
            if c is not None:
                c -= 1
                counts[slot] = c
                if c == 0:
                    env[slot] = None
        for s in seg.succs:
            remaining[s] -= 1
            if remaining[s] == 0:
                nursery.start_soon(run, segs[s], nursery)

    try:
        async with trio.open_nursery() as nursery:
            for seg in segs:
                if not seg.preds:
                    nursery.start_soon(run, seg, nursery)
    except BaseExceptionGroup as eg:
        raise _first_error(eg) from None


def _first_error(eg: BaseExceptionGroup) -> BaseException:
    for e in eg.exceptions:
        if isinstance(e, BaseExceptionGroup):
            return _first_error(e)
        if not isinstance(e, trio.Cancelled):
            return e
    return eg.exceptions[0]


def open_session(model: ModelLike, providers: Sequence[Any] | None = None,
                 options: SessionOptions | None = None) -> AsyncContextManager[Session]:
    """Load ``model``, start its provider actors and yield a :class:`Session`::

        async with actorrt.open_session("model.onnx") as session:
            ...

    What leaves the block is the exception itself, never an ExceptionGroup
    around it (unless several distinct failures happened at once): the body's
    own exception passes through unchanged, and ``except actorrt.ActorRTError``
    catches the session's errors outside the block.

    Args:
        model: path, bytes, ``onnx.ModelProto`` or ``onnx_ir.Model``.
        providers: provider names in priority order (``"cpu"`` /
            ``"CPUExecutionProvider"``, ``"reference"``, ``"cuda"``) or provider
            instances; default ``["cpu"]``.
        options: :class:`SessionOptions`.

    Raises:
        ModelLoadError: the model cannot be loaded.
        UnsupportedOperatorError: a node no provider supports.
        InvalidArgumentError: an unknown provider name.
    """
    options = SessionOptions.check(options)
    # resolved here, in the caller's frame: fallback warnings point at its line
    provs = resolve_providers(providers, options)
    if options.enable_cpu_mem_arena:
        keep_freed_heap_memory()
    return UnwrapGroups(_open_session(model, provs, options))


def inter_op_parallel(options: SessionOptions, providers: Sequence[ExecutionProvider],
                      cores: int | None = None) -> bool:
    """Whether a session's plan may run independent branches concurrently:
    ``options.parallel_execution``, except for a plan on host CPU providers
    only whose ``intra_op_num_threads`` is set above half of ``cores``
    (default ``os.cpu_count()``). There each concurrent segment would run its
    kernels on ``intra_op_num_threads`` threads (and each calling thread gets
    its own compiled partner team, :mod:`actorrt.providers.cpu._partner`), so
    branches side by side oversubscribe the cores: measured on 2 cores at 2
    threads, the BERT-style encoder's first-layer K/V branches cost the sync
    API its one-thread fast path (:meth:`Session.run_blocking`) and CPU time
    without wall gain; the genai engine turns branches off for the same
    reason. ``None`` / ``0`` (every core, the default) keeps the option as
    given."""
    if not options.parallel_execution:
        return False
    n = options.intra_op_num_threads
    if not n or any(p.name != "cpu" for p in providers):
        return True
    return 2 * n <= (cores or os.cpu_count() or 1)


@asynccontextmanager
async def _open_session(model: ModelLike, provs: list[ExecutionProvider],
                        options: SessionOptions) -> AsyncIterator[Session]:
    from . import tracing

    trace_path = options.trace_path or os.environ.get("ACTORRT_TRACE") or None
    level = options.trace if options.trace != "off" else ("ops" if trace_path else "off")
    tracer = tracing.TraceCollector(level) if level != "off" else None
    loaded = await trio.to_thread.run_sync(load_model, model)
    plan_opts = PlanOptions(fold_constants=options.fold_constants,
                            parallel=inter_op_parallel(options, provs),
                            segment_threshold_us=options.segment_threshold_us, tracer=tracer,
                            track_memory=options.track_memory or options.memory_limit is not None,
                            fuse=options.fuse_kernels,
                            graph_optimization_level=_opt_level(options))
    m = loaded.model
    opsets = dict(m.opset_imports)
    for p in provs:  # its memory errors name the model
        p.memory.model = loaded.name
    try:
        plan = await trio.to_thread.run_sync(
            lambda: compile_plan(m.graph, opsets, provs, plan_opts, loaded.name))
    except ActorRTError as e:
        raise e.add_context(model=loaded.name)
    async with AsyncExitStack() as stack:
        for p in provs:
            await stack.enter_async_context(p.open())
        # weights: initializers and folded constants live on the CPU provider
        weights = _weights_bytes(plan)
        host = next(p for p in provs if p.name == "cpu")
        host.memory.reserve(weights, "weights", what="initializers (the model's weights)")
        session = Session(plan, provs, loaded.name, tracer, options)
        try:
            yield session
        finally:
            session._mark_closed()
            if session._direct_running:  # kernels in callers' threads finish first
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(session._wait_direct_runs)
            # runs still under way stop: queued work is withdrawn, control
            # flow stops at its next iteration (so closing never waits on it)
            session._cancel_runs("the session closed")
            session._bindings.clear()
            host.memory.release(weights, "weights")
            if tracer is not None and trace_path:
                tracer.export_chrome(trace_path)


def _weights_bytes(plan: Plan) -> int:
    seen: set[int] = set()
    total = 0
    for st in plan.steps:
        for arr in st.node.constant_inputs.values():
            if isinstance(arr, np.ndarray) and id(arr) not in seen:
                seen.add(id(arr))
                total += arr.nbytes
    return total
