"""Per-layer float32 MaxPool / AveragePool of the zoo CNNs: actorrt's current
paths against the round-7 paths and onnxruntime, one-node models, in one process.

    python benchmarks/bench_pool_layers.py [--rounds 5] [--budget 0.05] [--cpu]

``new``: the defaults (AveragePool on the depthwise kernel, the direct MaxPool
for every size); ``old``: ``pool.AVG_DEPTHWISE = False`` (the per-element
compiled loop of :mod:`._pool_numba`) and ``_pool_direct.MAX_ELEMENTS = 1 << 17``
(larger MaxPools on the separable numpy max), toggled on the same session
between interleaved rounds (a window over the whole unpadded plane takes the
plane mean in both). 1 thread. ``--cpu``: time by the calling process's
CPU time (robust to a busy machine's preemption; onnxruntime at 1 intra-op
thread runs on the caller). Prints microseconds per call (medians) and the
ratios to onnxruntime; outputs are checked against onnxruntime.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# (name, op, (N, C, H, W), kernel, stride, pads (t, l, b, r))
LAYERS = [
    ("inc.max3s2@112", "MaxPool", (1, 64, 112, 112), 3, 2, (0, 0, 1, 1)),
    ("inc.max3s2@56", "MaxPool", (1, 192, 56, 56), 3, 2, (0, 0, 1, 1)),
    ("inc.max3s2@28", "MaxPool", (1, 320, 28, 28), 3, 2, (0, 0, 1, 1)),
    ("inc.max3@7", "MaxPool", (1, 1024, 7, 7), 3, 1, (1, 1, 1, 1)),
    ("res.max3s2@32", "MaxPool", (4, 16, 32, 32), 3, 2, (1, 1, 1, 1)),
    ("dn.max3s2@112", "MaxPool", (1, 64, 112, 112), 3, 2, (1, 1, 1, 1)),
    ("inc.avg3@28", "AveragePool", (1, 192, 28, 28), 3, 1, (1, 1, 1, 1)),
    ("inc.avg3@14", "AveragePool", (1, 576, 14, 14), 3, 1, (1, 1, 1, 1)),
    ("inc.avg7@7", "AveragePool", (1, 1024, 7, 7), 7, 1, (0, 0, 0, 0)),
    ("dn.avg2s2@56", "AveragePool", (1, 128, 56, 56), 2, 2, (0, 0, 0, 0)),
    ("dn.avg2s2@14", "AveragePool", (1, 512, 14, 14), 2, 2, (0, 0, 0, 0)),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.05)
    ap.add_argument("--cpu", action="store_true", help="time by process CPU time")
    args = ap.parse_args()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[v] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto as TP, helper

    import actorrt
    from actorrt.providers.cpu import _pool_direct, pool

    clock = time.process_time if args.cpu else time.perf_counter
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    rng = np.random.default_rng(0)
    print(f"1 thread, {'CPU' if args.cpu else 'wall'} time")
    print(f"{'layer':18s} {'new us':>9s} {'old us':>9s} {'ort us':>9s} {'new/ort':>8s} {'old/ort':>8s}")
    defaults = (pool.AVG_DEPTHWISE, _pool_direct.MAX_ELEMENTS)

    def use(old: bool) -> None:
        pool.AVG_DEPTHWISE = defaults[0] and not old
        _pool_direct.MAX_ELEMENTS = (1 << 17) if old else defaults[1]

    for name, op, shape, k, s, pads in LAYERS:
        x = rng.standard_normal(shape).astype(np.float32)
        node = helper.make_node(op, ["x"], ["y"], kernel_shape=[k, k], strides=[s, s], pads=list(pads))
        g = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", TP.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)])
        raw = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString()
        o = ort.InferenceSession(raw, so, providers=["CPUExecutionProvider"])
        a = actorrt.InferenceSession(raw, actorrt.SessionOptions(intra_op_num_threads=1))
        want = o.run(None, {"x": x})[0]
        fns = {"new": lambda: (use(False), a.run(None, {"x": x}))[1],
               "old": lambda: (use(True), a.run(None, {"x": x}))[1],
               "ort": lambda: o.run(None, {"x": x})}
        for f in fns.values():
            np.testing.assert_allclose(f()[0], want, rtol=1e-5, atol=1e-6)
        times = {k_: [] for k_ in fns}
        for _ in range(args.rounds):
            for k_, f in fns.items():
                t0, c0, nrep = time.perf_counter(), clock(), 0
                while nrep == 0 or time.perf_counter() - t0 < args.budget:
                    f()
                    nrep += 1
                times[k_].append((clock() - c0) / nrep * 1e6)
        a.close()
        med = {k_: statistics.median(v) for k_, v in times.items()}
        print(f"{name:18s} {med['new']:9.1f} {med['old']:9.1f} {med['ort']:9.1f} "
              f"{med['new'] / med['ort']:8.2f} {med['old'] / med['ort']:8.2f}", flush=True)
    use(False)


if __name__ == "__main__":
    main()
