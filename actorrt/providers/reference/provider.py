"""Fallback execution provider on ``onnx.reference`` (see package docstring)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from .._contract import (Cost, DeviceProfile, Kernel, KernelMatch, NodeSpec, Supported,
                         Unsupported)
from .._registry import KernelRegistry
from ..cpu.provider import CPUExecutionProvider

__all__ = ["ReferenceExecutionProvider"]

#: Deliberately pessimistic: any native kernel is preferred.
REFERENCE_PROFILE = DeviceProfile(gflops=0.05, gbytes_per_s=0.2, launch_us=5000.0)


def _attr_proto(name: str, value: Any) -> onnx.AttributeProto:
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, onnx.numpy_helper.from_array(value))
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(name, [onnx.numpy_helper.from_array(v) for v in value])
    return helper.make_attribute(name, value)


class _ReferenceKernel(Kernel):
    """Runs one node with ``onnx.reference.ReferenceEvaluator``."""

    multi_output = True

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        from onnx.reference import ReferenceEvaluator

        proto = helper.make_node(node.op_type, list(node.inputs), list(node.outputs),
                                 domain=node.domain, name=node.name)
        proto.attribute.extend(_attr_proto(k, v) for k, v in node.attrs.items())
        ins = [helper.make_empty_tensor_value_info(n) for n in node.inputs if n]
        outs = [helper.make_empty_tensor_value_info(n) for n in node.outputs if n]
        imports = [helper.make_opsetid(node.domain, node.opset)]
        if node.domain:
            imports.append(helper.make_opsetid("", 21))
        model = helper.make_model(helper.make_graph([proto], "fallback", ins, outs),
                                  opset_imports=imports)
        self._ref = ReferenceEvaluator(model)
        self._in = [n for n in node.inputs]
        self._out = [n for n in node.outputs if n]

    def run(self, *inputs: Any) -> tuple:
        feeds = {n: v for n, v in zip(self._in, inputs) if n}
        res = self._ref.run(None, feeds)
        out = iter(res)
        return tuple(next(out) if n else None for n in self.node.outputs)


class ReferenceExecutionProvider(CPUExecutionProvider):
    """Host-memory provider whose kernels are ``onnx.reference`` ops.

    Declines nodes with subgraph attributes and ops ``onnx.reference`` lacks.
    """

    name = "reference"
    aliases = ("ReferenceExecutionProvider",)
    registry = KernelRegistry("reference")

    def __init__(self, *, workers: int | None = 1, memory_limit: int | None = None):
        super().__init__(workers=workers or 1, memory_limit=memory_limit)
        self.profile = REFERENCE_PROFILE

    def supports_op(self, node: NodeSpec) -> KernelMatch:
        if any(isinstance(v, (ir.Graph, list)) and (isinstance(v, ir.Graph) or (
                v and isinstance(v[0], ir.Graph))) for v in node.attrs.values()):
            return Unsupported("the reference fallback does not run nodes with subgraphs")
        try:
            from onnx.reference.ops import load_op
            load_op(node.domain, node.op_type, node.opset)
        except Exception as e:  # noqa: BLE001 - the reason is reported
            return Unsupported(f"onnx.reference has no {node.domain or 'ai.onnx'}:"
                               f"{node.op_type} at opset {node.opset} ({type(e).__name__})")
        cost = Cost.of_work(flops=_Flops.estimate_flops(node),
                            bytes_moved=node.input_bytes() + node.output_bytes(),
                            gflops=self.profile.gflops, gbytes_per_s=self.profile.gbytes_per_s,
                            launch_us=self.profile.launch_us)
        return Supported(cost)

    def create_kernel(self, node: NodeSpec) -> Kernel:
        return _ReferenceKernel(node)


_Flops = Kernel
