"""Sessions do not cross ``fork``.

A session's actors run in a trio loop and its kernels in threads; a process
made by ``fork`` (multiprocessing's default start method on Linux, gunicorn
``--preload``) gets a copy of the session object but none of those threads, so
a call would wait forever for a loop that is not there. Every live session
registers here; in the child each is marked forked, and its next use raises
:class:`~actorrt.SessionForkedError` instead.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from ._errors import SessionForkedError

__all__ = ["register", "forked_error"]

_live: "weakref.WeakSet[Any]" = weakref.WeakSet()


def register(obj: Any) -> int:
    """Track ``obj`` (it must have a ``_forked`` attribute and may have
    ``_closed``): in a forked child both are set to ``True``. Returns the
    creating process's id."""
    _live.add(obj)
    return os.getpid()


def forked_error(created_pid: int, what: str = "this session",
                 model: str | None = None) -> SessionForkedError:
    """The error a forked child gets when it uses a session of its parent."""
    pid = os.getpid()
    return SessionForkedError(
        f"{what} was created in process {created_pid} and this is process {pid}, made by "
        f"fork: sessions cannot cross fork (their actors and threads stay in the parent); "
        f"create the session in the child (e.g. in a multiprocessing initializer or a "
        f"gunicorn post_fork hook), or use the 'spawn' start method",
        created_pid=created_pid, pid=pid, model=model)


def _after_fork_in_child() -> None:
    for obj in list(_live):
        try:
            obj._forked = True
            if hasattr(obj, "_closed"):
                obj._closed = True
        except Exception:  # pragma: no cover - never let a fork fail over this
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
