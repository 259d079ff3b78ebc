"""Where a batched decode step of the default model (SmolLM2-135M, level 4)
spends its time: the whole step through the session (B rows, one new token
each, KV cache with spare capacity, donated as the engine does), and the
int8 projections of one layer and the LM head timed alone (one thread, thread
CPU time) at the same row count, with their arithmetic rate; per row count
also the region call's time against the rest of ``session.run`` and each
stage's work and barrier wait (the region's cycle counters, the
``_fusion.STAGE_PROFILE`` hook).

    python benchmarks/profile_decode.py [--rows 1,8,16] [--past 80] [--steps 20]
        [--kv contiguous|paged|paged16]

``--kv``: the KV cache fed to the step: a contiguous float32 buffer per layer
(the default), or the engine's block-paged pools (:mod:`actorrt.genai.kv_cache`)
of float32 or float16 values, one run of blocks per row.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import trio

from actorrt import SessionOptions, open_session
from actorrt.genai.models import model_file, prepare_model


STAGE_NAMES = {0: "quantize h", 1: "q/k/v proj", 2: "attention", 10: "prompt attn",
               3: "merge+quantize", 4: "o proj", 5: "residual+norm+quant", 6: "gate/up proj",
               7: "SiLU-mul+quant", 8: "down proj", 9: "residual+norm"}
HEAD_NAMES = {0: "head gather", 1: "head quantize", 2: "head proj"}
ORDER = (0, 1, 2, 10, 3, 4, 5, 6, 7, 8, 9)


def stage_split(prof):
    """Per stage (summed over layers): (thread-ms of work, thread-ms waiting at
    its barrier) from the region's cycle counters (prof summed over steps).
    Each thread's stage time is the time between its exits from consecutive
    barriers; layer 0's first stage is left out (its start is not recorded)."""
    from actorrt.providers.cpu.llm import _block_kernels as bk
    W, E = bk.PROFILE_WAIT, bk.PROFILE_EXIT
    layers = prof.shape[0] - 1
    seq = []  # (name, wait, exit sum) in program order
    for l in range(layers):
        for st in ORDER:
            if prof[l, E + st]:
                seq.append((STAGE_NAMES[st], prof[l, W + st], prof[l, E + st]))
    for st in (0, 1, 2):
        if prof[layers, E + st]:
            seq.append((HEAD_NAMES[st], prof[layers, W + st], prof[layers, E + st]))
    tot = {}
    for (n0, _, e0), (n, w, e) in zip(seq, seq[1:]):
        t = tot.setdefault(n, [0, 0])
        t[0] += (e - e0) - w
        t[1] += w
    return tot


def _calibrate():
    from actorrt.providers.cpu.llm import _block_kernels as bk
    c0, t0 = bk.cycles(), time.perf_counter()
    time.sleep(0.2)
    return (bk.cycles() - c0) / (time.perf_counter() - t0)


