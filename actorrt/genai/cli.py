"""``actorrt generate`` and ``actorrt bench decode``."""

from __future__ import annotations

import argparse
import os
import sys
import time

import trio

__all__ = ["generate_main", "bench_decode_main"]


def _params(args: argparse.Namespace):
    """SamplingParams from the flags; sampling-only flags without a sampling
    temperature are an error rather than silently ignored.

    Raises:
        GenerationError: conflicting or out-of-range flags.
    """
    from .._errors import GenerationError
    from .sampling import SamplingParams

    sampling = args.temperature not in (None, 0.0)
    if args.greedy and sampling:
        raise GenerationError("--greedy and --temperature > 0 contradict each other")
    if not sampling:
        given = [f for f, v in (("--top-k", args.top_k), ("--top-p", args.top_p),
                                ("--seed", args.seed)) if v is not None]
        if given:
            raise GenerationError(f"{', '.join(given)} only apply when sampling: add "
                                  f"--temperature T (> 0); the default is greedy")
    return SamplingParams(max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature if sampling else 0.0,
                          top_k=args.top_k or 0,
                          top_p=1.0 if args.top_p is None else args.top_p, seed=args.seed)


def generate_main(args: argparse.Namespace) -> int:
    """Stream a continuation to stdout; ``--stats`` prints tok/s to stderr."""
    from .._errors import ActorRTError
    from ..cli import one_line
    from .engine import open_engine

    try:
        params = _params(args)
    except ActorRTError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    # argv bytes that were not UTF-8 in the locale's encoding arrive as lone
    # surrogates: the original bytes, read as UTF-8 (U+FFFD where invalid)
    try:
        args.prompt = os.fsencode(args.prompt).decode("utf-8", errors="replace")
    except UnicodeEncodeError:  # text the filesystem encoding cannot hold: not from argv
        pass
    prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt

    async def main() -> None:
        async with open_engine(args.model, accuracy_level=args.accuracy_level,
                               kv_dtype=getattr(args, "kv_dtype", None)) as engine:
            nonlocal params
            if not (args.greedy or args.temperature is not None or args.top_k is not None
                    or args.top_p is not None):  # the model folder's sampling defaults
                import attrs

                params = attrs.evolve(engine.default_params, max_new_tokens=params.max_new_tokens,
                                      seed=params.seed)
            await warm_up(engine)  # compiling the kernels is not prompt time
            if not args.chat:
                _write(args.prompt)
            stream = engine.stream(prompt, params)
            async for piece in stream:
                _write(piece)
            res = stream.result
            _write("\n")
            if args.stats and res is not None:
                print(f"prompt: {res.prompt_tokens} tokens, {res.prompt_tokens_per_s:.1f} tok/s; "
                      f"decode: {len(res.token_ids)} tokens, {res.decode_tokens_per_s:.1f} tok/s; "
                      f"finish: {res.finish_reason}", file=sys.stderr)

    return _run_reporting(main)


#: a warm-up slower than this (s) is announced with one line on stderr
WARM_UP_NOTICE_S = 2.0
WARM_UP_NOTICE = ("actorrt: preparing the CPU kernels (the first run compiles them with numba, "
                  "about a minute; later runs load them from its cache)...")


async def warm_up(engine, notice_after_s: float = WARM_UP_NOTICE_S) -> float:
    """Run a 3-token prompt for 2 tokens (one prefill, one decode step) before
    the real request, so that the first run's kernel compilation (numba, about
    a minute on 2 cores; cached on disk afterwards) is neither prompt nor
    decode time in ``--stats``. When it takes longer than ``notice_after_s``
    seconds, :data:`WARM_UP_NOTICE` is printed on stderr (once).

    Returns:
        The warm-up's wall time (s).
    """
    from .sampling import SamplingParams

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        async def notice() -> None:
            await trio.sleep(notice_after_s)
            _end_line()
            print(WARM_UP_NOTICE, file=sys.stderr, flush=True)

        nursery.start_soon(notice)
        await engine.generate(engine.encode_prompt("Hello, world")[:3] or [0],
                              SamplingParams(max_new_tokens=2, ignore_eos=True))
        nursery.cancel_scope.cancel()
    return time.perf_counter() - t0


_open_line = False  # stdout holds a line without its newline


class StdoutClosed(Exception):
    """stdout's reader went away (``actorrt generate ... | head -c 20``):
    generation stops and the command exits quietly."""


def _write(text: str) -> None:
    """Write to stdout at once.

    Raises:
        StdoutClosed: the pipe's reader closed it (stdout is pointed at
            ``os.devnull`` then, so the interpreter's last flush is quiet).
    """
    global _open_line
    if text:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
            raise StdoutClosed() from None
        _open_line = not text.endswith("\n")


def _silence_stdout() -> None:
    import os

    global _open_line
    _open_line = False
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file descriptor
        pass


def _end_line() -> None:
    """End a partly written stdout line before a message on stderr."""
    if _open_line:
        _write("\n")


