"""Compiled partner threads: the other cores' share of a compiled kernel with
no Python hand-off.

The chunk loop of :mod:`._parallel` hands work to its helpers through Python
(a queue and locks: 15-63 us a split measured on the 2-core machine), more
than a decode step's one-row products take (2-40 us each). Here each calling
thread gets a team of ``threads - 1`` partner threads, each parked in a
``nogil`` compiled loop that polls one shared control word (an int64 array
slot read with acquire loads). A job is posted by a compiled caller in one
store: ``job << 32 | chunks << 16 | 0``; every thread, the caller included,
claims chunk indices with an atomic add on that word and runs them, so a
partner that is not scheduled never holds the caller up (help-first, as
:func:`._parallel.run_chunks`): the caller runs what nobody claimed and waits
only for chunks already under way. A chunk's parameters are read after its
claim; the next job is posted only after every claimed chunk of this one
finished, so a partner never mixes two jobs.

A partner spins (x86 ``pause``, then ``sched_yield`` each round: on a busy
machine it hands its core to whoever is runnable) while jobs keep coming;
after :data:`IDLE_CYCLES` cycle-counter ticks without one it leaves the
compiled loop and blocks on a semaphore (no CPU while idle); the next post
from Python wakes it (its first chunks then run on the caller alone).

Jobs (:func:`gemm_panels`): the compiled sgemm's column panels
(:mod:`._sgemm_numba`). Available with :data:`._sgemm_numba.HAVE_SGEMM`.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import ctypes
import os
import platform
import threading

import numpy as np

from . import _sgemm_numba as _sg

__all__ = ["AVAILABLE", "IDLE_CYCLES", "gemm_panels", "team"]

#: cycle-counter ticks (TSC, 2.6 GHz here: ~77 us) a partner spins without a
#: job before it parks (3,000,000 measured the same on/off ratios under load 4)
IDLE_CYCLES = 200_000
#: pause rounds before a waiting thread starts yielding its core each round
SPIN_PAUSES = 2048

# control word slots
_WORD, _DONE, _STOP = 0, 1, 3
_P = 8  # job parameters from here
_SLOTS = 32


def _register_yield() -> bool:
    try:
        import llvmlite.binding as ll
        fn = ctypes.CDLL(None).sched_yield
    except (OSError, AttributeError, ImportError):  # pragma: no cover - no libc symbol
        return False
    ll.add_symbol("actorrt_partner_sched_yield", ctypes.cast(fn, ctypes.c_void_p).value)
    return True


AVAILABLE = _sg.HAVE_SGEMM and _register_yield()

if AVAILABLE:
    from llvmlite import ir
    from numba import carray, njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _X86 = platform.machine().lower() in ("x86_64", "amd64")

    @intrinsic
    def _atomic_add(typingctx, arr, idx, val):
        """arr[idx] += val atomically (seq_cst); the old value."""
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            return builder.atomic_rmw("add", builder.gep(data, [args[1]]), args[2], "seq_cst")
        return types.int64(arr, types.int64, types.int64), codegen

    @intrinsic
    def _load_acq(typingctx, arr, idx):
        """arr[idx] as an acquire load."""
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            return builder.load_atomic(builder.gep(data, [args[1]]), "acquire", 8)
        return types.int64(arr, types.int64), codegen

    @intrinsic
    def _store_rel(typingctx, arr, idx, val):
        """arr[idx] = val as a release store."""
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            builder.store_atomic(args[2], builder.gep(data, [args[1]]), "release", 8)
            return context.get_dummy_value()
        return types.none(arr, types.int64, types.int64), codegen

    @intrinsic
    def _f32_at(typingctx, addr):
        """The float32 pointer at integer address ``addr``."""
        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], ir.FloatType().as_pointer())
        return types.CPointer(types.float32)(types.int64), codegen

    @intrinsic
    def _cycles(typingctx):
        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.IntType(64), []), "llvm.readcyclecounter")
            return builder.call(fn, [])
        return types.int64(), codegen

    @intrinsic
    def _pause_or_yield(typingctx, spins):
        def codegen(context, builder, sig, args):
            limit = ir.Constant(args[0].type, SPIN_PAUSES)
            with builder.if_else(builder.icmp_signed("<", args[0], limit)) as (spin, give):
                with spin:
                    if _X86:
                        fn = cgutils.get_or_insert_function(
                            builder.module, ir.FunctionType(ir.VoidType(), []),
                            "llvm.x86.sse2.pause")
                        builder.call(fn, [])
                with give:
                    fn = cgutils.get_or_insert_function(
                        builder.module, ir.FunctionType(ir.IntType(32), []),
                        "actorrt_partner_sched_yield")
                    builder.call(fn, [])
            return context.get_dummy_value()
        return types.none(types.int64), codegen

    @njit(nogil=True, cache=True)
    def _run_gemm_chunk(ctrl, c):  # pragma: no cover - compiled
        m = ctrl[_P + 4]
        k = ctrl[_P + 5]
        n = ctrl[_P + 6]
        npan = ctrl[_P + 7]
        size = ctrl[_P + 10]
        a = carray(_f32_at(ctrl[_P + 0]), (m, k))
        p = carray(_f32_at(ctrl[_P + 1]), (npan, k, _sg.NR))
        bias = carray(_f32_at(ctrl[_P + 2]), (npan * _sg.NR,))
        out = carray(_f32_at(ctrl[_P + 3]), (m, n))
        j0 = c * size
        j1 = min(npan, j0 + size)
        _sg.gemm_panels_range(a, p, bias, out, j0, j1, ctrl[_P + 8], ctrl[_P + 9])

    @njit(nogil=True, cache=True)
    def _partner_loop(ctrl, idle):  # pragma: no cover - compiled
        # claim chunks of posted jobs until ``idle`` cycles pass without one
        # or the stop slot is set; returns 0 (parked) or 1 (stopped)
        t0 = _cycles()
        spins = 0
        while True:
            if _load_acq(ctrl, _STOP) != 0:
                return 1
            w = _load_acq(ctrl, _WORD)
            if (w & 0xFFFF) < ((w >> 16) & 0xFFFF):
                old = _atomic_add(ctrl, _WORD, 1)
                if (old & 0xFFFF) < ((old >> 16) & 0xFFFF):
                    _run_gemm_chunk(ctrl, old & 0xFFFF)
                    _atomic_add(ctrl, _DONE, 1)
                t0 = _cycles()
                spins = 0
                continue
            if _cycles() - t0 > idle:
                return 0
            _pause_or_yield(spins)
            spins += 1

    @njit(nogil=True, cache=True)
    def _split_gemm(ctrl, a, p, bias, out, act, row_block, chunks, size):  # pragma: no cover
        # post the job (parameters, then the control word), claim chunks with
        # the team, wait for the claimed ones
        m, k = a.shape
        ctrl[_P + 0] = a.ctypes.data
        ctrl[_P + 1] = p.ctypes.data
        ctrl[_P + 2] = bias.ctypes.data
        ctrl[_P + 3] = out.ctypes.data
        ctrl[_P + 4] = m
        ctrl[_P + 5] = k
        ctrl[_P + 6] = out.shape[1]
        ctrl[_P + 7] = p.shape[0]
        ctrl[_P + 8] = act
        ctrl[_P + 9] = row_block
        ctrl[_P + 10] = size
        ctrl[_DONE] = 0
        job = (_load_acq(ctrl, _WORD) >> 32) + 1
        _store_rel(ctrl, _WORD, (job << 32) | (chunks << 16))
        mine = 0
        while True:
            old = _atomic_add(ctrl, _WORD, 1)
            c = old & 0xFFFF
            if c >= chunks:
                break
            _run_gemm_chunk(ctrl, c)
            mine += 1
        spins = 0
        while _load_acq(ctrl, _DONE) < chunks - mine:
            _pause_or_yield(spins)
            spins += 1
        # chunk indices past ``chunks`` stay claimed-out: idle partners see no work
        return mine


class _Team:
    """The partner threads of one calling thread (module docstring). Only
    that thread posts jobs and wakes partners, so ``awake`` needs no lock: a
    partner clears its flag before it blocks, the caller sets it before it
    releases the semaphore (a partner parking just as a job comes misses
    that job and is woken by the next one)."""

    def __init__(self, size: int):
        self.ctrl = np.zeros(_SLOTS, np.int64)
        self.size = size
        self.awake = [False] * size
        self.wake = [threading.Semaphore(0) for _ in range(size)]
        self.threads = []
        for i in range(size):
            t = threading.Thread(target=self._partner, args=(i,), daemon=True,
                                 name=f"actorrt-cpu-partner-{i}")
            t.start()
            self.threads.append(t)

    def _partner(self, i: int) -> None:
        ctrl, wake = self.ctrl, self.wake[i]
        while True:
            wake.acquire()
            if _partner_loop(ctrl, IDLE_CYCLES):
                return
            self.awake[i] = False

    def ensure_awake(self) -> None:
        """Wake every parked partner (they then spin for the next jobs)."""
        awake = self.awake
        for i in range(self.size):
            if not awake[i]:
                awake[i] = True
                self.wake[i].release()

    def stop(self) -> None:
        """End the partner threads (they finish the chunk they run)."""
        self.ctrl[_STOP] = 1
        self.ensure_awake()


class _Holder:
    """The thread-local owner of a team: when its thread ends (the local's
    values are dropped) the team's partners stop instead of staying parked."""

    __slots__ = ("team",)

    def __init__(self, t: _Team):
        self.team = t

    def __del__(self):
        self.team.stop()


