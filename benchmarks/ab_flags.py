"""In-process A/B of kernel flags on whole models: one actorrt session per
model, module attributes toggled between interleaved rounds, onnxruntime timed
in the same rounds.

    python benchmarks/ab_flags.py MODELS MOD:ATTR:OLD:NEW [...] [--threads 1] [--rounds 7] [--budget 0.3]

``MODELS``: comma-separated :mod:`bench_models` names. Each toggle names a
module under ``actorrt.providers.cpu`` and an attribute the kernels read at run
time (not at compile or plan time), with Python expressions for its old and new
values, e.g. ``pool:AVG_DEPTHWISE:False:True`` or
``_pool_direct:MAX_ELEMENTS:1<<17:1<<62``. Per round both settings run for
``--budget`` seconds each, in alternating order (old first in even rounds), then
onnxruntime; printed: median ms per run, the ratios to onnxruntime, and
new / old per round. On a shared machine check the spread with an A/A toggle
(the same value twice) first: at 2 threads under load 5-8 single rounds moved
0.44-1.23 with nothing changed (round 8).

``--sessions``: for attributes read when a kernel makes its per-shape plan
(e.g. ``_conv_direct:CHANNEL_TILES:False:True``): one session per setting,
each made and first run under its setting (the attributes are set again
before each of its timed rounds).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models")
    ap.add_argument("toggles", nargs="+", help="MOD:ATTR:OLD:NEW")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--budget", type=float, default=0.3)
    ap.add_argument("--sessions", action="store_true",
                    help="one session per setting (plan-time attributes)")
    args = ap.parse_args()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[v] = str(args.threads)
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    sys.path.insert(0, str(here.parent))
    import numpy as np
    import onnxruntime as ort

    import actorrt
    import bench_models

    toggles = []
    for spec in args.toggles:
        mod, attr, old, new = spec.split(":", 3)
        m = importlib.import_module("actorrt.providers.cpu." + mod)
        if not hasattr(m, attr):
            ap.error(f"{mod} has no attribute {attr}")
        toggles.append((m, attr, eval(old, {}), eval(new, {})))

    def use(new: bool) -> None:
        for m, attr, old, nv in toggles:
            setattr(m, attr, nv if new else old)

    for name in args.models.split(","):
        model, feeds = bench_models.build(name)
        raw = model.SerializeToString()
        opts = actorrt.SessionOptions(intra_op_num_threads=args.threads)
        s = actorrt.InferenceSession(raw, opts)
        sess = {False: s, True: actorrt.InferenceSession(raw, opts) if args.sessions else s}
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        o = ort.InferenceSession(raw, so, providers=["CPUExecutionProvider"])
        want = o.run(None, feeds)[0]
        for new in (False, True):
            use(new)
            got = sess[new].run(None, feeds)[0]
            err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
            print(f"{name} {'new' if new else 'old'}: err {err:.1e}")
        times = {"old": [], "new": [], "ort": []}
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for key in order + ("ort",):
                if key != "ort":
                    use(key == "new")
                f = (lambda: o.run(None, feeds)) if key == "ort" else \
                    (lambda: sess[key == "new"].run(None, feeds))
                t0, n = time.perf_counter(), 0
                while n == 0 or time.perf_counter() - t0 < args.budget:
                    f()
                    n += 1
                times[key].append((time.perf_counter() - t0) / n * 1e3)
        use(False)
        for x in set(sess.values()):
            x.close()
        med = {k: statistics.median(v) for k, v in times.items()}
        per = " ".join(f"{b / a:.2f}" for a, b in zip(times["old"], times["new"]))
        print(f"{name} {args.threads}t: old {med['old']:.2f} ms, new {med['new']:.2f} ms, "
              f"onnxruntime {med['ort']:.2f} ms | old/ort {med['old'] / med['ort']:.2f}, "
              f"new/ort {med['new'] / med['ort']:.2f} | new/old per round {per}", flush=True)


if __name__ == "__main__":
    main()
