"""Pooling kernels against the ONNX reference evaluator and onnxruntime."""

import numpy as np
import pytest

from tests.oracle import check_node

RNG = np.random.default_rng(1)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


POOL_CASES = [
    ((1, 2, 7, 7), {"kernel_shape": [3, 3]}),
    ((2, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 1, 8, 8), {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1],
                    "ceil_mode": 1}),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 8, 8), {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 9), {"kernel_shape": [3], "strides": [2]}),
    ((1, 1, 5, 6, 4), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2]}),
]


@pytest.mark.parametrize("shape,attrs", POOL_CASES)
def test_maxpool_with_indices_matches_ort(shape, attrs):
    check_node("MaxPool", {"x": rand(*shape)}, ("y", "i"), opset=12, peer="ort", **attrs)


@pytest.mark.parametrize("shape,attrs", POOL_CASES[:4])
def test_maxpool_column_major_indices_match_ort(shape, attrs):
    check_node("MaxPool", {"x": rand(*shape)}, ("y", "i"), opset=12, peer="ort",
               storage_order=1, **attrs)


def test_maxpool_int8_and_float16():
    x8 = RNG.integers(-128, 127, (1, 2, 6, 6), dtype=np.int8)
    check_node("MaxPool", {"x": x8}, opset=12, peer="ort", kernel_shape=[2, 2],
               pads=[1, 1, 1, 1])
    check_node("MaxPool", {"x": rand(1, 2, 6, 6, dtype=np.float16)}, opset=12, peer="ort",
               kernel_shape=[3, 3], strides=[2, 2])


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("shape,attrs", POOL_CASES)
def test_averagepool_matches_ort(shape, attrs, count_include_pad):
    check_node("AveragePool", {"x": rand(*shape)}, opset=19, peer="ort",
               count_include_pad=count_include_pad, **attrs)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("shape,attrs", [POOL_CASES[0], POOL_CASES[1], POOL_CASES[4]])
def test_lppool_matches_ort(shape, attrs, p):
    check_node("LpPool", {"x": rand(*shape)}, opset=18, peer="ort", p=p, **attrs)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 4, 5), (1, 2, 3, 2, 4)])
def test_global_pools_match_ort(op, shape):
    check_node(op, {"x": rand(*shape)}, opset=21, peer="ort")


def test_global_average_pool_float16():
    check_node("GlobalAveragePool", {"x": rand(1, 3, 8, 8, dtype=np.float16)}, opset=22,
               rtol=1e-3, atol=1e-3)


def test_maxunpool_inverts_maxpool_indices():
    x = rand(1, 2, 4, 4)
    vals = np.array([[[[1, 2], [3, 4]], [[5, 6], [7, 8]]]], np.float32)
    idx = np.array([[[[0, 3], [9, 14]], [[17, 18], [27, 30]]]], np.int64)
    assert x.shape == (1, 2, 4, 4)
    check_node("MaxUnpool", {"x": vals, "i": idx}, opset=11, peer="ort",
               kernel_shape=[2, 2], strides=[2, 2])
    check_node("MaxUnpool", {"x": vals, "i": idx, "shape": np.array([1, 2, 5, 5], np.int64)},
               opset=11, kernel_shape=[2, 2], strides=[2, 2])


def test_maxroipool_matches_ort():
    x = rand(2, 3, 8, 9)
    rois = np.array([[0, 1, 1, 6, 5], [1, 0, 0, 8, 7], [0, 2.4, 3.6, 2.6, 3.2],
                     [1, 3, 2, 20, 20]], np.float32)
    check_node("MaxRoiPool", {"x": x, "rois": rois}, opset=1, peer="ort", pooled_shape=[3, 2])
    check_node("MaxRoiPool", {"x": x, "rois": rois}, opset=1, peer="ort", pooled_shape=[2, 2],
               spatial_scale=0.5)


ROIS = np.array([[0, 0, 7, 7], [1.2, 0.5, 5.5, 6.3], [-2, -1, 3, 2], [4, 3, 11, 9],
                 [2, 2, 2.2, 2.3]], np.float32)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roialign_matches_reference(mode, ctm, sampling_ratio):
    x = rand(2, 3, 8, 10)
    check_node("RoiAlign", {"x": x, "rois": ROIS, "bi": np.array([0, 1, 0, 1, 1], np.int64)},
               opset=16, mode=mode, coordinate_transformation_mode=ctm,
               sampling_ratio=sampling_ratio, output_height=3, output_width=2,
               spatial_scale=0.9)


def test_roialign_opset10_is_output_half_pixel_like_ort():
    x = rand(1, 2, 6, 6)
    check_node("RoiAlign", {"x": x, "rois": ROIS[:3], "bi": np.zeros(3, np.int64)}, opset=10,
               peer="ort", output_height=2, output_width=3)
