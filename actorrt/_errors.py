"""Every exception actorrt raises on purpose.

All derive from :class:`ActorRTError`. They are split by meaning, in the spirit of
trio's ``ClosedResourceError`` (you closed it) versus ``BrokenResourceError`` (the
other side broke it):

* loading: :class:`ModelLoadError`;
* compiling a plan: :class:`UnsupportedOperatorError`;
* calling ``run``: :class:`InvalidArgumentError`, :class:`KernelError`,
  :class:`OutOfMemoryError`;
* lifetime: :class:`SessionClosedError` (closed by you) versus
  :class:`ProviderBrokenError` (a provider actor crashed).

Each message names the model and, where one is involved, the node and input.
"""

from __future__ import annotations

import sys

if sys.version_info < (3, 11):  # pragma: no cover - trio depends on the backport there
    from exceptiongroup import BaseExceptionGroup
else:
    BaseExceptionGroup = BaseExceptionGroup  # noqa: PLW0127 - re-exported for 3.10


def leaf_exceptions(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (possibly nested) exception groups, or ``[exc]``."""
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for e in exc.exceptions:
            out.extend(leaf_exceptions(e))
        return out
    return [exc]


def single_exception(exc: BaseException) -> BaseException | None:
    """The one failure inside ``exc``, a (possibly nested) exception group:
    its only distinct leaf, or its only leaf that is not ``trio.Cancelled``
    (a cancellation a sibling's failure caused). ``None`` when there really
    are several distinct failures (the group should then propagate)."""
    leaves = []
    for e in leaf_exceptions(exc):
        if not any(e is x for x in leaves):
            leaves.append(e)
    if len(leaves) == 1:
        return leaves[0]
    import trio

    real = [e for e in leaves if not isinstance(e, trio.Cancelled)]
    if len(real) == 1:
        return real[0]
    if not real and leaves:
        return leaves[0]
    return None


class UnwrapGroups:
    """Wraps an async context manager (``@asynccontextmanager``) so that what
    leaves it is the single underlying exception rather than the
    ExceptionGroup trio's nurseries wrap it in: the body's own exception
    passes through as the very object, traceback kept; a failure while
    entering or leaving arrives as itself. A group with several distinct
    failures is left as it is."""

    __slots__ = ("_cm",)

    def __init__(self, cm):
        self._cm = cm

    async def __aenter__(self):
        try:
            return await self._cm.__aenter__()
        except BaseExceptionGroup as eg:
            leaf = single_exception(eg)
            if leaf is None:
                raise
        _reraise(leaf)

    async def __aexit__(self, exc_type, exc, tb):
        try:
            return await self._cm.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as eg:
            leaf = single_exception(eg)
            if leaf is None:
                raise
        if leaf is exc:
            exc.__traceback__ = tb  # the body's own exception, as it was raised
            return False
        _reraise(leaf)


def _reraise(leaf: BaseException) -> None:
    # raising sets __context__ to whatever is being handled (here: the group
    # that held it, or the body's exception a nursery wrapped): keep the
    # context the exception had where it was first raised
    context, suppress = leaf.__context__, leaf.__suppress_context__
    try:
        raise leaf
    finally:
        leaf.__context__, leaf.__suppress_context__ = context, suppress


class ProviderUnavailableWarning(UserWarning):
    """A requested execution provider is not available here (no GPU, a
    missing package, a provider actorrt does not implement); the session
    falls back to the next one in the list, as onnxruntime does."""


__all__ = [
    "ProviderUnavailableWarning",
    "ActorRTError",
    "ModelLoadError",
    "UnsupportedOperatorError",
    "InvalidArgumentError",
    "KernelError",
    "OutOfMemoryError",
    "SessionClosedError",
    "ProviderBrokenError",
    "GenerationError",
    "RunCancelledError",
    "SessionForkedError",
]


class ActorRTError(Exception):
    """Base class of every error actorrt raises on purpose.

    Attributes:
        model: name (or path) of the model involved, or ``None``.
        node: name of the node involved, or ``None``.
    """

    def __init__(self, message: str, *, model: str | None = None, node: str | None = None):
        self.model = model
        self.node = node
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        # built when shown: a model or node named after construction
        # (add_context, the plan naming the failing node) appears too
        prefix = []
        if self.model:
            prefix.append(f"model {self.model!r}")
        if self.node:
            prefix.append(f"node {self.node!r}")
        return f"[{', '.join(prefix)}] {self.message}" if prefix else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self):
        # keyword-only arguments and late context survive pickling (a worker
        # process handing an error back)
        return (_rebuild_error, (type(self), self.args, dict(self.__dict__)))

    def add_context(self, *, model: str | None = None,
                    node: str | None = None) -> "ActorRTError":
        """Name ``model`` / ``node`` where the raiser could not (kept when
        already set). Returns ``self``, for ``raise e.add_context(...)``."""
        if self.model is None and model:
            self.model = model
        if self.node is None and node:
            self.node = node
        return self


def _rebuild_error(cls: type, args: tuple, state: dict) -> ActorRTError:
    e = BaseException.__new__(cls)  # MemoryError.__new__ refuses subclasses
    e.args = args
    e.__dict__.update(state)
    return e


class ModelLoadError(ActorRTError):
    """The model could not be loaded.

    Raised by ``open_session`` / ``InferenceSession`` for a malformed protobuf, a
    missing file, a missing external-data file, or external data whose location
    escapes the model's folder (refused for safety).
    """


class UnsupportedOperatorError(ActorRTError):
    """No registered execution provider can run a node.

    Attributes:
        op_type: the operator type, e.g. ``"Conv"``.
        domain: the operator domain (``""`` for ai.onnx).
        opset: the opset version of that domain the model imports.
        reasons: mapping provider name -> that provider's decline reason.
    """

    def __init__(self, message: str, *, op_type: str, domain: str, opset: int,
                 reasons: dict[str, str] | None = None, model: str | None = None,
                 node: str | None = None):
        self.op_type = op_type
        self.domain = domain
        self.opset = opset
        self.reasons = dict(reasons or {})
        if self.reasons:
            message += "; " + "; ".join(f"{p}: {r}" for p, r in self.reasons.items())
        super().__init__(message, model=model, node=node)


class InvalidArgumentError(ActorRTError, ValueError):
    """A caller passed a bad argument: an unknown or missing input, a wrong dtype,
    a wrong rank, an incompatible static dimension, an unknown output name.

    Attributes:
        input: the input (or output) name involved, or ``None``.
        expected: what was expected, as text, or ``None``.
        got: what was passed, as text, or ``None``.
    """

    def __init__(self, message: str, *, input: str | None = None, expected: str | None = None,
                 got: str | None = None, model: str | None = None, node: str | None = None):
        self.input = input
        self.expected = expected
        self.got = got
        if expected is not None or got is not None:
            message += f" (expected {expected}, got {got})"
        super().__init__(message, model=model, node=node)


class KernelError(ActorRTError):
    """A kernel failed while running a node. ``__cause__`` holds the original error.

    Attributes:
        op_type: the operator type of the failing node.
    """

    def __init__(self, message: str, *, op_type: str | None = None, model: str | None = None,
                 node: str | None = None):
        self.op_type = op_type
        super().__init__(message, model=model, node=node)


class OutOfMemoryError(ActorRTError, MemoryError):
    """An allocation would exceed a provider's memory limit, or its byte count
    overflows. Raised *before* anything is allocated.

    Attributes:
        requested: bytes asked for (may be astronomically large).
        in_use: bytes the provider held when asked.
        limit: the provider's limit in bytes, or ``None`` when unlimited.
        role: what the memory was for (``"weights"``, ``"activations"``,
            ``"kv-cache"``, ``"workspace"``, ``"bindings"``).
        provider: the provider's name.
    """

    def __init__(self, message: str, *, requested: int, in_use: int, limit: int | None,
                 role: str, provider: str, model: str | None = None, node: str | None = None):
        self.requested = requested
        self.in_use = in_use
        self.limit = limit
        self.role = role
        self.provider = provider
        lim = "unlimited" if limit is None else f"{limit} bytes"
        message += (f" (provider {provider}: requested {requested} bytes for {role}, "
                    f"{in_use} bytes in use, limit {lim})")
        super().__init__(message, model=model, node=node)


class SessionClosedError(ActorRTError):
    """The session (or one of its providers, tensors or bindings) was closed by
    its owner and can no longer be used."""


class SessionForkedError(SessionClosedError):
    """A session was used in a process made by ``fork`` (multiprocessing's
    default start method on Linux, gunicorn ``--preload``) from the one that
    created it. Its actors and threads live only in the parent: create the
    session in the child instead.

    Attributes:
        created_pid: the process that created the session.
        pid: the process that tried to use it.
    """

    def __init__(self, message: str, *, created_pid: int, pid: int, model: str | None = None):
        self.created_pid = created_pid
        self.pid = pid
        super().__init__(message, model=model)


class RunCancelledError(ActorRTError):
    """A run stopped before it finished: its caller was cancelled (a
    ``RunOptions`` timeout or ``terminate``; under trio the caller sees
    ``trio.Cancelled`` itself) or the session closed while it ran."""


class ProviderBrokenError(ActorRTError):
    """A provider actor crashed; the session that used it cannot run any more.
    ``__cause__`` holds the crash."""


class GenerationError(ActorRTError):
    """A generation request is invalid (e.g. a prompt longer than the context
    window, a request that can never fit the KV budget)."""
