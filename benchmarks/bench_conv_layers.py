"""Per-layer float32 Conv + Relu: the direct kernel (:mod:`actorrt.providers.cpu._conv_direct`)
against the GEMM / im2col / compiled-depthwise path (:func:`._conv_util.conv_core` + the
compiled epilogue) and onnxruntime (a one-node Conv + Relu model), in one process.

    python benchmarks/bench_conv_layers.py [--threads 1] [--rounds 5] [--budget 0.05] [--only res,mob.pw] [--cpu]

Shapes: the convs of ``resnetish`` / ``mobilenetish`` and some zoo-style layers (wider 3x3,
7x7 stems, 1x1 expands). Prints microseconds per call (median over interleaved rounds) and
direct / onnxruntime, core / onnxruntime. Only ratios of one run mean anything on a shared
machine. ``--cpu`` (1 thread): time each call by the calling thread's CPU time
(``time.thread_time``; onnxruntime at 1 intra-op thread runs on the caller), which a busy
machine's preemption does not inflate: on the round-8 machine (load 4-8) wall ratios of one
layer moved 1.0-5.0 between runs, CPU-time ratios by 0.05-0.5.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# (name, n, c, h, w, m, k, stride, pad, group)
LAYERS = [
    ("res.stem7x7s2", 4, 3, 64, 64, 16, 7, 2, 3, 1),
    ("res.3x3.16", 4, 16, 16, 16, 16, 3, 1, 1, 1),
    ("res.3x3s2.16-32", 4, 16, 16, 16, 32, 3, 2, 1, 1),
    ("res.3x3.32", 4, 32, 8, 8, 32, 3, 1, 1, 1),
    ("res.1x1s2.16-32", 4, 16, 16, 16, 32, 1, 2, 0, 1),
    ("res.3x3.64@4", 4, 64, 4, 4, 64, 3, 1, 1, 1),
    ("mob.stem3x3s2", 1, 3, 160, 160, 32, 3, 2, 1, 1),
    ("mob.dw.32@80", 1, 32, 80, 80, 32, 3, 1, 1, 32),
    ("mob.pw.32-64@80", 1, 32, 80, 80, 64, 1, 1, 0, 1),
    ("mob.dws2.64@80", 1, 64, 80, 80, 64, 3, 2, 1, 64),
    ("mob.pw.64-128@40", 1, 64, 40, 40, 128, 1, 1, 0, 1),
    ("mob.dw.128@40", 1, 128, 40, 40, 128, 3, 1, 1, 128),
    ("mob.pw.128@40", 1, 128, 40, 40, 128, 1, 1, 0, 1),
    ("mob.pw.256@20", 1, 256, 20, 20, 256, 1, 1, 0, 1),
    ("mob.dw.256@20", 1, 256, 20, 20, 256, 3, 1, 1, 256),
    ("mob.pw.256-512@10", 1, 256, 10, 10, 512, 1, 1, 0, 1),
    ("zoo.3x3.64@56", 1, 64, 56, 56, 64, 3, 1, 1, 1),
    ("zoo.3x3.128@28", 1, 128, 28, 28, 128, 3, 1, 1, 1),
    ("zoo.3x3.256@14", 1, 256, 14, 14, 256, 3, 1, 1, 1),
    ("zoo.3x3.512@7", 1, 512, 7, 7, 512, 3, 1, 1, 1),
    ("zoo.1x1.256-64@56", 1, 256, 56, 56, 64, 1, 1, 0, 1),
    ("zoo.1x1.64-256@56", 1, 64, 56, 56, 256, 1, 1, 0, 1),
    ("zoo.1x1.1024-256@14", 1, 1024, 14, 14, 256, 1, 1, 0, 1),
    ("zoo.stem7x7s2.64", 1, 3, 224, 224, 64, 7, 2, 3, 1),
    ("zoo.5x5.32-64@28", 1, 32, 28, 28, 64, 5, 1, 2, 1),
    ("inc.3x3.64-192@56", 1, 64, 56, 56, 192, 3, 1, 1, 1),
    ("inc.3x3.96@28", 1, 96, 28, 28, 96, 3, 1, 1, 1),
    ("inc.3x3.128-160@14", 1, 128, 14, 14, 160, 3, 1, 1, 1),
    ("inc.3x3.192-224@7", 1, 192, 7, 7, 224, 3, 1, 1, 1),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.05)
    ap.add_argument("--only", default="", help="comma-separated name prefixes")
    ap.add_argument("--cpu", action="store_true",
                    help="time by the calling thread's CPU time (1 thread only)")
    args = ap.parse_args()
    if args.cpu and args.threads != 1:
        ap.error("--cpu measures the calling thread: use it with --threads 1")
    clock = time.thread_time if args.cpu else time.perf_counter
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[v] = str(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto as TP, helper, numpy_helper

    from actorrt.providers.cpu import _conv_direct as cdr, _epilogue_numba as en, _threads
    from actorrt.providers.cpu._conv_util import conv_core, conv_geometry

    rng = np.random.default_rng(0)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    _threads.apply(args.threads)
    print(f"threads {args.threads}, VW {cdr.VW}, {'thread CPU' if args.cpu else 'wall'} time")
    print(f"{'layer':22s} {'direct us':>10s} {'core us':>10s} {'ort us':>10s} {'dir/ort':>8s} "
          f"{'core/ort':>8s}")
    only = [p for p in args.only.split(",") if p]
    for name, n, c, h, w, m, k, s, p, g in LAYERS:
        if only and not any(name.startswith(o) for o in only):
            continue
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        wt = (rng.standard_normal((m, c // g, k, k)) * 0.1).astype(np.float32)
        b = rng.standard_normal(m).astype(np.float32)
        node = helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[k, k], strides=[s, s],
                                pads=[p] * 4, group=g)
        relu = helper.make_node("Relu", ["c"], ["y"])
        graph = helper.make_graph([node, relu], "l", [helper.make_tensor_value_info("x", TP.FLOAT, x.shape)],
                                  [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                                  [numpy_helper.from_array(wt, "W"), numpy_helper.from_array(b, "B")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        want = sess.run(None, {"x": x})[0]
        out, pb, pe = conv_geometry((h, w), (k, k), (s, s), (1, 1), (p, p), (p, p))
        wpack = np.ascontiguousarray(wt.reshape(g, m // g, -1))
        plan = cdr.make_plan(x.shape, wpack.shape, g, (k, k), (s, s), (1, 1), pb, out, flatten=True)
        wp = cdr.pack_weights(wpack, out[1], plan.mr)
        ap_ = cdr.act_params("Relu")

        def direct():
            return cdr.run(plan, x, wp, b, None, *ap_)

        def core():
            y, _ = conv_core(x, wpack, g, (k, k), (s, s), (1, 1), pb, pe, out)
            en.bias_add_act(y, b, None, "Relu", ())
            return y

        def peer():
            return sess.run(None, {"x": x})[0]

        fns = {"direct": direct, "core": core, "ort": peer}
        for f in fns.values():
            got = f()
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
        times = {k_: [] for k_ in fns}
        for _ in range(args.rounds):
            for k_, f in fns.items():
                t0 = time.perf_counter()
                c0 = clock()
                nrep = 0
                while time.perf_counter() - t0 < args.budget:
                    f()
                    nrep += 1
                times[k_].append((clock() - c0) / nrep * 1e6)
        med = {k_: statistics.median(v) for k_, v in times.items()}
        print(f"{name:22s} {med['direct']:10.1f} {med['core']:10.1f} {med['ort']:10.1f} "
              f"{med['direct'] / med['ort']:8.2f} {med['core'] / med['ort']:8.2f}", flush=True)


if __name__ == "__main__":
    main()
