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
    assert main(["run", str(tmp_path / "bad.onnx")]) == 1  # a model error: exit 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "cannot parse" in err and err.count("\n") == 1



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
    # the default: the engine picks (4 for a model actorrt built, an
    # onnxruntime-genai folder as written)
    assert build_parser().parse_args(cmd).accuracy_level is None


def _argument_cases(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((1, 3, 64, 64), np.float32))
    (tmp_path / "text.npy").write_text("not numpy")
    np.save(tmp_path / "objects.npy", np.array([{}], object), allow_pickle=True)
    np.savez(tmp_path / "two.npz", a=np.ones(2), b=np.ones(3))
    (tmp_path / "blocker").write_text("a file where a folder should be")
    model = str(DATA / "resnetish.onnx")
    x = f"pixels={tmp_path / 'x.npy'}"
    return [
        (["run", model, "--random-inputs", "--dim", "N"], "expected SYMBOL=N"),
        (["run", model, "--random-inputs", "--dim", "N=abc"], "'abc' is not an integer"),
        (["run", model, "--random-inputs", "--dim", "N=-3"], ">= 0"),
        (["run", model, "--random-inputs", "--dim", "=3"], "expected SYMBOL=N"),
        (["run", model, "--dim", "batch=2"], "only applies with --random-inputs"),
        (["run", model, "--input", "x=missing.npy"], "no such file: missing.npy"),
        (["run", model, "--input", "x"], "expected NAME=FILE.npy"),
        (["run", model, "--input", "=a.npy"], "expected NAME=FILE.npy"),
        (["run", model, "--input", x, "--input", x], "given twice"),
        (["run", model, "--input", f"pixels={tmp_path / 'text.npy'}"], "not a .npy file"),
        (["run", model, "--input", f"pixels={tmp_path / 'objects.npy'}"], "not a readable"),
        (["run", model, "--input", f"pixels={tmp_path / 'two.npz'}"], "npz archive"),
        (["run", model, "--input", f"pixels={tmp_path}"], "is a directory"),
        (["run", str(tmp_path)], "is a directory"),
        (["run", str(tmp_path / "nope.onnx")], "no such file"),
        (["run", model, "--input", x, "--repeat", "-5"], "--repeat must be >= 1"),
        (["run", model, "--input", x, "--repeat", "0"], "--repeat must be >= 1"),
        (["run", model, "--input", x, "--seed", "-1"], "--seed must be >= 0"),
        (["run", model, "--input", x, "--trace", str(tmp_path / "blocker" / "t.json")],
         "no such directory"),
        (["run", model, "--input", x, "--trace", str(tmp_path)], "is a directory"),
        (["run", model, "--input", f"nope={tmp_path / 'x.npy'}"], "no such input"),
        (["run", model], "no value for input(s) pixels"),
        (["run", model, "--repeat", "abc"], "invalid int value"),
        (["run", model, "--bogus"], "unrecognized arguments"),
    ]


def test_every_run_argument_error_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    import actorrt

    ran = []
    orig = actorrt.InferenceSession.run
    monkeypatch.setattr(actorrt.InferenceSession, "run",
                        lambda self, *a, **k: ran.append(1) or orig(self, *a, **k))
    for argv, msg in _argument_cases(tmp_path):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            rc = exc.code
        err = capsys.readouterr().err
        assert rc == 2, (argv, err)
        assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)
        assert msg in err, (argv, err)
    assert not ran  # every one was caught before the model ran


def test_a_run_error_is_one_line_and_exit_1(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones((3,), np.float32))
    assert main(["run", str(DATA / "resnetish.onnx"), "--input",
                 f"pixels={tmp_path / 'x.npy'}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "rank" in err


def test_a_trace_that_cannot_be_written_on_close_is_one_line(tmp_path, capsys, monkeypatch):
    from actorrt import tracing

    def refuse(self, path):
        raise PermissionError(13, "Permission denied", path)

    for cls in vars(tracing).values():
        if isinstance(cls, type) and hasattr(cls, "export_chrome"):
            monkeypatch.setattr(cls, "export_chrome", refuse)
    rc = main(["run", str(DATA / "resnetish.onnx"), "--random-inputs",
               "--trace", str(tmp_path / "t.json")])
    out, err = capsys.readouterr()
    assert rc == 1 and "trace written" not in out
    assert err == f"error: cannot write the trace {tmp_path / 't.json'}: Permission denied\n"


def test_run_prints_non_ascii_names_on_an_ascii_stdout(tmp_path):
    import os
    import subprocess
    import sys

    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y\u00e9\u4e2d", TensorProto.FLOAT, [2])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y\u00e9\u4e2d"])], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx")
    env = {**os.environ, "PYTHONIOENCODING": "ascii",
           "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-m", "actorrt.cli", "run", str(tmp_path / "m.onnx"),
                           "--random-inputs"], capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert b"y??: shape=[2] dtype=float32" in proc.stdout


def test_a_multi_line_model_error_is_printed_on_one_line(tmp_path, capsys, monkeypatch):
    import actorrt
    from actorrt.cli import one_line

    assert one_line(ValueError("first\n  second\n\n")) == "first | second"
    assert one_line(KeyError()) == "KeyError"

    def refuse(*args, **kwargs):
        raise actorrt.ModelLoadError("checker said:\nline one\nline two", model="m.onnx")

    monkeypatch.setattr(actorrt, "InferenceSession", refuse)
    assert main(["run", str(DATA / "resnetish.onnx"), "--random-inputs"]) == 1
    assert capsys.readouterr().err == ("error: [model 'm.onnx'] checker said: | line one | "
                                       "line two\n")
