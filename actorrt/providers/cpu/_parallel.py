"""A help-first parallel loop for the CPU kernels' coarse work items (the
column blocks of a convolution's GEMMs).

:func:`run_chunks` runs ``fn(i)`` for ``i in range(n)`` on the calling thread
and up to ``threads - 1`` helper threads. Chunks are claimed one at a time
under a lock, and the caller claims too: a helper that a busy machine has
not scheduled yet never holds the caller up, because the caller runs the
chunks nobody claimed and waits only for chunks already under way. Helpers
block (no spinning) between jobs, so idle helpers cost nothing, unlike the
spinning BLAS / OpenMP pools, which on a shared 2-core machine made every
threaded call of a small GEMM wait milliseconds.

``fn`` must release the GIL for the work to overlap (numpy's matmul and the
``nogil`` compiled kernels do). The first exception a chunk raises is
re-raised in the caller after every claimed chunk has finished.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Callable

__all__ = ["run_chunks", "CHUNKS_PER_THREAD"]

#: chunks the kernels cut their work into, per thread: few, because every
#: chunk start is a GIL handoff, and on a busy machine a thread descheduled
#: while holding the GIL stalls the other for a whole time slice
CHUNKS_PER_THREAD = 1

_helpers: list[threading.Thread] = []
_jobs: "queue.SimpleQueue[_Job]" = queue.SimpleQueue()
_start_lock = threading.Lock()


class _Job:
    __slots__ = ("fn", "n", "next", "done", "lock", "finished", "error")

    def __init__(self, fn: Callable[[int], None], n: int):
        self.fn = fn
        self.n = n
        self.next = 0
        self.done = 0
        self.lock = threading.Lock()
        # held until the last chunk ends: the caller blocks in ``acquire``
        # (one futex wait in C), where ``threading.Event.wait`` runs a
        # Python-level Condition whose wake-up needed several GIL hand-offs
        # (measured 0.5-1.5 ms late after a helper's last chunk, idle machine)
        self.finished = threading.Lock()
        self.finished.acquire()
        self.error: BaseException | None = None

    def work(self) -> None:
        lock = self.lock
        while True:
            with lock:
                i = self.next
                if i >= self.n:
                    return
                self.next = i + 1
            try:
                self.fn(i)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                with lock:
                    if self.error is None:
                        self.error = e
            with lock:
                self.done += 1
                if self.done == self.n:
                    self.finished.release()


def _helper(jobs: "queue.SimpleQueue[_Job]") -> None:
    while True:
        jobs.get().work()


def _ensure(count: int) -> None:
    if len(_helpers) >= count:
        return
    with _start_lock:
        while len(_helpers) < count:
            t = threading.Thread(target=_helper, args=(_jobs,),
                                 name=f"actorrt-cpu-helper-{len(_helpers)}", daemon=True)
            t.start()
            _helpers.append(t)


def _after_fork() -> None:
    """A forked child has none of the parent's helper threads: start afresh."""
    global _jobs, _start_lock
    _helpers.clear()
    _jobs = queue.SimpleQueue()
    _start_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def run_chunks(fn: Callable[[int], None], n: int, threads: int) -> None:
    """Run ``fn(0) .. fn(n - 1)`` on the caller and ``threads - 1`` helpers.

    Raises:
        whatever a chunk raised (the first one), after all claimed chunks ended.
    """
    if n <= 0:
        return
    helpers = min(threads, n) - 1
    if helpers <= 0:
        for i in range(n):
            fn(i)
        return
    _ensure(helpers)
    job = _Job(fn, n)
    for _ in range(helpers):
        _jobs.put(job)
    job.work()
    job.finished.acquire()
    if job.error is not None:
        raise job.error
