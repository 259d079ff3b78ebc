"""Where a batched decode step of the default model (SmolLM2-135M, level 4)
spends its time: the whole step through the session (B rows, one new token
each, KV cache with spare capacity, donated as the engine does), and the
int8 projections of one layer and the LM head timed alone (one thread, thread
CPU time) at the same row count, with their arithmetic rate.

    python benchmarks/profile_decode.py [--rows 1,8,16] [--past 80] [--steps 20]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import trio

from actorrt import SessionOptions, open_session
from actorrt.genai.models import model_file, prepare_model


async def step_times(path, rows_list, past, steps, threads):
    import attrs
    opts = attrs.evolve(SessionOptions(parallel_execution=False), output_views=True)
    out = {}
    async with open_session(path, None, opts) as sess:
        names = [i.name for i in sess.get_inputs()]
        kv_names = [n for n in names if n.startswith("past_key_values")]
        for b in rows_list:
            cap = past + steps + 8
            kv = [np.zeros((b, 3, cap, 64), np.float32) for _ in kv_names]
            for a in kv:
                a[:, :, :past] = np.random.default_rng(0).standard_normal(
                    (b, 3, past, 64)).astype(np.float32)
            times = []
            for s in range(steps + 3):
                ids = np.full((b, 1), 1000 + s, np.int64)
                mask = np.ones((b, past + s + 1), np.int64)
                feeds = {"input_ids": ids, "attention_mask": mask,
                         **dict(zip(kv_names, kv))}
                if "logits_positions" in names:
                    feeds["logits_positions"] = np.zeros((b, 1, 1), np.int64)
                t0, c0 = time.perf_counter(), time.process_time()
                res = await sess.run(None, feeds, donate=kv_names)
                times.append((time.perf_counter() - t0, time.process_time() - c0))
                kv = list(res[1:])
            wall = sorted(t[0] for t in times[3:])
            cpu = sorted(t[1] for t in times[3:])
            out[b] = (wall[len(wall) // 2], cpu[len(cpu) // 2])
    return out


def kernel_times(rows_list, rounds=5):
    """Per row count: (ms of one layer's 7 projections + head, one thread,
    GMAC/s), the projections' shapes those of SmolLM2-135M (4-bit, float16
    scales embedded, as its Q4_1 weights pack)."""
    from actorrt.providers.cpu.llm import _contrib_int8 as i8
    rng = np.random.default_rng(1)
    shapes = {"q": (576, 576), "k": (192, 576), "v": (192, 576), "o": (576, 576),
              "gate": (1536, 576), "up": (1536, 576), "down": (576, 1536),
              "head": (49152, 576)}
    packed = {}
    for name, (n, k) in shapes.items():
        nb = k // 32
        q = rng.integers(0, 256, (n, nb, 16), dtype=np.uint8)
        sc = (rng.random((n, nb)).astype(np.float16).astype(np.float32) + 0.5) * 0.01
        zp = np.full((n, nb), 8.0, np.float32)
        packed[name] = i8.pack_i8(q, sc, zp, 4)
    res = {}
    for m in rows_list:
        per = {}
        for name, (n, k) in shapes.items():
            a = rng.standard_normal((m, k)).astype(np.float32)
            xb = i8._quantized(a)
            w, d, dz = packed[name]
            o = np.empty((m, n), np.float32)
            best = 1e9
            for _ in range(rounds):
                t0 = time.thread_time()
                i8._cols(*xb, w, d, dz, o, 0, n, 3)
                best = min(best, time.thread_time() - t0)
            per[name] = best
        layer = sum(v for kk, v in per.items() if kk != "head")
        macs_layer = sum(n * k for kk, (n, k) in shapes.items() if kk != "head") * m
        res[m] = (per, layer, macs_layer / layer / 1e9, per["head"],
                  49152 * 576 * m / per["head"] / 1e9)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8,16")
    ap.add_argument("--past", type=int, default=80)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from actorrt.providers.cpu.llm import _contrib_numba
    threads = _contrib_numba.set_num_threads(args.threads)
    rows = [int(x) for x in args.rows.split(",")]
    path = model_file(prepare_model("smollm2"), 4, last_logits=True)
    kt = kernel_times(rows)
    st = trio.run(step_times, path, rows, args.past, args.steps, threads)
    print(f"{threads} threads, past {args.past} cached rows")
    print(f"{'rows':>5} {'step ms':>8} {'CPU ms':>7} {'tok/s':>7} | one thread: 30 layers ms  GMAC/s  "
          f"head ms  GMAC/s  -> /threads ms  share of step")
    for m in rows:
        per, layer, g, head, gh = kt[m]
        ideal = (30 * layer + head) / threads
        wall, cpu = st[m]
        print(f"{m:5d} {wall*1e3:8.2f} {cpu*1e3:7.2f} {m / wall:7.1f} | {30 * layer * 1e3:8.2f} {g:7.1f} "
              f"{head * 1e3:8.2f} {gh:7.1f} -> {ideal * 1e3:8.2f}  {ideal / wall:.0%}")
        print("       per projection ms (one layer, one thread): "
              + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in per.items()))


if __name__ == "__main__":
    main()
