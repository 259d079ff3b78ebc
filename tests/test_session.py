"""The async and sync session APIs, feeds validation and typed errors."""

import threading

import numpy as np
import pytest
import trio

import actorrt
from tests.models import add_chain, two_branch


def _expected_two_branch(x):
    return np.maximum(x * np.float32([2.0, -1.0, 0.5]), 0) + (x - 1)


async def test_async_session_runs_and_reports_io():
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    async with actorrt.open_session(two_branch()) as s:
        (y,) = await s.run(None, {"x": x})
        np.testing.assert_allclose(y, _expected_two_branch(x), rtol=1e-6)
        (inp,) = s.get_inputs()
        assert (inp.name, inp.shape, inp.type) == ("x", ["batch", 3], "tensor(float)")
        assert [o.name for o in s.get_outputs()] == ["y"]
        assert s.get_providers() == ["cpu"]


async def test_output_names_select_and_order():
    x = np.ones((2, 3), np.float32)
    async with actorrt.open_session(two_branch()) as s:
        (y,) = await s.run(["y"], {"x": x})
        assert y.shape == (2, 3)
        with pytest.raises(actorrt.InvalidArgumentError, match="unknown output 'nope'"):
            await s.run(["nope"], {"x": x})


async def test_32_concurrent_async_runs_match_sequential():
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((8, 3)).astype(np.float32) for _ in range(32)]
    async with actorrt.open_session(two_branch()) as s:
        seq = [(await s.run(None, {"x": x}))[0] for x in xs]
        results = [None] * 32

        async def one(i):
            results[i] = (await s.run(None, {"x": xs[i]}))[0]

        async with trio.open_nursery() as n:
            for i in range(32):
                n.start_soon(one, i)
    for a, b, x in zip(results, seq, xs):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, _expected_two_branch(x), rtol=1e-6)