def _run_reporting(main) -> int:
    """``trio.run(main)``: Ctrl-C and actorrt errors end with one line, not a
    traceback (trio delivers them wrapped in exception groups)."""
    from .._errors import ActorRTError, leaf_exceptions
    from ..cli import one_line

    try:
        trio.run(main)
    except BaseException as exc:  # noqa: BLE001 - classified below, others re-raised
        leaves = leaf_exceptions(exc)
        if any(isinstance(e, StdoutClosed) for e in leaves):
            return 0  # the reader has what it wanted
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            # Ctrl-C: whatever else unwound with it is a consequence
            _end_line()
            print("interrupted", file=sys.stderr)
            return 130
        errors = [e for e in leaves if isinstance(e, ActorRTError)]
        if errors and all(isinstance(e, ActorRTError) for e in leaves):
            _end_line()
            print(f"error: {one_line(errors[0])}", file=sys.stderr)
            return 1
        raise
    return 0


#: short prompts for decode benchmarks (prefill stays negligible)
BENCH_PROMPTS = ["The capital of France is", "Once upon a time", "The best way to learn is",
                 "In 1969, humans", "Water boils at", "My favourite food is",
                 "The meaning of life is", "Computers are"]


async def concurrency_curve(engine, levels, new_tokens: int) -> list[tuple[int, float, float, float]]:
    """For each concurrency ``n``, ``n`` greedy streams of ``new_tokens`` tokens
    started together: ``(n, aggregate decode tok/s, mean per-stream decode
    tok/s, end-to-end aggregate tok/s)``. Aggregate decode tok/s is decode
    tokens over the wall time of the engine's decode steps (prefill runs
    excluded, as llama.cpp's batched-bench reports generation speed);
    end-to-end counts every generated token over the whole wall time,
    prefill included."""
    from .sampling import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    curve = []
    for n in levels:
        results = [None] * n

        async def one(i):
            results[i] = await engine.generate(BENCH_PROMPTS[i % len(BENCH_PROMPTS)], params)

        before = engine.statistics()
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
        el = time.perf_counter() - t0
        after = engine.statistics()
        toks = sum(len(r.token_ids) for r in results)
        dec = ((after.decode_tokens - before.decode_tokens)
               / max(after.decode_time_s - before.decode_time_s, 1e-9))
        curve.append((n, dec, sum(r.decode_tokens_per_s for r in results) / n, toks / el))
    return curve


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def median_curve(rounds: list[list[tuple[int, float, float, float]]]):
    """Per level, the median over interleaved rounds of each column, and per
    level the median of the per-round ratios against the first level (this
    machine's speed drifts between rounds; a ratio within one round does not)."""
    import statistics

    curve, ratios = [], []
    for i, (n, *_rest) in enumerate(rounds[0]):
        cols = list(zip(*(r[i] for r in rounds)))
        curve.append((n, *(statistics.median(c) for c in cols[1:])))
        each = [_ratio(r[i][1], r[0][1]) for r in rounds]
        ratios.append((statistics.median(each),
                       statistics.median(_ratio(r[i][3], r[0][3]) for r in rounds), each))
    return curve, ratios


def print_curve(rounds: list[list[tuple[int, float, float, float]]]) -> None:
    """The concurrency curve as a table: medians over rounds, ratios against
    the first level (median of the per-round ratios; every round's decode
    ratio in brackets)."""
    curve, ratios = median_curve(rounds)
    print(f"{'streams':>8} {'decode tok/s':>13} {'ratio':>6} {'per-stream':>11} "
          f"{'end-to-end tok/s':>17} {'ratio':>6}   decode ratio per round")
    for (n, dec, per, e2e), (r_dec, r_e2e, each) in zip(curve, ratios):
        rounds_txt = ", ".join(f"{x:.2f}" for x in each)
        print(f"{n:>8} {dec:>13.1f} {r_dec:>6.2f} {per:>11.1f} {e2e:>17.1f} "
              f"{r_e2e:>6.2f}   [{rounds_txt}]")


def bench_decode_main(args: argparse.Namespace) -> int:
    """Aggregate and per-stream decode tok/s at each concurrency."""
    from .engine import open_engine
    from .sampling import SamplingParams

    try:
        levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        print(f"error: --concurrency must be positive integers separated by commas, got "
              f"{args.concurrency!r}", file=sys.stderr)
        return 2
    if args.max_new_tokens < 2:
        print("error: --max-new-tokens must be >= 2 (the first token of each stream comes "
              "from prefill, not from a decode step)", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print(f"error: --rounds must be >= 1, got {args.rounds}", file=sys.stderr)
        return 2
    from ..providers.cpu.llm import _contrib_numba

    threads = _contrib_numba.set_num_threads(getattr(args, "threads", 2))

    async def main() -> None:
        async with open_engine(args.model, max_batch=max(levels),
                               accuracy_level=args.accuracy_level) as engine:
            await engine.generate(BENCH_PROMPTS[0], SamplingParams(max_new_tokens=4))  # warm up
            rounds = [await concurrency_curve(engine, levels, args.max_new_tokens)
                      for _ in range(args.rounds)]
        print(f"{threads} kernel threads, {args.max_new_tokens} tokens per stream, "
              f"{args.rounds} rounds, accuracy_level "
              f"{'default' if args.accuracy_level is None else args.accuracy_level}")
        print_curve(rounds)

    return _run_reporting(main)
