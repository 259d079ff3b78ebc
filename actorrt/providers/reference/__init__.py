"""The reference fallback provider: a slow, always-correct provider built on
``onnx.reference`` ops. Off by default (``SessionOptions(enable_fallback=True)``
or ``providers=["cpu", "reference"]``); its cost model makes it take only the
nodes the CPU provider declines, and :meth:`Session.placement` reports them."""

from .provider import ReferenceExecutionProvider

__all__ = ["ReferenceExecutionProvider"]
