"""The synchronous API's direct path (``Session.run_blocking``): a one-segment
host plan runs in the caller's thread, with the same results, errors and
close semantics as the path through the event loop."""

from __future__ import annotations

import threading
import time

import numpy as np
import onnxruntime as ort
import pytest
import trio
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from tests.models import add_chain


def _matmul_chain(n: int, width: int) -> bytes:
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "y" if i == n - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out], name=f"mm{i}"))
        prev = out
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TP.FLOAT, [width, width])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [width, width])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_one_segment_plan_runs_in_the_callers_thread_and_matches_onnxruntime():
    model = add_chain(7, shape=(3, 16))
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with actorrt.InferenceSession(model) as s:
        assert s.session.runs_blocking
        before = s.statistics()["cpu"].segments_run
        (y,) = s.run(None, {"x": x})
        (y2,) = s.run(["y"], {"x": x})
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(y, y2)
        assert s.statistics()["cpu"].segments_run == before + 2
        assert y.flags.writeable and y.flags.owndata or y.base is not None
        y[...] = 0  # owned: the next run is unaffected
        np.testing.assert_array_equal(s.run(None, {"x": x})[0], y2)
        with pytest.raises(actorrt.InvalidArgumentError, match="unknown output"):
            s.run(["nope"], {"x": x})
        with pytest.raises(actorrt.InvalidArgumentError):
            s.run(None, {"x": x.astype(np.float64)})


def test_plans_the_direct_path_does_not_take():
    from tests.test_runstate import loop_model
    with actorrt.InferenceSession(loop_model()) as s:  # control flow
        assert not s.session.runs_blocking
    with actorrt.InferenceSession(add_chain(3), actorrt.SessionOptions(memory_limit=1 << 30)) as s:
        assert not s.session.runs_blocking  # memory accounting
        with pytest.raises(actorrt.InvalidArgumentError, match="run_blocking"):
            s.session.run_blocking(None, {"x": np.ones((1, 16), np.float32)})
    with actorrt.InferenceSession(add_chain(3), actorrt.SessionOptions(trace="ops")) as s:
        assert not s.session.runs_blocking
        (y,) = s.run(None, {"x": np.ones((1, 16), np.float32)})
        np.testing.assert_allclose(y, 1.003, rtol=1e-6)


def test_close_while_a_direct_run_computes_waits_then_raises_closed():
    model = _matmul_chain(40, 1024)
    x = np.random.default_rng(2).standard_normal((1024, 1024)).astype(np.float32)
    s = actorrt.InferenceSession(model)
    assert s.session.runs_blocking
    s.run(None, {"x": x})  # the first run pays one-time costs (0.3 s alone in a process)
    t0 = time.perf_counter()
    s.run(None, {"x": x})
    once = time.perf_counter() - t0
    result: dict = {}
    started = threading.Event()

    def work():
        started.set()
        try:
            result["y"] = s.run(None, {"x": x})
        except actorrt.SessionClosedError as e:
            result["err"] = e

    t = threading.Thread(target=work)
    t.start()
    started.wait()
    time.sleep(min(once / 4, 0.05))
    s.close()
    t.join(30)
    assert not t.is_alive()
    # either the run had finished before the close began, or it raised the
    # closed error after the close waited for its kernels
    assert ("y" in result) != ("err" in result)
    if once > 0.15:  # the close (after 50 ms at most) surely came mid-run
        assert "err" in result
    if "err" in result:
        assert "closed during the run" in str(result["err"])
    with pytest.raises(actorrt.SessionClosedError):
        s.run(None, {"x": x})


def test_many_threads_on_the_direct_path_close_midway():
    model = add_chain(20)
    s = actorrt.InferenceSession(model)
    x = np.ones((1, 16), np.float32)
    want = x + sum(np.float32(i * 0.001) for i in range(20))
    errors, ok = [], []
    stop = threading.Event()

    def work():
        while not stop.is_set():
            try:
                (y,) = s.run(None, {"x": x})
                np.testing.assert_allclose(y, want, rtol=1e-5)
                ok.append(1)
            except actorrt.SessionClosedError:
                errors.append(1)
                return

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    s.close()
    stop.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert ok and len(errors) <= 8


async def test_async_inline_run_is_cancellable_and_matches():
    x = np.ones((1, 16), np.float32)
    async with actorrt.open_session(add_chain(5)) as s:
        (y,) = await s.run(None, {"x": x})
        np.testing.assert_allclose(y, 1.010, rtol=1e-6)
        with trio.CancelScope() as scope:
            scope.cancel()
            await s.run(None, {"x": x})  # cancelled before it starts
        assert scope.cancelled_caught
        with pytest.raises(actorrt.InvalidArgumentError):
            await s.run(None, {"y": x})
