"""Returned outputs own their memory (issue #18.5): writes to an output never
reach the caller's feeds, the model's constants, another output or the next
run's output, on every entry point; ``output_views=True`` opts out."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import actorrt
from actorrt._outputs import own_outputs, root_of

X_SHAPE = (1, 4, 3)


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _model(nodes, outputs, inits=(), opset=17, inputs=None):
    ins = inputs or [helper.make_tensor_value_info("x", TP.FLOAT, list(X_SHAPE))]
    outs = [o if isinstance(o, onnx.ValueInfoProto)
            else helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs]
    g = helper.make_graph(nodes, "alias", ins, outs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _branch(name, out, node):
    return helper.make_graph([node], name, [], [helper.make_tensor_value_info(out, TP.FLOAT,
                                                                              None)])


# (case id, model): every output is (a view of / the very object) the feed x
# inside the plan
VIEW_CASES = {
    "identity": _model([helper.make_node("Identity", ["x"], ["y"])], ["y"]),
    "input_is_output": _model([], ["x"]),
    "reshape": _model([helper.make_node("Reshape", ["x", "s"], ["y"])], ["y"],
                      [_i64("s", [-1])]),
    "flatten": _model([helper.make_node("Flatten", ["x"], ["y"], axis=1)], ["y"]),
    "slice": _model([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])], ["y"],
                    [_i64("st", [1]), _i64("en", [3]), _i64("ax", [1])]),
    "transpose": _model([helper.make_node("Transpose", ["x"], ["y"], perm=[2, 1, 0])], ["y"]),
    "squeeze": _model([helper.make_node("Squeeze", ["x", "a"], ["y"])], ["y"],
                      [_i64("a", [0])]),
    "unsqueeze": _model([helper.make_node("Unsqueeze", ["x", "a"], ["y"])], ["y"],
                        [_i64("a", [0])]),
    "expand_same": _model([helper.make_node("Expand", ["x", "s"], ["y"])], ["y"],
                          [_i64("s", list(X_SHAPE))]),
    "expand_broadcast": _model([helper.make_node("Expand", ["x", "s"], ["y"])], ["y"],
                               [_i64("s", [2, 4, 3])]),
    "split": _model([helper.make_node("Split", ["x", "n"], ["y0", "y1"], axis=1)],
                    ["y0", "y1"], [_i64("n", [2, 2])]),
    "split_axis2": _model([helper.make_node("Split", ["x", "n"], ["y0", "y1"], axis=2)],
                          ["y0", "y1"], [_i64("n", [1, 2])]),
    "dropout": _model([helper.make_node("Dropout", ["x"], ["y"])], ["y"]),
    "cast_same": _model([helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT)], ["y"]),
    "concat_one": _model([helper.make_node("Concat", ["x"], ["y"], axis=0)], ["y"]),
    "input_and_identity": _model([helper.make_node("Identity", ["x"], ["y"])], ["x", "y"]),
    "if_outer": _model([
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TP.BOOL, [], [1])),
        helper.make_node("If", ["c"], ["y"],
                         then_branch=_branch("t", "ty", helper.make_node("Identity", ["x"],
                                                                           ["ty"])),
                         else_branch=_branch("e", "ey", helper.make_node("Identity", ["x"],
                                                                           ["ey"])))], ["y"]),
}


def _feed():
    return np.arange(np.prod(X_SHAPE), dtype=np.float32).reshape(X_SHAPE)


def _check_owned(outs, x, x_before):
    for o in outs:
        assert isinstance(o, np.ndarray)
        assert o.flags.writeable
        assert not np.shares_memory(o, x)
        o[...] = -7.0  # a write to the output never reaches the feed
    np.testing.assert_array_equal(x, x_before)
    for i, a in enumerate(outs):
        for b in outs[i + 1:]:
            assert not np.shares_memory(a, b)


@pytest.mark.parametrize("case", sorted(VIEW_CASES))
async def test_outputs_never_alias_the_feed(case):
    model = VIEW_CASES[case]
    x = _feed()
    want = ReferenceEvaluator(model).run(None, {"x": x.copy()})
    async with actorrt.open_session(model) as s:
        outs = await s.run(None, {"x": x})
        for o, w in zip(outs, want):
            np.testing.assert_array_equal(o, w)
        _check_owned(outs, x, _feed())
        again = await s.run(None, {"x": x})  # the next run is unaffected by the write
        for o, w in zip(again, want):
            np.testing.assert_array_equal(o, w)


@pytest.mark.parametrize("case", sorted(VIEW_CASES))
def test_sync_session_outputs_never_alias_the_feed(case):
    x = _feed()
    with actorrt.InferenceSession(VIEW_CASES[case]) as sess:
        _check_owned(sess.run(None, {"x": x}), x, _feed())


def test_read_only_feed_gives_writable_output():
    x = _feed()
    x.flags.writeable = False
    with actorrt.InferenceSession(VIEW_CASES["reshape"]) as sess:
        (y,) = sess.run(None, {"x": x})
        assert y.flags.writeable and not np.shares_memory(x, y)


CONST = np.float32([[1.5, 2.5, 3.5]])
CONST_CASES = {
    "initializer_output": _model([], ["w"], [numpy_helper.from_array(CONST, "w")]),
    "identity_of_initializer": _model([helper.make_node("Identity", ["w"], ["y"])], ["y"],
                                      [numpy_helper.from_array(CONST, "w")]),
    "constant_node": _model([helper.make_node("Constant", [], ["y"],
                                              value=numpy_helper.from_array(CONST, "v"))],
                            ["y"]),
    "folded": _model([helper.make_node("Relu", ["w"], ["y"])], ["y"],
                     [numpy_helper.from_array(CONST, "w")]),
    "reshape_of_initializer": _model([helper.make_node("Reshape", ["w", "s"], ["y"])], ["y"],
                                     [numpy_helper.from_array(CONST, "w"), _i64("s", [-1])]),
}


@pytest.mark.parametrize("case", sorted(CONST_CASES))
@pytest.mark.parametrize("fold", [True, False])
async def test_constant_outputs_are_fresh_and_writable_each_run(case, fold):
    x = _feed()
    opts = actorrt.SessionOptions(fold_constants=fold)
    async with actorrt.open_session(CONST_CASES[case], options=opts) as s:
        (a,) = await s.run(None, {"x": x})
        (b,) = await s.run(None, {"x": x})
        assert a is not b and not np.shares_memory(a, b)
        assert a.flags.writeable and b.flags.writeable
        np.testing.assert_array_equal(a.reshape(CONST.shape), CONST)
        a[...] = 0
        (c,) = await s.run(None, {"x": x})
        np.testing.assert_array_equal(c.reshape(CONST.shape), CONST)


async def test_two_outputs_of_one_value_are_distinct():
    model = _model([helper.make_node("Relu", ["x"], ["t"]),
                    helper.make_node("Identity", ["t"], ["y0"]),
                    helper.make_node("Identity", ["t"], ["y1"])], ["y0", "y1", "t"])
    x = _feed()
    async with actorrt.open_session(model) as s:
        outs = await s.run(None, {"x": x})
        _check_owned(outs, x, _feed())
        (a, b) = await s.run(["t", "t"], {"x": x})
        assert not np.shares_memory(a, b)


async def test_fresh_outputs_are_not_copied():
    # a computed output (and disjoint parts of one) is returned as the kernel made it
    model = _model([helper.make_node("Relu", ["x"], ["y"])], ["y"])
    x = _feed()
    async with actorrt.open_session(model, options=actorrt.SessionOptions(output_views=True)) as s:
        (ref,) = await s.run(None, {"x": x})
    fresh = [np.ones(4, np.float32), np.zeros((2, 2), np.float32)]
    parts = list(np.ones((4, 3), np.float32).reshape(2, 2, 3))  # disjoint views of one buffer
    out = own_outputs(fresh + parts, {"x": x}, s.plan)
    assert all(o is f for o, f in zip(out, fresh + parts))
    assert ref.flags.writeable


async def test_output_views_opt_in_returns_views():
    x = _feed()
    opts = actorrt.SessionOptions(output_views=True)
    async with actorrt.open_session(VIEW_CASES["identity"], options=opts) as s:
        (y,) = await s.run(None, {"x": x})
        assert np.shares_memory(y, x)


async def test_sequence_outputs_do_not_alias_feeds():
    model = _model([helper.make_node("SequenceConstruct", ["x", "x"], ["seq"])],
                   [helper.make_tensor_sequence_value_info("seq", TP.FLOAT, None)])
    x = _feed()
    async with actorrt.open_session(model) as s:
        (seq,) = await s.run(None, {"x": x})
        assert len(seq) == 2
        for t in seq:
            assert not np.shares_memory(t, x)
        assert not np.shares_memory(seq[0], seq[1])
        seq[0][...] = 5
        np.testing.assert_array_equal(x, _feed())


async def test_sequence_input_passed_through_is_a_new_list():
    model = _model([], [helper.make_tensor_sequence_value_info("s", TP.FLOAT, None)],
                   inputs=[helper.make_tensor_sequence_value_info("s", TP.FLOAT, None)])
    items = [_feed(), _feed()]
    async with actorrt.open_session(model) as s:
        (out,) = await s.run(None, {"s": items})
        assert out is not items
        assert all(not np.shares_memory(o, i) for o, i in zip(out, items))


async def test_run_many_outputs_are_owned():
    model = VIEW_CASES["identity"]
    x = _feed()
    seen = []

    def next_feeds(outputs):
        if outputs is not None:
            seen.append(outputs[0])
            outputs[0][...] = 99  # writing the output must not reach x
        return {"x": x} if len(seen) < 3 else None

    async with actorrt.open_session(model) as s:
        assert await s.run_many(next_feeds) == 3
    np.testing.assert_array_equal(x, _feed())
    assert not any(np.shares_memory(o, x) for o in seen)


async def test_run_many_carried_input_written_in_place_is_not_copied():
    # a donated carried buffer may come back as the output itself (a KV cache)
    model = VIEW_CASES["identity"]
    buf = _feed()
    outs = []

    def next_feeds(outputs):
        if outputs is not None:
            outs.append(outputs[0])
        return {"x": buf} if len(outs) < 2 else None

    async with actorrt.open_session(model) as s:
        await s.run_many(next_feeds, donate=["x"])
    assert all(root_of(o) is root_of(buf) for o in outs)


async def test_iobinding_outputs_do_not_alias_inputs():
    x = _feed()
    async with actorrt.open_session(VIEW_CASES["reshape"]) as s:
        b = s.io_binding()
        b.bind_cpu_input("x", x)
        b.bind_output("y")
        await s.run_with_iobinding(b)
        (t,) = b.get_outputs()
        assert not np.shares_memory(t.numpy(), x)
        t.numpy()[...] = 3
        np.testing.assert_array_equal(x, _feed())
        t.close()


def test_onnx_backend_outputs_do_not_alias_inputs():
    from actorrt import backend

    x = _feed()
    node = helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2])
    (y,) = backend.run_node(node, [x])
    assert y.flags.writeable and not np.shares_memory(y, x)
    rep = backend.prepare(VIEW_CASES["identity"])
    try:
        (y,) = rep.run([x])
        y -= y.mean()
    finally:
        rep.session.close()
    np.testing.assert_array_equal(x, _feed())


async def test_run_many_carried_outputs_are_owned():
    # y = Identity(x) carried back into x: every output the caller sees is its own
    x = _feed()
    seen = []

    def next_feeds(outputs):
        if outputs is None:
            return {"x": x}
        seen.append(outputs[0])
        outputs[0][...] = len(seen)  # must reach neither x nor the next run's output
        return {} if len(seen) < 3 else None

    async with actorrt.open_session(VIEW_CASES["identity"]) as s:
        assert await s.run_many(next_feeds, carry={"x": "y"}) == 3
    np.testing.assert_array_equal(x, _feed())
    for i, a in enumerate(seen):
        assert not np.shares_memory(a, x)
        assert all(not np.shares_memory(a, b) for b in seen[i + 1:])