def _kv_feeds(kind, kv_names, b, past, cap):
    """A function of (step s, the previous step's outputs or None) returning
    step s's past feeds: the contiguous buffers donated and carried as the
    session returns them, or a paged cache grown and bound per step."""
    rng = np.random.default_rng(0)
    if kind == "contiguous":
        kv = [np.zeros((b, 3, cap, 64), np.float32) for _ in kv_names]
        for a in kv:
            a[:, :, :past] = rng.standard_normal((b, 3, past, 64)).astype(np.float32)
        state = {"kv": kv}

        def feeds(s, res):
            if res is not None:
                state["kv"] = list(res[1:])
            return dict(zip(kv_names, state["kv"]))
        return feeds
    from actorrt.genai.kv_cache import KVCache
    from actorrt.providers._memory import MemoryAccountant
    per_row = -(-cap // 16)
    cache = KVCache(kv_names, 3, 64, b * per_row, memory=MemoryAccountant("cpu"),
                    dtype=np.float16 if kind == "paged16" else np.float32)
    for pool in cache.pools:
        pool[...] = rng.standard_normal(pool.shape).astype(pool.dtype)
    rows = [[] for _ in range(b)]

    def feeds(s, res):
        for r in rows:
            cache.grow(r, past + s + 1)
        return cache.bind(rows, 1)
    return feeds


async def step_times(path, rows_list, past, steps, threads, kind="contiguous"):
    import attrs
    from actorrt.providers.cpu.llm import _block_kernels as bk, _contrib_numba as nb
    from actorrt.providers.cpu.llm import _fusion
    opts = attrs.evolve(SessionOptions(parallel_execution=False), output_views=True)
    out = {}
    region_t = []
    inner = nb._parallel

    def timed_parallel(fn, *a):  # the region call alone (captured by the plan at build)
        t0 = time.perf_counter()
        try:
            return inner(fn, *a)
        finally:
            region_t.append(time.perf_counter() - t0)
    nb._parallel = timed_parallel
    async with open_session(path, None, opts) as sess:
        names = [i.name for i in sess.get_inputs()]
        kv_names = [n for n in names if n.startswith("past_key_values")]
        for b in rows_list:
            cap = past + steps + 8
            kv_feeds = _kv_feeds(kind, kv_names, b, past, cap)
            res = None
            times = []
            regions = []
            prof = None
            for s in range(steps + 3):
                if s == 3:  # after the warm-up steps
                    prof = _fusion.STAGE_PROFILE = np.zeros((31, bk.PROFILE_SLOTS), np.int64)
                region_t.clear()
                ids = np.full((b, 1), 1000 + s, np.int64)
                mask = np.ones((b, past + s + 1), np.int64)
                feeds = {"input_ids": ids, "attention_mask": mask, **kv_feeds(s, res)}
                if "logits_positions" in names:
                    feeds["logits_positions"] = np.zeros((b, 1, 1), np.int64)
                t0, c0 = time.perf_counter(), time.process_time()
                res = await sess.run(None, feeds, donate=kv_names)
                times.append((time.perf_counter() - t0, time.process_time() - c0))
                regions.append(sum(region_t))
            _fusion.STAGE_PROFILE = None
            wall = sorted(t[0] for t in times[3:])
            cpu = sorted(t[1] for t in times[3:])
            reg = sorted(regions[3:])
            out[b] = (wall[len(wall) // 2], cpu[len(cpu) // 2], reg[len(reg) // 2],
                      stage_split(prof), len(times) - 3)
    nb._parallel = inner
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
    ap.add_argument("--kv", default="contiguous", choices=("contiguous", "paged", "paged16"))
    ap.add_argument("--no-kernels", action="store_true",
                    help="skip the one-thread projection timings")
    args = ap.parse_args()
    from actorrt.providers.cpu.llm import _contrib_numba
    threads = _contrib_numba.set_num_threads(args.threads)
    rows = [int(x) for x in args.rows.split(",")]
    path = model_file(prepare_model("smollm2"), 4, last_logits=True)
    kt = {m: ({}, 0.0, 0.0, 0.0, 0.0) for m in rows} if args.no_kernels else kernel_times(rows)
    st = trio.run(step_times, path, rows, args.past, args.steps, threads, args.kv)
    hz = _calibrate()
    print(f"{threads} threads, past {args.past} cached rows, KV {args.kv}")
    print(f"{'rows':>5} {'step ms':>8} {'CPU ms':>7} {'tok/s':>7} | one thread: 30 layers ms  GMAC/s  "
          f"head ms  GMAC/s  -> /threads ms  share of step")
    for m in rows:
        per, layer, g, head, gh = kt[m]
        ideal = (30 * layer + head) / threads
        wall, cpu, reg, split, n = st[m]
        print(f"{m:5d} {wall*1e3:8.2f} {cpu*1e3:7.2f} {m / wall:7.1f} | {30 * layer * 1e3:8.2f} {g:7.1f} "
              f"{head * 1e3:8.2f} {gh:7.1f} -> {ideal * 1e3:8.2f}  {ideal / wall:.0%}")
        print("       per projection ms (one layer, one thread): "
              + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in per.items()))
        print(f"       region (the stack + head call) {reg * 1e3:.2f} ms, the rest of "
              f"session.run {(wall - reg) * 1e3:.2f} ms (medians)")
        print(f"       per stage, 30 layers summed, mean per step: thread-ms working / "
              f"waiting at the barrier (summed over {threads} threads)")
        allw = allx = 0.0
        for name, (work, wt) in split.items():
            w_ms, x_ms = work / hz / n * 1e3, wt / hz / n * 1e3
            allw += w_ms
            allx += x_ms
            print(f"         {name:22s} {w_ms:8.2f} {x_ms:8.2f}")
        print(f"         {'all':22s} {allw:8.2f} {allx:8.2f}")


if __name__ == "__main__":
    main()
