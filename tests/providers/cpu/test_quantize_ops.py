"""QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear against the ONNX
reference evaluator."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from tests.oracle import check_node

RNG = np.random.default_rng(5)

_INT_TYPES = [np.uint8, np.int8, np.uint16, np.int16, ml_dtypes.uint4, ml_dtypes.int4,
              ml_dtypes.uint2, ml_dtypes.int2]
_FLOAT8 = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
           ml_dtypes.float8_e5m2fnuz]


@pytest.mark.parametrize("qtype", _INT_TYPES)
def test_quantize_per_tensor_int(qtype):
    x = np.concatenate([RNG.uniform(-40, 40, 30), [0.5, 1.5, 2.5, -0.5, -2.5, 1e9, -1e9]])
    x = x.astype(np.float32)
    zp = np.array(1, qtype)
    check_node("QuantizeLinear", {"x": x, "s": np.array(0.5, np.float32), "zp": zp},
               opset=25)


@pytest.mark.parametrize("qtype", _FLOAT8)
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8(qtype, saturate):
    x = np.array([0.0, 1.0, -3.3, 100.0, 1e6, -1e6, 0.0137], dtype=np.float32)
    check_node("QuantizeLinear", {"x": x, "s": np.array(2.0, np.float32),
                                  "zp": np.zeros((), qtype)}, opset=21, saturate=saturate)


def test_quantize_float4():
    x = np.array([0.0, 0.3, -1.2, 2.6, 5.0, 100.0, -100.0], dtype=np.float32)
    check_node("QuantizeLinear", {"x": x, "s": np.array(1.0, np.float32)}, opset=23,
               output_dtype=TensorProto.FLOAT4E2M1)


def test_quantize_default_uint8_and_output_dtype():
    x = RNG.uniform(-5, 300, (3, 4)).astype(np.float32)
    check_node("QuantizeLinear", {"x": x, "s": np.array(1.3, np.float32)}, opset=13)
    check_node("QuantizeLinear", {"x": x, "s": np.array(1.3, np.float32)}, opset=21,
               output_dtype=TensorProto.INT16)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_axis(axis):
    x = RNG.uniform(-10, 10, (2, 3, 4)).astype(np.float32)
    n = x.shape[axis]
    check_node("QuantizeLinear", {"x": x, "s": RNG.uniform(0.1, 1, n).astype(np.float32),
                                  "zp": RNG.integers(-3, 3, n).astype(np.int8)},
               opset=13, axis=axis)


@pytest.mark.parametrize("block_size, dim", [(2, 6), (4, 6)])
def test_quantize_blocked(block_size, dim):
    x = RNG.uniform(-10, 10, (3, dim)).astype(np.float32)
    nb = -(-dim // block_size)
    check_node("QuantizeLinear", {"x": x, "s": RNG.uniform(0.1, 1, (3, nb)).astype(np.float32),
                                  "zp": RNG.integers(0, 9, (3, nb)).astype(np.uint8)},
               opset=21, axis=1, block_size=block_size)


def test_quantize_float16_input_and_scale():
    x = RNG.uniform(-10, 10, (4, 5)).astype(np.float16)
    check_node("QuantizeLinear", {"x": x, "s": np.array(0.25, np.float16),
                                  "zp": np.array(3, np.int8)}, opset=19)


@pytest.mark.parametrize("qtype", _INT_TYPES + [np.int32])
def test_dequantize_per_tensor(qtype):
    info = ml_dtypes.iinfo(qtype)
    x = RNG.integers(max(info.min, -1000), min(info.max, 1000), 20, endpoint=True).astype(qtype)
    inputs = {"x": x, "s": np.array(0.7, np.float32)}
    if qtype != np.int32:
        inputs["zp"] = np.array(min(1, info.max), qtype)
    check_node("DequantizeLinear", inputs, opset=25)


@pytest.mark.parametrize("qtype", _FLOAT8 + [ml_dtypes.float4_e2m1fn])
def test_dequantize_floats(qtype):
    x = np.array([0.0, 0.5, -1.5, 3.0, 6.0], dtype=np.float32).astype(qtype)
    check_node("DequantizeLinear", {"x": x, "s": np.array(2.0, np.float32)}, opset=23)


def test_dequantize_per_axis_and_float16_scale():
    x = RNG.integers(0, 255, (2, 3, 4)).astype(np.uint8)
    check_node("DequantizeLinear", {"x": x, "s": RNG.uniform(0.1, 1, 3).astype(np.float16),
                                    "zp": RNG.integers(0, 9, 3).astype(np.uint8)}, opset=21,
               axis=1)


def test_dequantize_blocked_output_dtype():
    x = RNG.integers(-8, 8, (5, 4)).astype(ml_dtypes.int4)
    check_node("DequantizeLinear", {"x": x, "s": RNG.uniform(0.1, 1, (3, 4)).astype(np.float32),
                                    "zp": RNG.integers(-2, 2, (3, 4)).astype(ml_dtypes.int4)},
               opset=23, axis=0, block_size=2, output_dtype=TensorProto.FLOAT16)


@pytest.mark.parametrize("lo, hi", [(-3, 5), (0.5, 4), (-4, -1), (0, 0)])
def test_dynamic_quantize_linear(lo, hi):
    x = RNG.uniform(lo, hi, (3, 7)).astype(np.float32)
    check_node("DynamicQuantizeLinear", {"x": x}, ("y", "scale", "zp"), opset=11)
