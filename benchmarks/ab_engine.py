"""Interleaved A/B of our engine's concurrency curve and prefill between two
checkouts of this repository (e.g. this branch and a detached worktree of
the commit it started from). Each round runs ``bench_genai.py
--batch-worker`` once per checkout (its own ``PYTHONPATH``; the order
alternates), on the same job: n concurrent greedy streams of 64 tokens after
the same prompt (aggregate decode tok/s from the engine's statistics,
prefill excluded) and one-request prefill tok/s at the given prompt lengths
(prefix caching off), 2 threads. Prints each worker's figures, then per
cell the two medians and the per-round ratios A/B.

    python benchmarks/ab_engine.py --a . --b /path/to/base [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import genai_peers  # noqa: E402
from bench_genai import PROMPT  # noqa: E402


def _job(concurrency: list[int], lengths: list[int]) -> dict:
    from actorrt.genai.models import prepare_model
    from actorrt.genai.tokenizer import load_tokenizer

    tok = load_tokenizer(prepare_model("smollm2"))
    ids = tok.encode(PROMPT)
    text = (Path(__file__).parent / "data" / "python_license.txt").read_text()
    long_ids = tok.encode(text)
    while len(ids) + len(long_ids) < max(lengths):
        long_ids = long_ids + tok.encode("\n\n" + text)
    prefill = {n: (ids if n == len(ids) else (ids + long_ids)[:n]) for n in lengths}
    return genai_peers.batch_job(ids, prefill, concurrency, 64, 2, rounds=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="checkout A (its root folder)")
    ap.add_argument("--b", required=True, help="checkout B")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--prefill", default="512,2048", help="prompt lengths (tokens)")
    args = ap.parse_args()
    trees = [str(Path(args.a).resolve()), str(Path(args.b).resolve())]
    job = _job([int(x) for x in args.concurrency.split(",")],
               [int(x) for x in args.prefill.split(",")])
    res: list[list[dict]] = [[], []]
    for r in range(args.rounds):
        for side in (0, 1) if r % 2 == 0 else (1, 0):
            t = trees[side]
            env = {**os.environ, "PYTHONPATH": t}
            p = subprocess.run([sys.executable, str(Path(t) / "benchmarks" / "bench_genai.py"),
                                "--batch-worker", json.dumps(job)],
                               capture_output=True, text=True, env=env)
            if p.returncode:
                raise SystemExit(f"worker in {t} failed:\n{p.stderr[-2000:]}")
            out = json.loads(p.stdout.strip().splitlines()[-1])
            res[side].append(out)
            print(t, json.dumps({k: out[k] for k in ("curve", "prefill", "rss_mb")}), flush=True)
    med = statistics.median
    for key, label in (("curve", "streams"), ("prefill", "prompt tokens")):
        for n in res[0][0][key]:
            ra = [x[key][n] for x in res[0]]
            rb = [x[key][n] for x in res[1]]
            print(f"{label} {n}: A {med(ra):.1f} B {med(rb):.1f} tok/s; A/B per round "
                  + ", ".join(f"{x / y:.2f}" for x, y in zip(ra, rb)))


if __name__ == "__main__":
    main()
