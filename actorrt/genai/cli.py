"""``actorrt generate`` and ``actorrt bench decode``."""

from __future__ import annotations

import argparse
import sys
import time

import trio

__all__ = ["generate_main", "bench_decode_main"]


def _params(args: argparse.Namespace):
    from .sampling import SamplingParams

    greedy = args.greedy or args.temperature in (None, 0.0)
    return SamplingParams(max_new_tokens=args.max_new_tokens,
                          temperature=0.0 if greedy else args.temperature,
                          top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def generate_main(args: argparse.Namespace) -> int:
    """Stream a continuation to stdout; ``--stats`` prints tok/s to stderr."""
    from .._errors import ActorRTError
    from .engine import open_engine

    try:
        params = _params(args)
    except ActorRTError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt

    async def main() -> None:
        async with open_engine(args.model) as engine:
            if not args.chat:
                sys.stdout.write(args.prompt)
                sys.stdout.flush()
            res = None
            async for item in engine._run(prompt, params):
                if isinstance(item, str):
                    sys.stdout.write(item)
                    sys.stdout.flush()
                else:
                    res = item
            sys.stdout.write("\n")
            if args.stats and res is not None:
                print(f"prompt: {res.prompt_tokens} tokens, {res.prompt_tokens_per_s:.1f} tok/s; "
                      f"decode: {len(res.token_ids)} tokens, {res.decode_tokens_per_s:.1f} tok/s; "
                      f"finish: {res.finish_reason}", file=sys.stderr)

    try:
        trio.run(main)
    except ActorRTError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    return 0


def bench_decode_main(args: argparse.Namespace) -> int:
    """Aggregate and per-stream decode tok/s at each concurrency."""
    from .engine import open_engine
    from .sampling import SamplingParams

    levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    prompts = ["The capital of France is", "Once upon a time", "The best way to learn is",
               "In 1969, humans", "Water boils at", "My favourite food is",
               "The meaning of life is", "Computers are"]

    async def main() -> None:
        async with open_engine(args.model, max_batch=max(levels)) as engine:
            params = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
            await engine.generate(prompts[0], SamplingParams(max_new_tokens=4))  # warm up
            print(f"{'streams':>8} {'aggregate tok/s':>16} {'per-stream tok/s':>17}")
            for n in levels:
                results = [None] * n

                async def one(i):
                    results[i] = await engine.generate(prompts[i % len(prompts)], params)

                t0 = time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for i in range(n):
                        nursery.start_soon(one, i)
                el = time.perf_counter() - t0
                toks = sum(len(r.token_ids) for r in results)
                per = sum(r.decode_tokens_per_s for r in results) / n
                print(f"{n:>8} {toks / el:>16.1f} {per:>17.1f}")

    trio.run(main)
    return 0
