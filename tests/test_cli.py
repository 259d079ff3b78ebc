"""The ``actorrt`` command line: run, placement, trace, compare-ort."""

import json
from pathlib import Path

import numpy as np
import onnx

from actorrt.cli import main

DATA = Path(__file__).parent / "data"


def test_run_resnet_writes_a_trace_with_one_event_per_node(tmp_path, capsys):
    trace = tmp_path / "t.json"
    rc = main(["run", str(DATA / "resnetish.onnx"), "--random-inputs", "--dim", "batch=2",
               "--trace", str(trace), "--placement", "--compare-ort"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "logits: shape=[2, 10] dtype=float32" in out
    assert "placement:" in out and "-> cpu" in out
    assert "vs onnxruntime logits: max abs diff" in out
    data = json.loads(trace.read_text())
    ops = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "op"]
    model = onnx.load(str(DATA / "resnetish.onnx"))
    from actorrt import InferenceSession
    with InferenceSession(model) as s:
        executed = len(s.session.plan.steps)
    assert len(ops) == executed
    for e in ops:
        assert {"device", "bytes", "flops"} <= set(e["args"])
    lanes = {e["tid"] for e in ops}
    names = {e["tid"]: e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M"}
    assert lanes <= set(names)


def test_run_with_input_files_and_bad_model(tmp_path, capsys):
    x = np.ones((1, 3, 64, 64), np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(DATA / "resnetish.onnx"), "--input", f"pixels={tmp_path / 'x.npy'}",
                 "--repeat", "2"]) == 0
    assert "run x2" in capsys.readouterr().out
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    assert main(["run", str(tmp_path / "bad.onnx")]) == 2
    assert "cannot parse" in capsys.readouterr().err
