"""Layout passes (basic level): Transpose pairs, Reshape chains and 2-D
Transposes folded into Gemm. Each fires on its pattern, the optimized plan's
outputs equal onnxruntime's on the unoptimized model (ORT_DISABLE_ALL), and
patterns that must not be rewritten are left alone."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt

RNG = np.random.default_rng(99)


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _vi(name, shape, dt=TP.FLOAT):
    return helper.make_tensor_value_info(name, dt, shape)


def _i64(name, vals):
    return numpy_helper.from_array(np.array(vals, np.int64), name)


def _run(model, feeds, level="ORT_ENABLE_ALL"):
    with actorrt.InferenceSession(model, actorrt.SessionOptions(graph_optimization_level=level)) as s:
        return s.run(None, feeds), [st.node.op_type for st in s.session.plan.steps], \
            list(s.session.plan.fusions)


def _check(model, feeds, *, expect_ops, fired=True):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    for level in ("ORT_ENABLE_BASIC", "ORT_ENABLE_ALL", "ORT_DISABLE_ALL"):
        got, ops, fusions = _run(model, feeds, level)
        if level == "ORT_ENABLE_BASIC":
            assert ops == expect_ops, ops
            assert bool(fusions) == fired
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p1,p2,expect", [
    ((0, 2, 1, 3), (0, 2, 1, 3), []),                    # inverse: heads split and merged back
    ((1, 2, 0), (2, 0, 1), []),                          # (the Identity left is eliminated)
    ((0, 2, 1, 3), (0, 1, 3, 2), ["Transpose"]),         # merged into one
    (None, (1, 0, 2), ["Transpose"]),                    # default reversal, known rank
])
def test_transpose_pairs(p1, p2, expect):
    shape = [2, 3, 5, 7][:len(p2)]
    x = RNG.standard_normal(shape).astype(np.float32)
    a1 = {} if p1 is None else {"perm": list(p1)}
    nodes = [helper.make_node("Transpose", ["x"], ["t"], **a1),
             helper.make_node("Transpose", ["t"], ["u"], perm=list(p2)),
             helper.make_node("Relu", ["u"], ["y"])]
    _check(_model(nodes, [_vi("x", shape)], [_vi("y", None)]), {"x": x},
           expect_ops=expect + ["Relu"])


def test_transpose_read_elsewhere_is_kept():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Transpose", ["t"], ["y"], perm=[0, 2, 1])]
    _check(_model(nodes, [_vi("x", [2, 3, 4])], [_vi("y", None), _vi("t", None)]), {"x": x},
           expect_ops=["Transpose", "Transpose"], fired=False)


@pytest.mark.parametrize("s1,s2,expect_fire", [
    ([6, 35], [2, 3, 35], True),
    ([0, 0, -1], [3, 2, 5, 7], True),        # zeros in the inner shape copy x's dims: fine
    ([-1, 7], [2, -1], True),
    ([6, 35], [0, 5, 7], False),             # a 0 in the outer shape reads the intermediate
])
def test_reshape_chains(s1, s2, expect_fire):
    x = RNG.standard_normal((2, 3, 5, 7)).astype(np.float32)
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r"]),
             helper.make_node("Reshape", ["r", "s2"], ["q"]),
             helper.make_node("Neg", ["q"], ["y"])]
    m = _model(nodes, [_vi("x", [2, 3, 5, 7])], [_vi("y", None)], [_i64("s1", s1), _i64("s2", s2)])
    _check(m, {"x": x}, expect_ops=(["Reshape"] if expect_fire else ["Reshape", "Reshape"]) + ["Neg"],
           fired=expect_fire)


def test_an_invalid_inner_reshape_still_fails():
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r"]),
             helper.make_node("Reshape", ["r", "s2"], ["y"])]
    m = _model(nodes, [_vi("x", [2, 3])], [_vi("y", None)], [_i64("s1", [4, 2]), _i64("s2", [6])])
    with actorrt.InferenceSession(m, actorrt.SessionOptions(graph_optimization_level=1)) as s:
        assert [st.node.op_type for st in s.session.plan.steps] == ["Reshape", "Reshape"]
        with pytest.raises(actorrt.KernelError, match="Reshape"):
            s.run(None, {"x": np.zeros((2, 3), np.float32)})


@pytest.mark.parametrize("ta,tb,const_b", [(1, 0, True), (0, 1, True), (1, 1, False), (0, 0, False)])
def test_transposes_fold_into_gemm(ta, tb, const_b):
    m_, k, n = 5, 7, 3
    a = RNG.standard_normal((m_, k)).astype(np.float32)   # Transpose(a) feeds when ta
    b = RNG.standard_normal((k, n)).astype(np.float32)
    c = RNG.standard_normal(n).astype(np.float32)
    nodes, ins, inits, feeds = [], [_vi("a", [m_, k])], [numpy_helper.from_array(c, "c")], {"a": a}
    # the Gemm's own trans flags are the opposite of the Transposes in front of it
    a_in = "a"
    if ta:
        nodes.append(helper.make_node("Transpose", ["a"], ["at"], perm=[1, 0]))
        a_in = "at"
    b_arr = b.T.copy()  # B' = (k, n) either way
    if const_b:
        inits.append(numpy_helper.from_array(b_arr, "b"))
    else:
        ins.append(_vi("b", list(b_arr.shape)))
        feeds["b"] = b_arr
    b_in = "b"
    if tb:
        nodes.append(helper.make_node("Transpose", ["b"], ["bt"], perm=[1, 0]))
        b_in = "bt"
    nodes.append(helper.make_node("Gemm", [a_in, b_in, "c"], ["y"], transA=ta, transB=int(not tb),
                                  alpha=0.5, beta=1.5))
    # a Transpose of a constant folds at load time: only the others are rewritten
    fired = bool(ta or (tb and not const_b))
    _check(_model(nodes, ins, [_vi("y", None)], inits), feeds, expect_ops=["Gemm"], fired=fired)


def test_matmul_of_a_transposed_2d_operand_becomes_gemm():
    a = RNG.standard_normal((4, 9)).astype(np.float32)
    b = RNG.standard_normal((6, 9)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["b"], ["bt"], perm=[1, 0]),
             helper.make_node("MatMul", ["a", "bt"], ["y"])]
    _check(_model(nodes, [_vi("a", [4, 9]), _vi("b", [6, 9])], [_vi("y", None)]), {"a": a, "b": b},
           expect_ops=["Gemm"])
    # a 3-D MatMul is left alone
    a3 = RNG.standard_normal((2, 4, 9)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["b"], ["bt"], perm=[1, 0]),
             helper.make_node("MatMul", ["a", "bt"], ["y"])]
    _check(_model(nodes, [_vi("a", [2, 4, 9]), _vi("b", [6, 9])], [_vi("y", None)]), {"a": a3, "b": b},
           expect_ops=["Transpose", "MatMul"], fired=False)
