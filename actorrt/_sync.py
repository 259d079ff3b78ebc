"""The synchronous, onnxruntime-shaped API: ``actorrt.InferenceSession``.

It hosts the async session and its actors on one background thread running a
trio loop; calls from any number of threads are forwarded to it with
``trio.from_thread`` and run concurrently there. A run without
:class:`RunOptions` of a plan that is one host segment without control flow,
memory accounting or tracing (:attr:`actorrt.Session.runs_blocking`) skips
the hop: it runs in the calling thread (:meth:`actorrt.Session.run_blocking`;
closing waits for such runs, which then raise
:class:`~actorrt.SessionClosedError`). The hop to the loop's thread and back
cost ~200 µs of a 1-node model's ~250 µs per run here.

Lifetime: the background thread holds only a :class:`_Host` (the loop's
token, the async session, a stop event), never the ``InferenceSession``
itself, so a session dropped without :meth:`~InferenceSession.close` is
collected and a finalizer stops its thread (no leaked thread or file
descriptors). A session does not cross ``fork``: in a child process every call
raises :class:`~actorrt.SessionForkedError`.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any, Sequence

import trio

from . import _fork
from ._errors import (InvalidArgumentError, RunCancelledError, SessionClosedError,
                      leaf_exceptions)
from ._model import ModelLike
from ._session import NodeArg, Session, SessionOptions, open_session

__all__ = ["InferenceSession", "RunOptions"]

#: how long a finalizer (a session dropped without close()) waits for its thread
_FINALIZER_JOIN_S = 10.0


def _single(exc: BaseException) -> BaseException:
    """The one real exception inside (nested) exception groups, else ``exc``:
    a group is kept only when it holds several (cancellations not counted)."""
    leaves = leaf_exceptions(exc)
    if len(leaves) == 1:
        return leaves[0]
    real = [e for e in leaves if not isinstance(e, trio.Cancelled)]
    return real[0] if len(real) == 1 else exc


def _refuse_in_trio(what: str) -> None:
    if trio.lowlevel.in_trio_run():
        raise InvalidArgumentError(
            f"the synchronous {what} cannot be called from inside a trio task: it would "
            f"block (or deadlock) the event loop; use `async with actorrt.open_session(...) "
            f"as session` and `await session.run(...)` instead, or call it from a thread "
            f"(`await trio.to_thread.run_sync(...)`)",
            expected="a call from plain (non-async) code", got="a call inside trio.run")


class RunOptions:
    """Options of one synchronous run, as onnxruntime's ``RunOptions``.

    Args:
        timeout_s: give up after this many seconds (``None``: no timeout);
            the run then raises :class:`~actorrt.RunCancelledError`.
        run_tag: a label (kept for onnxruntime compatibility).

    Attributes:
        terminate: set it to ``True`` from any thread to stop every run using
            these options (each raises :class:`~actorrt.RunCancelledError`);
            while ``True``, new runs with them raise at once. Work not yet
            started is withdrawn; control flow stops at its next iteration;
            what the run holds is released when its running kernels end.
    """

    def __init__(self, *, timeout_s: float | None = None, run_tag: str = ""):
        if timeout_s is not None:
            if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                    or math.isnan(timeout_s) or timeout_s < 0:
                raise InvalidArgumentError("RunOptions timeout_s must be a number of seconds "
                                           ">= 0 or None", input="timeout_s",
                                           expected="float >= 0 or None", got=repr(timeout_s))
        self.timeout_s = timeout_s
        self.run_tag = run_tag
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self._terminate = False
        self._lock = threading.Lock()
        self._active: set[tuple[Any, Any]] = set()  # (trio token, cancel scope)

    @property
    def terminate(self) -> bool:
        return self._terminate

    @terminate.setter
    def terminate(self, value: bool) -> None:
        with self._lock:
            self._terminate = bool(value)
            active = list(self._active) if value else []
        for token, scope in active:
            try:
                token.run_sync_soon(scope.cancel)
            except trio.RunFinishedError:
                pass

    def _attach(self, token: Any, scope: Any) -> None:
        with self._lock:
            self._active.add((token, scope))
            if self._terminate:
                scope.cancel()

    def _detach(self, token: Any, scope: Any) -> None:
        with self._lock:
            self._active.discard((token, scope))


async def _run_with_options(session: Session, names, feeds, ro: RunOptions) -> list:
    token = trio.lowlevel.current_trio_token()
    with trio.CancelScope() as scope:
        if ro.timeout_s is not None:
            scope.deadline = trio.current_time() + ro.timeout_s
        ro._attach(token, scope)
        try:
            return await session.run(names, feeds)
        finally:
            ro._detach(token, scope)
    why = "terminate was set" if ro.terminate else f"its timeout of {ro.timeout_s} s passed"
    raise RunCancelledError(f"the run was cancelled: {why}", model=session.model_name)


class _Host:
    """What the background thread and the :class:`InferenceSession` share.

    The thread runs :meth:`main`; the session object keeps a reference to the
    host, never the other way round."""

    def __init__(self) -> None:
        self.session: Session | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self.stop: trio.Event | None = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.thread: threading.Thread | None = None
        self.model_name: str | None = None
        self._forked = False
        self.pid = _fork.register(self)

    def main(self, model, providers, opts) -> None:
        async def host():
            try:
                async with open_session(model, providers, opts) as s:
                    self.session = s
                    self.model_name = s.model_name
                    self.token = trio.lowlevel.current_trio_token()
                    self.stop = trio.Event()
                    self.ready.set()
                    await self.stop.wait()
            except BaseException as e:  # reported to the constructor / close()
                self.error = _single(e)
                if not self.ready.is_set():
                    self.ready.set()
                    return
                raise

        try:
            trio.run(host)
        except BaseException as e:  # noqa: BLE001 - a failed shutdown, raised by close()
            if self.error is None:
                self.error = _single(e)
        finally:
            self.ready.set()

    def live_session(self) -> Session:
        if self._forked:
            raise _fork.forked_error(self.pid, "this InferenceSession", self.model_name)
        if self.session is None or self.token is None:
            raise SessionClosedError("the session is closed", model=self.model_name)
        return self.session

    def call(self, fn, *args):
        self.live_session()
        _refuse_in_trio("InferenceSession.run")
        try:
            return trio.from_thread.run(fn, *args, trio_token=self.token)
        except (trio.RunFinishedError, trio.Cancelled) as e:
            raise SessionClosedError("the session was closed during the call",
                                     model=self.model_name) from e

    def shutdown(self, join_s: float | None = None) -> BaseException | None:
        """Stop the loop and (unless called on the loop's own thread) wait up
        to ``join_s`` seconds for its thread. Returns an error the shutdown
        raised, if any. Idempotent; a no-op in a forked child."""
        if self._forked or self.token is None:
            self.session = None
            return None
        token, stop = self.token, self.stop
        self.session = None
        self.token = None
        try:
            token.run_sync_soon(stop.set)
        except trio.RunFinishedError:
            pass
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(join_s)
        err, self.error = self.error, None
        return err


class InferenceSession:
    """Drop-in for ``onnxruntime.InferenceSession``.

    Args:
        model: path, bytes, ``onnx.ModelProto`` or ``onnx_ir.Model``.
        sess_options: a :class:`SessionOptions` (onnxruntime's positional slot).
        providers: names in priority order, e.g. ``["CPUExecutionProvider"]``.

    A session dropped without :meth:`close` is collected and its background
    thread stopped. It cannot be used in a process made by ``fork`` from the
    one that created it.

    Raises:
        ModelLoadError, UnsupportedOperatorError, InvalidArgumentError,
            OutOfMemoryError: as :func:`actorrt.open_session` (the single
            error itself, never wrapped in an exception group).
        InvalidArgumentError: called from inside a trio task (use
            :func:`actorrt.open_session` there).
    """

    def __init__(self, model: ModelLike, sess_options: SessionOptions | None = None,
                 providers: Sequence[Any] | None = None, *, options: SessionOptions | None = None,
                 provider_options: Sequence[dict] | None = None):
        _refuse_in_trio("InferenceSession constructor")
        opts = options or sess_options
        if provider_options and providers:
            providers = [(p, o) if isinstance(p, str) else p
                         for p, o in zip(providers, provider_options)]
        host = self._host = _Host()
        host.thread = threading.Thread(target=host.main, args=(model, providers, opts),
                                       name="actorrt-session", daemon=True)
        host.thread.start()
        host.ready.wait()
        if host.session is None:
            err = host.error
            host.error = None
            host.thread.join()
            raise err if err is not None else SessionClosedError("the session failed to start")
        # collected when unreferenced: the finalizer holds the host, not self
        self._finalizer = weakref.finalize(self, _Host.shutdown, host, _FINALIZER_JOIN_S)

    def run(self, output_names: Sequence[str] | None, input_feed: dict[str, Any],
            run_options: Any = None) -> list:
        """Run the model; see :meth:`actorrt.Session.run`. Thread-safe.

        Args:
            run_options: a :class:`RunOptions` (timeout, terminate), or
                ``None``.

        Raises:
            RunCancelledError: ``run_options`` timed out or was terminated.
            SessionForkedError: called in a process forked from the creator.
            InvalidArgumentError: called from inside a trio task; and as
                :meth:`actorrt.Session.run`.
        """
        host = self._host
        session = host.live_session()
        if run_options is None and session.runs_blocking_with(input_feed):
            # one host segment: run it right here, no hop to the loop's thread
            _refuse_in_trio("InferenceSession.run")
            return session.run_blocking(output_names, input_feed)
        if isinstance(run_options, RunOptions):
            return host.call(_run_with_options, session, output_names, input_feed,
                             run_options)
        if run_options is not None and getattr(run_options, "terminate", False):
            raise RunCancelledError("the run was cancelled: terminate was set",
                                    model=session.model_name)
        return host.call(session.run, output_names, input_feed)

    def _session_or_raise(self) -> Session:
        return self._host.live_session()

    def get_inputs(self) -> list[NodeArg]:
        return self._session_or_raise().get_inputs()

    def get_outputs(self) -> list[NodeArg]:
        return self._session_or_raise().get_outputs()

    def get_overridable_initializers(self) -> list[NodeArg]:
        return self._session_or_raise().get_overridable_initializers()

    def get_providers(self) -> list[str]:
        return self._session_or_raise().get_providers()

    def placement(self):
        return self._session_or_raise().placement()

    def statistics(self):
        return self._session_or_raise().statistics()

    @property
    def session(self) -> Session:
        """The underlying async :class:`Session` (use only from its loop)."""
        return self._session_or_raise()

    def close(self) -> None:
        """Stop the actors and the background loop. Idempotent. Runs under
        way stop: their queued work is withdrawn and control flow stops at its
        next iteration (their callers get :class:`~actorrt.SessionClosedError`).
        In a forked child it only marks the session closed."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is None:
            return
        if finalizer.detach() is None:
            return  # closed already
        error = self._host.shutdown(None)
        if error is not None:
            raise error

    def __enter__(self) -> "InferenceSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
