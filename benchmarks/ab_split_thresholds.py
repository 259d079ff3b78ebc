"""Interleaved A/B of the convolution split's per-call overhead and where it
starts: ``old`` (main: per-call ``np.array`` parameter blocks, a new phase
buffer per call, thresholds 8M conv flops / 1M depthwise / 256K pool work),
``blocks`` (the template blocks and pooled buffers, old thresholds) and
``new`` (template blocks, the module's current thresholds or ``--new``'s; with
ReduceMean's ones-vector product, which ``old`` and ``blocks`` leave off),
onnxruntime timed in the same rounds.

    python benchmarks/ab_split_thresholds.py [--models resnetish,mobilenetish,densenet121,inception_v2]
                                             [--threads 2] [--rounds 15] [--budget 0.3]
                                             [--new CONV,DW,POOL (log2 thresholds)]

One actorrt session per model at ``--threads`` (one onnxruntime session with
``intra_op_num_threads`` the same, ``inter_op_num_threads = 1``); each round
times the model for ``--budget`` seconds in each configuration in a shuffled
order; prints the medians (wall ms per run) and the medians [min-max] of the
per-round ratios new/old, blocks/old, new/ort and old/ort (below 1: faster).
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
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--budget", type=float, default=0.3)
    ap.add_argument("--new", default="", help="log2 thresholds conv,dw,pool for 'new'")
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
    from actorrt.providers.cpu import _conv_direct, _conv_split, reduce

    cur = (_conv_split.MIN_CONV_FLOPS, _conv_split.MIN_DEPTHWISE_WORK, _conv_split.MIN_POOL_WORK)
    if args.new:
        cur = tuple(1 << int(v) for v in args.new.split(","))
    old = (1 << 23, 1 << 20, 1 << 18)
    configs = {"old": (False, old), "blocks": (True, old), "new": (True, cur)}
    print(f"thresholds old {old}, new {cur}", flush=True)

    def use(key):
        blocks, (conv, dw, pool) = configs[key]
        _conv_split.SPLIT_BLOCKS = _conv_direct.REUSE_BUFFERS = blocks
        reduce.MEAN_DOT = key == "new"
        _conv_split.MIN_CONV_FLOPS, _conv_split.MIN_DEPTHWISE_WORK = conv, dw
        _conv_split.MIN_POOL_WORK = pool

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
        for key in list(configs) * 2:
            use(key)
            for _ in range(3):
                s.run(None, feeds)
        o.run(None, feeds)
        res = {k: [] for k in (*configs, "ort")}
        rnd = random.Random(0)
        for _ in range(args.rounds):
            order = list(res)
            rnd.shuffle(order)
            for key in order:
                if key == "ort":
                    res[key].append(timed(lambda: o.run(None, feeds)))
                    continue
                use(key)
                res[key].append(timed(lambda: s.run(None, feeds)))
        use("new")
        a = {k: np.array(v) for k, v in res.items()}

        def med(r):
            return f"{np.median(r):.3f} [{r.min():.2f}-{r.max():.2f}]"

        print(f"{name:<13} {args.threads}t old {np.median(a['old']):.3f} ms, blocks "
              f"{np.median(a['blocks']):.3f}, new {np.median(a['new']):.3f}, ort "
              f"{np.median(a['ort']):.3f} | new/old {med(a['new'] / a['old'])}  blocks/old "
              f"{med(a['blocks'] / a['old'])}  new/ort {med(a['new'] / a['ort'])}  old/ort "
              f"{med(a['old'] / a['ort'])}", flush=True)
        s.close()


if __name__ == "__main__":
    main()
