"""Actors on trio: a mailbox, request/reply, supervision.

An actor is a trio task that owns some state and changes it only in response to
messages taken from its mailbox, one at a time (so a provider's work is ordered,
like a device stream). Others hold an :class:`ActorRef` — a capability handle —
and either ``tell`` (fire and forget) or ``ask`` (await the reply).

Actors start only inside nurseries (:func:`open_actors`). A handler that raises
sends that error back to the asker and the actor goes on; an actor whose own
loop fails is *broken*: it stops, and every ask after that raises
:class:`~actorrt.ProviderBrokenError` with the crash as cause. An actor closed by
its owner raises :class:`~actorrt.SessionClosedError` instead.

An ``ask`` whose caller is cancelled while it waits is *withdrawn*: the actor
drops the message if it had not started it and :meth:`Actor.withdrawable`
says so, and hands a reply nobody will take to :meth:`Actor.on_abandoned` (a
provider frees an allocation made for a caller that gave up).
"""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Sequence

import attrs
import trio

from .._errors import ProviderBrokenError, SessionClosedError

__all__ = ["Actor", "ActorRef", "open_actors", "Crash", "ActorStatistics"]


class _Reply:
    __slots__ = ("event", "value", "error", "withdrawn")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        #: the asker was cancelled while waiting: nobody takes the reply
        self.withdrawn = False


@attrs.frozen
class Crash:
    """Tell an actor to fail on purpose (supervision tests, fault injection)."""

    error: BaseException


@attrs.frozen
class ActorStatistics:
    """Counters of one actor.

    Attributes:
        name: the actor's name.
        handled: messages handled.
        failed: messages whose handler raised (error sent to the asker).
        queued: messages waiting in the mailbox.
        alive: the actor is running.
    """

    name: str
    handled: int
    failed: int
    queued: int
    alive: bool


class Actor:
    """Base class: subclasses define ``async def handle(self, message)``.

    Several actors may share one mailbox (a worker pool): whichever is idle
    takes the next message.
    """

    def __init__(self, name: str, *, mailbox: tuple | None = None, capacity: float = math.inf):
        self.name = name
        if mailbox is None:
            mailbox = trio.open_memory_channel(capacity)
        self._send, self._recv = mailbox
        self._handled = 0
        self._failed = 0
        self._alive = False
        self._closed = False
        self._crash: BaseException | None = None
        self.ref = ActorRef(self)

    # subclass hooks ----------------------------------------------------------
    async def handle(self, message: Any) -> Any:  # pragma: no cover - abstract
        raise TypeError(f"{self.name} cannot handle {type(message).__name__}")

    async def on_stop(self) -> None:
        """Called once when the actor stops (also when it broke)."""

    def withdrawable(self, message: Any) -> bool:
        """Whether ``message``, asked by a caller that was cancelled before the
        actor took it, is dropped unhandled (default: no, it is handled)."""
        return False

    def on_abandoned(self, message: Any, value: Any) -> None:
        """Called with the reply of an ask whose caller was cancelled while
        the actor handled it: release what ``value`` owns (default: nothing)."""

    # loop ----------------------------------------------------------------------
    async def _main(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._alive = True
        task_status.started()
        try:
            async with self._recv:
                async for message, reply in self._recv:
                    if isinstance(message, Crash):
                        raise message.error
                    if reply is not None and reply.withdrawn and self.withdrawable(message):
                        continue  # its asker gave up before it started
                    try:
                        value = await self.handle(message)
                    except (Exception, trio.Cancelled) as e:
                        self._failed += 1
                        if reply is None or isinstance(e, trio.Cancelled):
                            if reply is not None:
                                reply.error = SessionClosedError(
                                    f"actor {self.name} was cancelled")
                                reply.event.set()
                            raise
                        reply.error = e
                        reply.event.set()
                        continue
                    self._handled += 1
                    if reply is not None:
                        if reply.withdrawn:
                            self.on_abandoned(message, value)
                        else:
                            reply.value = value
                            reply.event.set()
        except trio.Cancelled:
            raise
        except BaseException as e:  # the actor broke
            self._crash = e
            self._fail_pending(e)
            if not isinstance(e, Exception):
                raise
        finally:
            self._alive = False
            with trio.CancelScope(shield=True):
                await self.on_stop()

    def _fail_pending(self, e: BaseException) -> None:
        while True:
            try:
                message, reply = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            if reply is not None:
                reply.error = ProviderBrokenError(f"actor {self.name} broke: {e!r}")
                reply.error.__cause__ = e
                reply.event.set()

    def close(self) -> None:
        """Stop taking messages; the actor finishes those already queued."""
        self._closed = True
        self._send.close()

    def statistics(self) -> ActorStatistics:
        return ActorStatistics(self.name, self._handled, self._failed,
                               self._send.statistics().current_buffer_used, self._alive)


class ActorRef:
    """A capability handle to an actor: the only way to reach its state."""

    __slots__ = ("_actor",)

    def __init__(self, actor: Actor):
        self._actor = actor

    @property
    def name(self) -> str:
        return self._actor.name

    def _check(self) -> None:
        a = self._actor
        if a._crash is not None:
            raise ProviderBrokenError(f"actor {a.name} broke: {a._crash!r}") from a._crash
        if a._closed:
            raise SessionClosedError(f"actor {a.name} was closed")

    def tell(self, message: Any) -> None:
        """Send without waiting for a reply.

        Raises:
            SessionClosedError: the actor was closed.
            ProviderBrokenError: the actor broke.
        """
        self._check()
        try:
            self._actor._send.send_nowait((message, None))
        except (trio.ClosedResourceError, trio.BrokenResourceError) as e:
            raise SessionClosedError(f"actor {self._actor.name} was closed") from e

    async def ask(self, message: Any) -> Any:
        """Send ``message`` and wait for the handler's return value.

        Raises:
            SessionClosedError: the actor was closed (before or while waiting).
            ProviderBrokenError: the actor broke.
            Exception: whatever the handler raised for this message.
        """
        self._check()
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller sends nothing
        reply = _Reply()
        try:
            self._actor._send.send_nowait((message, reply))
        except (trio.ClosedResourceError, trio.BrokenResourceError) as e:
            raise SessionClosedError(f"actor {self._actor.name} was closed") from e
        except trio.WouldBlock:
            await self._actor._send.send((message, reply))
        try:
            await reply.event.wait()
        except trio.Cancelled:
            if not reply.event.is_set():
                reply.withdrawn = True  # the actor drops or releases the reply
            elif reply.error is None:
                # answered while this caller was being cancelled: give it back
                self._actor.on_abandoned(message, reply.value)
            raise
        if reply.error is not None:
            raise reply.error
        return reply.value


@asynccontextmanager
async def open_actors(actors: Sequence[Actor]) -> AsyncIterator[list[ActorRef]]:
    """Start ``actors`` in a nursery; on exit close their mailboxes and wait for
    them to drain and stop."""
    async with trio.open_nursery() as nursery:
        started = []
        try:
            for a in actors:
                await nursery.start(a._main)
                started.append(a)
            yield [a.ref for a in actors]
        finally:
            for a in started:
                if not a._closed:
                    a.close()
