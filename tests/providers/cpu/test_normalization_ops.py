"""Normalizations and Dropout against the ONNX reference evaluator or
onnxruntime (where the reference evaluator deviates from the spec)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.oracle import check_node, make_node_model, run_actorrt

RNG = np.random.default_rng(2)


def _bn_inputs(shape, dtype=np.float32):
    c = shape[1]
    return {
        "x": RNG.standard_normal(shape).astype(dtype),
        "s": RNG.uniform(0.5, 1.5, c).astype(dtype),
        "bias": RNG.standard_normal(c).astype(dtype),
        "mean": RNG.standard_normal(c).astype(dtype),
        "var": RNG.uniform(0.5, 1.5, c).astype(dtype),
    }


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4, 5)])
def test_batchnorm_inference(opset, shape):
    # the reference evaluator runs training statistics for opsets 7 and 9
    check_node("BatchNormalization", _bn_inputs(shape), opset=opset, epsilon=1e-3,
               peer="ort" if opset < 14 else "reference")


def test_batchnorm_inference_float16():
    check_node("BatchNormalization", _bn_inputs((2, 3, 4), np.float16), opset=15, rtol=2e-3,
               atol=2e-3)


def test_batchnorm_training_mode():
    check_node("BatchNormalization", _bn_inputs((3, 4, 2, 2)), ("y", "rm", "rv"), opset=15,
               training_mode=1, momentum=0.7)


def test_instance_norm():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    check_node("InstanceNormalization", {"x": x, "s": RNG.standard_normal(3).astype(np.float32),
                                         "b": RNG.standard_normal(3).astype(np.float32)},
               opset=22, epsilon=1e-2)


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_layer_norm_all_outputs(axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    norm_shape = x.shape[axis % 3:]
    check_node("LayerNormalization",
               {"x": x, "w": RNG.standard_normal(norm_shape).astype(np.float32),
                "b": RNG.standard_normal(norm_shape).astype(np.float32)},
               ("y", "mean", "inv"), opset=17, axis=axis)


def test_layer_norm_no_bias_one_output():
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    check_node("LayerNormalization", {"x": x, "w": RNG.standard_normal(8).astype(np.float32)},
               opset=17, epsilon=1e-3)


def test_group_norm_opset18_per_group_scale():
    x = RNG.standard_normal((2, 6, 3, 3)).astype(np.float32)
    check_node("GroupNormalization", {"x": x, "s": RNG.standard_normal(3).astype(np.float32),
                                      "b": RNG.standard_normal(3).astype(np.float32)},
               opset=18, num_groups=3)


def test_group_norm_opset21_per_channel_scale():
    x = RNG.standard_normal((2, 6, 3, 3)).astype(np.float32)
    check_node("GroupNormalization", {"x": x, "s": RNG.standard_normal(6).astype(np.float32),
                                      "b": RNG.standard_normal(6).astype(np.float32)},
               opset=21, num_groups=2, epsilon=1e-3)


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_norm(axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    check_node("RMSNormalization",
               {"x": x, "s": RNG.standard_normal(x.shape[axis % 3:]).astype(np.float32)},
               opset=23, axis=axis)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, -1])
def test_lp_normalization(p, axis):
    # the reference evaluator omits abs() for p=1; onnxruntime follows the spec
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    x[1] = 0.0
    check_node("LpNormalization", {"x": x}, opset=13, peer="ort", p=p, axis=axis)


@pytest.mark.parametrize("axes", [None, [1], [0, 1, 2, 3]])
def test_mean_variance_normalization(axes):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    attrs = {} if axes is None else {"axes": axes}
    check_node("MeanVarianceNormalization", {"x": x}, opset=13, **attrs)


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn(size):
    # the reference evaluator loops over the batch dim, not channels; use onnxruntime
    x = RNG.standard_normal((2, 7, 3, 3)).astype(np.float32)
    check_node("LRN", {"x": x}, opset=13, peer="ort", size=size, alpha=1e-2, beta=0.6, bias=2.0)


@pytest.mark.parametrize("opset", [10, 13, 22])
def test_dropout_inference_mask(opset):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    check_node("Dropout", {"x": x}, ("y", "mask"), opset=opset)


def test_dropout_opset7_mask_has_data_dtype():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    check_node("Dropout", {"x": x}, opset=7)
    y, mask = run_actorrt(make_node_model("Dropout", {"x": x}, ("y", "mask"), opset=7), {"x": x})
    assert mask.dtype == np.float32 and (mask == 1).all()  # mask is T before opset 10


def test_dropout_training_zero_ratio():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    check_node("Dropout", {"x": x, "r": np.array(0.0, np.float32), "t": np.array(True)},
               ("y", "mask"), opset=13)


def test_dropout_training_seeded_matches_reference():
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    check_node("Dropout", {"x": x, "r": np.array(0.3, np.float32), "t": np.array(True)},
               ("y", "mask"), opset=13, seed=7)


def test_dropout_training_unseeded_scales_kept_values():
    x = RNG.uniform(1, 2, (50, 50)).astype(np.float32)
    feeds = {"x": x, "r": np.array(0.25, np.float32), "t": np.array(True)}
    y, mask = run_actorrt(make_node_model("Dropout", feeds, ("y", "mask"), opset=13), feeds)
    assert mask.dtype == np.bool_ and 0 < mask.mean() < 1
    np.testing.assert_allclose(y[mask], x[mask] / 0.75, rtol=1e-6)
    assert (y[~mask] == 0).all()


def test_batchnorm_constant_parameters_folded():
    from onnx import helper, numpy_helper

    from tests.oracle import check_model

    p = _bn_inputs((2, 3, 4, 4))
    node = helper.make_node("BatchNormalization", ["x", "s", "bias", "mean", "var"], ["y"])
    graph = helper.make_graph(
        [node], "bn_const", [helper.make_tensor_value_info("x", 1, ["n", 3, 4, 4])],
        [helper.make_tensor_value_info("y", 1, None)],
        [numpy_helper.from_array(p[k], k) for k in ("s", "bias", "mean", "var")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    check_model(model, {"x": p["x"]})
    check_model(model, {"x": p["x"][:1]})
