"""The execution-provider contract.

An :class:`ExecutionProvider` is two things:

* at plan time, a kernel source: :meth:`~ExecutionProvider.supports_op` answers
  :class:`~actorrt.providers.Supported` / :class:`~actorrt.providers.Unsupported`
  for a node, :meth:`~ExecutionProvider.create_kernel` builds its kernel;
* at run time, a trio actor that owns its allocations (accounted by role, with an
  optional limit) and its stream (messages are handled one at a time, in order),
  plus a pool of worker actors that run plan segments off the event loop.

Every request is a frozen attrs message sent through an
:class:`~actorrt.actors.ActorRef`.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import math
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, ClassVar

import attrs
import numpy as np
import trio

from .._dtypes import storage_bytes, to_numpy_dtype
from .._errors import InvalidArgumentError, SessionClosedError
from .._runstate import check_cancelled, running
from ..actors import Actor, ActorRef, open_actors
from ._contract import (DeviceProfile, Kernel, KernelMatch, NodeSpec, Unsupported,
                        ValueType, estimate_bytes)
from ._memory import MemoryAccountant, MemoryStatistics, WorkspaceArena, running_on
from ._registry import KernelRegistry

__all__ = [
    "ExecutionProvider", "Allocate", "Free", "CopyFromHost", "CopyToHost", "Sync", "Argmax",
    "RunSegment", "RunLoop", "Buffer", "ProviderStatistics",
]


# ---------------------------------------------------------------------- messages

@attrs.frozen
class Allocate:
    """Allocate a buffer. Reply: :class:`Buffer`.

    Attributes:
        shape: dims of the buffer.
        dtype: ONNX element type (``onnx_ir.DataType`` int).
        role: accounting role (``"tensors"``, ``"bindings"``, ``"kv-cache"``...).
        zero: fill with zeros.
    """

    shape: tuple[int, ...]
    dtype: int
    role: str = "tensors"
    zero: bool = False


@attrs.frozen
class Free:
    """Return a buffer to its provider. Reply: None. Freeing twice is a no-op."""

    buffer_id: int


@attrs.frozen
class CopyFromHost:
    """Copy a host array into a new provider buffer. Reply: :class:`Buffer`."""

    array: Any
    role: str = "tensors"


@attrs.frozen
class Adopt:
    """Take ownership of an array already in provider memory (no copy).
    Reply: :class:`Buffer`."""

    array: Any
    role: str = "tensors"
    guard: Any = None  # called once when the buffer is freed


@attrs.frozen
class CopyToHost:
    """Copy a buffer (or a byte range of it) to host memory. Reply: numpy array."""

    buffer_id: int


@attrs.frozen
class WriteBytes:
    """Write raw bytes into a buffer at a byte offset. Reply: None."""

    buffer_id: int
    offset: int
    data: bytes


@attrs.frozen
class Sync:
    """Wait until every earlier message's work finished. Reply: None."""


@attrs.frozen
class Argmax:
    """Argmax over the last axis of a float32/float16 buffer, on the provider.

    Attributes:
        buffer_id: the logits buffer, shape ``(..., n)``.
        n: how many leading elements of the last axis to consider (0: all).
    Reply: numpy uint32 array of shape ``(...)``.
    """

    buffer_id: int
    n: int = 0


@attrs.frozen
class RunSegment:
    """Run one plan segment (handled by a worker actor). Reply: None.

    Attributes:
        state: the run's :class:`~actorrt._runstate.RunState` (or ``None``):
            a segment whose run was cancelled before a worker took it is
            skipped; kernels check its flag between iterations.
    """

    plan: Any
    segment: Any
    env: list
    state: Any = None


