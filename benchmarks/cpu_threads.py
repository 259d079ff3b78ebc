"""Where a model's CPU time goes, per thread, at 1 and 2 intra-op threads,
for one or more source trees (same-run A/B).

    python benchmarks/cpu_threads.py [--models encoder,mobilenetish,decode]
        [--threads 1,2] [--trees .,/work/wt/base] [--rounds 3] [--budget 1.0]

Each (round, tree, thread count) runs in a child process with that tree
first on ``sys.path`` (``PYTHONPATH``) and the BLAS / numba / OpenMP pools
sized before numpy loads (as :mod:`bench_models`); the rounds interleave the
trees, in alternating order (the first child of a round measured up to 30 %
faster wall time on the loaded machine, so a fixed order biases the ratio).
Per model the child runs one actorrt session (``intra_op_num_threads``) for about ``--budget`` seconds and reports, per run: wall ms, process CPU ms
(every thread), and the CPU ms of each thread group: ``main`` (the calling
thread), the session's worker thread(s), the compiled partner threads
(``actorrt-cpu-partner-*``), the chunk-loop helpers (``actorrt-cpu-helper-*``)
and ``native`` (threads Python does not know: OpenBLAS's pool, numba's
workers). A second thread's CPU that buys no wall time is spin waste.
Timings on a shared machine move between runs: compare trees of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _group(name: str) -> str:
    for p in ("actorrt-cpu-partner", "actorrt-cpu-helper"):
        if name.startswith(p):
            return p[len("actorrt-cpu-"):]
    if name == "MainThread":
        return "main"
    return "py:" + name.split("-")[0].split("_")[0][:16]


def _thread_cpu() -> dict[str, float]:
    """CPU seconds per thread group so far (Python threads by name)."""
    import threading
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            c = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError, ProcessLookupError):
            continue
        g = _group(t.name)
        out[g] = out.get(g, 0.0) + c
    return out


def child(threads: int, models: list[str], budget: float) -> None:
    sys.path.insert(0, str(HERE))
    import actorrt
    import bench_models
    for name in models:
        m, feeds = bench_models.build(name)
        a = actorrt.InferenceSession(m.SerializeToString(),
                                     actorrt.SessionOptions(intra_op_num_threads=threads))
        try:
            for _ in range(3):
                a.run(None, feeds)
            t_end = time.perf_counter() + 0.2
            while time.perf_counter() < t_end:
                a.run(None, feeds)
            g0, c0, t0 = _thread_cpu(), time.process_time(), time.perf_counter()
            n = 0
            while time.perf_counter() - t0 < budget:
                a.run(None, feeds)
                n += 1
            wall, cpu, g1 = time.perf_counter() - t0, time.process_time() - c0, _thread_cpu()
            groups = {k: (v - g0.get(k, 0.0)) / n * 1e3 for k, v in g1.items()}
            groups["native"] = cpu / n * 1e3 - sum(groups.values())
            print(json.dumps({"model": name, "threads": threads, "wall_ms": wall / n * 1e3,
                              "cpu_ms": cpu / n * 1e3, "groups": groups}), flush=True)
        finally:
            a.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="encoder,mobilenetish,decode")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--trees", default=".", help="comma-separated source trees (A/B)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per model per child")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    if args.child:
        child(args.child, models, args.budget)
        return
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    rows: list[dict] = []
    for r in range(args.rounds):
        for t in [int(x) for x in args.threads.split(",")]:
            for tree in (trees if r % 2 == 0 else trees[::-1]):  # alternate the order
                env = dict(os.environ, PYTHONPATH=tree)
                for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                          "NUMBA_NUM_THREADS"):
                    env[v] = str(t)
                p = subprocess.run([sys.executable, __file__, "--child", str(t), "--models",
                                    ",".join(models), "--budget", str(args.budget)],
                                   env=env, stdout=subprocess.PIPE, text=True, cwd=tree)
                for line in p.stdout.splitlines():
                    if line.startswith("{"):
                        row = json.loads(line)
                        row["tree"], row["round"] = tree, r
                        rows.append(row)
                if p.returncode:
                    print(f"child {tree} {t}t exited {p.returncode}", file=sys.stderr)
    import statistics as st
    print("per run, medians over rounds: wall ms, process CPU ms, CPU ms per thread group")
    for m in models:
        for t in [int(x) for x in args.threads.split(",")]:
            for tree in trees:
                rs = [x for x in rows if x["model"] == m and x["threads"] == t and x["tree"] == tree]
                if not rs:
                    continue
                gs = sorted({k for x in rs for k in x["groups"]})
                g = {k: st.median(x["groups"].get(k, 0.0) for x in rs) for k in gs}
                print(f"{m:<13} {t}t {Path(tree).name:<8} wall {st.median(x['wall_ms'] for x in rs):8.3f}"
                      f"  cpu {st.median(x['cpu_ms'] for x in rs):8.3f}  "
                      + " ".join(f"{k}={v:.2f}" for k, v in g.items() if abs(v) >= 0.005))
            if len(trees) == 2:
                ratios = []
                for r in range(args.rounds):
                    a = [x for x in rows if x["model"] == m and x["threads"] == t and x["round"] == r]
                    by = {x["tree"]: x for x in a}
                    if all(tr in by for tr in trees):
                        ratios.append((by[trees[0]]["wall_ms"] / by[trees[1]]["wall_ms"],
                                       by[trees[0]]["cpu_ms"] / by[trees[1]]["cpu_ms"]))
                if ratios:
                    print(f"{'':<13} {t}t {Path(trees[0]).name}/{Path(trees[1]).name}: wall "
                          f"{st.median(x[0] for x in ratios):.3f} cpu {st.median(x[1] for x in ratios):.3f}"
                          f" (per-round median)")


if __name__ == "__main__":
    main()
