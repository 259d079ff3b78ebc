"""actorrt — an async, actor-based ONNX inference engine.

Execution providers are trio actors that own their memory and their stream;
the session scheduler fans graph segments out to their worker actors.

Async::

    async with actorrt.open_session("model.onnx") as session:
        outputs = await session.run(None, {"x": x})

Sync (onnxruntime-shaped)::

    sess = actorrt.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    outputs = sess.run(None, {"x": x})
"""

from typing import TYPE_CHECKING

from . import _lazy
from ._errors import (ActorRTError, GenerationError, InvalidArgumentError, KernelError,
                      ModelLoadError, OutOfMemoryError, ProviderBrokenError,
                      ProviderUnavailableWarning, SessionClosedError,
                      UnsupportedOperatorError)
from ._errors import RunCancelledError, SessionForkedError

if TYPE_CHECKING:  # the names below are imported on first use (PEP 562)
    from ._session import NodeArg, Session, SessionOptions, open_session
    from ._sync import InferenceSession, RunOptions
    from ._tensor import DeviceIoBinding, IOBinding, Tensor, TransferStatistics

_lazy.defer_sympy_in_onnx_ir()  # onnx-ir imports sympy on first use, not on import

__version__ = "0.1.0"

__all__ = [
    "ActorRTError", "GenerationError", "InvalidArgumentError", "KernelError",
    "ModelLoadError", "OutOfMemoryError", "ProviderBrokenError", "SessionClosedError",
    "UnsupportedOperatorError", "NodeArg", "Session", "SessionOptions", "open_session",
    "InferenceSession", "Tensor", "DeviceIoBinding", "IOBinding", "TransferStatistics",
    "__version__", "ProviderUnavailableWarning",
]
__all__ += ["RunOptions", "RunCancelledError", "SessionForkedError"]

#: public name -> the submodule defining it. ``import actorrt`` stays cheap
#: (no numpy, onnx, onnx-ir, sympy or trio): the session machinery is
#: imported when one of these names is first used.
_LAZY = {
    "NodeArg": "._session", "Session": "._session", "SessionOptions": "._session",
    "open_session": "._session", "InferenceSession": "._sync", "RunOptions": "._sync", "Tensor": "._tensor",
    "DeviceIoBinding": "._tensor", "IOBinding": "._tensor", "TransferStatistics": "._tensor",
}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