def test_sync_session_is_thread_safe_with_32_threads():
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(32)]
    model = add_chain(50)
    with actorrt.InferenceSession(model, providers=["CPUExecutionProvider"]) as sess:
        seq = [sess.run(None, {"x": x})[0] for x in xs]
        out = [None] * 32

        def work(i):
            out[i] = sess.run(None, {"x": xs[i]})[0]

        threads = [threading.Thread(target=work, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    const = sum(np.float32(i * 0.001) for i in range(50))
    for a, b, x in zip(out, seq, xs):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, x + const, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("feeds, match", [
    ({"x": np.ones((2, 3), np.float32), "z": np.ones(1)}, "unknown input 'z'"),
    ({}, "missing input 'x'"),
    ({"x": np.ones((2, 3), np.float64)}, r"input 'x' has the wrong element type \(expected tensor\(float\), got tensor\(double\)\)"),
    ({"x": np.ones((2, 3, 1), np.float32)}, r"input 'x' has the wrong rank \(expected rank 2"),
    ({"x": np.ones((2, 4), np.float32)}, r"input 'x' has an incompatible dimension 1 \(expected shape \['batch', 3\], got shape \[2, 4\]\)"),
    ({"x": "hello"}, "input 'x' must be a numpy array"),
])
def test_bad_feeds_raise_typed_errors_naming_the_input(feeds, match):
    with actorrt.InferenceSession(two_branch()) as sess:
        with pytest.raises(actorrt.InvalidArgumentError, match=match) as ei:
            sess.run(None, feeds)
        assert ei.value.model == "two_branch"
        # the session stays usable
        assert sess.run(None, {"x": np.ones((1, 3), np.float32)})[0].shape == (1, 3)


def test_kernel_error_names_the_node_and_session_survives():
    # x (batch,3) + c (4,) cannot broadcast: a runtime kernel failure in node add0
    from onnx import TensorProto as TP, helper, numpy_helper
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"], name="bad_add")], "g",
        [helper.make_tensor_value_info("x", TP.FLOAT, None)],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [numpy_helper.from_array(np.ones(4, np.float32), "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with actorrt.InferenceSession(m) as sess:
        with pytest.raises(actorrt.KernelError) as ei:
            sess.run(None, {"x": np.ones((2, 3), np.float32)})
        assert ei.value.node == "bad_add"
        assert "Add" in str(ei.value) and "bad_add" in str(ei.value)
        (y,) = sess.run(None, {"x": np.ones((2, 4), np.float32)})
        np.testing.assert_array_equal(y, np.full((2, 4), 2, np.float32))


def test_unsupported_operator_names_op_domain_opset_and_reasons():
    from onnx import TensorProto as TP, helper
    g = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], name="frob",
                                            domain="com.example")], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.example", 3)])
    with pytest.raises(actorrt.UnsupportedOperatorError) as ei:
        actorrt.InferenceSession(m, options=actorrt.SessionOptions(enable_fallback=True))
    e = ei.value
    assert (e.op_type, e.domain, e.opset, e.node) == ("Frobnicate", "com.example", 3, "frob")
    assert set(e.reasons) == {"cpu", "reference"}
    assert "no kernel for com.example:Frobnicate" in e.reasons["cpu"]
    assert "Frobnicate" in str(e)


def test_unknown_provider_is_a_typed_error():
    with pytest.raises(actorrt.InvalidArgumentError, match="unknown execution provider 'tpu'"):
        actorrt.InferenceSession(two_branch(), providers=["tpu"])


def test_closed_session_raises_session_closed():
    sess = actorrt.InferenceSession(two_branch())
    sess.close()
    sess.close()  # idempotent
    with pytest.raises(actorrt.SessionClosedError):
        sess.run(None, {"x": np.ones((1, 3), np.float32)})


def _state_model():
    """acc = state + x; cast = Cast(acc, int64): a running sum whose ``acc``
    output becomes the next run's ``state`` input."""
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as oh
    f = TP.FLOAT
    graph = oh.make_graph(
        [oh.make_node("Add", ["state", "x"], ["acc"]),
         oh.make_node("Cast", ["acc"], ["cast"], to=TP.INT64)],
        "state", [oh.make_tensor_value_info("x", f, [2, 3]),
                  oh.make_tensor_value_info("state", f, ["batch", 3])],
        [oh.make_tensor_value_info("acc", f, ["batch", 3]),
         oh.make_tensor_value_info("cast", TP.INT64, ["batch", 3])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


async def test_run_many_carries_outputs_to_inputs():
    # carry={"state": "acc"}: from the second run on, state is the previous
    # run's acc without being fed; a feed for it wins. Values: numpy's sum
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s0 = np.full((2, 3), 0.5, np.float32)
    seen, fed = [], []

    def next_feeds(outs):
        if outs is not None:
            seen.append(outs[0].copy())
        if len(seen) == 6:
            return None
        feeds = {"x": x}
        if outs is None or len(seen) == 3:  # the first run, and an override
            feeds["state"] = s0
            fed.append(len(seen))
        return feeds

    async with actorrt.open_session(_state_model()) as s:
        assert await s.run_many(next_feeds, carry={"state": "acc"}) == 6
        want, got = s0, []
        for i in range(6):
            want = (s0 if i in fed else want) + x
            got.append(want)
        assert fed == [0, 3]
        for g, w in zip(seen, got):
            np.testing.assert_array_equal(g, w)
        # unknown names, and a carried output that does not fit its input
        for carry, match in (({"nope": "acc"}, "unknown input 'nope'"),
                             ({"state": "nope"}, "unknown output 'nope'")):
            with pytest.raises(actorrt.InvalidArgumentError, match=match):
                await s.run_many(lambda outs: None, carry=carry)
        runs = []

        def feeds_twice(outs):
            runs.append(outs)
            return {"x": x, "state": s0} if outs is None else {"x": x}

        with pytest.raises(actorrt.InvalidArgumentError, match="state"):
            await s.run_many(feeds_twice, carry={"state": "cast"})  # int64 into float
        assert len(runs) == 2  # the first run, then the check before the second


async def test_provider_memory_returns_to_zero_after_close():
    async with actorrt.open_session(two_branch()) as s:
        cpu = s._providers[0]
        assert cpu.statistics().memory.live_by_role["weights"] == 24
        await s.run(None, {"x": np.ones((1, 3), np.float32)})
    assert cpu.statistics().memory.live_bytes == 0


async def test_run_many_feeds_each_run_from_the_last_in_a_worker_thread():
    # y = relu(x * [2, -1, .5]) + (x - 1), fed back as the next x: each
    # run's outputs are the previous ones through numpy's formula
    rng = np.random.default_rng(4)
    x0 = rng.standard_normal((2, 3)).astype(np.float32)
    seen, threads = [], set()

    def next_feeds(outs):
        threads.add(threading.current_thread())
        if outs is None:
            return {"x": x0}
        seen.append(outs[0])
        return {"x": outs[0]} if len(seen) < 5 else None

    async with actorrt.open_session(two_branch()) as s:
        assert await s.run_many(next_feeds) == 5
        assert threading.current_thread() not in threads  # off the event loop
        want = x0
        for got in seen:
            want = _expected_two_branch(want)
            np.testing.assert_allclose(got, want, rtol=1e-5)
        # a bad feed raises the typed error of run(), from the worker thread
        with pytest.raises(actorrt.InvalidArgumentError, match="wrong element type"):
            await s.run_many(lambda outs: {"x": x0.astype(np.float64)} if outs is None else None)
        (y,) = await s.run(None, {"x": x0})  # the session still serves
        np.testing.assert_allclose(y, _expected_two_branch(x0), rtol=1e-6)
