"""MatMul, Gemm, MatMulInteger, QLinearMatMul, Einsum and Det against the ONNX
reference evaluator (onnxruntime where noted)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.oracle import check_model, check_node

RNG = np.random.default_rng(4)


def _f(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("sa, sb", [
    ((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((5, 2, 3), (3, 4)),
    ((1, 2, 3), (4, 3, 5)), ((2, 1, 2, 3), (3, 3, 2)), ((0, 3), (3, 4)),
])
def test_matmul_shapes(sa, sb):
    check_node("MatMul", {"a": _f(*sa), "b": _f(*sb)}, opset=13)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, ml_dtypes.bfloat16])
def test_matmul_dtypes(dtype):
    a = RNG.integers(-3, 3, (4, 5)).astype(dtype)
    b = RNG.integers(-3, 3, (5, 2)).astype(dtype)
    check_node("MatMul", {"a": a, "b": b}, opset=13)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (4,), (3, 1), (3, 4)])
def test_gemm_inputs(trans_a, trans_b, c_shape):
    a = _f(5, 3) if trans_a else _f(3, 5)
    b = _f(4, 5) if trans_b else _f(5, 4)
    inputs = {"a": a, "b": b, "c": None if c_shape is None else _f(*c_shape)}
    check_node("Gemm", inputs, opset=13, transA=trans_a, transB=trans_b, alpha=0.5, beta=2.0)


def test_gemm_opset6_broadcast():
    check_node("Gemm", {"a": _f(3, 5), "b": _f(5, 4), "c": _f(4)}, opset=6, broadcast=1)


def test_gemm_float16():
    check_node("Gemm", {"a": _f(3, 8, dtype=np.float16), "b": _f(8, 4, dtype=np.float16),
                        "c": _f(4, dtype=np.float16)}, opset=13, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("beta", [1.0, 0.25])
def test_gemm_constant_weights_prepacked(trans_b, beta):
    a = _f(6, 5)
    w = _f(4, 5) if trans_b else _f(5, 4)
    bias = _f(4)
    node = helper.make_node("Gemm", ["a", "w", "bias"], ["y"], transB=trans_b, alpha=1.5,
                            beta=beta)
    graph = helper.make_graph(
        [node], "gemm_const",
        [helper.make_tensor_value_info("a", 1, ["n", 5])],
        [helper.make_tensor_value_info("y", 1, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    check_model(model, {"a": a})
    check_model(model, {"a": _f(2, 5)})  # same prepacked weights, another batch


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("zp", ["none", "scalar", "vector"])
def test_matmul_integer(dtype, zp):
    lo, hi = (0, 255) if dtype == np.uint8 else (-128, 127)
    a = RNG.integers(lo, hi, (3, 7)).astype(dtype)
    b = RNG.integers(lo, hi, (7, 4)).astype(dtype)
    inputs = {"a": a, "b": b}
    if zp == "scalar":
        inputs["az"] = np.array(3, dtype)
        inputs["bz"] = np.array(5, dtype)
    elif zp == "vector":
        # per-column b zero point; neither peer implements a per-row a_zero_point
        inputs["az"] = np.array(2, dtype)
        inputs["bz"] = RNG.integers(0, 9, 4).astype(dtype)
    check_node("MatMulInteger", inputs, opset=10)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("scale_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_qlinear_matmul(dtype, scale_dtype, batch):
    lo, hi = (0, 255) if dtype == np.uint8 else (-128, 127)
    a = RNG.integers(lo, hi, batch + (3, 6)).astype(dtype)
    b = RNG.integers(lo, hi, batch + (6, 5)).astype(dtype)
    sc = lambda v: np.array(v, scale_dtype)  # noqa: E731
    inputs = {"a": a, "as": sc(0.02), "az": np.array(7, dtype), "b": b, "bs": sc(0.03),
              "bz": np.array(3, dtype), "ys": sc(0.5), "yz": np.array(9, dtype)}
    check_node("QLinearMatMul", inputs, opset=21)


@pytest.mark.parametrize("eq, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]),
    ("...ii->...i", [(2, 3, 3)]),
    ("ij->ji", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("ij", [(3, 4)]),
    ("ij -> i", [(3, 4)]),
    ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 2)]),
])
def test_einsum(eq, shapes):
    inputs = {f"x{i}": _f(*s) for i, s in enumerate(shapes)}
    check_node("Einsum", inputs, opset=12, equation=eq)


def test_einsum_bfloat16():
    inputs = {"a": _f(3, 4, dtype=ml_dtypes.bfloat16), "b": _f(4, 2, dtype=ml_dtypes.bfloat16)}
    check_node("Einsum", inputs, opset=28, equation="ij,jk->ik", rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4)])
def test_det(shape):
    check_node("Det", {"x": _f(*shape)}, opset=22)
