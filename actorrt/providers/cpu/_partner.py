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
from Python wakes it (its first chunks then run on the caller alone). A
:func:`run_items` job may ask the partners to *linger*: not to park before a
cycle-counter deadline (the ``_LINGER`` slot) however long they idle, for
callers whose next job comes soon (the convolutions of :mod:`._conv_split`).

Jobs (one kind a post, its items cut into ``chunks`` ranges):

* :func:`gemm_panels`: the compiled sgemm's column panels (:mod:`._sgemm_numba`);
* :func:`bmm_entries`: the batch entries of the compiled batched product
  (attention's two products, :func:`._sgemm_numba.bmm`);
* :func:`layer_norm_rows`: rows of (Skip)LayerNormalization
  (:mod:`._layernorm_numba`);
* :func:`softmax_rows`: rows of the scaled, masked softmax
  (:mod:`._softmax_numba`);
* :func:`run_items`: the public hook for any other compiled kernel: a
  ``numba.cfunc`` of C signature ``void(int64 params, int64 i0, int64 i1)``
  (:data:`ITEMS_SIGNATURE`; :data:`f32_ptr` / :data:`i64_ptr` read its operands)
  that runs items ``i0 .. i1 - 1`` of its work, reading its operands from the
  address ``params`` (e.g. an int64 array of array addresses and sizes it
  holds); called through its address from every thread of the team.

Every row / entry gives the same bits whichever thread runs it, so a split
result equals the one-thread result exactly. Available
(:data:`AVAILABLE`) with :data:`._sgemm_numba.HAVE_SGEMM` (numba, AVX-512)
and libc's ``sched_yield``.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import os
import threading

import numpy as np

from . import _atomics as _at
from . import _layernorm_numba as _ln
from . import _sgemm_numba as _sg
from . import _softmax_numba as _sm

__all__ = ["AVAILABLE", "IDLE_CYCLES", "ITEMS_SIGNATURE", "bmm_entries", "call_items",
           "f32_ptr", "gemm_panels", "i64_ptr", "layer_norm_rows", "post_items", "run_items",
           "softmax_rows", "team"]

#: cycle-counter ticks (TSC, 2.6 GHz here: ~77 us) a partner spins without a
#: job before it parks (3,000,000 measured the same on/off ratios under load 4)
IDLE_CYCLES = 200_000
#: pause rounds before a waiting thread starts yielding its core each round
SPIN_PAUSES = 2048

# control word slots
_WORD, _DONE, _KIND, _STOP, _ITEMS, _SIZE, _LINGER = 0, 1, 2, 3, 4, 5, 6
_P = 8  # job parameters from here
_SLOTS = 40
# job kinds
_GEMM, _LN, _SOFTMAX, _BMM, _FN = 0, 1, 2, 3, 4


AVAILABLE = _sg.HAVE_SGEMM and _at.HAVE_YIELD

if AVAILABLE:
    from llvmlite import ir
    from numba import carray, njit, types
    from numpy.lib.stride_tricks import as_strided
    from numba.extending import intrinsic

    from ._atomics import atomic_add as _atomic_add
    from ._atomics import cycles as _cycles
    from ._atomics import load_acquire as _load_acq
    from ._atomics import store_release as _store_rel

    @intrinsic
    def _f32_at(typingctx, addr):
        """The float32 pointer at integer address ``addr``."""
        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], ir.FloatType().as_pointer())
        return types.CPointer(types.float32)(types.int64), codegen

    def _ptr_intrinsic(ty):
        def typer(typingctx, addr):
            sig = types.CPointer(ty)(types.int64)

            def codegen(context, builder, sig, args):
                return builder.inttoptr(args[0], context.get_value_type(sig.return_type))
            return sig, codegen
        typer.__name__ = f"ptr_{ty}"
        return intrinsic(typer)

    #: the ``float32`` / ``int64`` pointer at an integer address: how a
    #: :func:`run_items` kernel reads the operands its ``params`` block holds
    #: (``carray(f32_ptr(p[0]), (p[1],))``)
    f32_ptr, i64_ptr = _ptr_intrinsic(types.float32), _ptr_intrinsic(types.int64)
    #: the C signature of a :func:`run_items` kernel: ``void(params, i0, i1)``
    ITEMS_SIGNATURE = types.void(types.int64, types.int64, types.int64)

    @njit(nogil=True, cache=True, inline="always")
    def _pause_or_yield(spins):  # pragma: no cover - compiled
        _at.pause_or_yield(spins, SPIN_PAUSES)

    @intrinsic
    def _f64_from_bits(typingctx, bits):
        """The float64 whose bit pattern is the int64 ``bits``."""
        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], ir.DoubleType())
        return types.float64(types.int64), codegen

    @intrinsic
    def _bits_of_f64(typingctx, x):
        """The int64 bit pattern of the float64 ``x``."""
        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], ir.IntType(64))
        return types.int64(types.float64), codegen

    @intrinsic
    def _call_fn(typingctx, addr, params, i0, i1):
        """Call the C function ``void(int64, int64, int64)`` at ``addr``."""
        def codegen(context, builder, sig, args):
            i64 = ir.IntType(64)
            fnty = ir.FunctionType(ir.VoidType(), [i64, i64, i64])
            builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [args[1], args[2], args[3]])
            return context.get_dummy_value()
        return types.none(types.int64, types.int64, types.int64, types.int64), codegen

    @njit(nogil=True, cache=True, inline="always")
    def _f32s(addr, shape):  # pragma: no cover - compiled
        return carray(_f32_at(addr), shape)

    @njit(nogil=True, cache=True)
    def _run_chunk(ctrl, c):  # pragma: no cover - compiled
        # items c * size .. of the posted job (parameters read after the claim)
        kind = ctrl[_KIND]
        size = ctrl[_SIZE]
        i0 = c * size
        i1 = min(ctrl[_ITEMS], i0 + size)
        q = _P
        if kind == _GEMM:
            m, k, n, npan = ctrl[q + 4], ctrl[q + 5], ctrl[q + 6], ctrl[q + 7]
            _sg.gemm_panels_range(_f32s(ctrl[q], (m, k)), _f32s(ctrl[q + 1], (npan, k, _sg.NR)),
                                  _f32s(ctrl[q + 2], (npan * _sg.NR,)),
                                  _f32s(ctrl[q + 3], (m, n)), i0, i1, ctrl[q + 8], ctrl[q + 9])
        elif kind == _LN:
            rows, d = ctrl[q + 9], ctrl[q + 10]
            _ln.rows_range(_f32s(ctrl[q], (rows, d)), _f32s(ctrl[q + 1], (ctrl[q + 13], ctrl[q + 14])),
                           _f32s(ctrl[q + 2], (ctrl[q + 15],)), _f32s(ctrl[q + 3], (d,)),
                           _f32s(ctrl[q + 4], (ctrl[q + 16],)), _f64_from_bits(ctrl[q + 12]),
                           _f32s(ctrl[q + 5], (rows, d)),
                           _f32s(ctrl[q + 6], (ctrl[q + 17], ctrl[q + 18])),
                           _f32s(ctrl[q + 7], (rows,)), _f32s(ctrl[q + 8], (rows,)),
                           ctrl[q + 11], i0, i1)
        elif kind == _SOFTMAX:
            _sm.rows_range(_f32s(ctrl[q], (ctrl[q + 1], ctrl[q + 2])),
                           np.float32(_f64_from_bits(ctrl[q + 5])),
                           _f32s(ctrl[q + 3], (ctrl[q + 4], ctrl[q + 7])), ctrl[q + 4],
                           ctrl[q + 6] != 0, i0, i1)
        elif kind == _FN:
            _call_fn(ctrl[q], ctrl[q + 1], i0, i1)
        else:  # _BMM
            bt, m, k, n = ctrl[q + 3], ctrl[q + 4], ctrl[q + 5], ctrl[q + 6]
            b = as_strided(_f32s(ctrl[q + 1], (ctrl[q + 10],)), shape=(bt, k, n),
                           strides=(ctrl[q + 7], ctrl[q + 8], ctrl[q + 9]))
            _sg.bmm_entries(_f32s(ctrl[q], (bt, m, k)), b, _f32s(ctrl[q + 2], (bt, m, n)),
                            ctrl[q + 11], i0, i1)

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
                    _run_chunk(ctrl, old & 0xFFFF)
                    _atomic_add(ctrl, _DONE, 1)
                t0 = _cycles()
                spins = 0
                continue
            now = _cycles()
            if now - t0 > idle and now > _load_acq(ctrl, _LINGER):
                return 0
            _pause_or_yield(spins)
            spins += 1

    @njit(nogil=True, cache=True)
    def _run_job(ctrl, kind, items, chunks):  # pragma: no cover - compiled
        # post the job (its parameters already in place, then the control
        # word), claim chunks with the team, wait for the claimed ones;
        # returns the chunks this thread ran
        size = (items + chunks - 1) // chunks
        chunks = (items + size - 1) // size
        ctrl[_KIND] = kind
        ctrl[_ITEMS] = items
        ctrl[_SIZE] = size
        ctrl[_DONE] = 0
        job = (_load_acq(ctrl, _WORD) >> 32) + 1
        _store_rel(ctrl, _WORD, (job << 32) | (chunks << 16))
        mine = 0
        while True:
            old = _atomic_add(ctrl, _WORD, 1)
            c = old & 0xFFFF
            if c >= chunks:
                break
            _run_chunk(ctrl, c)
            mine += 1
        spins = 0
        while _load_acq(ctrl, _DONE) < chunks - mine:
            _pause_or_yield(spins)
            spins += 1
        # chunk indices past ``chunks`` stay claimed-out: idle partners see no work
        return mine

    @njit(nogil=True, cache=True)
    def _split_gemm(ctrl, a, p, bias, out, act, row_block, chunks):  # pragma: no cover
        m, k = a.shape
        q = _P
        ctrl[q + 0] = a.ctypes.data
        ctrl[q + 1] = p.ctypes.data
        ctrl[q + 2] = bias.ctypes.data
        ctrl[q + 3] = out.ctypes.data
        ctrl[q + 4] = m
        ctrl[q + 5] = k
        ctrl[q + 6] = out.shape[1]
        ctrl[q + 7] = p.shape[0]
        ctrl[q + 8] = act
        ctrl[q + 9] = row_block
        return _run_job(ctrl, _GEMM, p.shape[0], chunks)

    @njit(nogil=True, cache=True)
    def _split_ln(ctrl, x, skip, bias, gamma, beta, eps, y, s, mean, inv, flags,
                  chunks):  # pragma: no cover - compiled
        q = _P
        ctrl[q + 0] = x.ctypes.data
        ctrl[q + 1] = skip.ctypes.data
        ctrl[q + 2] = bias.ctypes.data
        ctrl[q + 3] = gamma.ctypes.data
        ctrl[q + 4] = beta.ctypes.data
        ctrl[q + 5] = y.ctypes.data
        ctrl[q + 6] = s.ctypes.data
        ctrl[q + 7] = mean.ctypes.data
        ctrl[q + 8] = inv.ctypes.data
        ctrl[q + 9] = x.shape[0]
        ctrl[q + 10] = x.shape[1]
        ctrl[q + 11] = flags
        ctrl[q + 12] = _bits_of_f64(eps)
        ctrl[q + 13] = skip.shape[0]
        ctrl[q + 14] = skip.shape[1]
        ctrl[q + 15] = bias.shape[0]
        ctrl[q + 16] = beta.shape[0]
        ctrl[q + 17] = s.shape[0]
        ctrl[q + 18] = s.shape[1]
        return _run_job(ctrl, _LN, x.shape[0], chunks)

    @njit(nogil=True, cache=True)
    def _split_softmax(ctrl, s, scale, mask, mrows, masked, chunks):  # pragma: no cover
        q = _P
        ctrl[q + 0] = s.ctypes.data
        ctrl[q + 1] = s.shape[0]
        ctrl[q + 2] = s.shape[1]
        ctrl[q + 3] = mask.ctypes.data
        ctrl[q + 4] = mrows
        ctrl[q + 5] = _bits_of_f64(np.float64(scale))
        ctrl[q + 6] = 1 if masked else 0
        ctrl[q + 7] = mask.shape[1]
        return _run_job(ctrl, _SOFTMAX, s.shape[0], chunks)

    @njit(nogil=True, cache=True)
    def _split_bmm(ctrl, a, b0, s0, s1, s2, extent, bshape, out, row_block,
                   chunks):  # pragma: no cover - compiled
        # b0: the first element of b (a 1-D view), its byte strides s0..s2
        bt, m, k = a.shape
        q = _P
        ctrl[q + 0] = a.ctypes.data
        ctrl[q + 1] = b0.ctypes.data
        ctrl[q + 2] = out.ctypes.data
        ctrl[q + 3] = bt
        ctrl[q + 4] = m
        ctrl[q + 5] = k
        ctrl[q + 6] = bshape
        ctrl[q + 7] = s0
        ctrl[q + 8] = s1
        ctrl[q + 9] = s2
        ctrl[q + 10] = extent
        ctrl[q + 11] = row_block
        return _run_job(ctrl, _BMM, bt, chunks)


    @njit(nogil=True, cache=True)
    def _split_fn(ctrl, fn, params, items, chunks, linger):  # pragma: no cover - compiled
        ctrl[_P] = fn
        ctrl[_P + 1] = params
        mine = _run_job(ctrl, _FN, items, chunks)
        if linger > 0:  # partners keep spinning until then (the next job comes soon)
            _store_rel(ctrl, _LINGER, _cycles() + linger)
        return mine

    #: the compiled form of :func:`run_items` for compiled callers (one
    #: dispatch fills a parameter block and posts it): ``post_items(team.ctrl,
    #: fn, params, items, chunks, linger)`` with ``1 <= chunks <= min(items,
    #: 4096)``, ``items >= 1``; the caller holds ``team`` from :func:`team` (its
    #: partners awake) and, with ``linger``, calls ``team.ensure_awake()`` after
    #: it returns, as :func:`run_items` does. Returns the chunks the caller ran.
    post_items = _split_fn

    @njit(nogil=True, cache=True)
    def _lingering(ctrl):  # pragma: no cover - compiled
        # whether a caller's linger deadline is still ahead
        return _cycles() <= _load_acq(ctrl, _LINGER)

    @njit(nogil=True, cache=True)
    def _call_items(fn, params, i0, i1):  # pragma: no cover - compiled
        _call_fn(fn, params, i0, i1)


