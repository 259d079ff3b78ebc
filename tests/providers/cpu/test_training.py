"""ai.onnx.preview.training optimizers against the ONNX reference evaluator."""

import numpy as np
import pytest
from onnx import helper

from tests.oracle import assert_close, check_model, run_actorrt, run_reference

TRAINING = "ai.onnx.preview.training"


def _model(op, feeds, n_out, **attrs):
    names = list(feeds)
    node = helper.make_node(op, names, [f"o{i}" for i in range(n_out)], domain=TRAINING,
                            **attrs)
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in feeds.items()]
    outs = [helper.make_empty_tensor_value_info(f"o{i}") for i in range(n_out)]
    g = helper.make_graph([node], op, vis, outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                               helper.make_opsetid(TRAINING, 1)])


def _feeds(n_tensors, groups, t, dtype=np.float32):
    rng = np.random.default_rng(n_tensors * 10 + groups)
    feeds = {"r": np.array(0.1, np.float32), "t": np.array(t, np.int64)}
    shapes = [(3,), (2, 2)][:n_tensors]
    for g in range(groups):
        for i, s in enumerate(shapes):
            v = rng.standard_normal(s).astype(dtype)
            feeds[f"g{g}_{i}"] = np.abs(v) if g >= 2 else v  # H (squared sums) stays >= 0
    return feeds


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 3])
def test_adagrad(n, t):
    feeds = _feeds(n, 3, t)
    check_model(_model("Adagrad", feeds, 2 * n, decay_factor=0.1, epsilon=1e-6,
                       norm_coefficient=0.01), feeds)


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 2])
def test_adam(n, t):
    feeds = _feeds(n, 4, t)
    feeds = {k: (np.abs(v) if k.startswith("g3") else v) for k, v in feeds.items()}
    m = _model("Adam", feeds, 3 * n, alpha=0.8, beta=0.95, epsilon=1e-5,
               norm_coefficient=0.001, norm_coefficient_post=0.01)
    got = run_actorrt(m, feeds)
    # the reference evaluator returns float64 for a single float32 tensor; the spec
    # keeps X's dtype
    want = [w.astype(np.float32) for w in run_reference(m, feeds)]
    assert_close(got, want)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 4])
def test_momentum(mode, n, t):
    feeds = _feeds(n, 3, t)
    check_model(_model("Momentum", feeds, 2 * n, alpha=0.9, beta=0.5, mode=mode,
                       norm_coefficient=0.02), feeds)


def test_adagrad_double():
    feeds = _feeds(1, 3, 1, dtype=np.float64)
    check_model(_model("Adagrad", feeds, 2, epsilon=1e-6), feeds)