_local = threading.local()


def team(threads: int) -> "_Team | None":
    """The calling thread's partner team for ``threads`` intra-op threads
    (``threads - 1`` partners, started on first use), awake; None when
    :data:`AVAILABLE` is False or ``threads`` < 2."""
    if not AVAILABLE or threads < 2:
        return None
    h = getattr(_local, "holder", None)
    t = h.team if h is not None else None
    if t is None or t.size != threads - 1 or os.getpid() != getattr(_local, "pid", None):
        if t is not None and os.getpid() != getattr(_local, "pid", None):
            h.team = _Team(0)  # a forked child: the parent's partners are not here
        t = _Team(threads - 1)
        _local.holder = _Holder(t)  # the previous holder (if any) stops its team
        _local.pid = os.getpid()
    t.ensure_awake()
    return t


def gemm_panels(t: _Team, a2: np.ndarray, panels: np.ndarray, bias: np.ndarray,
                out2: np.ndarray, act: int, row_block: int, chunks: int) -> None:
    """``out2 = act(a2 @ B + bias)`` (the arguments of
    :func:`._sgemm_numba.gemm_panels_range`, whole panel range) in ``chunks``
    panel ranges over the caller and team ``t``. Arrays C-contiguous float32."""
    npan = panels.shape[0]
    size = -(-npan // chunks)
    _split_gemm(t.ctrl, a2, panels, bias, out2, act, row_block, -(-npan // size), size)
