"""Spin-wait backoff of the fused decoder stack's stage barriers
(:mod:`._block_kernels`): a thread waiting for its partner spins on the x86
``pause`` hint for :data:`SPIN_PAUSES` rounds (tens of microseconds, longer
than an idle machine's stage skew), then calls ``sched_yield`` each round, so
that on a machine with more runnable threads than cores the waiting thread
hands its core to the partner it waits for instead of burning its time
slice (the loaded runs of docs/int8_tiles.md: one stream 20x slower than
idle, the stage program's spin-waits the suspect).

* ``backoff(spins)``: one round of a wait loop; returns ``spins + 1``.

The backoff is :func:`.._atomics.backoff` (shared with the partner threads
of :mod:`.._partner`) with this module's :data:`SPIN_PAUSES`; without libc's
``sched_yield`` (:data:`HAVE_YIELD` False) it only spins.
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

from .. import _atomics as _at
from . import _contrib_numba as _nb

#: pause rounds before a waiting thread starts to yield its core (one round
#: ~10-40 ns on the x86-64 cores measured here: 4,096 is ~40-160 us)
SPIN_PAUSES = 4096


HAVE_YIELD = _nb.HAVE_NUMBA and _at.HAVE_YIELD

if _nb.HAVE_NUMBA:
    from numba import njit

    @njit(nogil=True, cache=True, inline="always")
    def backoff(spins):  # pragma: no cover - compiled
        # one round of a spin-wait: spins pause rounds so far -> spins + 1
        return _at.backoff(spins, SPIN_PAUSES)
