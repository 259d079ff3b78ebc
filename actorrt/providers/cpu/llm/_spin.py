"""Spin-wait backoff of the fused decoder stack's stage barriers
(:mod:`._block_kernels`): a thread waiting for its partner spins on the x86
``pause`` hint for :data:`SPIN_PAUSES` rounds (tens of microseconds, longer
than an idle machine's stage skew), then calls ``sched_yield`` each round, so
that on a machine with more runnable threads than cores the waiting thread
hands its core to the partner it waits for instead of burning its time
slice (the loaded runs of docs/int8_tiles.md: one stream 20x slower than
idle, the stage program's spin-waits the suspect).

* ``backoff(spins)``: one round of a wait loop; returns ``spins + 1``.

``sched_yield`` is reached through a symbol this module registers with LLVM
(``actorrt_sched_yield``, libc's address) before any kernel is compiled or
loaded from numba's disk cache; without libc's ``sched_yield`` (not Linux or
another POSIX libc) the backoff only spins.
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import ctypes
import platform

from . import _contrib_numba as _nb

#: pause rounds before a waiting thread starts to yield its core (one round
#: ~10-40 ns on the x86-64 cores measured here: 4,096 is ~40-160 us)
SPIN_PAUSES = 4096


def _register_yield() -> bool:
    try:
        import llvmlite.binding as ll
        fn = ctypes.CDLL(None).sched_yield
    except (OSError, AttributeError, ImportError):  # pragma: no cover - no libc symbol
        return False
    ll.add_symbol("actorrt_sched_yield", ctypes.cast(fn, ctypes.c_void_p).value)
    return True


HAVE_YIELD = _nb.HAVE_NUMBA and _register_yield()

if _nb.HAVE_NUMBA:
    from llvmlite import ir as _ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _X86 = platform.machine().lower() in ("x86_64", "amd64")

    @intrinsic
    def _pause_or_yield(typingctx, spins):
        """``pause`` while spins < SPIN_PAUSES (x86), else ``sched_yield()``."""
        def codegen(context, builder, sig, args):
            limit = _ir.Constant(args[0].type, SPIN_PAUSES)
            with builder.if_else(builder.icmp_signed("<", args[0], limit)) as (spin, give):
                with spin:
                    if _X86:
                        fn = cgutils.get_or_insert_function(
                            builder.module, _ir.FunctionType(_ir.VoidType(), []),
                            "llvm.x86.sse2.pause")
                        builder.call(fn, [])
                with give:
                    if HAVE_YIELD:
                        fn = cgutils.get_or_insert_function(
                            builder.module, _ir.FunctionType(_ir.IntType(32), []),
                            "actorrt_sched_yield")
                        builder.call(fn, [])
            return context.get_dummy_value()
        return types.none(types.int64), codegen

    @njit(nogil=True, cache=True, inline="always")
    def backoff(spins):  # pragma: no cover - compiled
        # one round of a spin-wait: spins pause rounds so far -> spins + 1
        _pause_or_yield(spins)
        return spins + 1
