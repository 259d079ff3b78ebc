"""LLM benchmarks on the default model (SmolLM2-135M, Q4_1 GGUF -> ONNX):
prompt and decode tok/s for greedy tokens, 2 threads, against onnxruntime on
the same ONNX file in the same run, and the aggregate decode curve of the
concurrent engine.

    python benchmarks/bench_genai.py [--new-tokens 128] [--ort-tokens 8]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import trio

from actorrt.genai import SamplingParams, open_engine, prepare_model
from actorrt.genai.cli import concurrency_curve, print_curve

PROMPT = ("The history of the city of Paris begins in the 3rd century BC, when a Celtic "
          "people called the Parisii settled on an island in the river Seine. The Romans "
          "conquered the area in 52 BC and built a town they called Lutetia. In the")


def ort_greedy(folder, ids: list[int], new_tokens: int, threads: int) -> tuple[float, float]:
    """(prompt tok/s, decode tok/s) of onnxruntime on the same file."""
    import onnxruntime as ort
    cfg = json.loads((folder / "genai_config.json").read_text())
    layers, kvh, hd = (cfg["model"]["num_layers"], cfg["model"]["num_kv_heads"],
                       cfg["model"]["head_dim"])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
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


def weight_bytes_per_token(folder) -> tuple[int, int]:
    """(bytes of the MatMulNBits weights in the file, bytes the numba kernels
    stream: one byte per quantized value plus float32 scales and zero points).
    Every decode step reads each of them once."""
    import onnx
    m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    sizes = {}
    for t in m.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        sizes[t.name] = n * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    file_b = kern_b = 0
    for node in m.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        at = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        n, k, bs = at["N"], at["K"], at["block_size"]
        nb = -(-k // bs)
        file_b += sum(sizes.get(x, 0) for x in node.input[1:4] if x)
        kern_b += n * nb * bs + 2 * 4 * n * nb
    return file_b, kern_b


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


async def ours(folder, new_tokens: int, levels: list[int], rounds_n: int):
    async with open_engine(folder, max_batch=max(levels)) as engine:
        params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=4))  # warm-up
        single = await engine.generate(PROMPT, params)
        rounds = [await concurrency_curve(engine, levels, min(new_tokens, 64))
                  for _ in range(rounds_n)]
        return single, len(engine.encode_prompt(PROMPT)), rounds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--ort-tokens", type=int, default=8,
                    help="onnxruntime is slow on float zero points: time fewer tokens")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds of the concurrency curve (medians printed)")
    args = ap.parse_args()
    from actorrt.providers.cpu import _contrib_numba
    threads = _contrib_numba.set_num_threads(2)  # the setting; ORT gets 2 too
    folder = prepare_model("smollm2")
    levels = [int(x) for x in args.concurrency.split(",")]
    single, n_prompt, curve = trio.run(ours, folder, args.new_tokens, levels, max(1, args.rounds))
    from actorrt.genai.tokenizer import load_tokenizer
    ids = load_tokenizer(folder).encode(PROMPT)
    ort_prompt, ort_decode = ort_greedy(folder, ids, args.ort_tokens, threads=2)
    print(f"SmolLM2-135M Q4_1, prompt {n_prompt} tokens, {threads} kernel threads "
          f"(onnxruntime: 2 intra-op threads)")
    print(f"{'':24} {'prompt tok/s':>13} {'decode tok/s':>13}")
    print(f"{'actorrt':24} {single.prompt_tokens_per_s:13.1f} {single.decode_tokens_per_s:13.1f}"
          f"   ({len(single.token_ids)} greedy tokens)")
    print(f"{'onnxruntime (same file)':24} {ort_prompt:13.1f} {ort_decode:13.1f}"
          f"   ({args.ort_tokens} greedy tokens)")
    print(f"{'ratio actorrt/ort':24} {single.prompt_tokens_per_s / ort_prompt:13.2f} "
          f"{single.decode_tokens_per_s / ort_decode:13.2f}")
    file_b, kern_b = weight_bytes_per_token(folder)
    bw = read_bandwidth(threads)
    print(f"\nmemory roof (decode is a pass over the weights per token): read bandwidth "
          f"{bw / 1e9:.1f} GB/s ({threads} threads, numpy sums, this run)")
    print(f"  weights in the file {file_b / 1e6:.0f} MB/token -> roof {bw / file_b:.0f} tok/s; "
          f"as the kernels stream them {kern_b / 1e6:.0f} MB/token -> roof {bw / kern_b:.0f} "
          f"tok/s; actorrt decode {single.decode_tokens_per_s:.1f} tok/s = "
          f"{single.decode_tokens_per_s * kern_b / bw:.0%} of the kernels' roof")
    print("\nconcurrent engine, greedy streams (short prompts, 64 new tokens each):")
    print_curve(curve)


if __name__ == "__main__":
    main()
