"""Plan compilation: constant folding, segments, fan-out, release of values."""

import numpy as np
import onnx
import trio
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt._plan import Plan
from actorrt._session import execute
from tests.models import add_chain, two_branch


async def test_cheap_graph_is_one_segment_and_dispatch_is_straight_line_code():
    async with actorrt.open_session(add_chain(20)) as s:
        plan: Plan = s.plan
        assert len(plan.segments) == 1
        src = plan.segments[0].source
        assert src.count("k") >= 20 and "for " not in src  # no interpreter loop
        assert "_span" not in src  # tracing off: no hooks at all


async def test_independent_branches_fan_out_when_worth_it():
    opts = actorrt.SessionOptions(segment_threshold_us=0.0)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    async with actorrt.open_session(two_branch(), options=opts) as s:
        plan = s.plan
        assert len(plan.segments) >= 2
        join = [seg for seg in plan.segments if any(st.node.name == "join" for st in seg.steps)]
        assert len(join) == 1 and len(join[0].preds) >= 1
        (y,) = await s.run(None, {"x": x})
        np.testing.assert_allclose(y, np.maximum(x * np.float32([2, -1, .5]), 0) + x - 1,
                                   rtol=1e-6)
        # cross-segment intermediates are released after their last consumer
        env = plan.new_env()
        plan.bind_feeds({"x": x}, env)
        await execute(plan, env)
        names = {plan.slot_names[i]: env[i] for i in range(plan.nslots)}
        assert names["y"] is not None
        for tmp in ("m", "r", "s"):
            assert names.get(tmp) is None, tmp


async def test_all_constant_subgraphs_fold_at_load():
    shape = numpy_helper.from_array(np.int64([2, 3]), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                              value=numpy_helper.from_array(np.float32([1.0]))),
             helper.make_node("Add", ["x", "ones"], ["y"], name="add")]
    g = helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3])], [shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    async with actorrt.open_session(m) as s:
        kinds = {p.op_type: p.provider for p in s.placement()}
        assert kinds == {"ConstantOfShape": "constant", "Add": "cpu"}
        assert len(s.plan.steps) == 1
        (y,) = await s.run(None, {"x": np.zeros((2, 3), np.float32)})
        np.testing.assert_array_equal(y, np.ones((2, 3), np.float32))


async def test_graph_output_that_is_an_input_or_constant():
    c = numpy_helper.from_array(np.float32([7]), "c")
    g = helper.make_graph([], "passthrough", [helper.make_tensor_value_info("x", TP.FLOAT, [1])],
                          [helper.make_tensor_value_info("x", TP.FLOAT, [1]),
                           helper.make_tensor_value_info("c", TP.FLOAT, [1])], [c])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    async with actorrt.open_session(m) as s:
        x, cc = await s.run(None, {"x": np.float32([3])})
        assert x.tolist() == [3.0] and cc.tolist() == [7.0]


def _transpose_reshape(shape_to):
    g = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1], name="tr"),
         helper.make_node("Reshape", ["t", "shape"], ["y"], name="rs")], "views",
        [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [numpy_helper.from_array(np.int64(shape_to), "shape")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


async def test_transpose_reshape_chain_allocates_nothing_when_views_suffice():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    opts = actorrt.SessionOptions(track_memory=True)
    async with actorrt.open_session(_transpose_reshape([2, 4, 3, 1]), options=opts) as s:
        cpu = s._providers[0]
        before = cpu.statistics().memory
        (y,) = await s.run(None, {"x": x})
        after = cpu.statistics().memory
        np.testing.assert_array_equal(y, x.transpose(0, 2, 1).reshape(2, 4, 3, 1))
        assert np.shares_memory(y, x)
        assert after.allocations == before.allocations
        assert after.peak_by_role["activations"] == 0
    # merging transposed dims cannot be a view: one buffer, accounted and returned
    async with actorrt.open_session(_transpose_reshape([2, 12]), options=opts) as s:
        cpu = s._providers[0]
        before = cpu.statistics().memory
        (y,) = await s.run(None, {"x": x})
        after = cpu.statistics().memory
        np.testing.assert_array_equal(y, x.transpose(0, 2, 1).reshape(2, 12))
        assert after.allocations == before.allocations + 1
        assert after.peak_by_role["activations"] == 96
        assert after.live_by_role["activations"] == 0
