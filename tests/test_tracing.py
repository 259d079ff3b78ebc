"""Tracing: spans per op, variant decisions, Chrome JSON export."""

import json

import numpy as np
import onnx
from onnx import TensorProto as TP, helper

import actorrt
from actorrt import tracing
from actorrt.providers.cpu import cpu_kernel
from tests.models import add_chain

FORMATTED = []


class _Spy:
    def __str__(self):
        FORMATTED.append(1)
        return "spy"


@cpu_kernel("Choose", domain="test.actorrt")
def Choose(x):
    tracing.kernel_variant("path", "fast", "because %s", _Spy())
    tracing.kernel_variant("tile", "8x8", "fits")
    return x * 2


def _choose_model():
    g = helper.make_graph([helper.make_node("Choose", ["x"], ["y"], domain="test.actorrt",
                                            name="choose")], "c",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [2])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("test.actorrt", 1)])


async def test_variant_is_recorded_when_tracing_and_never_formatted_when_off():
    FORMATTED.clear()
    async with actorrt.open_session(_choose_model()) as s:
        assert s.tracer is None
        await s.run(None, {"x": np.ones(2, np.float32)})
    assert FORMATTED == []
    async with actorrt.open_session(_choose_model(),
                                    options=actorrt.SessionOptions(trace="ops")) as s:
        await s.run(None, {"x": np.ones(2, np.float32)})
        (span,) = s.tracer.spans
    assert FORMATTED == [1]
    assert span.args["kernel_variant.path"] == {"variant": "fast", "reason": "because spy"}
    assert span.args["kernel_variant.tile"] == {"variant": "8x8", "reason": "fits"}


async def test_chrome_export_has_one_complete_event_per_node(tmp_path):
    path = tmp_path / "t.json"
    opts = actorrt.SessionOptions(trace="ops", trace_path=str(path))
    async with actorrt.open_session(add_chain(10), options=opts) as s:
        await s.run(None, {"x": np.ones((1, 16), np.float32)})
    data = json.loads(path.read_text())
    ops = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "op"]
    assert len(ops) == 10
    for e in ops:
        assert e["args"]["device"] == "cpu"
        assert e["args"]["bytes"] == 3 * 16 * 4 - 16 * 4 + 16 * 4 or e["args"]["bytes"] > 0
        assert "flops" in e["args"] and e["dur"] >= 0
    lanes = [e for e in data["traceEvents"] if e["ph"] == "M"]
    assert lanes and all(e["name"] == "thread_name" for e in lanes)


def test_env_var_enables_tracing(tmp_path, monkeypatch):
    path = tmp_path / "env.json"
    monkeypatch.setenv("ACTORRT_TRACE", str(path))
    with actorrt.InferenceSession(add_chain(3)) as s:
        s.run(None, {"x": np.ones((1, 16), np.float32)})
    events = json.loads(path.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == 3
