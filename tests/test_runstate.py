"""Run lifetime: cancelled runs withdraw their queued work and release what
they accounted; control flow never runs on the event loop and stops between
iterations when its run is cancelled; closing never waits on a long loop."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import trio
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import actorrt

OPSET = [helper.make_opsetid("", 17)]


def loop_model():
    """``v = v0 + M`` by a Loop adding 1 per iteration (trip count ``M``)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TP.INT64, []),
         helper.make_tensor_value_info("cond_in", TP.BOOL, []),
         helper.make_tensor_value_info("v_in", TP.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TP.BOOL, []),
         helper.make_tensor_value_info("v_out", TP.FLOAT, [1])],
        [numpy_helper.from_array(np.float32([1.0]), "one")])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "c", "v0"], ["v"], body=body, name="loop")], "loop",
        [helper.make_tensor_value_info("M", TP.INT64, []),
         helper.make_tensor_value_info("c", TP.BOOL, []),
         helper.make_tensor_value_info("v0", TP.FLOAT, [1])],
        [helper.make_tensor_value_info("v", TP.FLOAT, [1])])
    return helper.make_model(g, opset_imports=OPSET)


def scan_model():
    """A running sum over ``xs`` (``(T, 1)``) by Scan."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y"])],
        "body",
        [helper.make_tensor_value_info("s_in", TP.FLOAT, [1]),
         helper.make_tensor_value_info("x", TP.FLOAT, [1])],
        [helper.make_tensor_value_info("s_out", TP.FLOAT, [1]),
         helper.make_tensor_value_info("y", TP.FLOAT, [1])])
    g = helper.make_graph(
        [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1)],
        "scan",
        [helper.make_tensor_value_info("s0", TP.FLOAT, [1]),
         helper.make_tensor_value_info("xs", TP.FLOAT, ["T", 1])],
        [helper.make_tensor_value_info("s", TP.FLOAT, [1]),
         helper.make_tensor_value_info("ys", TP.FLOAT, ["T", 1])])
    return helper.make_model(g, opset_imports=OPSET)


def wide_model(n=256):
    """Two heavy branches and a join (several segments, some in threads):
    ``y = relu(x * a) + (x - b)`` on ``(n, n)`` float32."""
    a = numpy_helper.from_array(np.full((n,), 2.0, np.float32), "a")
    b = numpy_helper.from_array(np.full((n,), 1.0, np.float32), "b")
    nodes = [helper.make_node("Mul", ["x", "a"], ["m"], name="mul"),
             helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node("Sub", ["x", "b"], ["s"], name="sub"),
             helper.make_node("Exp", ["s"], ["e"], name="exp"),
             helper.make_node("Add", ["r", "e"], ["y"], name="join")]
    g = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TP.FLOAT, [n, n])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [n, n])], [a, b])
    return helper.make_model(g, opset_imports=OPSET)


def loop_feeds(m):
    return {"M": np.array(m, np.int64), "c": np.array(True), "v0": np.float32([0.0])}


def _memory(stats):
    m = stats["cpu"].memory
    return m.live_bytes, dict(m.live_by_role)


async def _settled(session, baseline, timeout=5.0):
    """Wait until the provider's memory is back at ``baseline`` (work that was
    already running when its caller gave up finishes first)."""
    with trio.move_on_after(timeout):
        while _memory(session.statistics()) != baseline:
            await trio.sleep(0.01)
    return _memory(session.statistics())


async def test_400_cancelled_runs_under_a_memory_limit_then_a_run_and_baseline():
    n = 256
    x = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    want = np.maximum(x * 2, 0) + np.exp(x - 1)
    per_run = 5 * x.nbytes
    # room for about two runs at once: a handful of leaked runs would refuse all
    opts = actorrt.SessionOptions(memory_limit=2 * n * 4 + 3 * per_run, workers=2,
                                  segment_threshold_us=10)
    async with actorrt.open_session(wide_model(n), options=opts) as s:
        assert len(s.plan.segments) > 1
        baseline = _memory(s.statistics())
        before = s.statistics()["cpu"].segments_run
        # cancelled before any work started: every segment is withdrawn
        for _ in range(200):
            with trio.move_on_after(0):
                await s.run(None, {"x": x})
        await trio.sleep(0.05)
        assert s.statistics()["cpu"].segments_run == before
        assert _memory(s.statistics()) == baseline
        # cancelled at every point of a run, several at once
        rng = np.random.default_rng(1)
        cancelled = 0

        async def one(delay):
            nonlocal cancelled
            with trio.move_on_after(delay) as scope:
                await s.run(None, {"x": x})
            cancelled += scope.cancelled_caught

        for _ in range(100):
            async with trio.open_nursery() as nursery:
                for d in rng.uniform(0, 0.002, 2):
                    nursery.start_soon(one, float(d))
        assert cancelled > 0
        assert await _settled(s, baseline) == baseline
        (y,) = await s.run(None, {"x": x})
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        assert await _settled(s, baseline) == baseline


def test_400_cancelled_sync_runs_then_a_run_and_baseline():
    n = 256
    x = np.random.default_rng(2).standard_normal((n, n)).astype(np.float32)
    want = np.maximum(x * 2, 0) + np.exp(x - 1)
    opts = actorrt.SessionOptions(memory_limit=2 * n * 4 + 3 * 5 * x.nbytes, workers=2,
                                  segment_threshold_us=10)
    with actorrt.InferenceSession(wide_model(n), opts) as s:
        baseline = _memory(s.statistics())
        cancelled = 0
        for i in range(400):
            ro = actorrt.RunOptions(timeout_s=0.0 if i % 2 else 0.0005)
            try:
                s.run(None, {"x": x}, ro)
            except actorrt.RunCancelledError:
                cancelled += 1
        assert cancelled >= 200
        terminated = actorrt.RunOptions()
        terminated.terminate = True
        with pytest.raises(actorrt.RunCancelledError, match="terminate"):
            s.run(None, {"x": x}, terminated)
        (y,) = s.run(None, {"x": x})
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        deadline = time.monotonic() + 5
        while _memory(s.statistics()) != baseline and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _memory(s.statistics()) == baseline


async def test_failed_run_releases_its_activations():
    # relu's output is accounted, then Reshape fails at run time
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Reshape", ["r", "shape"], ["y"], name="reshape")],
        "fails", [helper.make_tensor_value_info("x", TP.FLOAT, [1000]),
                  helper.make_tensor_value_info("shape", TP.INT64, [2])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    opts = actorrt.SessionOptions(track_memory=True)
    async with actorrt.open_session(helper.make_model(g, opset_imports=OPSET),
                                    options=opts) as s:
        baseline = _memory(s.statistics())
        for _ in range(3):
            with pytest.raises(actorrt.KernelError, match="reshape"):
                await s.run(None, {"x": np.ones(1000, np.float32),
                                   "shape": np.int64([7, 7])})
        assert _memory(s.statistics()) == baseline
        (y,) = await s.run(None, {"x": np.ones(1000, np.float32), "shape": np.int64([10, 100])})
        assert y.shape == (10, 100)
        assert _memory(s.statistics()) == baseline


async def test_loop_body_outputs_are_not_held_accounted_across_iterations():
    async with actorrt.open_session(loop_model(),
                                    options=actorrt.SessionOptions(track_memory=True)) as s:
        (v,) = await s.run(None, loop_feeds(1000))
        assert float(v[0]) == 1000.0
        mem = s.statistics()["cpu"].memory
        assert mem.live_by_role["activations"] == 0
        # one iteration's 4-byte value at a time, not a thousand of them
        assert mem.peak_by_role["activations"] <= 64


def test_control_flow_and_unknown_costs_never_run_on_the_event_loop():
    def segments(model):
        with actorrt.InferenceSession(model) as s:
            return s.session.plan.segments

    for model in (loop_model(), scan_model()):
        (seg,) = segments(model)
        assert seg.iterates and seg.unbounded and seg.cost_us == float("inf")
    from tests.models import add_chain, two_branch
    # symbolic dims: the plan-time estimate (a dim counted as 1) says nothing
    (seg,) = segments(two_branch())
    assert seg.unbounded and not seg.iterates and seg.cost_us == float("inf")
    # ... but this run's input sizes bound it
    small, big = [0] * 64, [0] * 64
    small[seg.dim_refs[0][0]] = np.ones((4, 3), np.float32)
    big[seg.dim_refs[0][0]] = np.ones((10**6, 3), np.float32)
    assert seg.runtime_cost_us(small) < 100 <= seg.runtime_cost_us(big)
    assert seg.runtime_cost_us(big) >= 10**6 * seg.base_cost_us
    # sizes the inputs do not give (data-dependent): unknown at run time too
    g = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"]),
         helper.make_node("Cast", ["nz"], ["y"], to=TP.FLOAT)], "nz",
        [helper.make_tensor_value_info("x", TP.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    (seg,) = segments(helper.make_model(g, opset_imports=OPSET))
    assert seg.unbounded and seg.runtime_cost_us([np.ones(4, np.float32)] * 8) == float("inf")
    # static and small: cheap, may run inline
    assert not any(seg.unbounded for seg in segments(add_chain(3)))


async def test_a_big_run_of_a_symbolic_dim_model_runs_in_a_thread():
    from tests.models import two_branch
    async with actorrt.open_session(two_branch()) as s:
        where = []
        run_segment = s.plan.run_segment

        def spy(seg, env):
            where.append(threading.get_ident())
            return run_segment(seg, env)

        s.plan.run_segment = spy
        loop_thread = threading.get_ident()
        await s.run(None, {"x": np.ones((2, 3), np.float32)})
        assert where == [loop_thread]  # cheap for these sizes: inline
        (y,) = await s.run(None, {"x": np.ones((300_000, 3), np.float32)})
        assert where[1] != loop_thread
        np.testing.assert_allclose(y[:2], np.float32([[2, 0, 0.5]] * 2))


async def test_huge_loop_is_cancelled_within_a_second_while_others_tick():
    async with actorrt.open_session(loop_model(),
                                    options=actorrt.SessionOptions(track_memory=True)) as s:
        baseline = _memory(s.statistics())
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await trio.sleep(0.01)
                ticks += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            t0 = time.monotonic()
            with trio.move_on_after(0.3) as scope:
                await s.run(None, loop_feeds(10**9))
            elapsed = time.monotonic() - t0
            nursery.cancel_scope.cancel()
        assert scope.cancelled_caught
        assert elapsed < 1.3
        assert ticks >= 5  # the event loop went on while the loop ran
        assert await _settled(s, baseline) == baseline
        (v,) = await s.run(None, loop_feeds(5))  # the session goes on
        assert float(v[0]) == 5.0


async def test_long_scan_is_cancelled_within_a_second():
    xs = np.ones((2_000_000, 1), np.float32)
    async with actorrt.open_session(scan_model()) as s:
        t0 = time.monotonic()
        with trio.move_on_after(0.2):
            await s.run(None, {"s0": np.float32([0]), "xs": xs})
        assert time.monotonic() - t0 < 1.2
        s_, ys = await s.run(None, {"s0": np.float32([0]), "xs": xs[:4]})
        assert float(s_[0]) == 4.0 and ys.ravel().tolist() == [1, 2, 3, 4]


async def test_closing_an_async_session_stops_a_running_loop():
    errors = []

    async def long_run(s):
        try:
            await s.run(None, loop_feeds(10**9))
        except actorrt.SessionClosedError as e:
            errors.append(e)

    async with trio.open_nursery() as nursery:
        async with actorrt.open_session(loop_model()) as s:
            nursery.start_soon(long_run, s)
            await trio.sleep(0.2)
            t0 = time.monotonic()
        closed_in = time.monotonic() - t0
    assert closed_in < 1.0
    assert len(errors) == 1


def test_sync_second_caller_and_close_while_a_long_loop_runs():
    s = actorrt.InferenceSession(loop_model(), actorrt.SessionOptions(workers=1))
    result = {}

    def long_run():
        try:
            s.run(None, loop_feeds(10**9))
            result["long"] = "finished"
        except actorrt.SessionClosedError as e:
            result["long"] = e

    t = threading.Thread(target=long_run)
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    (v,) = s.run(None, loop_feeds(10))  # not stuck behind the long loop
    assert float(v[0]) == 10.0
    assert time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    s.close()
    t.join(5)
    assert time.monotonic() - t0 < 1.0
    assert isinstance(result["long"], actorrt.SessionClosedError)


def test_run_options_terminate_from_another_thread_and_timeout():
    with actorrt.InferenceSession(loop_model()) as s:
        ro = actorrt.RunOptions()
        threading.Timer(0.2, lambda: setattr(ro, "terminate", True)).start()
        t0 = time.monotonic()
        with pytest.raises(actorrt.RunCancelledError, match="terminate"):
            s.run(None, loop_feeds(10**9), ro)
        assert time.monotonic() - t0 < 1.2
        with pytest.raises(actorrt.RunCancelledError, match="timeout"):
            s.run(None, loop_feeds(10**9), actorrt.RunOptions(timeout_s=0.1))
        (v,) = s.run(None, loop_feeds(3), actorrt.RunOptions(timeout_s=30))
        assert float(v[0]) == 3.0
    for bad in (-1, float("nan"), "1", True):
        with pytest.raises(actorrt.InvalidArgumentError, match="timeout_s"):
            actorrt.RunOptions(timeout_s=bad)


async def test_run_many_stops_when_its_caller_is_cancelled():
    from tests.models import add_chain
    calls = 0

    def next_feeds(outputs):
        nonlocal calls
        calls += 1
        return {"x": np.ones((1, 16), np.float32)}  # never stops by itself

    async with actorrt.open_session(add_chain(2)) as s:
        t0 = time.monotonic()
        with trio.move_on_after(0.2):
            await s.run_many(next_feeds)
        assert time.monotonic() - t0 < 1.2
        await trio.sleep(0.1)
        seen = calls
        await trio.sleep(0.2)
        assert calls == seen > 0  # the worker loop stopped


def test_run_state_releases_once_after_its_last_running_segment():
    from actorrt._runstate import RunState, check_cancelled, running
    from actorrt.providers._memory import MemoryAccountant

    acc = MemoryAccountant("cpu")
    released = []
    st = RunState(lambda: released.append(1))
    arr = np.ones(10, np.float32)
    acc.reserve(arr.nbytes, "activations")
    st.ledger[id(arr)] = (acc, arr)
    assert st.begin() and st.begin()
    st.finish()  # the caller is gone; two segments still run
    assert st.cancelled and not st.begin()  # nothing more starts
    assert released == [] and acc.statistics().live_bytes == 40
    st.end()
    assert released == []
    st.end()
    assert released == [1] and acc.statistics().live_bytes == 0
    st.finish()
    assert released == [1]  # once
    with running(st):
        with pytest.raises(actorrt.RunCancelledError, match="cancelled"):
            check_cancelled()
    check_cancelled()  # outside a run: nothing to check
