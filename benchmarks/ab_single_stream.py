"""Interleaved A/B of single-stream greedy decode between two checkouts of
this repository (e.g. this branch and the commit it started from, in a
detached worktree): each round runs one subprocess per checkout (its own
``PYTHONPATH``), alternating which goes first; each subprocess opens the
engine at its defaults (accuracy level 4), warms up, and reports the best
decode tok/s of ``--runs`` requests of ``--new-tokens`` tokens after the same
prompt. Prints every round's pair and the median of the per-round ratios.

    python benchmarks/ab_single_stream.py --a . --b /path/to/base [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_WORKER = r"""
import json, sys, trio
from actorrt.genai import SamplingParams, open_engine
from actorrt.providers.cpu.llm import _contrib_numba
_contrib_numba.set_num_threads(2)
prompt, new, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
async def main():
    async with open_engine("smollm2", max_batch=1) as engine:
        await engine.generate(prompt, SamplingParams(max_new_tokens=8))
        best = 0.0
        for _ in range(runs):
            r = await engine.generate(prompt, SamplingParams(max_new_tokens=new, ignore_eos=True))
            best = max(best, r.decode_tokens_per_s)
        return best
print(json.dumps({"decode": trio.run(main)}))
"""

PROMPT = ("The history of the city of Paris begins in the 3rd century BC, when a Celtic "
          "people called the Parisii settled on an island in the river Seine.")


def one(tree: str, new: int, runs: int) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    r = subprocess.run([sys.executable, "-c", _WORKER, PROMPT, str(new), str(runs)],
                       capture_output=True, text=True, env=env, cwd=os.path.abspath(tree))
    if r.returncode != 0:
        raise RuntimeError(f"{tree}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["decode"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="checkout A (e.g. this one)")
    ap.add_argument("--b", required=True, help="checkout B (e.g. the base commit)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()
    ratios = []
    for i in range(args.rounds):
        order = (("a", args.a), ("b", args.b)) if i % 2 == 0 else (("b", args.b), ("a", args.a))
        got = {k: one(t, args.new_tokens, args.runs) for k, t in order}
        ratios.append(got["a"] / got["b"])
        print(f"round {i + 1}: A {got['a']:.1f} tok/s, B {got['b']:.1f} tok/s, "
              f"A/B {ratios[-1]:.3f}", flush=True)
    print(f"median A/B over {args.rounds} rounds: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
