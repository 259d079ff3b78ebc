"""Per-operator time of one model in actorrt against onnxruntime's profiler.

    python benchmarks/profile_ops.py MODEL [--threads 1] [--runs 10] [--nodes]

``MODEL`` is one of :mod:`bench_models`' names. Both engines run the model in
this process with the same thread count (BLAS / numba / OpenMP pools sized
before numpy loads); actorrt's per-node spans (``SessionOptions(trace="ops")``)
and onnxruntime's ``*_kernel_time`` profile events are summed per operator
type (``--nodes``: per node) and printed as milliseconds per run, with each
engine's wall time per run (the difference to the kernels' sum is dispatch
and per-run cost). Figures from a shared machine move between runs: compare
the two engines of one run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--nodes", action="store_true", help="per node instead of per operator type")
    args = ap.parse_args()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[v] = str(args.threads)
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    sys.path.insert(0, str(here.parent))
    import onnxruntime as ort

    import actorrt
    import bench_models

    m, feeds = bench_models.build(args.model)
    raw = m.SerializeToString()
    key = (lambda name, op: (name, op)) if args.nodes else (lambda name, op: op)

    a = actorrt.InferenceSession(raw, actorrt.SessionOptions(intra_op_num_threads=args.threads,
                                                              trace="ops"))
    for _ in range(3):
        a.run(None, feeds)
    a.session.tracer.clear()
    t0 = time.perf_counter()
    for _ in range(args.runs):
        a.run(None, feeds)
    wall_a = (time.perf_counter() - t0) / args.runs * 1e3
    ours = collections.defaultdict(float)
    for s in a.session.tracer.spans:
        if s.cat == "op":
            ours[key(s.name, s.op_type)] += s.dur_us / args.runs / 1e3
    a.close()

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    o = ort.InferenceSession(raw, so, providers=["CPUExecutionProvider"])
    for _ in range(3):
        o.run(None, feeds)
    t0 = time.perf_counter()
    for _ in range(args.runs):
        o.run(None, feeds)
    wall_o = (time.perf_counter() - t0) / args.runs * 1e3
    path = o.end_profiling()
    theirs = collections.defaultdict(float)
    for e in json.loads(Path(path).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            theirs[key(e["name"][:-len("_kernel_time")], e["args"]["op_name"])] += \
                e["dur"] / (args.runs + 3) / 1e3
    os.remove(path)

    print(f"{args.model}, {args.threads} thread(s): actorrt {wall_a:.2f} ms/run "
          f"(kernels {sum(ours.values()):.2f}), onnxruntime {wall_o:.2f} ms/run "
          f"(kernels {sum(theirs.values()):.2f})")
    for label, agg in (("actorrt", ours), ("onnxruntime", theirs)):
        for k, v in sorted(agg.items(), key=lambda kv: -kv[1]):
            print(f"  {label:<12} {str(k)[:60]:<60} {v:9.3f} ms")


if __name__ == "__main__":
    main()
