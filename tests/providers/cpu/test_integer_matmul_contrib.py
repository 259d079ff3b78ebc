"""com.microsoft MatMulIntegerToFloat and DynamicQuantizeMatMul against
onnxruntime's own kernels (int8 / uint8, scales and zero points per tensor
or per column, bias or none, batched A), and models that
``onnxruntime.quantization.quantize_dynamic`` made and onnxruntime's
optimizer saved (which write both ops) against onnxruntime running them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from tests.oracle import run_actorrt, run_onnxruntime_unoptimized

RNG = np.random.default_rng(8)
_NP2TP = {np.dtype(np.int8): TP.INT8, np.dtype(np.uint8): TP.UINT8,
          np.dtype(np.float32): TP.FLOAT}


def _model(op, names, feeds, inits):
    vis = [helper.make_tensor_value_info(n, _NP2TP[feeds[n].dtype], list(feeds[n].shape))
           for n in names if n in feeds]
    node = helper.make_node(op, names, ["y"], domain="com.microsoft")
    g = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()


def _ort(model, feeds):
    return run_onnxruntime_unoptimized(model, feeds)[0]


def _ours(model, feeds):
    return run_actorrt(model, feeds)[0]


def _b(dt, k, n):
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max + 1, (k, n)).astype(dt)


@pytest.mark.parametrize("b_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column,zero_points,bias", [(False, False, False),
                                                         (True, True, True),
                                                         (False, True, True),
                                                         (True, False, False)])
def test_dynamic_quantize_matmul_equals_onnxruntime(b_dtype, per_column, zero_points, bias):
    k, n = 37, 19
    a = (RNG.standard_normal((2, 5, k)) * 3).astype(np.float32)
    inits = {"B": _b(b_dtype, k, n),
             "bs": (RNG.random(n if per_column else ()) * 0.02 + 0.001).astype(np.float32)}
    names = ["A", "B", "bs", "", ""]
    if zero_points:
        inits["bz"] = _b(b_dtype, 1, n)[0] if per_column else np.array(3, b_dtype)
        names[3] = "bz"
    if bias:
        inits["bias"] = RNG.standard_normal(n).astype(np.float32)
        names[4] = "bias"
    while not names[-1]:
        names.pop()
    model = _model("DynamicQuantizeMatMul", names, {"A": a}, inits)
    np.testing.assert_allclose(_ours(model, {"A": a}), _ort(model, {"A": a}), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("a_dtype,b_dtype", [(np.uint8, np.int8), (np.int8, np.int8),
                                             (np.uint8, np.uint8)])
@pytest.mark.parametrize("per_column", [False, True])
def test_matmul_integer_to_float_equals_onnxruntime(a_dtype, b_dtype, per_column):
    m, k, n = 7, 33, 12
    a = _b(a_dtype, m, k)
    inits = {"B": _b(b_dtype, k, n), "as": np.array(0.013, np.float32),
             "bs": (RNG.random(n if per_column else ()) * 0.02 + 0.001).astype(np.float32),
             "az": np.array(5, a_dtype),
             "bz": _b(b_dtype, 1, n)[0] if per_column else np.array(2, b_dtype),
             "bias": RNG.standard_normal(n).astype(np.float32)}
    model = _model("MatMulIntegerToFloat", ["A", "B", "as", "bs", "az", "bz", "bias"],
                   {"A": a}, inits)
    np.testing.assert_allclose(_ours(model, {"A": a}), _ort(model, {"A": a}), rtol=1e-5,
                               atol=1e-4)


sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))


@pytest.mark.parametrize("name", ["mlp", "encoder"])
def test_quantize_dynamic_models_onnxruntime_saved_equal_onnxruntime(name, tmp_path):
    import bench_models
    from onnxruntime.quantization import QuantType, quantize_dynamic
    model, feeds = bench_models.build(name)[:2]
    onnx.save(model, str(tmp_path / "f.onnx"))
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"),
                     weight_type=QuantType.QInt8)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "saved.onnx")
    ort.InferenceSession(str(tmp_path / "q.onnx"), so, providers=["CPUExecutionProvider"])
    ops = {n.op_type for n in onnx.load(str(tmp_path / "saved.onnx")).graph.node}
    assert "DynamicQuantizeMatMul" in ops  # the case at hand
    path = str(tmp_path / "saved.onnx")
    want = _ort(path, feeds)
    got = _ours(path, feeds)
    # the encoder's dynamic quantization magnifies float noise (a value at a
    # rounding boundary moves one step): compare relative to the output's range
    tol = 1e-5 if name == "mlp" else 5e-2
    assert float(np.abs(got - want).max()) <= tol * float(np.abs(want).max())
