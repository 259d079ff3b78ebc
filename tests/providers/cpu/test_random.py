"""Random generators: values are implementation-defined, so these tests check
shape, dtype, determinism under a seed and the distribution's statistics."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.oracle import make_node_model, run_actorrt


def _run_gen(op, opset=22, **attrs):
    node = helper.make_node(op, [], ["y"], **attrs)
    g = helper.make_graph([node], "g", [], [helper.make_empty_tensor_value_info("y")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return run_actorrt(m, {})[0]


@pytest.mark.parametrize("dtype,np_dtype", [(TensorProto.FLOAT, np.float32),
                                            (TensorProto.DOUBLE, np.float64),
                                            (TensorProto.FLOAT16, np.float16),
                                            (TensorProto.BFLOAT16, ml_dtypes.bfloat16)])
def test_random_normal_stats(dtype, np_dtype):
    y = _run_gen("RandomNormal", shape=[200, 100], mean=2.0, scale=3.0, dtype=dtype, seed=1.0)
    assert y.shape == (200, 100) and y.dtype == np_dtype
    y = y.astype(np.float64)
    assert abs(y.mean() - 2.0) < 0.1 and abs(y.std() - 3.0) < 0.1


def test_random_uniform_stats_and_range():
    y = _run_gen("RandomUniform", shape=[20000], low=-1.0, high=3.0, seed=3.0)
    assert y.dtype == np.float32 and y.shape == (20000,)
    assert y.min() >= -1.0 and y.max() < 3.0
    assert abs(y.mean() - 1.0) < 0.05


def test_seed_makes_runs_repeat_and_unseeded_differ():
    a = _run_gen("RandomUniform", shape=[64], seed=7.0)
    b = _run_gen("RandomUniform", shape=[64], seed=7.0)
    c = _run_gen("RandomUniform", shape=[64], seed=8.0)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    u1 = _run_gen("RandomUniform", shape=[64])
    u2 = _run_gen("RandomUniform", shape=[64])
    assert not np.array_equal(u1, u2)


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
@pytest.mark.parametrize("opset", [1, 22])
def test_like_ops_take_shape_and_dtype(op, opset):
    x = np.zeros((3, 4, 5), np.float64)
    y = run_actorrt(make_node_model(op, {"x": x}, ["y"], opset=opset, seed=0.0), {"x": x})[0]
    assert y.shape == (3, 4, 5) and y.dtype == np.float64
    y2 = run_actorrt(make_node_model(op, {"x": x}, ["y"], opset=opset, dtype=TensorProto.FLOAT),
                     {"x": x})[0]
    assert y2.dtype == np.float32


@pytest.mark.parametrize("dtype,np_dtype", [(None, np.float32), (TensorProto.INT32, np.int32),
                                            (TensorProto.BOOL, np.bool_)])
def test_bernoulli(dtype, np_dtype):
    p = np.tile(np.array([0.0, 1.0, 0.3], np.float32), 4000).reshape(-1, 3)
    attrs = {"seed": 5.0} if dtype is None else {"dtype": dtype}
    y = run_actorrt(make_node_model("Bernoulli", {"p": p}, ["y"], opset=22, **attrs),
                    {"p": p})[0]
    assert y.shape == p.shape and y.dtype == np_dtype
    y = y.astype(np.float64)
    assert (y[:, 0] == 0).all() and (y[:, 1] == 1).all()
    assert abs(y[:, 2].mean() - 0.3) < 0.03


@pytest.mark.parametrize("dtype,np_dtype", [(None, np.int32), (TensorProto.INT64, np.int64)])
def test_multinomial(dtype, np_dtype):
    probs = np.array([[0.1, 0.6, 0.3], [1.0, 0.0, 0.0]], np.float32)
    logits = np.log(np.maximum(probs, 1e-30)).astype(np.float32)
    attrs = {"sample_size": 20000, "seed": 2.0}
    if dtype is not None:
        attrs["dtype"] = dtype
    y = run_actorrt(make_node_model("Multinomial", {"x": logits}, ["y"], opset=7, **attrs),
                    {"x": logits})[0]
    assert y.shape == (2, 20000) and y.dtype == np_dtype
    freq = np.stack([np.bincount(r, minlength=3) / r.size for r in y])
    np.testing.assert_allclose(freq[0], probs[0], atol=0.02)
    assert (y[1] == 0).all()


def test_random_ops_are_not_folded():
    """RandomUniformLike of a constant still draws afresh each run."""
    node_c = helper.make_node("Constant", [], ["c"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [16], [0] * 16))
    node = helper.make_node("RandomUniformLike", ["c"], ["y"])
    g = helper.make_graph([node_c, node], "g", [], [helper.make_empty_tensor_value_info("y")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    import actorrt
    with actorrt.InferenceSession(m) as sess:
        a = sess.run(None, {})[0]
        b = sess.run(None, {})[0]
    assert a.shape == (16,) and not np.array_equal(a, b)
