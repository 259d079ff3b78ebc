"""Interleaved A/B of the compiled partner threads (``_sgemm_numba.USE_PARTNERS``
on vs off: the compiled team vs the Python chunk loop) in one process.

    python benchmarks/ab_partners.py [--models decode,prefill,encoder,mlp] [--threads 2]
                                     [--rounds 10] [--budget 0.15] [--partner-min-flops N]

One actorrt session per model at ``--threads``; each round times the model
for ``--budget`` seconds with the partners on, then off; prints the medians
(wall and process CPU time per run) and the median of the per-round on/off
wall ratios (below 1: the partners help).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="decode,prefill,encoder,mlp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--budget", type=float, default=0.15)
    ap.add_argument("--partner-min-flops", type=int, default=None,
                    help="_sgemm_numba.PARTNER_MIN_FLOPS for the 'on' rounds (e.g. 131072: "
                         "every decode GEMV split)")
    args = ap.parse_args()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[v] = str(args.threads)
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    sys.path.insert(0, str(here.parent))
    import numpy as np

    import actorrt
    import bench_models
    from actorrt.providers.cpu import _sgemm_numba
    if args.partner_min_flops is not None:
        _sgemm_numba.PARTNER_MIN_FLOPS = args.partner_min_flops

    for name in args.models.split(","):
        m, feeds = bench_models.build(name)
        s = actorrt.InferenceSession(m.SerializeToString(),
                                     actorrt.SessionOptions(intra_op_num_threads=args.threads))
        for _ in range(10):
            s.run(None, feeds)
        res: dict[bool, list] = {True: [], False: []}
        for _ in range(args.rounds):
            for flag in (True, False):
                _sgemm_numba.USE_PARTNERS = flag
                t0, c0, n = time.perf_counter(), time.process_time(), 0
                while time.perf_counter() - t0 < args.budget:
                    s.run(None, feeds)
                    n += 1
                res[flag].append(((time.perf_counter() - t0) / n * 1e3,
                                  (time.process_time() - c0) / n * 1e3))
        _sgemm_numba.USE_PARTNERS = True
        on, off = np.median(res[True], 0), np.median(res[False], 0)
        ratio = float(np.median([x[0] / y[0] for x, y in zip(res[True], res[False])]))
        print(f"{name:<10} {args.threads}t partners on {on[0]:.3f} ms (cpu {on[1]:.3f}), "
              f"off {off[0]:.3f} ms (cpu {off[1]:.3f}), on/off {ratio:.2f}")
        s.close()


if __name__ == "__main__":
    main()
