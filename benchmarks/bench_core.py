"""Core engine benchmarks, 1 thread, printed as ratios against onnxruntime
measured in the same run (ratio = actorrt time / onnxruntime time; < 1 is faster).

    python benchmarks/bench_core.py [--quick]

* per-node overhead on a chain of small Adds: (t(200 nodes) - t(1 node)) / 199
* fixed per-run cost of the 1-node model, sync and async API
* an MLP: 4 Gemm 1024x1024, batch 64
* the light ResNet-50 from the onnx wheel
* tracing off vs on (ops level) for the 200-Add chain and ResNet-50
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import trio  # noqa: E402
from onnx import TensorProto as TP, helper, numpy_helper  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import actorrt  # noqa: E402
from tests.models import add_chain  # noqa: E402


def best_of(fn, repeat: int, number: int) -> float:
    """Best mean seconds per call over ``repeat`` rounds of ``number`` calls."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t) / number)
    return best


def ort_session(model: onnx.ModelProto | str):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def mlp(batch: int = 64, width: int = 1024, layers: int = 4) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    prev = "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        b = rng.standard_normal(width).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        out = "y" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [out], name=f"gemm{i}"))
        prev = out
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TP.FLOAT, [batch, width])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [batch, width])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def light_resnet50() -> tuple[str, dict]:
    path = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    return str(path), {"gpu_0/data_0": x}


def row(name: str, ours: float, ort: float, unit: str = "µs") -> None:
    scale = 1e6 if unit == "µs" else 1e3
    print(f"{name:<44} actorrt {ours * scale:10.2f} {unit}   onnxruntime {ort * scale:10.2f} {unit}"
          f"   ratio {ours / ort:6.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rep, num = (3, 200) if args.quick else (7, 1000)
    x = np.ones((1, 16), np.float32)
    print("actorrt core benchmarks, 1 thread (ratio = actorrt / onnxruntime)")

    # per-node overhead and fixed per-run cost
    m1, m200 = add_chain(1), add_chain(200)
    a1, a200 = actorrt.InferenceSession(m1), actorrt.InferenceSession(m200)
    o1, o200 = ort_session(m1), ort_session(m200)
    # this machine's timings wander: interleave the four and take medians of rounds
    rounds = {"a1": [], "a200": [], "o1": [], "o200": []}
    for _ in range(3 if args.quick else 7):
        for key, sess in (("a1", a1), ("a200", a200), ("o1", o1), ("o200", o200)):
            rounds[key].append(best_of(lambda: sess.run(None, {"x": x}), 3, num))
    a1.close()
    a200.close()
    med = {k: float(np.median(v)) for k, v in rounds.items()}
    per = [((a - b) / 199, (c - d) / 199) for a, b, c, d in
           zip(rounds["a200"], rounds["a1"], rounds["o200"], rounds["o1"])]
    ratios = sorted(p / q for p, q in per)
    row("per-node overhead, 200-Add chain (median)", float(np.median([p for p, _ in per])),
        float(np.median([q for _, q in per])))
    print(f"{'':44} per-round ratios {', '.join(f'{r:.2f}' for r in ratios)}")
    row("fixed per-run cost, 1-node model (sync)", med["a1"], med["o1"])
    theirs = {1: med["o1"]}

    async def async_fixed():
        async with actorrt.open_session(m1) as s:
            feeds = {"x": x}
            await s.run(None, feeds)
            best = float("inf")
            for _ in range(rep):
                t = time.perf_counter()
                for _ in range(num):
                    await s.run(None, feeds)
                best = min(best, (time.perf_counter() - t) / num)
            return best
    row("fixed per-run cost, 1-node model (async)", trio.run(async_fixed), theirs[1])

    # MLP
    m = mlp()
    xb = np.random.default_rng(1).standard_normal((64, 1024)).astype(np.float32)
    with actorrt.InferenceSession(m) as s:
        a = best_of(lambda: s.run(None, {"x": xb}), 3, 10 if args.quick else 30)
    o = ort_session(m)
    b = best_of(lambda: o.run(None, {"x": xb}), 3, 10 if args.quick else 30)
    row("MLP 4x Gemm 1024x1024, batch 64", a, b, "ms")

    # ResNet-50 (light)
    path, feeds = light_resnet50()
    with actorrt.InferenceSession(path) as s:
        a = best_of(lambda: s.run(None, feeds), 2, 2 if args.quick else 5)
    o = ort_session(path)
    b = best_of(lambda: o.run(None, feeds), 2, 2 if args.quick else 5)
    row("light ResNet-50, batch 1", a, b, "ms")

    # tracing cost
    print("\ntracing (ops level) cost:")
    for name, model, feeds_, n in (("200-Add chain", m200, {"x": x}, num),
                                   ("light ResNet-50", path, feeds, 3)):
        with actorrt.InferenceSession(model) as s:
            off = best_of(lambda: s.run(None, feeds_), rep if n > 10 else 2, n)
        with actorrt.InferenceSession(model, options=actorrt.SessionOptions(trace="ops")) as s:
            def run_traced():
                s.run(None, feeds_)
                s.session.tracer.clear()
            on = best_of(run_traced, rep if n > 10 else 2, n)
            nodes = len(s.session.plan.steps)
        print(f"{name:<20} off {off * 1e3:9.3f} ms   on {on * 1e3:9.3f} ms   "
              f"on-cost per node {(on - off) / nodes * 1e6:7.2f} µs")


if __name__ == "__main__":
    main()
