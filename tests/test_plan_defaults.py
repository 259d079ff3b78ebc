"""Overridable initializers (graph inputs with an initializer): the plan is
specialised for their default values (folded, optimized) and a run feeding one
of them takes the generic plan. Expected values from onnxruntime (which lets
IR >= 4 models override such inputs) and the ONNX reference evaluator."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import actorrt

RNG = np.random.default_rng(3)
X = RNG.standard_normal((2, 3, 9, 7)).astype(np.float32)


def _conv_bn_model(ir_version: int) -> onnx.ModelProto:
    """Conv (W, B) + BatchNormalization (scale, bias, mean, var) + Relu, every
    parameter an initializer that is also listed as a graph input."""
    params = {
        "W": RNG.standard_normal((5, 3, 3, 3)).astype(np.float32),
        "B": RNG.standard_normal(5).astype(np.float32),
        "scale": RNG.uniform(0.5, 2, 5).astype(np.float32),
        "bias": RNG.standard_normal(5).astype(np.float32),
        "mean": RNG.standard_normal(5).astype(np.float32),
        "var": RNG.uniform(0.5, 2, 5).astype(np.float32),
    }
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 0, 1, 2], strides=[2, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT, X.shape)] + [
        helper.make_tensor_value_info(k, TP.FLOAT, v.shape) for k, v in params.items()]
    g = helper.make_graph(nodes, "convbn", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in params.items()])
    # opset 15: the reference evaluator's BatchNormalization-9 disagrees with
    # onnxruntime and the spec here
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = ir_version
    return m


def _constant_of_shape_model() -> onnx.ModelProto:
    """The light zoo models' form (IR 3): weights made by ConstantOfShape from
    shape initializers that are graph inputs, a bias initializer-input."""
    shape = np.array([4, 3, 3, 3], np.int64)
    b = RNG.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("ConstantOfShape", ["W__SHAPE"], ["W"],
                              value=numpy_helper.from_array(np.array([0.125], np.float32))),
             helper.make_node("Conv", ["x", "W", "b"], ["y"], pads=[1, 1, 1, 1])]
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT, X.shape),
              helper.make_tensor_value_info("W__SHAPE", TP.INT64, [4]),
              helper.make_tensor_value_info("b", TP.FLOAT, [4])]
    g = helper.make_graph(nodes, "cos", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          [numpy_helper.from_array(shape, "W__SHAPE"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    m.ir_version = 3
    return m


def _ort(m, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_defaults_are_folded_and_an_override_runs_the_generic_plan():
    m = _conv_bn_model(ir_version=4)
    w2 = RNG.standard_normal((5, 3, 3, 3)).astype(np.float32)
    var2 = RNG.uniform(0.1, 3, 5).astype(np.float32)
    with actorrt.InferenceSession(m) as s:
        plan = s.session.plan
        assert plan.specialised == {"W", "B", "scale", "bias", "mean", "var"}
        # Conv + BN folded, then Conv + Relu fused: one step, no BatchNormalization
        assert [st.node.op_type for st in plan.steps] == ["FusedConv"]
        assert {a.name for a in s.get_overridable_initializers()} == plan.specialised
        assert [a.name for a in s.get_inputs()] == ["x"]
        (y,) = s.run(None, {"x": X})
        np.testing.assert_allclose(y, _ort(m, {"x": X})[0], rtol=1e-5, atol=1e-5)
        # an override: onnxruntime (IR 4 lets it be fed) and the reference agree with us
        feeds = {"x": X, "W": w2, "var": var2}
        (y2,) = s.run(None, feeds)
        np.testing.assert_allclose(y2, _ort(m, feeds)[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y2, ReferenceEvaluator(m).run(None, feeds)[0], rtol=1e-5, atol=1e-5)
        assert not np.allclose(y2, y)
        generic = plan.generic_plan()
        assert "BatchNormalization" in [st.node.op_type for st in generic.steps]
        # back to the defaults: the specialised plan again, same values as before
        (y3,) = s.run(None, {"x": X})
        np.testing.assert_array_equal(y3, y)
        assert plan.generic_plan() is generic  # compiled once


def test_ir3_constant_of_shape_weights_fold_like_onnxruntime():
    m = _constant_of_shape_model()
    with actorrt.InferenceSession(m) as s:
        plan = s.session.plan
        assert [st.node.op_type for st in plan.steps] == ["Conv"]  # ConstantOfShape folded
        (y,) = s.run(None, {"x": X})
        np.testing.assert_allclose(y, _ort(m, {"x": X})[0], rtol=1e-5, atol=1e-6)
        # onnxruntime refuses to feed an IR-3 initializer; the reference evaluator
        # and we take it as the spec says (the initializer is the input's default)
        b2 = RNG.standard_normal(4).astype(np.float32)
        shape2 = np.array([4, 3, 1, 1], np.int64)
        for feeds in ({"x": X, "b": b2}, {"x": X, "W__SHAPE": shape2}, {"x": X, "b": b2, "W__SHAPE": shape2}):
            (y2,) = s.run(None, feeds)
            ref = ReferenceEvaluator(m).run(None, feeds)[0]
            assert y2.shape == ref.shape
            np.testing.assert_allclose(y2, ref, rtol=1e-5, atol=1e-6)


async def test_override_in_run_many_and_with_specialisation_off():
    m = _conv_bn_model(ir_version=4)
    w2 = RNG.standard_normal((5, 3, 3, 3)).astype(np.float32)
    feeds = [{"x": X}, {"x": X, "W": w2}, {"x": X}]
    want = [_ort(m, f)[0] for f in feeds]
    async with actorrt.open_session(m) as s:
        got = []

        def next_feeds(outs):
            if outs is not None:
                got.append(outs[0])
            return feeds[len(got)] if len(got) < len(feeds) else None

        assert await s.run_many(next_feeds) == 3
        assert len(got) == 3
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        # run(): a small one-segment plan runs on the calling task; an override
        # takes the generic plan instead (never the specialised segment)
        for f, w in zip(feeds, want):
            np.testing.assert_allclose((await s.run(None, f))[0], w, rtol=1e-5, atol=1e-5)
    async with actorrt.open_session(m, options=actorrt.SessionOptions(
            graph_optimization_level=0, fold_constants=False)) as s:
        for f, w in zip(feeds, want):
            np.testing.assert_allclose((await s.run(None, f))[0], w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [np.zeros((5, 3, 3), np.float32), np.zeros((5, 3, 3, 3), np.float64)])
def test_a_bad_override_is_a_typed_error(bad):
    m = _conv_bn_model(ir_version=4)
    with actorrt.InferenceSession(m) as s:
        with pytest.raises(actorrt.InvalidArgumentError, match="W"):
            s.run(None, {"x": X, "W": bad})
        s.run(None, {"x": X})  # the session still runs
