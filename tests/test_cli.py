"""The ``actorrt`` command line: run, placement, trace, compare-ort."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

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



@pytest.mark.parametrize("argv, msg", [
    (["--temperature", "nan"], "temperature must be a finite number"),
    (["--temperature", "0.8", "--seed", "-1"], "seed must be"),
    (["--top-k", "50", "--seed", "5"], "only apply when sampling"),
    (["--greedy", "--temperature", "0.9"], "contradict"),
    (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
])
def test_generate_rejects_bad_flags_before_loading_a_model(argv, msg, capsys):
    # the model name does not exist: reaching it would be a different error
    assert main(["generate", "Hi", "--model", "/nonexistent.gguf", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and msg in err and "Traceback" not in err


@pytest.mark.parametrize("argv, msg", [
    (["--concurrency", "a"], "--concurrency"),
    (["--concurrency", "0,2"], "--concurrency"),
    (["--max-new-tokens", "1"], "--max-new-tokens"),
    (["--rounds", "0"], "--rounds"),
])
def test_bench_decode_rejects_bad_numbers(argv, msg, capsys):
    assert main(["bench", "decode", "--model", "/nonexistent.gguf", *argv]) == 2
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("cmd", [["generate", "Hi"], ["bench", "decode"]])
def test_accuracy_level_flag_takes_only_the_offered_levels(cmd, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*cmd, "--model", "/nonexistent.gguf", "--accuracy-level", "2"])
    assert exc.value.code == 2
    assert "--accuracy-level: invalid choice: 2 (choose from 0, 4)" in capsys.readouterr().err
    from actorrt.cli import build_parser
    assert build_parser().parse_args([*cmd, "--accuracy-level", "4"]).accuracy_level == 4
    assert build_parser().parse_args([*cmd, "--accuracy-level", "0"]).accuracy_level == 0
    assert build_parser().parse_args(cmd).accuracy_level == 4  # the default