class _Team:
    """The partner threads of one calling thread (module docstring). Only
    that thread posts jobs and wakes partners, so ``awake`` needs no lock: a
    partner clears its flag before it blocks, the caller sets it before it
    releases the semaphore (a partner parking just as a job comes misses
    that job and is woken by the next one).

    A linger deadline closes that window for the jobs that set one: after
    clearing its flag the partner checks the deadline again (still ahead: it
    sets the flag back and spins on), and the caller, after storing the
    deadline, wakes any partner whose flag is clear. Whichever of the two
    checks comes second sees the other's write, so a partner that left its
    loop just as a lingering job came cannot stay parked through the
    deadline (at worst it takes one extra semaphore count: one more idle
    spin before it parks)."""

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
            while True:
                if _partner_loop(ctrl, IDLE_CYCLES):
                    return
                self.awake[i] = False
                if not _lingering(ctrl):
                    break
                self.awake[i] = True  # a linger deadline stored as it left

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
#: forks this process descends through (a child's thread-locals hold its
#: parent's teams, whose partner threads did not come along)
_forks = 0


def _after_fork() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def team(threads: int) -> "_Team | None":
    """The calling thread's partner team for ``threads`` intra-op threads
    (``threads - 1`` partners, started on first use), awake; None when
    :data:`AVAILABLE` is False or ``threads`` < 2."""
    if not AVAILABLE or threads < 2:
        return None
    h = getattr(_local, "holder", None)
    t = h.team if h is not None else None
    if t is None or t.size != threads - 1 or _local.forks != _forks:
        if t is not None and _local.forks != _forks:
            h.team = _Team(0)  # a forked child: the parent's partners are not here
        t = _Team(threads - 1)
        _local.holder = _Holder(t)  # the previous holder (if any) stops its team
        _local.forks = _forks
    t.ensure_awake()
    return t


