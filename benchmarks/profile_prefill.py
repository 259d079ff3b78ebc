"""Where a long prefill of the default model (SmolLM2-135M, level 4) spends
its time: the whole prompt through the engine (one request, one new token,
prefix caching off), and its attention alone on SmolLM2's shapes (9 query
heads, 3 KV heads of 64, x 30 layers, random queries/keys/values): the
tiled kernel (``_flash``, what prompts run) and the two-pass per (batch row,
KV head) kernel prompts ran before (``_contrib_numba._attend_group``, what
decode rows still run), at 1 and 2 threads, in the same run. With
``--stages``, also the engine's prefill split per decoder-stack stage (30
layers summed: thread-ms working and waiting at the stage's barrier, from the
region's cycle counters, the ``_fusion.STAGE_PROFILE`` hook) and each
projection's multiply-add rate over the team's working time.

    python benchmarks/profile_prefill.py [--lengths 512,2048,4096] [--threads 1,2]
        [--stages] [--no-engine]
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import numpy as np
import trio

from actorrt.providers.cpu.llm import _contrib_numba as nb

H, KVH, D, LAYERS = 9, 3, 64, 30

if nb.HAVE_NUMBA:
    from numba import njit, prange

    @njit(parallel=True, fastmath=True, nogil=True, cache=True)
    def _two_pass(query, pk, pv, cos, sin, pos, past, tot, h, kvh, alpha, out,
                  chunks):  # pragma: no cover - compiled
        # the prompt path before the tiled kernel: one (batch row, KV head)
        # pair a unit, each query row's scores over all its keys, two passes
        bsz, s_len, width = query.shape
        d = width // h
        g = h // kvh
        pairs = bsz * kvh
        per = (pairs + chunks - 1) // chunks
        for c in prange(chunks):
            qg = np.empty((g, d), np.float32)
            acc = np.empty((g, d), np.float32)
            sc = np.empty((g, tot.max()), np.float32)
            mx = np.empty(g, np.float32)
            den = np.empty(g, np.float32)
            for bk in range(c * per, min(pairs, (c + 1) * per)):
                nb._attend_group(query, pk, pv, cos, sin, pos, past, tot, bk // kvh, bk % kvh,
                                 g, d, s_len, cos.shape[1], True, False, alpha, 0, qg, acc, sc,
                                 mx, den, out)


def attention_times(n: int, threads: int, reps: int = 2) -> tuple[float, float]:
    """(tiled, two-pass) seconds of the attention of 30 layers of an n-token prompt."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, n, H * D)).astype(np.float32)
    k = rng.standard_normal((1, n, KVH * D)).astype(np.float32)
    v = rng.standard_normal((1, n, KVH * D)).astype(np.float32)
    ang = rng.random((n, D // 2)).astype(np.float32) * 6
    cos, sin = np.cos(ang), np.sin(ang)
    pk = np.zeros((1, KVH, n, D), np.float32)
    pv = np.zeros_like(pk)
    seq = np.array([n - 1])
    nb.set_num_threads(threads)
    try:
        def tiled():
            return nb.gqa_attention(q, k, v, pk, pv, pk, pv, seq, n, cos, sin, None,
                                    num_heads=H, kv_num_heads=KVH, copy_past=False,
                                    alpha=D ** -0.5, window=0, interleaved=False)
        tiled()  # also appends the (rotated) keys the two-pass kernel reads
        out = np.empty((1, n, H * D), np.float32)
        pos = np.arange(n)[None, :].astype(np.int64)
        args = (q, pk, pv, cos, sin, pos, np.zeros(1, np.int64), np.array([n]), H, KVH,
                np.float32(D ** -0.5), out, min(KVH, 4 * threads))
        _two_pass(*args)
        best_t = best_o = float("inf")
        for _ in range(reps):  # interleaved
            t = time.perf_counter()
            tiled()
            best_t = min(best_t, time.perf_counter() - t)
            t = time.perf_counter()
            _two_pass(*args)
            best_o = min(best_o, time.perf_counter() - t)
        return best_t * LAYERS, best_o * LAYERS
    finally:
        nb.set_num_threads(None)


#: multiply-adds a row of each projection stage of SmolLM2-135M (N x K)
STAGE_MACS = {"q/k/v proj": (576 + 2 * 192) * 576, "o proj": 576 * 576,
              "gate/up proj": 2 * 1536 * 576, "down proj": 576 * 1536}


async def prefill_rate(n: int, threads: int, stages: dict | None = None) -> float:
    from actorrt.genai import SamplingParams, open_engine
    from actorrt.genai.models import prepare_model
    from actorrt.genai.tokenizer import load_tokenizer
    folder = prepare_model("smollm2")
    text = (Path(__file__).parent / "data" / "python_license.txt").read_text()
    ids = load_tokenizer(folder).encode(text)
    ids = (ids * (n // len(ids) + 1))[:n]
    nb.set_num_threads(threads)
    try:
        async with open_engine(folder, max_batch=1, prefix_caching=False) as engine:
            one = SamplingParams(max_new_tokens=1, ignore_eos=True)
            await engine.generate(ids[:64], one)
            rate = max([(await engine.generate(ids, one)).prompt_tokens_per_s
                        for _ in range(2)])
            if stages is not None:  # one more prefill, its stages timed
                from actorrt.providers.cpu.llm import _block_kernels as bk, _fusion
                from profile_decode import _calibrate, stage_split
                prof = _fusion.STAGE_PROFILE = np.zeros((31, bk.PROFILE_SLOTS), np.int64)
                try:
                    await engine.generate(ids, one)
                finally:
                    _fusion.STAGE_PROFILE = None
                hz = _calibrate()
                stages.update({k: (w / hz, x / hz) for k, (w, x) in stage_split(prof).items()})
            return rate
    finally:
        nb.set_num_threads(None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="2048")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--no-engine", action="store_true", help="the attention kernels only")
    ap.add_argument("--stages", action="store_true", help="the engine's prefill per stage")
    args = ap.parse_args()
    split = {}
    print(f"{'tokens':>6} {'thr':>3} {'prefill s':>9} {'tiled attn s':>12} {'share':>6} "
          f"{'two-pass s':>10} {'share':>6} {'two-pass/tiled':>14}")
    for n in [int(x) for x in args.lengths.split(",")]:
        for th in [int(x) for x in args.threads.split(",")]:
            st = {} if args.stages else None
            total = float("nan") if args.no_engine else n / trio.run(prefill_rate, n, th, st)
            t, o = attention_times(n, th)
            print(f"{n:6d} {th:3d} {total:9.2f} {t:12.2f} {t / total:6.0%} {o:10.2f} "
                  f"{o / (total - t + o):6.0%} {o / t:14.2f}", flush=True)
            if st:
                split[(n, th)] = st
    for (n, th), st in split.items():
        print(f"{n} tokens, {th} threads, per stage (30 layers): thread-ms working / waiting;"
              " GMAC/s over the working time")
        for name, (w, x) in st.items():
            rate = (f"{STAGE_MACS[name] * n * 30 / w / 1e9:7.1f}" if name in STAGE_MACS
                    else "")
            print(f"  {name:22s} {w * 1e3:8.1f} {x * 1e3:8.1f} {rate}")
        print(f"  {'all':22s} {sum(w for w, _ in st.values()) * 1e3:8.1f} "
              f"{sum(x for _, x in st.values()) * 1e3:8.1f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MB")


if __name__ == "__main__":
    main()
