"""MatMul / Gemm / MatMulEpilogue with a 2-D weight run as one 2-D BLAS
product (a GEMV for one row, ``matmul.matmul_rows``): outputs equal
onnxruntime's over ranks 2-4, one row and many, odd sizes, non-contiguous
inputs (a Transpose ahead), transposed Gemm operands."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu.matmul import matmul_rows

RNG = np.random.default_rng(77)


def _run_both(nodes, inputs, feeds, inits, n_out=1):
    outs = [helper.make_tensor_value_info("y", TP.FLOAT, None)]
    g = helper.make_graph(nodes, "t", inputs, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with actorrt.InferenceSession(m) as s:
        got = s.run(None, feeds)[0]
        ops = [st.node.op_type for st in s.session.plan.steps]
    return got, want, ops


@pytest.mark.parametrize("lead,k,n", [((1,), 256, 768), ((1, 1), 37, 5), ((1, 1, 1), 1, 9),
                                      ((7,), 33, 17), ((2, 3), 64, 129), ((3, 1), 5, 1),
                                      ((1, 4), 300, 3)])
def test_matmul_2d_weight_equals_onnxruntime(lead, k, n):
    x = RNG.standard_normal(lead + (k,)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    got, want, _ = _run_both([helper.make_node("MatMul", ["x", "w"], ["y"])],
                             [helper.make_tensor_value_info("x", TP.FLOAT, list(x.shape))],
                             {"x": x}, [numpy_helper.from_array(w, "w")])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,perm", [((1, 5, 1, 7), (0, 2, 1, 3)), ((3, 4, 9), (1, 0, 2)),
                                        ((2, 1, 11), (1, 0, 2))])
def test_matmul_of_a_transposed_input_with_bias_and_gelu(shape, perm):
    x = RNG.standard_normal(shape).astype(np.float32)
    k = shape[perm[-1]]
    w = RNG.standard_normal((k, 13)).astype(np.float32)
    b = RNG.standard_normal(13).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=list(perm)),
             helper.make_node("MatMul", ["t", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    got, want, ops = _run_both(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                               {"x": x}, [numpy_helper.from_array(w, "w"),
                                          numpy_helper.from_array(b, "b")])
    assert "MatMulEpilogue" in ops
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,k,n,ta,tb", [(1, 31, 7, 0, 0), (1, 31, 7, 1, 1), (1, 256, 1024, 0, 1),
                                         (5, 3, 2, 1, 0), (1, 1, 1, 0, 0)])
def test_gemm_one_row_and_transposes_equal_onnxruntime(m, k, n, ta, tb):
    a = RNG.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    w = RNG.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c = RNG.standard_normal(n).astype(np.float32)
    got, want, _ = _run_both([helper.make_node("Gemm", ["a", "w", "c"], ["y"], transA=ta, transB=tb,
                                               alpha=0.5, beta=2.0)],
                             [helper.make_tensor_value_info("a", TP.FLOAT, list(a.shape))],
                             {"a": a}, [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_matmul_rows_against_numpy_for_every_path():
    for a_shape, b_shape in [((1, 1, 6), (6, 4)), ((2, 3, 6), (6, 4)), ((3, 6), (6, 4)),
                             ((0, 6), (6, 4)), ((2, 0, 6), (6, 3)), ((1, 0), (0, 5)),
                             ((2, 3, 6), (2, 6, 4)), ((4, 6), (6,))]:
        for dt in (np.float32, np.float64):
            a = RNG.standard_normal(a_shape).astype(dt)
            b = RNG.standard_normal(b_shape).astype(dt)
            want = np.matmul(a, b)
            got = matmul_rows(a, b)
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    a = RNG.standard_normal((3, 6, 4)).astype(np.float32).transpose(1, 0, 2)  # not contiguous
    b = RNG.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(matmul_rows(a, b), np.matmul(a, b), rtol=1e-6, atol=1e-6)
