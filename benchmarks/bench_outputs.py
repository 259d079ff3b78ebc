"""What owned outputs cost (issue #18.5), as same-run ratios
(owned / ``SessionOptions(output_views=True)``; interleaved rounds, best of each).

    python benchmarks/bench_outputs.py [--quick]

* 1-node Relu, fresh output: the check alone (no copy is made);
* 1-node Identity of a 64 KiB input: the copy that keeps the feed safe;
* 61 fresh outputs (an LLM's logits + 60 KV buffers, not donated);
* :func:`actorrt._outputs.own_outputs` on an LLM decode step's outputs
  (60 KV buffers carved from one mapping, donated): µs per call.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto as TP, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import actorrt  # noqa: E402
from actorrt._outputs import own_outputs  # noqa: E402
from actorrt.providers._memory import huge_page_arrays  # noqa: E402


def _model(op: str, n_out: int = 1, shape=(128, 128)):
    nodes = [helper.make_node(op, ["x"], [f"y{i}"]) for i in range(n_out)]
    g = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                          [helper.make_tensor_value_info(f"y{i}", TP.FLOAT, list(shape))
                           for i in range(n_out)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _per_call(fn, number: int) -> float:
    t = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t) / number


def compare(name: str, model, x, rounds: int, number: int) -> None:
    owned = actorrt.InferenceSession(model)
    views = actorrt.InferenceSession(model, options=actorrt.SessionOptions(output_views=True))
    try:
        feeds = {"x": x}
        a = lambda: owned.run(None, feeds)  # noqa: E731
        b = lambda: views.run(None, feeds)  # noqa: E731
        a(), b()
        ta = tb = float("inf")
        for _ in range(rounds):  # interleaved: the machine's drift hits both
            ta = min(ta, _per_call(a, number))
            tb = min(tb, _per_call(b, number))
        print(f"{name:42s} owned {ta * 1e6:8.1f} us  views {tb * 1e6:8.1f} us  "
              f"ratio {ta / tb:5.2f}")
    finally:
        owned.close()
        views.close()


def decode_step(number: int) -> None:
    class _Plan:  # no constants
        output_consts: dict = {}
        inputs: list = []
        steps: list = []

    kv = huge_page_arrays(60, (1, 3, 256, 64), np.float32)
    names = [f"kv{i}" for i in range(60)]
    feeds = {"input_ids": np.zeros((1, 1), np.int64),
             "attention_mask": np.ones((1, 100), np.int64), **dict(zip(names, kv))}
    outs = [np.zeros((1, 1, 49152), np.float32)] + [k[:, :, :101] for k in kv]
    plan, donated = _Plan(), frozenset(names)
    t = min(_per_call(lambda: own_outputs(outs, feeds, plan, donated), number)
            for _ in range(5))
    print(f"{'own_outputs, LLM decode step (60 donated KV)':42s} {t * 1e6:8.1f} us per step")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rounds, number = (3, 200) if args.quick else (7, 1000)
    x = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
    compare("Relu (fresh output: check only)", _model("Relu"), x, rounds, number)
    compare("Identity (64 KiB copy)", _model("Identity"), x, rounds, number)
    compare("61 x Relu (61 fresh outputs)", _model("Relu", 61, (4, 4)), x[:4, :4].copy(),
            rounds, max(10, number // 10))
    decode_step(number)
    print("(shared machine: only the ratios within one run mean anything)")


if __name__ == "__main__":
    main()
