"""Tracing: spans per segment and per op, exported as Chrome trace-event JSON
(opens in Perfetto / chrome://tracing).

Levels: ``"off"`` (the plan is compiled with no trace hooks at all), ``"ops"``
(one complete event per executed node, with args ``device``, ``bytes``,
``flops`` and any kernel-variant decisions), ``"full"`` (also one event per
segment on its worker lane).

Enable with ``SessionOptions(trace="ops", trace_path="t.json")``, the
environment variable ``ACTORRT_TRACE=path``, or ``actorrt run --trace t.json``.
Kernels record a choice with :func:`kernel_variant`; it costs one thread-local
read when tracing is off, and the reason is never formatted then.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import attrs

__all__ = ["TraceCollector", "Span", "kernel_variant", "LEVELS"]

LEVELS = ("off", "ops", "full")


class _Local(threading.local):
    """Per-thread tracing state; class-level defaults make the check in
    :func:`kernel_variant` (on every fused kernel's hot path) two plain
    attribute reads."""

    decisions: dict | None = None
    active: bool = False


_local = _Local()


@attrs.define
class Span:
    """One executed node (or segment).

    Attributes:
        name: node name. cat: ``"op"`` or ``"segment"``. op_type: operator.
        start_us / dur_us: start and duration (µs, monotonic clock).
        lane: the worker thread lane. args: standard metrics and decisions.
    """

    name: str
    cat: str
    op_type: str
    start_us: float
    dur_us: float
    lane: str
    args: dict[str, Any]


class TraceCollector:
    """In-memory span collector (thread-safe).

    Args:
        level: ``"ops"`` or ``"full"``.
    """

    clock = staticmethod(time.perf_counter)

    def __init__(self, level: str = "ops"):
        if level not in LEVELS or level == "off":
            raise ValueError(f"trace level must be 'ops' or 'full', not {level!r}")
        self.level = level
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()

    def _lane(self) -> str:
        return threading.current_thread().name

    def op_span(self, step: Any, t0: float, inputs: tuple, outputs: tuple) -> None:
        """Record a completed op (called by traced plan code)."""
        t1 = time.perf_counter()
        node = step.node
        nbytes = sum(getattr(v, "nbytes", 0) or 0 for v in inputs + outputs)
        shapes = [getattr(v, "shape", None) for v in inputs]
        args: dict[str, Any] = {
            "device": step.provider.name,
            "op_type": node.op_type,
            "bytes": int(nbytes),
            "flops": float(step.kernel.flops(shapes)),
        }
        decisions = _local.decisions
        if decisions:
            args.update(decisions)
            _local.decisions = None
        span = Span(node.name, "op", node.op_type, (t0 - self._t0) * 1e6,
                    (t1 - t0) * 1e6, self._lane(), args)
        with self._lock:
            self.spans.append(span)

    def segment_span(self, name: str, t0: float, t1: float, args: dict) -> None:
        if self.level != "full":
            return
        span = Span(name, "segment", "segment", (t0 - self._t0) * 1e6, (t1 - t0) * 1e6,
                    self._lane(), args)
        with self._lock:
            self.spans.append(span)

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()

    def to_chrome(self) -> dict:
        """The trace as a Chrome trace-event dict: complete (``"X"``) events, one
        thread lane per worker."""
        lanes: dict[str, int] = {}
        events = []
        pid = os.getpid()
        with self._lock:
            spans = list(self.spans)
        for s in spans:
            tid = lanes.setdefault(s.lane, len(lanes) + 1)
            events.append({"name": s.name, "cat": s.cat, "ph": "X", "ts": s.start_us,
                           "dur": s.dur_us, "pid": pid, "tid": tid, "args": s.args})
        for lane, tid in lanes.items():
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"name": lane}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def export_chrome(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_chrome` as JSON to ``path``."""
        with open(path, "w") as f:
            json.dump(self.to_chrome(), f)


def kernel_variant(stage: str, variant: str, reason: str = "", *args: Any) -> None:
    """Record that a kernel chose ``variant`` at ``stage`` (e.g. ``"gemm"`` ->
    ``"im2col"``), with ``reason % args``, on the running op's span. A no-op
    (nothing formatted) when tracing is off. Two stages in one node don't
    overwrite each other: each is stored as ``kernel_variant.<stage>``."""
    d = _local.decisions
    if d is None:
        if not _local.active:
            return
        d = _local.decisions = {}
    d[f"kernel_variant.{stage}"] = {"variant": variant,
                                    "reason": (reason % args) if args else reason}


def _set_active(on: bool) -> None:
    _local.active = on
