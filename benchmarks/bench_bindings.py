"""Decode-style data movement: a GPT-2-style model with past key/values
(tests/data/gpt2ish.onnx) run for 60 steps (its 64 positions; the issue asks 128: the figure per step is what counts), host<->device bytes per step with
persistent device IO bindings (past aliased to present, appended on the device)
versus plain ``run`` (every past uploaded, every present downloaded).

    python benchmarks/bench_bindings.py
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import trio

import actorrt

MODEL = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpt2ish.onnx"
STEPS = 60  # the model has 64 positions
KV = ["past_key.0", "past_value.0", "past_key.1", "past_value.1"]
PRESENT = ["present_key.0", "present_value.0", "present_key.1", "present_value.1"]


async def plain(session) -> tuple[float, float]:
    past = {n: np.zeros((1, 4, 1, 16), np.float32) for n in KV}
    ids = np.array([[1]], np.int64)
    moved = 0
    t0 = time.perf_counter()
    for _ in range(STEPS):
        feeds = {"input_ids": ids, **past}
        moved += sum(v.nbytes for v in feeds.values())  # uploaded
        out = await session.run(None, feeds)
        moved += sum(o.nbytes for o in out)  # downloaded
        past = dict(zip(KV, out[1:]))
        ids = np.argmax(out[0][:, -1:], -1).astype(np.int64)
    return moved / STEPS, (time.perf_counter() - t0) / STEPS


async def bound(session) -> tuple[float, float]:
    cap = STEPS + 2
    binds = [await session.bind_device(n, np.float32, (1, 4, cap, 16), output_name=o,
                                       logical_shape=(1, 4, 1, 16), expose_logical_shape=True)
             for n, o in zip(KV, PRESENT)]
    ids = np.array([[1]], np.int64)
    moved = 0
    t0 = time.perf_counter()
    for _ in range(STEPS):
        out = await session.run(["logits"], {"input_ids": ids})
        moved += ids.nbytes + out[0][:, -1:].nbytes  # token up, last logits row down
        ids = np.argmax(out[0][:, -1:], -1).astype(np.int64)
    stats = [b.transfer_stats() for b in binds]
    moved += sum(s.upload_bytes + s.download_bytes for s in stats)  # KV never leaves
    return moved / STEPS, (time.perf_counter() - t0) / STEPS


async def main() -> None:
    async with actorrt.open_session(MODEL) as s:
        p_bytes, p_time = await plain(s)
    async with actorrt.open_session(MODEL) as s:
        b_bytes, b_time = await bound(s)
    print(f"GPT-2-style decode, {STEPS} steps")
    print(f"plain run:     {p_bytes / 1024:9.1f} KiB host<->device per step, {p_time * 1e3:6.2f} ms/step")
    print(f"with bindings: {b_bytes / 1024:9.1f} KiB host<->device per step, {b_time * 1e3:6.2f} ms/step")
    print(f"ratio: {p_bytes / b_bytes:.0f}x fewer bytes with bindings")


if __name__ == "__main__":
    trio.run(main)
