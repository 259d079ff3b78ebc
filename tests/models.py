"""Small models built in code for the engine's own tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper


def add_chain(n: int, *, shape=(1, 16), opset: int = 17) -> onnx.ModelProto:
    """``y = x + c0 + c1 + ... `` with ``n`` Add nodes."""
    nodes, inits = [], []
    prev = "x"
    for i in range(n):
        c = f"c{i}"
        inits.append(numpy_helper.from_array(np.full(shape[-1:], i * 0.001, np.float32), c))
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node("Add", [prev, c], [out], name=f"add{i}"))
        prev = out
    g = helper.make_graph(nodes, f"add_chain_{n}",
                          [helper.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TP.FLOAT, list(shape))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def two_branch(opset: int = 17) -> onnx.ModelProto:
    """Two independent branches joined by an Add: ``y = relu(x*a) + (x-b)``."""
    a = numpy_helper.from_array(np.float32([2.0, -1.0, 0.5]), "a")
    b = numpy_helper.from_array(np.float32([1.0, 1.0, 1.0]), "b")
    nodes = [
        helper.make_node("Mul", ["x", "a"], ["m"], name="mul"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("Sub", ["x", "b"], ["s"], name="sub"),
        helper.make_node("Add", ["r", "s"], ["y"], name="join"),
    ]
    g = helper.make_graph(nodes, "two_branch",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 3])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["batch", 3])], [a, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
