"""asyncio callers: :func:`open_session` and :func:`open_engine` for code that
runs under ``asyncio.run`` (FastAPI, aiohttp, plain asyncio).

The trio actors run on a host thread with its own trio loop, as
:class:`actorrt.InferenceSession` does for threads; each call is a trio task
there whose outcome comes back to the asyncio loop
(``loop.call_soon_threadsafe``), so the asyncio loop never blocks on it.
Cancelling the awaiting asyncio task cancels the trio task (an engine request
is dropped and its KV cache freed at the engine's next step); a stream is an
``async for`` iterator whose ``aclose()``, cancellation or garbage collection
cancels its request.

Example::

    import asyncio
    from actorrt import aio
    from actorrt.genai import SamplingParams

    async def main():
        async with aio.open_engine("smollm2") as engine:
            stream = engine.stream("The capital of France is",
                                   SamplingParams(max_new_tokens=16))
            async for text in stream:
                print(text, end="", flush=True)
            print(stream.result.finish_reason)

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import trio

from ._errors import BaseExceptionGroup, SessionClosedError, leaf_exceptions

__all__ = ["open_session", "open_engine", "AsyncSession", "AsyncEngine", "AsyncStream"]


def _single(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-member groups, else ``exc``."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = [e for e in leaf_exceptions(exc) if not isinstance(e, trio.Cancelled)]
        if len(leaves) == 1:
            return leaves[0]
    return exc


def _settle(fut: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class _Host:
    """One trio loop on a daemon thread, holding an async context manager's
    value until :meth:`stop`; runs trio tasks for the asyncio loop."""

    def __init__(self, enter: Callable[[], Any], name: str):
        self._enter = enter
        self._name = name
        self.value: Any = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> Any:
        self._loop = loop = asyncio.get_running_loop()
        ready = loop.create_future()

        async def host() -> None:
            try:
                async with self._enter() as value:
                    async with trio.open_nursery() as nursery:
                        self.value = value
                        self._token = trio.lowlevel.current_trio_token()
                        self._nursery = nursery
                        self._stop = trio.Event()
                        loop.call_soon_threadsafe(_settle, ready, value)
                        await self._stop.wait()
                        nursery.cancel_scope.cancel()  # calls still running
            except BaseException as exc:  # noqa: BLE001 - reported to start() / stop()
                if not ready.done():
                    loop.call_soon_threadsafe(_settle, ready, None, _single(exc))
                else:
                    self._error = _single(exc)

        def main() -> None:
            try:
                trio.run(host)
            except BaseException as exc:  # noqa: BLE001 - a broken host loop
                self._error = self._error or exc
                if not loop.is_closed():
                    loop.call_soon_threadsafe(_settle, ready, None, _single(exc))

        self._thread = threading.Thread(target=main, name=f"actorrt-aio-{self._name}",
                                        daemon=True)
        self._thread.start()
        try:
            return await asyncio.shield(ready)
        except asyncio.CancelledError:
            # cancelled while loading: let the host finish loading, then close it
            ready.add_done_callback(lambda f: f.cancelled() or f.exception() or self._post_stop())
            raise

    def _post_stop(self) -> None:
        if self._token is not None and self._stop is not None:
            try:
                self._token.run_sync_soon(self._stop.set)
            except trio.RunFinishedError:
                pass

    async def stop(self) -> None:
        """Close the context manager and end the host thread."""
        self._post_stop()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._token = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Start ``fn()`` as a task on the host loop (thread-safe, no wait).

        Raises:
            SessionClosedError: the host loop is closed.
        """
        if self._token is None or self._nursery is None:
            raise SessionClosedError(f"the {self._name} is closed")
        nursery = self._nursery
        try:
            self._token.run_sync_soon(nursery.start_soon, fn)
        except trio.RunFinishedError:
            raise SessionClosedError(f"the {self._name} is closed") from None

    def soon(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` on the host loop soon; nothing if it has ended."""
        if self._token is not None:
            try:
                self._token.run_sync_soon(fn)
            except trio.RunFinishedError:
                pass

    async def call(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """``await afn(*args)`` on the host loop, from the asyncio loop;
        cancelling the caller cancels it there."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        scope = trio.CancelScope()

        async def run() -> None:
            with scope:
                try:
                    result = await afn(*args)
                except trio.Cancelled:
                    raise
                except BaseException as exc:  # noqa: BLE001 - delivered to the caller
                    loop.call_soon_threadsafe(_settle, fut, None, _single(exc))
                    return
                loop.call_soon_threadsafe(_settle, fut, result)
            if scope.cancelled_caught and not fut.done():
                loop.call_soon_threadsafe(
                    _settle, fut, None, SessionClosedError(f"the {self._name} closed"))

        self.spawn(run)
        try:
            return await fut
        except asyncio.CancelledError:
            self.soon(scope.cancel)
            raise


class AsyncSession:
    """An :class:`actorrt.Session` for asyncio callers (from :func:`open_session`)."""

    def __init__(self, host: _Host):
        self._host = host
        self._session = host.value

    async def run(self, output_names: Sequence[str] | None, feeds: dict[str, Any]) -> list:
        """Run the model; see :meth:`actorrt.Session.run` (same arguments,
        outputs and errors). Concurrent calls run concurrently."""
        return await self._host.call(self._session.run, output_names, feeds)

    def get_inputs(self):
        return self._session.get_inputs()

    def get_outputs(self):
        return self._session.get_outputs()

    def get_providers(self) -> list[str]:
        return self._session.get_providers()

    @property
    def model_name(self) -> str:
        return self._session.model_name


class AsyncStream:
    """An engine stream for asyncio (``async for``): text pieces, or
    :class:`~actorrt.genai.engine.StreamPiece` with ``details=True``;
    :attr:`result` holds the :class:`~actorrt.genai.GenerationResult` once it
    ended. Errors are the engine's (:meth:`actorrt.genai.Engine.stream`)."""

    def __init__(self, host: _Host, prompt: Any, params: Any, details: bool):
        self._host = host
        self._args = (prompt, params, details)
        self._queue: asyncio.Queue | None = None
        self._scope = trio.CancelScope()
        self._ended = False
        #: the request's GenerationResult once the stream ended normally
        self.result = None

    def __aiter__(self) -> "AsyncStream":
        return self

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        queue = self._queue = asyncio.Queue()
        engine = self._host.value
        prompt, params, details = self._args
        scope = self._scope

        async def pump() -> None:
            put = queue.put_nowait
            with scope:
                try:
                    stream = engine.stream(prompt, params, details=details)
                    async for item in stream:
                        loop.call_soon_threadsafe(put, ("item", item))
                    loop.call_soon_threadsafe(put, ("end", stream.result))
                except trio.Cancelled:
                    raise
                except BaseException as exc:  # noqa: BLE001 - delivered to the reader
                    loop.call_soon_threadsafe(put, ("error", _single(exc)))
            if scope.cancelled_caught:  # the reader left, or the engine is closing
                loop.call_soon_threadsafe(put, ("error", SessionClosedError(
                    "the engine closed before the stream ended")))

        self._host.spawn(pump)

    async def __anext__(self) -> Any:
        if self._ended:
            raise StopAsyncIteration
        if self._queue is None:
            self._start()
        try:
            kind, value = await self._queue.get()
        except asyncio.CancelledError:
            self._cancel()
            raise
        if kind == "item":
            return value
        self._ended = True
        if kind == "end":
            self.result = value
            raise StopAsyncIteration
        raise value

    def _cancel(self) -> None:
        self._ended = True
        self._host.soon(self._scope.cancel)

    async def aclose(self) -> None:
        """Stop reading: the request is cancelled (KV freed at the next step)."""
        self._cancel()

    def __del__(self) -> None:
        if not self._ended:
            self._cancel()


class AsyncEngine:
    """A :class:`actorrt.genai.Engine` for asyncio callers (from
    :func:`open_engine`): same requests, same errors."""

    def __init__(self, host: _Host):
        self._host = host
        self._engine = host.value

    async def generate(self, prompt: Any, params: Any = None) -> Any:
        """Generate to completion -> :class:`~actorrt.genai.GenerationResult`;
        see :meth:`actorrt.genai.Engine.generate`."""
        return await self._host.call(self._engine.generate, prompt, params)

    def stream(self, prompt: Any, params: Any = None, *, details: bool = False) -> AsyncStream:
        """An :class:`AsyncStream` of the request; see
        :meth:`actorrt.genai.Engine.stream`."""
        return AsyncStream(self._host, prompt, params, details)

    def encode_prompt(self, prompt: Any) -> list[int]:
        """Token ids of a prompt; see :meth:`actorrt.genai.Engine.encode_prompt`."""
        return self._engine.encode_prompt(prompt)

    async def statistics(self) -> Any:
        """The engine's :class:`~actorrt.genai.EngineStatistics`, read on its loop."""
        async def read():
            return self._engine.statistics()
        return await self._host.call(read)

    @property
    def tokenizer(self) -> Any:
        return self._engine.tokenizer

    @property
    def context(self) -> int:
        """Context window (tokens)."""
        return self._engine.context

    @property
    def max_batch(self) -> int:
        return self._engine.max_batch


@asynccontextmanager
async def open_session(model: Any, providers: Sequence[Any] | None = None,
                       options: Any = None) -> AsyncIterator[AsyncSession]:
    """:func:`actorrt.open_session` for asyncio: ``async with
    aio.open_session(model) as session: outs = await session.run(None, feeds)``.

    Raises:
        ModelLoadError, UnsupportedOperatorError, InvalidArgumentError: as
            :func:`actorrt.open_session` (the exception itself, not a group).
    """
    from ._session import open_session as trio_open_session

    host = _Host(lambda: trio_open_session(model, providers, options), "session")
    await host.start()
    try:
        yield AsyncSession(host)
    finally:
        await host.stop()


@asynccontextmanager
async def open_engine(model: Any = "smollm2", **kwargs: Any) -> AsyncIterator[AsyncEngine]:
    """:func:`actorrt.genai.open_engine` for asyncio (same arguments).

    Raises:
        ModelLoadError: as :func:`actorrt.genai.open_engine`.
    """
    from .genai.engine import open_engine as trio_open_engine

    host = _Host(lambda: trio_open_engine(model, **kwargs), "engine")
    await host.start()
    try:
        yield AsyncEngine(host)
    finally:
        await host.stop()
