"""Serving benchmark of the engine's KV cache layouts (issue #23), same run:
the block-paged cache (``kv_layout="paged"``, the default) against the old
contiguous one (``kv_layout="contiguous"``), on the default model.

1. **Trace**: a seeded Poisson arrival trace (``--requests`` requests,
   prompts ``--min-prompt``..``--max-prompt`` tokens, outputs
   ``--min-output``..``--max-output`` greedy tokens, ``--max-batch`` in
   flight): time to first token p50/p99 (from arrival), inter-token latency
   p50/p99 (gaps between a stream's tokens as they reach the caller: decode
   runs hand tokens over every 25 ms, so gaps come in bursts), aggregate
   tok/s (generated tokens / makespan) and the peak KV bytes the host
   provider accounted (``peak_by_role["kv-cache"]``).
2. **Join cost**: ``--join-context``-token requests decoding (1 and 15 of
   them); the first decode step in which a newcomer takes part (its prefill
   excluded, the contiguous layout's batch rebuild included) against the
   median plain step of the same batch size. Steps go one at a time
   through the event loop (``decode_run_steps = 1``) so each is timed.
3. **Prefix**: 16 requests, one after another, sharing a ``--system``-token
   system prompt (a distinct 16-token suffix each), with and without prefix
   caching: prompt tokens computed and time to first token of the 2nd..16th.

4. **KV dtype** (``--kv-dtype``: this section only): decode tok/s (the
   engine statistics') of ``--dtype-streams`` streams of ``--dtype-tokens``
   greedy tokens after ``--dtype-context``-token prompts, float16 against
   float32 pools, rounds interleaved, and the peak KV bytes of each.

The machine's speed drifts: compare only ratios of the same run. Full run
(the issue's sizes; minutes on 2 cores)::

    python benchmarks/bench_serving.py

Quick run::

    python benchmarks/bench_serving.py --requests 16 --max-prompt 256 \\
        --max-output 48 --join-context 256 --system 256
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import trio

from actorrt.genai import SamplingParams, open_engine, prepare_model
from actorrt.genai.engine import Engine


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if len(xs) else float("nan")


def ids(rng, n, vocab=49152):
    return rng.integers(100, vocab - 100, n).tolist()


async def trace(folder, layout: str, args) -> dict:
    rng = np.random.default_rng(args.seed)
    gaps = np.cumsum(rng.exponential(1.0 / args.rate, args.requests))
    reqs = [(float(t), ids(rng, int(rng.integers(args.min_prompt, args.max_prompt + 1))),
             int(rng.integers(args.min_output, args.max_output + 1))) for t in gaps]
    ttft, itl, tokens = [], [], 0
    async with open_engine(folder, kv_layout=layout, max_batch=args.max_batch) as engine:
        cpu = engine.session._providers[0]
        await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))  # warm
        t0 = time.perf_counter()

        async def one(at, prompt, new):
            nonlocal tokens
            await trio.sleep_until(t_start + at)
            arrive = time.perf_counter()
            last = None
            async for _ in engine.stream(prompt, SamplingParams(max_new_tokens=new,
                                                               ignore_eos=True), details=True):
                now = time.perf_counter()
                if last is None:
                    ttft.append(now - arrive)
                else:
                    itl.append(now - last)
                last = now
                tokens += 1

        t_start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for at, prompt, new in reqs:
                nursery.start_soon(one, at, prompt, new)
        span = time.perf_counter() - t0
        peak = cpu.statistics().memory.peak_by_role.get("kv-cache", 0)
    return dict(ttft50=pct(ttft, 50), ttft99=pct(ttft, 99), itl50=pct(itl, 50),
                itl99=pct(itl, 99), tok_s=tokens / span, peak_kv=peak)


async def join_cost(folder, layout: str, active: int, args) -> tuple[float, float]:
    """(join step s, median plain step s) with ``active`` requests decoding."""
    rng = np.random.default_rng(1)
    steps: list[tuple[int, float, bool]] = []
    orig = Engine._decode_step

    async def timed(self):
        joined = [r for r in self._decoding if getattr(r, "_bench_new", False)]
        t = time.perf_counter()
        await orig(self)
        steps.append((len(self._decoding), time.perf_counter() - t, bool(joined)))
        for r in joined:
            r._bench_new = False

    Engine._decode_step = timed
    try:
        async with open_engine(folder, kv_layout=layout, max_batch=active + 1,
                               prefill_chunk=256) as engine:
            engine.decode_run_steps = 1
            params = SamplingParams(max_new_tokens=10_000, ignore_eos=True)
            ready = trio.Event()
            counts = [0] * active

            async def long(i):
                async for _ in engine.stream(ids(rng, args.join_context), params,
                                             details=True):
                    counts[i] += 1
                    if all(counts) and not ready.is_set():
                        ready.set()

            async with trio.open_nursery() as nursery:
                for i in range(active):
                    nursery.start_soon(long, i)
                await ready.wait()
                await trio.sleep(1.0)  # plain steps of the full batch
                steps.clear()
                await trio.sleep(1.0)
                plain = [dt for n, dt, j in steps if n == active and not j]

                # the newcomer: marked once its prefill is done (it then decodes)
                orig_pf = Engine._prefill_step

                async def mark(self, req):
                    await orig_pf(self, req)
                    if req in self._decoding:
                        req._bench_new = True
                Engine._prefill_step = mark
                try:
                    await engine.generate(ids(rng, 8), SamplingParams(max_new_tokens=4))
                finally:
                    Engine._prefill_step = orig_pf
                joins = [dt for n, dt, j in steps if j]
                nursery.cancel_scope.cancel()
    finally:
        Engine._decode_step = orig
    return (joins[0] if joins else float("nan")), float(np.median(plain))


async def prefix(folder, caching: bool, args) -> dict:
    rng = np.random.default_rng(2)
    system = ids(rng, args.system)
    ttft = []
    async with open_engine(folder, prefix_caching=caching) as engine:
        await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))  # warm
        before = engine.statistics().prefix_tokens_skipped
        computed = 0
        for i in range(16):
            prompt = system + ids(rng, 16)
            t = time.perf_counter()
            async for _ in engine.stream(prompt, SamplingParams(max_new_tokens=2,
                                                               ignore_eos=True), details=True):
                ttft.append(time.perf_counter() - t)
                break
            computed += len(prompt)
        while engine.statistics().active:
            await trio.sleep(0.01)
        skipped = engine.statistics().prefix_tokens_skipped - before
    return dict(computed=computed - skipped, first=ttft[0], rest=float(np.median(ttft[1:])))


async def dtype_decode(folder, kv_dtype: str, streams: int, args) -> tuple[float, int]:
    """(decode tok/s, peak KV bytes) of ``streams`` concurrent greedy
    streams on a ``kv_dtype`` paged cache (prefix caching off)."""
    rng = np.random.default_rng(args.seed + streams)
    prompts = [ids(rng, args.dtype_context) for _ in range(streams)]
    async with open_engine(folder, kv_dtype=kv_dtype, max_batch=streams,
                           prefix_caching=False) as engine:
        await engine.generate(ids(rng, 8), SamplingParams(max_new_tokens=2, ignore_eos=True))
        base = engine.statistics()
        async with trio.open_nursery() as nursery:
            for p in prompts:
                nursery.start_soon(engine.generate, p, SamplingParams(
                    max_new_tokens=args.dtype_tokens, ignore_eos=True))
        st = engine.statistics()
        peak = engine.session._providers[0].statistics().memory.peak_by_role.get("kv-cache", 0)
    toks = st.decode_tokens - base.decode_tokens
    return toks / max(st.decode_time_s - base.decode_time_s, 1e-9), peak


async def dtype_main(folder, args) -> None:
    print(f"kv dtype: decode of {args.dtype_tokens} tokens after {args.dtype_context}-token "
          f"prompts, paged cache")
    order = ["float32", "float16"]
    for streams in args.dtype_streams:
        res: dict[str, list] = {}
        for rnd in range(args.rounds):
            for dt in (order if rnd % 2 == 0 else order[::-1]):
                tps, peak = await dtype_decode(folder, dt, streams, args)
                res.setdefault(dt, []).append(tps)
                print(f"  {streams:2d} streams round {rnd} {dt}  decode {tps:7.1f} tok/s  peak KV "
                      f"{peak / 2**20:7.1f} MiB", flush=True)
        f16, f32 = np.median(res["float16"]), np.median(res["float32"])
        print(f"  {streams:2d} streams float16/float32 decode tok/s (medians): {f16 / f32:.3f}",
              flush=True)


async def main(args) -> None:
    folder = prepare_model("smollm2", progress=False)
    if args.kv_dtype:
        await dtype_main(folder, args)
        return
    layouts = ["paged", "contiguous"]
    print(f"trace: {args.requests} requests, Poisson {args.rate}/s, prompts "
          f"{args.min_prompt}-{args.max_prompt}, outputs {args.min_output}-{args.max_output}, "
          f"{args.max_batch} in flight")
    res = {}
    for rnd in range(args.rounds):
        for layout in (layouts if rnd % 2 == 0 else layouts[::-1]):
            r = await trace(folder, layout, args)
            res.setdefault(layout, []).append(r)
            print(f"  round {rnd} {layout:10s} TTFT p50 {r['ttft50'] * 1e3:7.0f} ms  p99 "
                  f"{r['ttft99'] * 1e3:7.0f} ms  ITL p50 {r['itl50'] * 1e3:6.1f} ms  p99 "
                  f"{r['itl99'] * 1e3:6.1f} ms  {r['tok_s']:6.1f} tok/s  peak KV "
                  f"{r['peak_kv'] / 2**20:7.1f} MiB", flush=True)
    if not args.skip_join:
        print(f"join cost: {args.join_context}-token requests decoding")
        for active in (1, 15):
            for layout in layouts:
                j, p = await join_cost(folder, layout, active, args)
                print(f"  {active:2d} active {layout:10s} join step {j * 1e3:7.1f} ms  plain "
                      f"{p * 1e3:6.1f} ms  ratio {j / p:5.2f}", flush=True)
    if not args.skip_prefix:
        print(f"prefix: 16 requests sharing a {args.system}-token system prompt")
        out = {}
        for caching in (True, False):
            out[caching] = r = await prefix(folder, caching, args)
            print(f"  caching {'on ' if caching else 'off'} prompt tokens computed "
                  f"{r['computed']:6d}  TTFT 1st {r['first'] * 1e3:6.0f} ms  2nd..16th median "
                  f"{r['rest'] * 1e3:6.0f} ms", flush=True)
        print(f"  2nd..16th TTFT off/on: {out[False]['rest'] / out[True]['rest']:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--rate", type=float, default=4.0, help="arrivals a second")
    ap.add_argument("--min-prompt", type=int, default=16)
    ap.add_argument("--max-prompt", type=int, default=1024)
    ap.add_argument("--min-output", type=int, default=16)
    ap.add_argument("--max-output", type=int, default=256)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--join-context", type=int, default=1000)
    ap.add_argument("--system", type=int, default=512)
    ap.add_argument("--skip-join", action="store_true")
    ap.add_argument("--skip-prefix", action="store_true")
    ap.add_argument("--kv-dtype", action="store_true",
                    help="only the float16 vs float32 KV decode comparison")
    ap.add_argument("--dtype-context", type=int, default=512)
    ap.add_argument("--dtype-tokens", type=int, default=64)
    ap.add_argument("--dtype-streams", type=lambda v: [int(x) for x in v.split(",")],
                    default=[1, 8])
    trio.run(main, ap.parse_args())