def gemm_panels(t: _Team, a2: np.ndarray, panels: np.ndarray, bias: np.ndarray,
                out2: np.ndarray, act: int, row_block: int, chunks: int) -> None:
    """``out2 = act(a2 @ B + bias)`` (the arguments of
    :func:`._sgemm_numba.gemm_panels_range`, whole panel range) in ``chunks``
    panel ranges over the caller and team ``t``. Arrays C-contiguous float32."""
    _split_gemm(t.ctrl, a2, panels, bias, out2, act, row_block, chunks)


def bmm_entries(t: _Team, a3: np.ndarray, b3: np.ndarray, out3: np.ndarray, row_block: int,
                chunks: int) -> bool:
    """``out3[i] = a3[i] @ b3[i]`` (:func:`._sgemm_numba.bmm_entries`' operands:
    ``a3`` ``(Bt, M, K)`` and ``out3`` ``(Bt, M, N)`` C-contiguous float32,
    ``b3`` ``(Bt, K, N)`` float32 of any non-negative strides) in ``chunks``
    entry ranges over the caller and team ``t``. False (nothing done) for
    ``b3`` strides that are negative or not whole elements."""
    st = b3.strides
    if any(x < 0 or x % 4 for x in st) or b3.size == 0:
        return False
    extent = 1 + sum((d - 1) * (x // 4) for d, x in zip(b3.shape, st))
    flat = np.lib.stride_tricks.as_strided(b3, shape=(extent,), strides=(4,))
    _split_bmm(t.ctrl, a3, flat, st[0], st[1], st[2], extent, b3.shape[2], out3, row_block,
               chunks)
    return True


def layer_norm_rows(t: _Team, x2, skip, bias, gamma, beta, eps: float, y, s, mean, inv,
                    flags: int, chunks: int) -> None:
    """:func:`._layernorm_numba.rows_range` over every row of ``x2`` (its
    operands: C-contiguous float32, ``eps`` float) in ``chunks`` row ranges
    over the caller and team ``t``."""
    _split_ln(t.ctrl, x2, skip, bias, gamma, beta, float(eps), y, s, mean, inv, flags, chunks)


def softmax_rows(t: _Team, s2, scale, mask2, mrows: int, masked: bool, chunks: int) -> None:
    """:func:`._softmax_numba.rows_range` over every row of ``s2`` (its
    operands: C-contiguous float32 ``s2`` ``(R, T)`` and ``mask2``
    ``(mrows, T)`` or a ``(1, 1)`` placeholder, ``scale`` float32) in
    ``chunks`` row ranges over the caller and team ``t``."""
    _split_softmax(t.ctrl, s2, scale, mask2, mrows, masked, chunks)


def run_items(t: _Team, fn: int, params: int, items: int, chunks: int,
              linger: int = 0) -> None:
    """Run the compiled kernel at address ``fn`` (``numba.cfunc`` signature
    ``void(int64, int64, int64)``: ``fn(params, i0, i1)`` runs items ``i0 ..
    i1 - 1``) over ``items`` items in ``chunks`` ranges on the caller and team
    ``t`` (help-first, as every job). ``params`` is an address the function
    reads its operands from; the caller keeps what it points to alive until
    this returns. The function runs without the GIL on several threads at
    once and must not raise (a ``cfunc`` cannot propagate an exception):
    ranges of distinct items must write distinct memory.

    ``linger`` (cycle-counter ticks, >= 0): after this job the partners keep
    spinning (``pause``, then yielding their core each round) at least that
    long before they may park, instead of :data:`IDLE_CYCLES` from their last
    chunk: for callers whose next job follows within about that time (the
    next convolution node of a CNN). 0: the usual idle limit.

    Raises:
        ValueError: ``chunks`` outside 1 .. 4096, ``items`` or ``linger``
            negative."""
    if not 1 <= chunks <= 4096 or items < 0 or linger < 0:
        raise ValueError(f"run_items: chunks {chunks} (1 .. 4096), items {items} (>= 0), "
                         f"linger {linger} (>= 0)")
    if items:
        _split_fn(t.ctrl, fn, params, items, min(chunks, items), linger)
        if linger:
            t.ensure_awake()  # one that parked as this job came (_Team's docstring)


def call_items(fn: int, params: int, i0: int, i1: int) -> None:
    """``fn(params, i0, i1)`` on the calling thread (:func:`run_items`' kernel
    without a team: one thread, or none available)."""
    _call_items(fn, params, i0, i1)