@attrs.frozen
class RunLoop:
    """Run a plan whose segments all belong to this provider again and again
    in one worker thread (handled by a worker actor). Reply: the number of
    runs.

    Attributes:
        plan: the plan.
        next_feeds: ``next_feeds(outputs)``, called in the worker thread with
            the previous run's outputs (``None`` before the first run): the
            next run's feeds, or ``None`` to stop.
        donate: names of inputs whose buffers in-place kernels may overwrite.
        carry: ``(input name, output name)`` pairs: from the second run on,
            the input takes the previous run's output unless the feeds name
            it (see :meth:`actorrt.Session.run_many`).
        state: the :class:`~actorrt._runstate.RunState` of the whole loop: when
            it is cancelled the loop stops before its next run (and control
            flow inside a run between body calls).
    """

    plan: Any
    next_feeds: Any
    donate: frozenset = frozenset()
    carry: tuple = ()
    state: Any = None


@attrs.define(eq=False)
class Buffer:
    """A provider-owned allocation.

    Attributes:
        id: provider-unique id.
        array: the provider's array object (numpy on CPU, cupy on CUDA).
        nbytes: accounted bytes.
        role: accounting role.
    """

    id: int
    array: Any
    nbytes: int
    role: str
    guard: Any = None


@attrs.frozen
class ProviderStatistics:
    """Statistics of a provider actor.

    Attributes:
        name: provider name.
        memory: :class:`MemoryStatistics`.
        live_buffers: buffers currently owned.
        segments_run: segments executed by its workers.
        host_to_device_bytes / device_to_host_bytes: bytes copied (bytes).
    """

    name: str
    memory: MemoryStatistics
    live_buffers: int
    segments_run: int
    host_to_device_bytes: int
    device_to_host_bytes: int


# ---------------------------------------------------------------------- provider

