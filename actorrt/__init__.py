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

from ._errors import (ActorRTError, GenerationError, InvalidArgumentError, KernelError,
                      ModelLoadError, OutOfMemoryError, ProviderBrokenError,
                      ProviderUnavailableWarning, SessionClosedError, UnsupportedOperatorError)
from ._session import NodeArg, Session, SessionOptions, open_session
from ._sync import InferenceSession
from ._tensor import DeviceIoBinding, IOBinding, Tensor, TransferStatistics

__version__ = "0.1.0"

__all__ = [
    "ActorRTError", "GenerationError", "InvalidArgumentError", "KernelError",
    "ModelLoadError", "OutOfMemoryError", "ProviderBrokenError", "SessionClosedError",
    "UnsupportedOperatorError", "NodeArg", "Session", "SessionOptions", "open_session",
    "InferenceSession", "Tensor", "DeviceIoBinding", "IOBinding", "TransferStatistics",
    "__version__", "ProviderUnavailableWarning",
]
