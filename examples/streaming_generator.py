"""Stream a continuation from the default model (SmolLM2-135M), token by token.

    python examples/streaming_generator.py "The capital of France is"

Ctrl-C stops the stream; leaving the loop frees the request's KV cache.
"""

import sys

import trio

from actorrt.genai import SamplingParams, open_engine


async def main(prompt: str) -> None:
    async with open_engine("smollm2") as engine:
        print(prompt, end="", flush=True)
        params = SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, seed=0)
        async for piece in engine.stream(prompt, params):
            print(piece, end="", flush=True)
        print()
        st = engine.statistics()
        print(f"[{st.tokens_generated} tokens, {st.tokens_per_s:.1f} tok/s]", file=sys.stderr)


def interrupted(exc: BaseException) -> bool:
    """Ctrl-C, possibly wrapped in trio's exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(KeyboardInterrupt)[0] is not None
    return isinstance(exc, KeyboardInterrupt)


if __name__ == "__main__":
    if len(sys.argv) > 2 or sys.argv[1:] in (["-h"], ["--help"]):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) == 2 else 2)
    try:
        trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "Once upon a time")
    except BaseException as exc:  # noqa: BLE001 - only Ctrl-C is handled here
        if not interrupted(exc):
            raise
        print("\n[interrupted]", file=sys.stderr)
        sys.exit(130)
