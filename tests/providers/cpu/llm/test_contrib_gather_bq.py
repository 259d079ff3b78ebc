"""com.microsoft GatherBlockQuantized against onnxruntime."""

import ml_dtypes
import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.oracle import assert_close, run_actorrt, run_onnxruntime


def check(data, indices, scales, zp=None, **attrs):
    names = ["data", "indices", "scales"] + (["zp"] if zp is not None else [])
    node = helper.make_node("GatherBlockQuantized", names, ["y"], domain="com.microsoft", **attrs)
    inits = [numpy_helper.from_array(data, "data"), numpy_helper.from_array(scales, "scales")]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zp"))
    ins = [helper.make_tensor_value_info("indices", helper.np_dtype_to_tensor_dtype(indices.dtype),
                                         indices.shape)]
    g = helper.make_graph([node], "gbq", ins, [helper.make_empty_tensor_value_info("y")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("com.microsoft", 1)])
    feeds = {"indices": indices}
    assert_close(run_actorrt(m, feeds), run_onnxruntime(m, feeds), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("with_zp", [False, True])
def test_uint8_embedding(bits, with_zp):
    rng = np.random.default_rng(bits)
    vocab, hidden, bs = 20, 64, 16
    per = 8 // bits
    data = rng.integers(0, 256, (vocab, hidden // per), dtype=np.uint8)
    scales = rng.random((vocab, hidden // bs)).astype(np.float32)
    zp = rng.integers(0, 256, (vocab, -(-(hidden // bs) // per)), dtype=np.uint8) if with_zp else None
    idx = np.array([[0, 5, 19], [3, 3, -1]], np.int64)
    check(data, idx, scales, zp, bits=bits, block_size=bs, gather_axis=0, quantize_axis=1)


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
@pytest.mark.parametrize("axes", [(0, 1), (1, 0), (0, 0)])
def test_int4(dtype, axes):
    rng = np.random.default_rng(7)
    ga, qa = axes
    shape = (16, 32)
    lo, hi = (-8, 8) if dtype == ml_dtypes.int4 else (0, 16)
    data = rng.integers(lo, hi, shape).astype(dtype)
    sshape = list(shape)
    sshape[qa] = shape[qa] // 16
    scales = rng.random(sshape).astype(np.float32)
    zp = rng.integers(lo, hi, sshape).astype(dtype)
    idx = np.array([1, 0, 7, 15], np.int32)
    check(data, idx, scales, zp, block_size=16, gather_axis=ga, quantize_axis=qa)
    check(data, idx, scales, None, block_size=16, gather_axis=ga, quantize_axis=qa)


def test_float16_scales_and_out_of_range():
    rng = np.random.default_rng(9)
    data = rng.integers(0, 256, (10, 16), dtype=np.uint8)
    scales = rng.random((10, 2)).astype(np.float16)
    check(data, np.array([0, 9, 12, -11], np.int64), scales, bits=4, block_size=16)


@pytest.mark.parametrize("scale_rows", [10, 1])
def test_float8(scale_rows):
    rng = np.random.default_rng(11)
    data = rng.standard_normal((10, 32)).astype(ml_dtypes.float8_e4m3fn)
    scales = rng.random((scale_rows, 2)).astype(np.float32)
    check(data, np.array([[2, 9], [0, 4]], np.int64), scales, block_size=16)
