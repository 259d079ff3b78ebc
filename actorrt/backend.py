"""``onnx.backend.base.Backend`` over actorrt: the ONNX ecosystem's standard
adapter (``prepare``, ``run_model``, ``run_node``, ``supports_device``), used by
``onnx.backend.test.BackendTest``."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from ._sync import InferenceSession

__all__ = ["ActorRTBackend", "ActorRTRep", "prepare", "run_model", "run_node",
           "supports_device"]


class ActorRTRep(BackendRep):
    """A prepared model: ``run(inputs)`` takes a list (graph-input order) or a dict."""

    def __init__(self, session: InferenceSession):
        self.session = session
        self._names = [i.name for i in session.get_inputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(self._names, inputs))
        return tuple(self.session.run(None, feeds))


class ActorRTBackend(Backend):
    """actorrt as an ONNX backend (CPU)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().startswith("CPU")

    @classmethod
    def prepare(cls, model: onnx.ModelProto | str | bytes, device: str = "CPU",
                **kwargs: Any) -> ActorRTRep:
        providers = kwargs.pop("providers", None)
        return ActorRTRep(InferenceSession(model, providers=providers, **kwargs))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple:
        rep = cls.prepare(model, device, **kwargs)
        try:
            return rep.run(inputs)
        finally:
            rep.session.close()

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Sequence[np.ndarray], device: str = "CPU",
                 outputs_info: Any = None, **kwargs: Any) -> tuple:
        from onnx import helper
        opset = kwargs.pop("opset_version", None) or onnx.defs.onnx_opset_version()
        ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype),
                                             np.asarray(x).shape)
               for n, x in zip(node.input, inputs) if n]
        outs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
        graph = helper.make_graph([node], "run_node", ins, outs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain, opset)])
        feeds = {n: np.asarray(x) for n, x in zip(node.input, inputs) if n}
        rep = cls.prepare(model, device, **kwargs)
        try:
            return rep.run(feeds)
        finally:
            rep.session.close()


prepare = ActorRTBackend.prepare
run_model = ActorRTBackend.run_model
run_node = ActorRTBackend.run_node
supports_device = ActorRTBackend.supports_device
