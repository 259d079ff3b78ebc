"""Plan compilation: constant folding, segments, fan-out, release of values."""

import numpy as np
import onnx
import pytest
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


def _filled_gemm_model(n: int, k: int, fill: float = 0.02):
    """y = x @ W.T + b with W (n, k) and b (n,) made by ConstantOfShape of
    constant shapes (as the onnx wheel's light zoo models make their weights)."""
    inits = [numpy_helper.from_array(np.int64([n, k]), "w_shape"),
             numpy_helper.from_array(np.int64([n]), "b_shape")]
    value = numpy_helper.from_array(np.float32([fill]))
    nodes = [helper.make_node("ConstantOfShape", ["w_shape"], ["w"], name="fill_w", value=value),
             helper.make_node("ConstantOfShape", ["b_shape"], ["b"], name="fill_b", value=value),
             helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "fill", [helper.make_tensor_value_info("x", TP.FLOAT, [2, k])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("fill_limit, folded", [(None, True), (1 << 10, False)])
async def test_constant_of_shape_fill_folds_past_the_general_limit(fill_limit, folded, monkeypatch):
    """A ConstantOfShape of a constant shape folds at load up to
    FOLD_FILL_LIMIT_ELEMENTS, past FOLD_LIMIT_ELEMENTS (set small here), so
    the Gemm gets a constant weight; past the fill limit it runs per call.
    Either way onnxruntime's values."""
    import onnxruntime as ort
    from actorrt._plan import compiler
    monkeypatch.setattr(compiler, "FOLD_LIMIT_ELEMENTS", 16)
    if fill_limit is not None:
        monkeypatch.setattr(compiler, "FOLD_FILL_LIMIT_ELEMENTS", fill_limit)
    m = _filled_gemm_model(64, 33)  # 2,112 weight elements
    x = np.random.default_rng(3).standard_normal((2, 33)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    async with actorrt.open_session(m) as s:
        where = {p.node: p.provider for p in s.placement()}
        assert where["fill_b"] == "constant"  # 64 elements: under the fill limit either way
        assert (where["fill_w"] == "constant") == folded, where
        (y,) = await s.run(None, {"x": x})
    np.testing.assert_allclose(y, want[0], rtol=1e-5, atol=1e-6)


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
    # output_views: see the plan's own zero-copy result (by default it is copied out)
    opts = actorrt.SessionOptions(track_memory=True, output_views=True)
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


@pytest.mark.parametrize("names", [("", ""), ("proj", "proj")])
def test_prepacked_weights_are_kept_per_node_not_per_name(names):
    """An unnamed node in a subgraph gets the same generated name as the first
    unnamed one in the main graph, and explicit names may repeat across graphs:
    each node must still prepack (and use) its own constant weight."""
    from tests.oracle import run_actorrt, run_onnxruntime

    rng = np.random.default_rng(0)
    k, n = 8, 4
    w1 = rng.standard_normal((k, n)).astype(np.float32)
    w2 = rng.standard_normal((k, n)).astype(np.float32)
    then_g = helper.make_graph(
        [helper.make_node("Gemm", ["A", "W2"], ["T"], name=names[1])], "then", [],
        [helper.make_tensor_value_info("T", TP.FLOAT, [1, n])], [numpy_helper.from_array(w2, "W2")])
    else_g = helper.make_graph([helper.make_node("Identity", ["Y1"], ["E"])], "else", [],
                               [helper.make_tensor_value_info("E", TP.FLOAT, [1, n])])
    g = helper.make_graph(
        [helper.make_node("Gemm", ["A", "W1"], ["Y1"], name=names[0]),
         helper.make_node("If", ["C"], ["Y2"], then_branch=then_g, else_branch=else_g)], "g",
        [helper.make_tensor_value_info("A", TP.FLOAT, [1, k]),
         helper.make_tensor_value_info("C", TP.BOOL, [])],
        [helper.make_empty_tensor_value_info("Y1"), helper.make_empty_tensor_value_info("Y2")],
        [numpy_helper.from_array(w1, "W1")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"A": rng.standard_normal((1, k)).astype(np.float32), "C": np.array(True)}
    got = run_actorrt(m, feeds)
    want = run_onnxruntime(m, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert np.abs(got[1] - got[0]).max() > 0.1  # the branch used its own weight


async def test_big_segment_frames_are_padded_past_one_data_stack_chunk():
    """A segment frame that nearly fills CPython's 16 KiB data-stack chunk made
    every kernel call open and free a chunk (mmap/munmap, page faults); frames
    of big segments are padded past the chunk, small ones are left alone."""
    from actorrt._plan.codegen import CHUNK_BYTES

    def frame_bytes(code):
        return 8 * (code.co_nlocals + code.co_stacksize)

    x = np.random.default_rng(0).random((1, 16), np.float32)
    for n, padded in ((20, False), (400, True)):
        model = add_chain(n)
        async with actorrt.open_session(model) as s:
            (seg,) = s.plan.segments
            size = frame_bytes(seg.fn.__code__)
            assert (size > CHUNK_BYTES) is padded, (n, size)
            assert ("_pad0" in seg.source) is padded
            (y,) = await s.run(None, {"x": x})
        want = x + sum(np.float32(i * 0.001) for i in range(n))
        np.testing.assert_allclose(y, want, rtol=1e-5)


def test_function_kernel_attributes_are_keywords_of_the_generated_call():
    # a kernel made from a function with attributes is called as fn(x, perm=...) in the
    # segment's code (no functools.partial per call); the result is the op's
    g = helper.make_graph([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
                           helper.make_node("Softmax", ["t"], ["y"], axis=0)], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    with actorrt.InferenceSession(m) as s:
        src = s.session.plan.segments[0].source
        (y,) = s.run(None, {"x": x})
    assert "perm=a" in src, src
    e = np.exp(x.T - x.T.max(axis=0))
    np.testing.assert_allclose(y, e / e.sum(axis=0), rtol=1e-6)
