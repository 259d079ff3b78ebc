"""N concurrent streaming HTTP clients against ``actorrt serve`` and, in the
same run, llama.cpp's server (``python -m llama_cpp.server`` from
llama-cpp-python[server]) on the same GGUF; and the engine called directly
(same prompts, same token counts) for the HTTP layer's cost per token.

Per level (concurrent clients) and server: TTFT p50/p99 (request sent to
first content chunk), ITL p50/p99 (gaps between a stream's successive content
chunks; one chunk is one token on both servers), aggregate tok/s (content
chunks of all streams / wall time of the level). Levels are interleaved
across servers within each round, so ratios are same-run ratios.

    python benchmarks/bench_serve.py --levels 1,4,8,16 --max-tokens 32 \\
        --llama-python /work/peers/.venv/bin/python

Each server runs in its own process, one at a time busy (never both under
load at once). The machine's speed drifts: compare only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Once upon a time", "The history of the city began", "Write a story about a dragon",
           "In the beginning of the century", "The old man walked to the sea and",
           "My favourite memory of school is", "The recipe starts with", "Long ago, in a land"]


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def start_ours(model: str, max_batch: int) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "actorrt.serve.cli", "--model", model,
                             "--port", "0", "--max-batch", str(max_batch), "--grace", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    line = proc.stdout.readline()
    if " on http" not in line:
        proc.kill()
        raise SystemExit(f"actorrt serve did not start: {line!r}")
    return proc, line.rsplit(" on ", 1)[1].strip()


def start_llama(python: str, gguf: str, port: int, threads: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([python, "-m", "llama_cpp.server", "--model", gguf, "--host",
                             "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
                             "--n_threads", str(threads), "--n_threads_batch", str(threads),
                             # queue concurrent requests (the default cancels the
                             # running one when a new one arrives)
                             "--interrupt_requests", "False"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("llama_cpp.server exited at start")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("llama_cpp.server did not start")


async def http_level(url: str, model: str, n: int, max_tokens: int, extra: dict) -> dict:
    ttft: list[float] = []
    itl: list[float] = []
    tokens = [0]

    async def one(i: int, client: httpx.AsyncClient) -> None:
        body = {"model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens,
                "temperature": 0, "stream": True, **extra}
        t0 = time.perf_counter()
        last = None
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if not chunk.get("choices") or not chunk["choices"][0].get("text"):
                    continue
                now = time.perf_counter()
                if last is None:
                    ttft.append(now - t0)
                else:
                    itl.append(now - last)
                last = now
                tokens[0] += 1

    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i, client)
        wall = time.perf_counter() - t0
    return {"ttft": ttft, "itl": itl, "tokens": tokens[0], "wall": wall}


async def direct_level(engine, n: int, max_tokens: int) -> dict:
    from actorrt.genai import SamplingParams

    params = SamplingParams(max_new_tokens=max_tokens, ignore_eos=True)
    tokens = [0]

    async def one(i: int) -> None:
        async for _ in engine.stream(PROMPTS[i % len(PROMPTS)], params, details=True):
            tokens[0] += 1

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return {"tokens": tokens[0], "wall": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--gguf", default=None,
                    help="GGUF for llama.cpp (default: the cached SmolLM2 Q4_1 GGUF)")
    ap.add_argument("--levels", default="1,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    ap.add_argument("--llama-python", default="/work/peers/.venv/bin/python",
                    help="interpreter with llama-cpp-python[server] ('' to skip)")
    ap.add_argument("--no-direct", action="store_true", help="skip the in-process engine")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    from actorrt.genai.models import model_home, prepare_model
    folder = prepare_model(args.model, progress=False)
    gguf = args.gguf or next(iter(sorted((model_home(None) / "downloads").glob("*.gguf"))), None)

    servers = {}
    ours, url = start_ours(str(folder), max(levels))
    servers["actorrt"] = (ours, url, httpx.get(url + "/v1/models").json()["data"][0]["id"],
                          {"ignore_eos": True})
    have_llama = False
    if args.llama_python and Path(args.llama_python).exists() and gguf:
        check = subprocess.run([args.llama_python, "-c", "import llama_cpp.server"],
                               capture_output=True)
        if check.returncode == 0:
            proc, lurl = start_llama(args.llama_python, str(gguf), 18000 + os.getpid() % 1000,
                                     args.threads)
            servers["llama.cpp"] = (proc, lurl, "smollm2", {})
            have_llama = True
    if not have_llama:
        print("llama.cpp server: not available, skipped")

    rows: dict = {}

    async def run_all() -> None:
        engine_cm = None
        engine = None
        if not args.no_direct:
            from actorrt.genai import SamplingParams, open_engine
            engine_cm = open_engine(folder, max_batch=max(levels))
            engine = await engine_cm.__aenter__()
            await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=4))
        try:
            for name, (_, u, model, extra) in servers.items():  # warm up
                await http_level(u, model, 1, 4, extra)
            for _ in range(args.rounds):
                for n in levels:
                    for name, (_, u, model, extra) in servers.items():
                        r = await http_level(u, model, n, args.max_tokens, extra)
                        rows.setdefault((name, n), []).append(r)
                        print(f"# {name} x{n}: {r['tokens']} tokens in {r['wall']:.2f} s",
                              flush=True)
                    if engine is not None:
                        r = await direct_level(engine, n, args.max_tokens)
                        rows.setdefault(("direct", n), []).append(r)
                        print(f"# direct x{n}: {r['tokens']} tokens in {r['wall']:.2f} s",
                              flush=True)
        finally:
            if engine_cm is not None:
                await engine_cm.__aexit__(None, None, None)

    try:
        trio.run(run_all)
    finally:
        for proc, *_ in servers.values():
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()

    print(f"{args.max_tokens} tokens a stream, greedy, {args.rounds} round(s); "
          f"llama.cpp threads {args.threads}; shared machine: same-run ratios only")
    print(f"{'server':>10} {'clients':>7} {'TTFT p50':>9} {'p99':>7} {'ITL p50':>8} {'p99':>7} "
          f"{'tok/s':>7} {'vs llama':>8}")
    for n in levels:
        for name in list(servers) + (["direct"] if not args.no_direct else []):
            runs = rows.get((name, n), [])
            if not runs:
                continue
            agg = statistics.median(r["tokens"] / r["wall"] for r in runs)
            llama = rows.get(("llama.cpp", n))
            ratio = ""
            if llama and name != "llama.cpp":
                ratio = f"{agg / statistics.median(r['tokens'] / r['wall'] for r in llama):.2f}x"
            if name == "direct":
                print(f"{name:>10} {n:>7} {'':>9} {'':>7} {'':>8} {'':>7} {agg:>7.1f} {ratio:>8}")
                continue
            ttft = [x for r in runs for x in r["ttft"]]
            itl = [x for r in runs for x in r["itl"]]
            print(f"{name:>10} {n:>7} {_pct(ttft, 50) * 1e3:>7.0f}ms {_pct(ttft, 99) * 1e3:>5.0f}ms "
                  f"{_pct(itl, 50) * 1e3:>6.1f}ms {_pct(itl, 99) * 1e3:>5.0f}ms {agg:>7.1f} "
                  f"{ratio:>8}")
        if not args.no_direct and ("direct", n) in rows and ("actorrt", n) in rows:
            http = statistics.median(r["wall"] / r["tokens"] for r in rows[("actorrt", n)])
            direct = statistics.median(r["wall"] / r["tokens"] for r in rows[("direct", n)])
            print(f"{'':>10} {n:>7} HTTP layer: {(http - direct) * 1e3:+.2f} ms per token "
                  f"({http / direct:.2f}x the engine's wall time per token)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
