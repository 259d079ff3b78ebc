"""Compiling a segment to one Python function.

:func:`generate_segment` writes ``segment(env)``: values are locals
``v<slot>``, kernels and constants default arguments, each node one call of
its kernel, intermediates deleted after their last use; trace spans and
activation accounting (:class:`ActivationTracker`) only when asked for.
:func:`frame_padding` keeps a big segment's frame in a data-stack chunk of
its own; :func:`materialise_sized` checks and wraps a kernel-sized output.
"""

from __future__ import annotations

import functools
import itertools
import keyword
from typing import Any, Callable

import numpy as np

from .. import _runstate
from ..providers._contract import KernelSizedOutput
from .plan import Plan, PlanOptions, Segment, Step

__all__ = ["CHUNK_BYTES", "ActivationTracker", "frame_padding", "generate_segment",
           "materialise_sized"]


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

def _read_only(v: Any) -> Any:
    """A read-only view, so an in-place kernel cannot overwrite a shared value."""
    if isinstance(v, np.ndarray) and v.flags.writeable:
        v = v.view()
        v.flags.writeable = False
    return v


def materialise_sized(o: KernelSizedOutput) -> np.ndarray:
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


def generate_segment(plan: Plan, seg: Segment, consts: dict[str, Any], slots: dict[str, int], *,
             options: PlanOptions) -> None:
    """Compile ``seg`` to ``fn(env)``: values are locals ``v<slot>``, kernels and
    constants are default arguments, intermediates are deleted after their last
    use in the segment."""
    const_slots = {slots[n]: v for n, v in consts.items() if n in slots}
    tracer = options.tracer
    defaults: dict[str, Any] = {"_sized": materialise_sized, "_contig": np.ascontiguousarray,
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
        from ..tracing import _set_active
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
    pad = frame_padding(ns["segment"].__code__)
    if pad:
        src += "    if 0:  # frame padding, see frame_padding\n        " + " = ".join(
            f"_pad{i}" for i in range(pad)) + " = None\n"
        ns = dict(defaults)
        exec(compile(src, filename, "exec"), ns)
    seg.fn = ns["segment"]
    seg.source = src
    seg.line_map = {n + 2: s for n, s in enumerate(line_steps) if s is not None}


#: CPython (3.11+) keeps frames on a per-thread stack of 16 KiB chunks and
#: frees a chunk (munmap) as soon as the frame that opened it returns
CHUNK_BYTES = 16 * 1024


def frame_padding(code: Any) -> int:
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
    if size < 4096 or size > CHUNK_BYTES:
        return 0
    return (CHUNK_BYTES - size) // 8 + 64
