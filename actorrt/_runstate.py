"""The state of one run, shared by its caller, the scheduler and the workers.

A :class:`RunState` is made per :meth:`actorrt.Session.run` (and per
:meth:`~actorrt.Session.run_many`). It carries

* the cancel flag: set when the run's caller is cancelled (a trio cancel
  scope, a client timeout) or the session closes. Segments not yet started are
  then withdrawn (a worker that takes one skips it), and kernels that iterate
  (every control-flow body call, see :func:`check_cancelled`) stop between
  iterations;
* the count of segments running now: what the run accounted is released when
  the caller is done *and* no segment of it runs any more, so work already
  running finishes and then releases everything;
* the run's activation ledger: every intermediate the run accounted (with
  ``track_memory``), so a failed or cancelled run releases all of it.

Kernels and the plan's memory tracker find the state of the run they work for
with :func:`current` (a thread-local the worker sets around each segment).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ._errors import RunCancelledError

__all__ = ["RunState", "current", "check_cancelled", "running"]

_local = threading.local()


class RunState:
    """One run's cancel flag, running-segment count and activation ledger.

    Counting (:meth:`begin` / :meth:`end` / :meth:`finish`) happens on the
    event-loop thread; :meth:`cancel` and the ledger may be used from any
    thread.

    Attributes:
        cancelled: the run's caller gave up (or the session closed); work not
            yet started must not start.
        reason: why it was cancelled (text), or ``""``.
        ledger: ``id(array) -> (accountant, array)`` of the activations the run
            holds accounted now.
    """

    __slots__ = ("cancelled", "reason", "ledger", "_running", "_finished", "_release",
                 "_released", "__weakref__")

    def __init__(self, release: Callable[[], None] | None = None):
        self.cancelled = False
        self.reason = ""
        self.ledger: dict[int, tuple[Any, Any]] = {}
        self._running = 0
        self._finished = False
        self._release = release
        self._released = False

    def cancel(self, reason: str = "its caller was cancelled") -> None:
        """Withdraw the work not yet started; running kernels stop at their
        next check. Thread-safe, idempotent."""
        if not self.cancelled:
            self.reason = reason
            self.cancelled = True

    def begin(self) -> bool:
        """A worker is about to run a segment of this run: ``False`` when the
        run was cancelled (skip it), else count it as running."""
        if self.cancelled:
            return False
        self._running += 1
        return True

    def end(self) -> None:
        """A segment counted by :meth:`begin` ended (finished or failed)."""
        self._running -= 1
        if self._finished and self._running == 0:
            self._release_all()

    def finish(self) -> None:
        """The caller is done with the run (returned, failed or was
        cancelled): work not yet started is withdrawn, and everything the run
        accounted is released now, or when its last running segment ends."""
        self._finished = True
        self.cancelled = True  # nothing more may start
        if self._running == 0:
            self._release_all()

    @property
    def running_segments(self) -> int:
        """Segments of this run running now."""
        return self._running

    def release_activations(self) -> None:
        """Release every activation in the ledger (bytes accounted as
        ``activations`` on each value's provider)."""
        ledger = self.ledger
        while ledger:
            _, (acc, arr) = ledger.popitem()
            acc.release(arr.nbytes, "activations")

    def _release_all(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            if self._release is not None:
                self._release()
        finally:
            self.release_activations()


def current() -> RunState | None:
    """The state of the run the calling thread works for, or ``None``."""
    return getattr(_local, "state", None)


def check_cancelled(what: str = "a kernel") -> None:
    """Raise when the run the calling thread works for was cancelled; kernels
    that iterate call it between iterations.

    Raises:
        RunCancelledError: the run was cancelled (its caller gave up or the
            session closed).
    """
    s = getattr(_local, "state", None)
    if s is not None and s.cancelled:
        raise RunCancelledError(f"{what} stopped: the run was cancelled ({s.reason})")


class running:
    """``with running(state):`` marks the calling thread as working for
    ``state``'s run (restores the previous one on exit)."""

    __slots__ = ("state", "prev")

    def __init__(self, state: RunState | None):
        self.state = state

    def __enter__(self) -> RunState | None:
        self.prev = getattr(_local, "state", None)
        _local.state = self.state
        return self.state

    def __exit__(self, *exc) -> None:
        _local.state = self.prev
