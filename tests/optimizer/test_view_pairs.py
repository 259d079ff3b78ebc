"""Reshape / Transpose pairs -> ``ai.actorrt:ReshapeTranspose`` (extended level,
:func:`actorrt.optimizer.transformer.fuse_view_pairs`): a transformer's head split and
head merge become one node, the outputs equal onnxruntime's on the unoptimized model,
and pairs whose middle value is read elsewhere, whose shape is not constant or that run
at the basic level stay as they are."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers import NodeSpec
from actorrt.providers.cpu.registry import CPU_KERNELS

RNG = np.random.default_rng(123)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "v", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _vi(name, shape, dt=TP.FLOAT):
    return helper.make_tensor_value_info(name, dt, shape)


def _i64(name, vals):
    return numpy_helper.from_array(np.array(vals, np.int64), name)


def _run(model, feeds, level="ORT_ENABLE_ALL"):
    opts = actorrt.SessionOptions(graph_optimization_level=level)
    with actorrt.InferenceSession(model, opts) as s:
        got = s.run(None, feeds)
        got2 = s.run(None, feeds)  # the kept reshape targets give the same views
        for a, b in zip(got, got2):
            np.testing.assert_array_equal(a, b)
        return got, [st.node.op_type for st in s.session.plan.steps]


def _want(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("x_shape,decl,shape,perm,first", [
    ((2, 5, 32), [2, 5, 32], [0, 0, 4, -1], [0, 2, 1, 3], 0),        # head split
    ((2, 5, 32), ["B", "S", 32], [0, 0, 4, 8], [0, 2, 3, 1], 0),     # keys, symbolic dims
    ((2, 4, 5, 8), [2, 4, 5, 8], [0, 0, -1], [0, 2, 1, 3], 1),       # head merge
    ((3, 7, 6), ["N", 7, 6], [-1, 42], [1, 0, 2], 1),                # a copying reshape
    ((6, 10), [6, 10], [5, 3, 4], None, 0),                          # the default reversal
])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_pairs_fuse_and_equal_onnxruntime(x_shape, decl, shape, perm, first, dtype):
    tt = TP.FLOAT if dtype == np.float32 else TP.INT64
    t_attrs = {} if perm is None else {"perm": perm}
    if first:
        nodes = [helper.make_node("Transpose", ["x"], ["m"], **t_attrs),
                 helper.make_node("Reshape", ["m", "s"], ["r"])]
    else:
        nodes = [helper.make_node("Reshape", ["x", "s"], ["m"]),
                 helper.make_node("Transpose", ["m"], ["r"], **t_attrs)]
    nodes.append(helper.make_node("Neg", ["r"], ["y"]))  # a reader after the views
    model = _model(nodes, [_vi("x", decl, tt)], [_vi("y", None, tt)], [_i64("s", shape)])
    x = (RNG.standard_normal(x_shape) * 10).astype(dtype)
    got, ops = _run(model, {"x": x})
    assert ops == ["ReshapeTranspose", "Neg"]
    np.testing.assert_array_equal(got[0], _want(model, {"x": x})[0])
    got0, ops0 = _run(model, {"x": x}, level="ORT_ENABLE_BASIC")
    assert "ReshapeTranspose" not in ops0
    np.testing.assert_array_equal(got0[0], got[0])


def test_allowzero_and_an_empty_tensor():
    nodes = [helper.make_node("Reshape", ["x", "s"], ["m"], allowzero=1),
             helper.make_node("Transpose", ["m"], ["y"], perm=[0, 2, 1])]
    model = _model(nodes, [_vi("x", [0, 12])], [_vi("y", None)], [_i64("s", [0, 3, 4])])
    got, ops = _run(model, {"x": np.zeros((0, 12), np.float32)})
    assert ops == ["ReshapeTranspose"] and got[0].shape == (0, 4, 3)


def test_middle_value_read_elsewhere_or_a_fed_shape_is_kept():
    nodes = [helper.make_node("Reshape", ["x", "s"], ["m"]),
             helper.make_node("Transpose", ["m"], ["y"], perm=[1, 0]),
             helper.make_node("Relu", ["m"], ["z"])]
    model = _model(nodes, [_vi("x", [4, 6])], [_vi("y", None), _vi("z", None)],
                   [_i64("s", [3, 8])])
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    got, ops = _run(model, {"x": x})
    assert "ReshapeTranspose" not in ops
    for g, w in zip(got, _want(model, {"x": x})):
        np.testing.assert_array_equal(g, w)
    out = _model(nodes[:2], [_vi("x", [4, 6])], [_vi("y", None), _vi("m", None)],
                 [_i64("s", [3, 8])])  # the middle value is a graph output
    assert "ReshapeTranspose" not in _run(out, {"x": x})[1]
    fed = _model(nodes[:2], [_vi("x", [4, 6]), _vi("s", [2], TP.INT64)], [_vi("y", None)])
    got, ops = _run(fed, {"x": x, "s": np.array([3, 8], np.int64)})
    assert "ReshapeTranspose" not in ops and got[0].shape == (8, 3)


def test_kernel_rejects_a_bad_perm_and_a_bad_shape():
    cls = CPU_KERNELS.lookup("ai.actorrt", "ReshapeTranspose", 1)

    def kernel(**attrs):
        node = NodeSpec(name="n", op_type="ReshapeTranspose", domain="ai.actorrt", opset=1,
                        attrs=attrs, inputs=("x",), outputs=("y",))
        return cls(node).compile()

    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with pytest.raises(ValueError, match="not a permutation"):
        kernel(shape=[6, 4], perm=[0, 0], transpose_first=0)(x)
    with pytest.raises(ValueError, match="cannot reshape"):
        kernel(shape=[5, 5], perm=[1, 0], transpose_first=0)(x)
    with pytest.raises(ValueError):
        kernel(shape=[6, 4], perm=[1, 0, 2], transpose_first=0)(x)  # perm of another rank
    y = kernel(shape=[4, 6], perm=[2, 0, 1], transpose_first=1)(x)
    np.testing.assert_array_equal(y, x.transpose(2, 0, 1).reshape(4, 6))