class ExecutionProvider(Actor, abc.ABC):
    """Base class of execution providers (see module docstring).

    Class attributes:
        name: short name (``"cpu"``).
        aliases: other accepted names (``"CPUExecutionProvider"``).
        host_accessible: buffers are plain host memory (zero-copy to numpy).
        registry: the provider's :class:`KernelRegistry`.
    """

    name: ClassVar[str] = "base"
    aliases: ClassVar[tuple[str, ...]] = ()
    host_accessible: ClassVar[bool] = True
    registry: ClassVar[KernelRegistry]

    #: segments estimated below this (µs) run on the worker's trio task instead
    #: of hopping to a thread (a hop costs ~80 µs).
    inline_threshold_us: float = 100.0

    def __init__(self, *, workers: int = 2, memory_limit: int | None = None,
                 profile: DeviceProfile | None = None):
        super().__init__(self.name)
        self.profile = profile or DeviceProfile()
        self.memory = MemoryAccountant(self.name, memory_limit)
        self.workspace = WorkspaceArena(self.memory)
        self.n_workers = max(1, int(workers))
        self._buffers: dict[int, Buffer] = {}
        self._ids = itertools.count(1)
        self._segments_run = 0
        self.h2d_bytes = 0
        self.d2h_bytes = 0
        self._limiter = trio.CapacityLimiter(self.n_workers)
        # control-flow segments: one thread each, outside the worker pool
        self._long_limiter = trio.CapacityLimiter(math.inf)
        self._pool_send, self._pool_recv = trio.open_memory_channel(math.inf)
        self._workers = [
            _Worker(f"{self.name}.worker{i}", self, (self._pool_send.clone(),
                                                      self._pool_recv.clone()))
            for i in range(self.n_workers)
        ]
        self.pool = self._workers[0].ref

    # ------------------------------------------------------------ plan time
    def supports_op(self, node: NodeSpec) -> KernelMatch:
        """:class:`Supported` with a cost, or :class:`Unsupported` with a reason."""
        cls = self.registry.lookup(node.domain, node.op_type, node.opset)
        if cls is None:
            return Unsupported(self.registry.miss_reason(node.domain, node.op_type, node.opset))
        return cls.supports(node, self.profile)

    def create_kernel(self, node: NodeSpec) -> Kernel:
        """Build the kernel for ``node`` (after :meth:`supports_op` said yes)."""
        cls = self.registry.lookup(node.domain, node.op_type, node.opset)
        return cls(node)

    def fuse_steps(self, steps: list, protected: set[int], consts: dict[int, Any],
                   make_step: Any) -> tuple[list, list[tuple[str, tuple[str, ...]]]]:
        """Replace subgraphs of a plan's steps with fused kernels (plan time,
        after every kernel is built and prepacked).

        Args:
            steps: the plan's steps in topological order (every provider's).
            protected: value slots read outside the steps (graph outputs).
            consts: slot -> constant value.
            make_step: ``make_step(node, provider, kernel, inputs, outputs,
                cost)`` builds a step.

        Returns:
            ``(steps, fusions)``: the new topological step list and one
            ``(fused node name, original node names)`` per fusion. The default
            fuses nothing.
        """
        return steps, []

    def transfer_us(self, vt: ValueType | None) -> float:
        """Estimated µs to move a value of type ``vt`` onto this provider."""
        if self.profile.transfer_gbytes_per_s == math.inf:
            return 0.0
        return estimate_bytes(vt) / (self.profile.transfer_gbytes_per_s * 1e3) + 5.0

    # -------------------------------------------------------------- run time
    @asynccontextmanager
    async def open(self) -> AsyncIterator[ActorRef]:
        """Run the provider actor and its workers until the block exits; then
        every buffer it still owns is returned."""
        try:
            async with open_actors([self, *self._workers]) as refs:
                try:
                    yield refs[0]
                finally:
                    self._pool_send.close()
        finally:
            self.free_all()
            self.workspace.release_all()

    def free_all(self) -> None:
        for b in list(self._buffers.values()):
            self._release(b)

    def statistics(self) -> ProviderStatistics:
        return ProviderStatistics(self.name, self.memory.statistics(), len(self._buffers),
                                  self._segments_run, self.h2d_bytes, self.d2h_bytes)

    # buffers (called from the actor's handler, or synchronously by the owner)
    def _new_buffer(self, array: Any, nbytes: int, role: str, guard: Any = None) -> Buffer:
        b = Buffer(next(self._ids), array, nbytes, role, guard)
        self._buffers[b.id] = b
        return b

    def _release(self, b: Buffer) -> None:
        if self._buffers.pop(b.id, None) is None:
            return
        self.memory.release(b.nbytes, b.role)
        b.array = None
        if b.guard is not None:
            guard, b.guard = b.guard, None
            guard()

    def buffer(self, buffer_id: int) -> Buffer:
        try:
            return self._buffers[buffer_id]
        except KeyError:
            raise SessionClosedError(f"buffer {buffer_id} was already freed on provider "
                                     f"{self.name}") from None

    # device primitives a provider implements --------------------------------
    @abc.abstractmethod
    def alloc_array(self, shape: tuple[int, ...], dtype: np.dtype, zero: bool) -> Any:
        """A new device array of ``shape``/``dtype`` (zero-filled when ``zero``)."""

    @abc.abstractmethod
    def to_host(self, array: Any) -> np.ndarray:
        """A host (numpy) copy of a device array."""

    @abc.abstractmethod
    def from_host(self, array: np.ndarray) -> Any:
        """A device copy of a host array."""

    @abc.abstractmethod
    def argmax(self, array: Any, n: int) -> np.ndarray:
        """uint32 argmax over the last axis (first ``n`` entries; 0: all)."""

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on a host provider)."""

    def segment_context(self):
        """Context the provider's segments run in (a device and stream on CUDA)."""
        return contextlib.nullcontext()

    def import_value(self, v: Any) -> Any:
        """A value from another provider in this provider's memory. Host
        providers bring device arrays back to numpy."""
        if isinstance(v, np.ndarray) or v is None:
            return v
        if isinstance(v, list):
            return [self.import_value(x) for x in v]
        if hasattr(v, "__cuda_array_interface__") and hasattr(v, "get"):
            return v.get()
        return v

    def run_segment(self, plan: Any, seg: Any, env: list) -> None:
        """Run ``seg`` in this provider's context (called by its workers)."""
        running_on(self.memory)
        with self.segment_context():
            plan.run_segment(seg, env)

    def runs_inline(self, seg: Any, env: list) -> bool:
        """Whether ``seg`` is cheap enough (its estimate, with the sizes of
        ``env``'s values where the plan's are symbolic, below
        :attr:`inline_threshold_us`) to run on a trio task rather than in a
        thread."""
        cost = seg.cost_us
        if cost == math.inf and seg.dim_refs is not None:
            cost = seg.runtime_cost_us(env)  # sizes known now
        return cost < self.inline_threshold_us

    def run_segment_direct(self, plan: Any, seg: Any, env: list) -> None:
        """Run ``seg`` in the calling thread for a caller outside the worker
        pool (:meth:`actorrt.Session.run_blocking`); counted in
        :attr:`ProviderStatistics.segments_run` as the workers' segments are."""
        self._segments_run += 1
        self.run_segment(plan, seg, env)

    async def run_iterating(self, plan: Any, seg: Any, env: list, state: Any = None) -> None:
        """Run a control-flow segment (``seg.iterates``: it may run for as
        long as a trip count says) in a thread of its own, outside the worker
        pool, so that a long Loop holds no worker and never blocks other
        callers or closing.

        When the calling task is cancelled, ``state`` (the run's
        :class:`~actorrt._runstate.RunState`) is cancelled, the body stops at
        its next iteration and this returns (re-raising the cancellation) once
        the thread has stopped.

        Raises:
            KernelError, OutOfMemoryError: as the segment raises.
            RunCancelledError: the run was cancelled (the session closed).
        """
        if state is not None and not state.begin():
            return
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def work() -> None:
            try:
                with running(state):
                    self.run_segment(plan, seg, env)
            finally:
                try:
                    token.run_sync_soon(done.set)
                except trio.RunFinishedError:  # pragma: no cover - loop already gone
                    pass

        self._segments_run += 1
        try:
            await trio.to_thread.run_sync(work, abandon_on_cancel=True,
                                          limiter=self._long_limiter)
        except trio.Cancelled:
            if state is not None:
                state.cancel()
            with trio.CancelScope(shield=True):
                await done.wait()
            raise
        finally:
            if state is not None:
                state.end()

    # handler ----------------------------------------------------------------
    def withdrawable(self, message: Any) -> bool:
        """Requests that only make something for their asker are dropped when
        the asker was cancelled before the provider took them (a ``Free`` or a
        write is still done)."""
        return isinstance(message, (Allocate, CopyFromHost, CopyToHost, Argmax, Sync))

    def on_abandoned(self, message: Any, value: Any) -> None:
        """A buffer made for an asker that was cancelled meanwhile is freed."""
        if isinstance(value, Buffer):
            self._release(value)

    async def handle(self, message: Any) -> Any:
        if isinstance(message, Allocate):
            nbytes = storage_bytes(message.shape, message.dtype, role=message.role,
                                   provider=self.name, limit=self.memory.limit)
            self.memory.reserve(nbytes, message.role, what=f"{message.shape}")
            try:
                arr = self.alloc_array(tuple(message.shape), to_numpy_dtype(message.dtype),
                                       message.zero)
            except BaseException:
                self.memory.release(nbytes, message.role)
                raise
            return self._new_buffer(arr, nbytes, message.role)
        if isinstance(message, CopyFromHost):
            host = message.array
            self.memory.reserve(host.nbytes, message.role)
            try:
                arr = self.from_host(host)
            except BaseException:
                self.memory.release(host.nbytes, message.role)
                raise
            self.h2d_bytes += host.nbytes
            return self._new_buffer(arr, host.nbytes, message.role)
        if isinstance(message, Adopt):
            nbytes = int(message.array.nbytes)
            self.memory.reserve(nbytes, message.role)
            return self._new_buffer(message.array, nbytes, message.role, message.guard)
        if isinstance(message, Free):
            b = self._buffers.get(message.buffer_id)
            if b is not None:
                self._release(b)
            return None
        if isinstance(message, CopyToHost):
            b = self.buffer(message.buffer_id)
            out = self.to_host(b.array)
            self.d2h_bytes += out.nbytes
            return out
        if isinstance(message, WriteBytes):
            b = self.buffer(message.buffer_id)
            self.write_bytes(b.array, message.offset, message.data)
            self.h2d_bytes += len(message.data)
            return None
        if isinstance(message, Sync):
            self.synchronize()
            return None
        if isinstance(message, Argmax):
            b = self.buffer(message.buffer_id)
            if np.dtype(b.array.dtype) not in (np.dtype(np.float32), np.dtype(np.float16)):
                raise InvalidArgumentError(
                    f"device argmax on provider {self.name} takes float32 or float16 logits",
                    expected="tensor(float) or tensor(float16)", got=str(b.array.dtype))
            return self.argmax(b.array, message.n)
        raise TypeError(f"provider {self.name} cannot handle {type(message).__name__}")

    @abc.abstractmethod
    def write_bytes(self, array: Any, offset: int, data: bytes) -> None:
        """Write ``data`` into ``array``'s bytes starting at byte ``offset``."""


