"""N prompts streamed side by side by one engine: their decode steps are
batched into one model run per step. A status line shows each stream's token
count while they run; each text is printed when its stream ends.

    python examples/concurrent_decode.py
"""

import sys

import trio

from actorrt.genai import SamplingParams, open_engine

PROMPTS = ["The capital of France is", "Once upon a time", "The best way to learn is",
           "Water boils at"]


async def main() -> None:
    texts = ["" for _ in PROMPTS]
    pieces = [0 for _ in PROMPTS]

    async with open_engine("smollm2", max_batch=len(PROMPTS)) as engine:
        async def one(i: int) -> None:
            async for piece in engine.stream(PROMPTS[i], SamplingParams(max_new_tokens=40)):
                texts[i] += piece
                pieces[i] += 1
                print(f"\rpieces per stream: {pieces}", end="", file=sys.stderr, flush=True)
            print(f"\n[{i}] {PROMPTS[i]}{texts[i]}", flush=True)

        async with trio.open_nursery() as nursery:
            for i in range(len(PROMPTS)):
                nursery.start_soon(one, i)
        st = engine.statistics()
        print(f"\n{st.completed} requests, {st.tokens_generated} tokens, "
              f"{st.tokens_per_s:.1f} tok/s aggregate, batch sizes {st.batch_histogram}")


if __name__ == "__main__":
    trio.run(main)
