"""The concurrency-curve summary of ``actorrt bench decode``."""

import statistics

import pytest

from actorrt.genai.cli import median_curve, print_curve


def test_median_curve_takes_ratios_within_each_round():
    # (streams, decode tok/s, per-stream tok/s, end-to-end tok/s) per round
    rounds = [[(1, 20.0, 20.0, 19.0), (8, 90.0, 11.0, 80.0)],
              [(1, 10.0, 10.0, 9.5), (8, 48.0, 6.0, 40.0)],   # a slow round
              [(1, 25.0, 25.0, 24.0), (8, 120.0, 15.0, 90.0)]]
    curve, ratios = median_curve(rounds)
    assert curve[0] == (1, 20.0, 20.0, 19.0)
    assert curve[1] == (8, 90.0, 11.0, 80.0)  # medians per column
    each = [90 / 20, 48 / 10, 120 / 25]
    assert ratios[1][2] == each
    assert ratios[1][0] == statistics.median(each) == 4.8  # not 90 / 20 = 4.5
    assert ratios[1][1] == statistics.median([80 / 19, 40 / 9.5, 90 / 24])
    assert ratios[0][0] == 1.0


def test_print_curve_lists_every_round(capsys):
    print_curve([[(1, 20.0, 20.0, 19.0), (8, 90.0, 11.0, 80.0)],
                 [(1, 10.0, 10.0, 9.5), (8, 48.0, 6.0, 40.0)]])
    out = capsys.readouterr().out
    assert "decode tok/s" in out and "[4.50, 4.80]" in out


def _generate_proc(args, **env_extra):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), **env_extra}
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.Popen([sys.executable, "-m", "actorrt.cli", "generate", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


@pytest.fixture(scope="module")
def smollm2():
    import actorrt
    from actorrt.genai import prepare_model

    try:
        return prepare_model("smollm2", progress=False)
    except actorrt.ModelLoadError as exc:  # offline machine
        pytest.skip(f"SmolLM2 unavailable: {exc}")


def test_generate_into_a_closed_pipe_exits_quietly(smollm2):
    """``actorrt generate ... | head -c 20``: the reader leaves after 20
    bytes; the command stops without a traceback and exits 0."""
    proc = _generate_proc(["Once upon a time", "--model", str(smollm2),
                           "--max-new-tokens", "200"])
    first = proc.stdout.read(20)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert first.startswith(b"Once upon a time")
    assert "Traceback" not in err and "Error" not in err and "Exception" not in err, err


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"},
                                 {"LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0",
                                  "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": None}])
def test_generate_on_a_non_utf8_stdout_replaces_what_it_cannot_write(smollm2, env):
    proc = _generate_proc(["Caf\u00e9 \u4e2d\u6587:", "--model", str(smollm2),
                           "--max-new-tokens", "4"], **env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    assert out.startswith(b"Caf? ??:"), out
    assert b"Traceback" not in err


class _SlowEngine:
    """Stands in for an engine whose first request compiles kernels."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.requests = []

    def encode_prompt(self, prompt):
        return [11, 12, 13, 14]

    async def generate(self, prompt, params):
        import trio

        self.requests.append((prompt, params))
        await trio.sleep(self.seconds)


@pytest.mark.parametrize("seconds, announced", [(0.3, True), (0.0, False)])
def test_warm_up_announces_a_slow_first_run_once(capsys, seconds, announced):
    import trio

    from actorrt.genai.cli import WARM_UP_NOTICE, warm_up

    engine = _SlowEngine(seconds)
    took = trio.run(warm_up, engine, 0.1)
    err = capsys.readouterr().err
    assert err == (WARM_UP_NOTICE + "\n" if announced else "")
    assert took >= seconds
    (prompt, params), = engine.requests
    assert prompt == [11, 12, 13] and params.max_new_tokens == 2 and params.ignore_eos


def test_generate_with_a_float16_kv_cache(smollm2):
    proc = _generate_proc(["The capital of France is", "--model", str(smollm2),
                           "--max-new-tokens", "4", "--kv-dtype", "float16"])
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()
    assert out.strip()
    bad = _generate_proc(["Hi", "--model", str(smollm2), "--kv-dtype", "float64"])
    _, err = bad.communicate(timeout=120)
    assert bad.returncode == 2 and b"--kv-dtype" in err
