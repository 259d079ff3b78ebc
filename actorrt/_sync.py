"""The synchronous, onnxruntime-shaped API: ``actorrt.InferenceSession``.

It hosts the async session and its actors on one background thread running a
trio loop; calls from any number of threads are forwarded to it with
``trio.from_thread`` and run concurrently there.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import trio

from ._errors import SessionClosedError
from ._model import ModelLike
from ._session import NodeArg, Session, SessionOptions, open_session

__all__ = ["InferenceSession"]


class InferenceSession:
    """Drop-in for ``onnxruntime.InferenceSession``.

    Args:
        model: path, bytes, ``onnx.ModelProto`` or ``onnx_ir.Model``.
        sess_options: a :class:`SessionOptions` (onnxruntime's positional slot).
        providers: names in priority order, e.g. ``["CPUExecutionProvider"]``.

    Raises:
        ModelLoadError, UnsupportedOperatorError, InvalidArgumentError: as
            :func:`actorrt.open_session`.
    """

    def __init__(self, model: ModelLike, sess_options: SessionOptions | None = None,
                 providers: Sequence[Any] | None = None, *, options: SessionOptions | None = None,
                 provider_options: Sequence[dict] | None = None):
        opts = options or sess_options
        if provider_options and providers:
            providers = [(p, o) if isinstance(p, str) else p
                         for p, o in zip(providers, provider_options)]
        self._session: Session | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=self._main, args=(model, providers, opts),
                                        name="actorrt-session", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            err, self._error = self._error, None
            self._thread.join()
            raise err

    def _main(self, model, providers, opts) -> None:
        async def host():
            try:
                async with open_session(model, providers, opts) as s:
                    self._session = s
                    self._token = trio.lowlevel.current_trio_token()
                    self._stop = trio.Event()
                    self._ready.set()
                    await self._stop.wait()
            except BaseException as e:  # reported to the constructor
                if not self._ready.is_set():
                    self._error = e
                    self._ready.set()
                else:
                    raise

        try:
            trio.run(host)
        except BaseException as e:  # noqa: BLE001 - only reached on a broken shutdown
            self._error = e
            self._ready.set()

    def _call(self, fn, *args):
        if self._session is None or self._token is None:
            raise SessionClosedError("the session is closed")
        try:
            return trio.from_thread.run(fn, *args, trio_token=self._token)
        except trio.RunFinishedError as e:
            raise SessionClosedError("the session is closed") from e

    def run(self, output_names: Sequence[str] | None, input_feed: dict[str, Any],
            run_options: Any = None) -> list:
        """Run the model; see :meth:`actorrt.Session.run`. Thread-safe."""
        return self._call(self._session_or_raise().run, output_names, input_feed)

    def _session_or_raise(self) -> Session:
        if self._session is None:
            raise SessionClosedError("the session is closed")
        return self._session

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
        """Stop the actors and the background loop. Idempotent."""
        if self._session is None:
            return
        token, stop = self._token, self._stop
        self._session = None
        try:
            trio.from_thread.run_sync(stop.set, trio_token=token)
        except trio.RunFinishedError:
            pass
        self._thread.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def __enter__(self) -> "InferenceSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
