"""Atomic, spin-wait and prefetch intrinsics shared by the CPU provider's
compiled kernels: the partner threads of :mod:`._partner`, the fused decoder
stack's stage barriers (:mod:`.llm._block_kernels`, :mod:`.llm._spin`) and
its weight / KV-cache prefetches (:mod:`.llm._paged_kernels`).

All operate on int64 array slots (a control word / counter array the threads
share) and are usable only inside numba-compiled code:

* ``atomic_add(arr, idx, val)``: ``arr[idx] += val`` atomically (sequentially
  consistent); returns the old value (int64).
* ``load_acquire(arr, idx)``: ``arr[idx]`` as an acquire load: whatever the
  writer stored before its matching release store / atomic add is visible.
* ``store_release(arr, idx, val)``: ``arr[idx] = val`` as a release store.
* ``cycles()``: the CPU's cycle counter (``rdtsc`` on x86-64: a constant
  rate, calibrate it against ``time.perf_counter``), int64.
* ``pause_or_yield(spins, pauses)``: one round of a spin-wait: the x86
  ``pause`` hint while ``spins < pauses``, else ``sched_yield()`` (on a
  machine with more runnable threads than cores the waiting thread hands
  its core to the one it waits for). Both int64.
* ``backoff(spins, pauses)``: ``pause_or_yield`` and ``spins + 1``.
* ``prefetch_line(arr, offset)``: a read prefetch (every cache level) of
  the cache line at byte ``offset`` of any array ``arr``: a hint.
* ``prefetch_line_w(arr, offset)``: the same for a line about to be written
  (``prefetchw`` on x86: the line comes in owned, so the store that follows
  does not wait for its read-for-ownership).

``sched_yield`` is reached through a symbol this module registers with LLVM
(``actorrt_sched_yield``, libc's address) at import, before any kernel using
it is compiled or loaded from numba's disk cache; without libc's
``sched_yield`` (:data:`HAVE_YIELD` False: not Linux or another POSIX libc)
the backoff only spins. :data:`HAVE_NUMBA` is False without numba, and then
nothing else is defined.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import ctypes
import platform

__all__ = ["HAVE_NUMBA", "HAVE_YIELD", "atomic_add", "backoff", "cycles", "load_acquire",
           "pause_or_yield", "prefetch_line", "prefetch_line_w", "store_release"]

try:
    from llvmlite import ir as _ir
    from numba import njit, types as _types
    from numba.core import cgutils as _cgutils
    from numba.extending import intrinsic as _intrinsic
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False


def _register_yield() -> bool:
    try:
        import llvmlite.binding as ll
        fn = ctypes.CDLL(None).sched_yield
    except (OSError, AttributeError, ImportError):  # pragma: no cover - no libc symbol
        return False
    ll.add_symbol("actorrt_sched_yield", ctypes.cast(fn, ctypes.c_void_p).value)
    return True


HAVE_YIELD = HAVE_NUMBA and _register_yield()

if HAVE_NUMBA:
    _X86 = platform.machine().lower() in ("x86_64", "amd64")

    @_intrinsic
    def atomic_add(typingctx, arr, idx, val):
        """arr[idx] += val atomically (seq_cst); the old value."""
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            return builder.atomic_rmw("add", builder.gep(data, [args[1]]), args[2], "seq_cst")
        return _types.int64(arr, _types.int64, _types.int64), codegen

    @_intrinsic
    def load_acquire(typingctx, arr, idx):
        """arr[idx] as an acquire load."""
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            return builder.load_atomic(builder.gep(data, [args[1]]), "acquire", 8)
        return _types.int64(arr, _types.int64), codegen

    @_intrinsic
    def store_release(typingctx, arr, idx, val):
        """arr[idx] = val as a release store."""
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            builder.store_atomic(args[2], builder.gep(data, [args[1]]), "release", 8)
            return context.get_dummy_value()
        return _types.none(arr, _types.int64, _types.int64), codegen

    def _prefetch_codegen(rw: int):
        def codegen(context, builder, sig, args):
            i8p = _ir.IntType(8).as_pointer()
            i32 = _ir.IntType(32)
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            fn = _cgutils.get_or_insert_function(
                builder.module, _ir.FunctionType(_ir.VoidType(), [i8p, i32, i32, i32]),
                "llvm.prefetch.p0")
            builder.call(fn, [builder.gep(builder.bitcast(data, i8p), [args[1]]),
                              _ir.Constant(i32, rw), _ir.Constant(i32, 3), _ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return codegen

    @_intrinsic
    def prefetch_line(typingctx, arr, offset):
        """Prefetch the cache line at byte ``offset`` of ``arr`` (a hint)."""
        return _types.none(arr, _types.int64), _prefetch_codegen(0)

    @_intrinsic
    def prefetch_line_w(typingctx, arr, offset):
        """Prefetch the cache line at byte ``offset`` of ``arr`` for a write (a hint)."""
        return _types.none(arr, _types.int64), _prefetch_codegen(1)

    @_intrinsic
    def cycles(typingctx):
        """The CPU's cycle counter (int64)."""
        def codegen(context, builder, sig, args):
            fn = _cgutils.get_or_insert_function(
                builder.module, _ir.FunctionType(_ir.IntType(64), []), "llvm.readcyclecounter")
            return builder.call(fn, [])
        return _types.int64(), codegen

    @_intrinsic
    def pause_or_yield(typingctx, spins, pauses):
        """``pause`` while spins < pauses (x86), else ``sched_yield()``."""
        def codegen(context, builder, sig, args):
            with builder.if_else(builder.icmp_signed("<", args[0], args[1])) as (spin, give):
                with spin:
                    if _X86:
                        fn = _cgutils.get_or_insert_function(
                            builder.module, _ir.FunctionType(_ir.VoidType(), []),
                            "llvm.x86.sse2.pause")
                        builder.call(fn, [])
                with give:
                    if HAVE_YIELD:
                        fn = _cgutils.get_or_insert_function(
                            builder.module, _ir.FunctionType(_ir.IntType(32), []),
                            "actorrt_sched_yield")
                        builder.call(fn, [])
            return context.get_dummy_value()
        return _types.none(_types.int64, _types.int64), codegen

    @njit(nogil=True, cache=True, inline="always")
    def backoff(spins, pauses):  # pragma: no cover - compiled
        # one round of a spin-wait: spins rounds so far -> spins + 1
        pause_or_yield(spins, pauses)
        return spins + 1