class _Worker(Actor):
    """Runs plan segments for its provider: cheap ones on its trio task, heavy
    ones in a thread (so numpy releases the GIL and the event loop stays free)."""

    def __init__(self, name: str, provider: ExecutionProvider, mailbox):
        super().__init__(name, mailbox=mailbox)
        self.provider = provider

    def withdrawable(self, message: Any) -> bool:
        """A segment whose asker was cancelled before a worker took it is
        dropped (its run is over)."""
        return isinstance(message, (RunSegment, RunLoop))

    async def handle(self, message: Any) -> Any:
        state = getattr(message, "state", None)
        if state is not None and not state.begin():
            return None  # the run was cancelled before its work started: withdrawn
        try:
            if isinstance(message, RunLoop):
                return await trio.to_thread.run_sync(self._run_loop, message,
                                                     limiter=self.provider._limiter)
            if not isinstance(message, RunSegment):
                raise TypeError(f"{self.name} cannot handle {type(message).__name__}")
            seg = message.segment
            plan = message.plan
            self.provider._segments_run += 1
            if self.provider.runs_inline(seg, message.env):
                if plan.tracker_release is None:
                    # inline segments have no control flow: only the memory
                    # tracker asks for the run it works for
                    self.provider.run_segment(plan, seg, message.env)
                else:
                    with running(state):
                        self.provider.run_segment(plan, seg, message.env)
            else:
                await trio.to_thread.run_sync(self._run_segment, plan, seg, message.env, state,
                                              limiter=self.provider._limiter)
            return None
        finally:
            if state is not None:
                state.end()

    def _run_segment(self, plan: Any, seg: Any, env: list, state: Any) -> None:
        with running(state):
            self.provider.run_segment(plan, seg, env)

    def _run_loop(self, message: RunLoop) -> int:
        with running(message.state):
            return self._loop(message)

    def _loop(self, message: RunLoop) -> int:
        # in the worker thread: runs back to back, no event-loop round trip
        plan, provider = message.plan, self.provider
        state = message.state
        outputs = None
        runs = 0
        carry = plan.carry_slots(message.carry) if message.carry else ()
        carried: dict = {}
        while True:
            if state is not None and state.cancelled:
                check_cancelled("run_many")
            feeds = message.next_feeds(outputs)
            if feeds is None:
                return runs
            env = plan.new_env()
            if outputs is not None and carry:
                carried = plan.bind_carried(carry, outputs, feeds, env, message.donate,
                                            carried)
            plan.bind_feeds(feeds, env, message.donate, carried)
            try:
                for seg in plan.segments:
                    provider._segments_run += 1
                    provider.run_segment(plan, seg, env)
            finally:
                if plan.tracker_release is not None:
                    plan.tracker_release(env)
                if state is not None:
                    state.release_activations()
            outputs = plan.collect_outputs(env)
            runs += 1
