"""LLM benchmarks on the default model (SmolLM2-135M, Q4_1 GGUF -> ONNX):
prompt and decode tok/s for greedy tokens, 2 threads, against onnxruntime on
the same ONNX file in the same run, and the aggregate decode curve of the
concurrent engine. Both MatMulNBits accuracy levels are measured: 0 (float32
activations, ``model.onnx``) and 4 (int8 activations,
``model.accuracy4.onnx``; onnxruntime 1.32 quantizes only the Q8_0 head there,
as it keeps float32 activations for weights with float zero points).

The peers the issue names run in the same run where installed
(``genai_peers.py``): onnxruntime-genai on its builder's int4 re-quantization
of the model (``pip install onnxruntime-genai``) and llama.cpp on the GGUF
(``pip install llama-cpp-python``, or ``--llama-python`` naming the
interpreter of a venv that has it).

    python benchmarks/bench_genai.py [--new-tokens 128] [--ort-tokens 8]
        [--llama-python PATH]

``--batched`` runs the issue's comparison instead: our engine (accuracy
level 4, the default), onnxruntime-genai (one Generator, ``batch_size = n``)
and llama.cpp (one ``llama_batch`` over n sequences, ``n_seq_max = n``),
each in a subprocess of its own (2 threads; its peak RSS its own), in
interleaved rounds: aggregate decode tok/s of n greedy streams of the same
57-token prompt (1/2/4/8/16, 64 new tokens, prefill excluded) and prefill
tok/s of one prompt of 57, 512 and 2,048 tokens (``--prefill``; ``PROMPT``,
then ``data/python_license.txt``, repeated past its ~3,770 tokens for
longer prompts), with the same-round ratios:

    python benchmarks/bench_genai.py --batched [--rounds 2]
        [--llama-python /work/peers/.venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import trio

from actorrt.genai import SamplingParams, open_engine, prepare_model
from actorrt.genai.models import model_file
from actorrt.genai.cli import concurrency_curve, print_curve

import genai_peers

PROMPT = ("The history of the city of Paris begins in the 3rd century BC, when a Celtic "
          "people called the Parisii settled on an island in the river Seine. The Romans "
          "conquered the area in 52 BC and built a town they called Lutetia. In the")


def ort_greedy(folder, ids: list[int], new_tokens: int, threads: int,
               level: int = 0) -> tuple[float, float]:
    """(prompt tok/s, decode tok/s) of onnxruntime on the same file."""
    import onnxruntime as ort
    cfg = json.loads((folder / "genai_config.json").read_text())
    layers, kvh, hd = (cfg["model"]["num_layers"], cfg["model"]["num_kv_heads"],
                       cfg["model"]["head_dim"])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(model_file(folder, level)), so,
                                providers=["CPUExecutionProvider"])
    names = ["logits"] + [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    past = {f"past_key_values.{i}.{k}": np.zeros((1, kvh, 0, hd), np.float32)
            for i in range(layers) for k in ("key", "value")}
    step = np.asarray([ids], np.int64)
    total = len(ids)
    t0 = time.perf_counter()
    t_first = None
    for n in range(new_tokens + 1):
        out = sess.run(names, {"input_ids": step, "attention_mask": np.ones((1, total), np.int64),
                               **past})
        if t_first is None:
            t_first = time.perf_counter()
        nxt = int(np.argmax(out[0][0, -1]))
        past = {f"past_key_values.{i}.{k}": out[1 + 2 * i + (k == "value")]
                for i in range(layers) for k in ("key", "value")}
        step = np.asarray([[nxt]], np.int64)
        total += 1
    t_end = time.perf_counter()
    return len(ids) / (t_first - t0), new_tokens / (t_end - t_first)


def weight_bytes_per_token(folder) -> tuple[int, int, int]:
    """(bytes of the MatMulNBits weights in the file, bytes the float32-activation
    numba kernels stream: one byte per quantized value plus float32 scales and
    zero points, bytes the int8 kernels stream: their prepacked arrays as a
    level-4 session holds them). Every decode step reads each once."""
    import onnx
    m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    kern_b = 0
    for node in m.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        at = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        n, k, bs = at["N"], at["K"], at["block_size"]
        kern_b += n * -(-k // bs) * bs + 2 * 4 * n * -(-k // bs)
    file_b = genai_peers.nbits_weight_bytes(folder / "model.onnx")
    return file_b, kern_b, int8_packed_bytes(model_file(folder, 4))


def int8_packed_bytes(path) -> int:
    """Bytes of the prepacked MatMulNBits arrays of a session on ``path``
    (fused decoder blocks and stacks included), each array counted once."""
    import actorrt
    from actorrt.providers.cpu.llm._contrib_quant import MatMulNBits
    seen: dict[int, int] = {}
    with actorrt.InferenceSession(path) as sess:
        steps = list(sess._session.plan.steps)
        while steps:
            st = steps.pop()
            steps.extend(getattr(st.kernel, "sub_steps", ()))  # a DecoderBlock's nodes
            steps.extend(getattr(st.kernel, "blocks", ()))  # a DecoderStack's blocks
            head = getattr(st.kernel, "head", None)  # and the LM head it took in
            if head is not None:
                steps.append(head)
            p = st.kernel.packed if isinstance(st.kernel, MatMulNBits) else None
            for a in (p.qi, p.scales, p.dz) if p is not None and p.qi is not None else ():
                seen[id(a)] = a.nbytes
    return sum(seen.values())


def read_bandwidth(threads: int, nbytes: int = 256 << 20) -> float:
    """Stream-read bandwidth (bytes/s) of numpy sums over ``nbytes`` split over
    ``threads`` Python threads (numpy releases the GIL), best of 3."""
    import threading
    parts = [np.ones(nbytes // 4 // threads, np.float32) for _ in range(threads)]
    best = 0.0
    for _ in range(3):
        ts = [threading.Thread(target=p.sum) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, nbytes / (time.perf_counter() - t0))
    return best


async def ours(folder, new_tokens: int, levels: list[int], rounds_n: int, accuracy_level: int):
    # prefix caching off: every prompt is computed (the same prompt repeats)
    async with open_engine(folder, max_batch=max(levels), accuracy_level=accuracy_level,
                           prefix_caching=False) as engine:
        params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=4))  # warm-up
        singles, rounds = [], []
        for _ in range(rounds_n):  # interleaved with the curve's rounds
            singles.append(await engine.generate(PROMPT, params))
            rounds.append(await concurrency_curve(engine, levels, min(new_tokens, 64)))
        # the run of median decode speed (the machine's speed drifts by minutes)
        single = sorted(singles, key=lambda r: r.decode_tokens_per_s)[len(singles) // 2]
        # prompt tok/s: the median over the runs and 5 prefill-only requests
        prompts = [r.prompt_tokens_per_s for r in singles]
        for _ in range(5):
            r = await engine.generate(PROMPT, SamplingParams(max_new_tokens=1))
            prompts.append(r.prompt_tokens_per_s)
        prompt = sorted(prompts)[len(prompts) // 2]
        return single, len(engine.encode_prompt(PROMPT)), rounds, prompt


async def ours_batched(job: dict) -> dict:
    """Our engine's side of ``--batched`` (run in a worker subprocess): the
    concurrency curve through the engine (n requests of the same prompt ids
    started together; decode tok/s from the engine's own decode statistics)
    and prefill tok/s (one request, one new token)."""
    folder = prepare_model("smollm2")
    levels = job["levels"]
    params = SamplingParams(max_new_tokens=job["new_tokens"], ignore_eos=True)
    curve, prefill = {}, {}
    # prefix caching off: the same prompts repeat across rounds and lengths, and
    # a cached prefix would skip the prefill this table measures
    async with open_engine(folder, max_batch=max(levels), prefix_caching=False) as engine:
        await engine.generate(job["ids"], SamplingParams(max_new_tokens=4))  # warm-up
        for n in levels:
            best = 0.0
            for _ in range(job["rounds"]):
                before = engine.statistics()
                async with trio.open_nursery() as nursery:
                    for _ in range(n):
                        nursery.start_soon(engine.generate, job["ids"], params)
                after = engine.statistics()
                best = max(best, (after.decode_tokens - before.decode_tokens)
                           / max(after.decode_time_s - before.decode_time_s, 1e-9))
            curve[n] = best
        one = SamplingParams(max_new_tokens=1, ignore_eos=True)
        for length, ids in job["prefill"].items():
            await engine.generate(ids[:64], one)  # this length's shapes warm
            best = 0.0
            for _ in range(job["rounds"]):
                r = await engine.generate(ids, one)
                best = max(best, r.prompt_tokens_per_s)
            prefill[length] = best
    return {"curve": curve, "prefill": prefill,
            "rss_mb": int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024,
            "version": "this checkout"}


def batched(args) -> None:
    """``--batched``: the three engines' curves and prefill tables, each in
    a subprocess, rounds interleaved; prints the medians, the per-round
    ratios and each one's peak RSS."""
    import statistics
    import subprocess
    import sys
    from pathlib import Path

    from actorrt.genai.models import _source_gguf, model_home
    from actorrt.genai.tokenizer import load_tokenizer
    folder = prepare_model("smollm2")
    tok = load_tokenizer(folder)
    ids = tok.encode(PROMPT)
    text = (Path(__file__).parent / "data" / "python_license.txt").read_text()
    long_ids = tok.encode(text)
    lengths = [int(x) for x in args.prefill.split(",")]
    while len(ids) + len(long_ids) < max(lengths):  # ~3,770 tokens a copy: repeat it
        long_ids = long_ids + tok.encode("\n\n" + text)
    prefill = {n: (ids if n == len(ids) else (ids + long_ids)[:n]) for n in lengths}
    levels = [int(x) for x in args.concurrency.split(",")]
    job = genai_peers.batch_job(ids, prefill, levels, 64, 2, rounds=args.worker_rounds)
    gguf = _source_gguf("smollm2", model_home(), False)[0]
    runs: dict[str, list[dict]] = {"actorrt": [], "onnxruntime-genai": [], "llama.cpp": []}
    for _ in range(max(1, args.rounds)):
        r = subprocess.run([sys.executable, __file__, "--batch-worker", json.dumps(job)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"our worker failed: {r.stderr[-2000:]}")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        runs["actorrt"].append({"curve": {int(k): v for k, v in out["curve"].items()},
                                "prefill": {int(k): v for k, v in out["prefill"].items()},
                                "rss_mb": out["rss_mb"], "version": out["version"]})
        print("actorrt", json.dumps(runs["actorrt"][-1]), flush=True)  # kept if cut short
        g = genai_peers.ort_genai_batched(folder, job)
        if g is not None:
            runs["onnxruntime-genai"].append(g)
            print("onnxruntime-genai", json.dumps(g), flush=True)
        lc = genai_peers.llama_cpp_batched(gguf, job, python=args.llama_python)
        if lc is not None:
            runs["llama.cpp"].append(lc)
            print("llama.cpp", json.dumps(lc), flush=True)
    med = statistics.median
    names = [k for k, v in runs.items() if v]
    print(f"SmolLM2-135M, 2 threads each, {args.rounds} interleaved round(s); streams: the "
          f"same {len(ids)}-token prompt, 64 greedy tokens; decode tok/s aggregate "
          f"(prefill excluded); versions: "
          + ", ".join(f"{k} {runs[k][0].get('version', '?')}" for k in names))
    ours = runs["actorrt"]
    single = [r["curve"][levels[0]] for r in ours]
    print(f"\n{'streams':>7} " + " ".join(f"{k:>18}" for k in names)
          + f" {'ours/ours@' + str(levels[0]):>12}"
          + "".join(f" {'ours/' + k:>24}" for k in names[1:]))
    for n in levels:
        cells = [f"{med(r['curve'][n] for r in runs[k]):18.1f}" for k in names]
        scale = med(r["curve"][n] / s for r, s in zip(ours, single))
        ratios = [f"{med(o['curve'][n] / p['curve'][n] for o, p in zip(ours, runs[k])):24.2f}"
                  for k in names[1:]]
        print(f"{n:7d} " + " ".join(cells) + f" {scale:12.2f}" + "".join(ratios))
    print(f"\n{'prompt':>7} " + " ".join(f"{k + ' tok/s':>24}" for k in names)
          + "".join(f" {'ours/' + k:>24}" for k in names[1:]))
    for n in lengths:
        cells = [f"{med(r['prefill'][n] for r in runs[k]):24.1f}" for k in names]
        ratios = [f"{med(o['prefill'][n] / p['prefill'][n] for o, p in zip(ours, runs[k])):24.2f}"
                  for k in names[1:]]
        print(f"{n:7d} " + " ".join(cells) + "".join(ratios))
    print("\npeak RSS (MB): " + ", ".join(f"{k} {max(r['rss_mb'] for r in runs[k]):.0f}"
                                         for k in names))
    print("per round, decode at " + ", ".join(str(n) for n in levels) + ": "
          + "; ".join(f"{k} " + "/".join(f"{r['curve'][n]:.0f}" for n in levels)
                      for k in names for r in runs[k]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--ort-tokens", type=int, default=8,
                    help="onnxruntime is slow on float zero points: time fewer tokens")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds of the single-stream run and the concurrency "
                         "curve (medians printed)")
    ap.add_argument("--llama-python", default=None,
                    help="Python interpreter with llama-cpp-python for the llama.cpp peer "
                         "(default: this one)")
    ap.add_argument("--batched", action="store_true",
                    help="the concurrency curve and prefill table of the three engines")
    ap.add_argument("--prefill", default="57,512,2048",
                    help="--batched: prompt lengths of the prefill table")
    ap.add_argument("--worker-rounds", type=int, default=2,
                    help="--batched: each measurement the best of this many in its worker")
    ap.add_argument("--batch-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    from actorrt.providers.cpu.llm import _contrib_numba
    threads = _contrib_numba.set_num_threads(2)  # the setting; ORT gets 2 too
    if args.batch_worker is not None:  # our side of --batched, in a subprocess
        job = json.loads(args.batch_worker)
        job["prefill"] = {int(k): v for k, v in job["prefill"].items()}
        print(json.dumps(trio.run(ours_batched, job)))
        return
    if args.batched:
        batched(args)
        return
    folder = prepare_model("smollm2")
    levels = [int(x) for x in args.concurrency.split(",")]
    runs = {lv: trio.run(ours, folder, args.new_tokens, levels, max(1, args.rounds), lv)
            for lv in (0, 4)}
    from actorrt.genai.tokenizer import load_tokenizer
    ids = load_tokenizer(folder).encode(PROMPT)
    peer = {lv: ort_greedy(folder, ids, args.ort_tokens, threads=2, level=lv) for lv in (0, 4)}
    genai = genai_peers.ort_genai_greedy(folder, ids, args.new_tokens, threads=2)
    from actorrt.genai.models import _source_gguf, model_home
    gguf = _source_gguf("smollm2", model_home(), False)[0]
    llama = genai_peers.llama_cpp_greedy(gguf, ids, args.new_tokens, threads=2,
                                         python=args.llama_python)
    print(f"SmolLM2-135M Q4_1, prompt {runs[0][1]} tokens, {threads} kernel threads "
          f"(onnxruntime: 2 intra-op threads)")
    print(f"{'':34} {'prompt tok/s':>13} {'decode tok/s':>13}")
    for lv in (0, 4):
        single = runs[lv][0]
        ort_prompt, ort_decode = peer[lv]
        print(f"{f'actorrt, accuracy_level {lv}':34} {runs[lv][3]:13.1f} "
              f"{single.decode_tokens_per_s:13.1f}   ({len(single.token_ids)} greedy tokens, "
              f"median of {max(1, args.rounds)} runs)")
        print(f"{f'onnxruntime, same file':34} {ort_prompt:13.1f} {ort_decode:13.1f}"
              f"   ({args.ort_tokens} greedy tokens)")
        print(f"{'ratio actorrt/ort':34} {runs[lv][3] / ort_prompt:13.2f} "
              f"{single.decode_tokens_per_s / ort_decode:13.2f}")
    ours4 = runs[4][0]
    print(f"\nthe issue's peers, same run, {args.new_tokens} greedy tokens after the same prompt "
          f"(decode: the run of median decode speed of 3; prompt: the median prompt speed):")
    for name, r, missing in (
            ("onnxruntime-genai, int4 re-quant.", genai, "pip install onnxruntime-genai"),
            ("llama.cpp, the GGUF", llama, "pip install llama-cpp-python (builds llama.cpp)")):
        if r is None:
            print(f"{name:34} not installed: {missing}")
            continue
        same = [next((i for i, (a, b) in enumerate(zip(runs[lv][0].token_ids, r["ids"]))
                      if a != b), min(len(runs[lv][0].token_ids), len(r["ids"])))
                for lv in (0, 4)]
        print(f"{name:34} {r['prompt']:13.1f} {r['decode']:13.1f}   (greedy ids equal "
              f"level 0's for the first {same[0]}, level 4's for the first {same[1]})")
        print(f"{'ratio actorrt level 4/it':34} {runs[4][3] / r['prompt']:13.2f} "
              f"{ours4.decode_tokens_per_s / r['decode']:13.2f}")
    if llama is not None:
        print(f"  (llama-cpp-python {llama['version']}; llama_decode a token, 2 threads)")
    file_b, kern_b, int8_b = weight_bytes_per_token(folder)
    bw = read_bandwidth(threads)
    print(f"\nmemory roof (decode is a pass over the weights per token): read bandwidth "
          f"{bw / 1e9:.1f} GB/s ({threads} threads, numpy sums, this run); weights in the "
          f"file {file_b / 1e6:.0f} MB/token -> roof {bw / file_b:.0f} tok/s")
    for lv, nbytes in ((0, kern_b), (4, int8_b)):
        dec = runs[lv][0].decode_tokens_per_s
        print(f"  accuracy_level {lv}: the kernels stream {nbytes / 1e6:.0f} MB/token -> roof "
              f"{bw / nbytes:.0f} tok/s; decode {dec:.1f} tok/s = {dec * nbytes / bw:.0%} of it")
    if genai is not None:
        print(f"  onnxruntime-genai's int4 file streams {genai['bytes'] / 1e6:.0f} MB/token -> roof "
              f"{bw / genai['bytes']:.0f} tok/s; decode {genai['decode']:.1f} tok/s = "
              f"{genai['decode'] * genai['bytes'] / bw:.0%} of it")
    for lv in (0, 4):
        print(f"\nconcurrent engine, accuracy_level {lv}, greedy streams (short prompts, "
              f"64 new tokens each):")
        print_curve(runs[lv][2])


if __name__ == "__main__":
    main()
