"""Micro-benchmark of the int8 tile kernel (issue #20): GMAC/s a thread of
``_int8_tiles._cols`` (what the fused decoder stack's projection stages and
``gemm_i8`` call) at M rows on SmolLM2-135M's projection shapes, thread CPU
time (``time.thread_time``: one thread, cache-warm weights), interleaved
between checkouts of this repository: each round runs one subprocess per
checkout (its own ``PYTHONPATH``, its own numba cache), alternating which
goes first, and every (shape, M) keeps its best time over the rounds.

    python benchmarks/bench_int8_kernel.py --a . --b /path/to/base [--rounds 3]
        [--rows 1,4,8,16,64,512] [--bits 4] [--shapes 576x576,192x576,...]

A shape is ``NxK`` (output columns x inner size); the default set is the
model's q/o (576x576), k/v (192x576), gate/up (1536x576), down (576x1536)
and the LM head (49152x576, run at fewer rows: its weights are 14 MB).
The weights are random 4-bit (or 8-bit) blocks with zero points (Q4_1's
layout: float16-exact scales embedded in the weight stream).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_WORKER = r"""
import json, sys, time
import numpy as np
from actorrt.providers.cpu.llm import _contrib_int8 as ci
from actorrt.providers.cpu.llm import _contrib_quant as cq
from actorrt.providers.cpu.llm import _int8_tiles as it
bits, rows, shapes, budget = int(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]), float(sys.argv[4])
rng = np.random.default_rng(0)
res = {}
for n, k in shapes:
    nb = k // 32
    b = rng.integers(0, 256, (n, nb * (16 if bits == 4 else 32)), dtype=np.uint8)
    s = (rng.random((n, nb)) * 0.02 + 0.001).astype(np.float16).astype(np.float32)
    z = rng.choice([0, 1, 2, 4, 8] if bits == 4 else [0, 64, 128, 192], (n, nb)).astype(np.uint8)
    if bits == 4:
        zp = np.zeros((n, -(-nb // 2)), np.uint8)
        for j in range(nb):
            zp[:, j // 2] |= z[:, j] << (4 * (j % 2))
    else:
        zp = z
    p = cq.pack_nbits(b, s, zp, k=k, n=n, bits=bits, block_size=32, use_numba=True, int8=True)
    for m in rows:
        if n * m * k > (1 << 31):  # the LM head at prompt sizes: minutes a round
            continue
        a = rng.standard_normal((m, k)).astype(np.float32)
        xq, sx, xsum = ci.quantize_rows(a)
        sx_t = np.zeros((m // 8, nb, 8), np.float32)
        out = np.empty((m, n), np.float32)
        it._cols(xq, sx, xsum, sx_t, sx_t, p.qi, p.scales, p.dz, out, 0, n, 0)  # compile, warm
        inner = max(1, (1 << 24) // (m * n * k))  # >= ~0.5 ms a measurement
        best, reps, spent = 1e30, 0, 0.0
        while reps < 3 or spent < budget:
            t0 = time.thread_time()
            for _ in range(inner):
                it._cols(xq, sx, xsum, sx_t, sx_t, p.qi, p.scales, p.dz, out, 0, n, 0)
            dt = (time.thread_time() - t0) / inner
            best, reps, spent = min(best, dt), reps + 1, spent + dt * inner
        res[f"{n}x{k}/M{m}"] = m * n * k / best / 1e9
print(json.dumps(res))
"""

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]


def _run(tree: str, args) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), NUMBA_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", _WORKER, str(args.bits), json.dumps(args.rows),
                          json.dumps(args.shapes), str(args.budget)],
                         env=env, cwd=os.path.abspath(tree), capture_output=True, text=True,
                         check=False)  # cwd: ``python -c`` puts it first on sys.path
    if out.returncode:
        raise SystemExit(f"worker in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default=".", help="checkout A (default: this one)")
    ap.add_argument("--b", default=None, help="checkout B (optional)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bits", type=int, default=4, choices=(4, 8))
    ap.add_argument("--rows", default="1,4,8,16,64,512")
    ap.add_argument("--shapes", default=None, help="NxK,NxK,... (default: SmolLM2's)")
    ap.add_argument("--budget", type=float, default=0.2,
                    help="thread CPU seconds per (shape, M) and round (default 0.2)")
    args = ap.parse_args()
    args.rows = [int(r) for r in args.rows.split(",")]
    args.shapes = ([[int(v) for v in s.split("x")] for s in args.shapes.split(",")]
                   if args.shapes else SHAPES)
    trees = {"A": args.a} if args.b is None else {"A": args.a, "B": args.b}
    best: dict[str, dict[str, float]] = {t: {} for t in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for t in order:
            got = _run(trees[t], args)
            print(f"round {r} {t}: " + json.dumps({k: round(v, 1) for k, v in got.items()}),
                  flush=True)
            for key, v in got.items():
                best[t][key] = max(best[t].get(key, 0.0), v)
    keys = list(best["A"])
    print("\nbest GMAC/s a thread over the rounds:")
    print("| shape/M | " + " | ".join(trees[t] for t in trees) +
          (" | A/B |" if len(trees) == 2 else " |"))
    for key in keys:
        vals = [best[t].get(key, float("nan")) for t in trees]
        ratio = f" | {vals[0] / vals[1]:.2f} |" if len(vals) == 2 else " |"
        print(f"| {key} | " + " | ".join(f"{v:.1f}" for v in vals) + ratio)


if __name__ == "__main__":
    main()
