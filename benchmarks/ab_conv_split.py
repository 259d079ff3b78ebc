"""Interleaved A/B of the convolution / pooling split on the compiled partner
threads (``_conv_split.ENABLED`` on vs off: the partners vs the Python chunk
loop of ``_parallel.run_chunks``, main's path) in one process, onnxruntime
timed in the same rounds.

    python benchmarks/ab_conv_split.py [--models resnetish,mobilenetish,densenet121,inception_v2]
                                       [--threads 2] [--rounds 7] [--budget 0.3]

One actorrt session per model at ``--threads`` (and one onnxruntime session,
``intra_op_num_threads`` the same, ``inter_op_num_threads = 1``); each round
times the model for ``--budget`` seconds with the split on, off and
onnxruntime in a shuffled order (onnxruntime's pool spins after its runs and
the partners linger after theirs: a fixed order taxes whichever comes next);
prints the medians (wall ms per run) and the medians of the
per-round ratios on/ort, off/ort and on/off (below 1: the split helps).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnetish,mobilenetish,densenet121,inception_v2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--budget", type=float, default=0.3)
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
    from actorrt.providers.cpu import _conv_split

    def timed(fn):
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < args.budget:
            fn()
            n += 1
        return (time.perf_counter() - t0) / n * 1e3

    for name in args.models.split(","):
        m, feeds = bench_models.build(name)
        raw = m.SerializeToString()
        s = actorrt.InferenceSession(raw, actorrt.SessionOptions(intra_op_num_threads=args.threads))
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
        o = ort.InferenceSession(raw, so, providers=["CPUExecutionProvider"])
        for flag in (True, False, True):
            _conv_split.ENABLED = flag
            for _ in range(5):
                s.run(None, feeds)
        o.run(None, feeds)
        res = {"on": [], "off": [], "ort": []}
        rnd = random.Random(0)
        for _ in range(args.rounds):
            order = ["on", "off", "ort"]
            rnd.shuffle(order)
            for key in order:
                if key == "ort":
                    res[key].append(timed(lambda: o.run(None, feeds)))
                    continue
                _conv_split.ENABLED = key == "on"
                res[key].append(timed(lambda: s.run(None, feeds)))
        _conv_split.ENABLED = True
        on, off, ref = (np.array(res[k]) for k in ("on", "off", "ort"))

        def med(a):
            return f"{np.median(a):.2f} [{a.min():.2f}-{a.max():.2f}]"

        print(f"{name:<13} {args.threads}t on {np.median(on):.3f} ms, off {np.median(off):.3f} ms, "
              f"ort {np.median(ref):.3f} ms | on/ort {med(on / ref)}  off/ort {med(off / ref)}  "
              f"on/off {med(on / off)}", flush=True)
        s.close()


if __name__ == "__main__":
    main()
