"""Teacher-forced perplexity of a prepared LLM at MatMulNBits accuracy levels
0 and 4 on a held-out English text (default: CPython's LICENSE.txt, the PSF
license and its history, committed as ``benchmarks/data/python_license.txt``).

The text is tokenized once and fed in prefill chunks with the KV cache carried
between them (the full-logits ``model.onnx`` / ``model.accuracy4.onnx``);
perplexity = exp(mean negative log-likelihood of every next token).

    python benchmarks/perplexity.py [--model smollm2] [--chunk 256] [--max-tokens N]
        [--kv-dtype float32,float16]

``--kv-dtype``: the KV caches to measure each level with: ``float32`` a
contiguous float32 buffer carried between chunks (onnxruntime's layout),
``float16`` the engine's block-paged cache of IEEE half values
(:mod:`actorrt.genai.kv_cache`; ``open_engine(kv_dtype="float16")``), each
new key and value rounded to half as the kernels append it.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import trio

TEXT = Path(__file__).with_name("data") / "python_license.txt"


def _log_softmax_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """(S, V) float32 logits, (S,) int targets -> (S,) float64 negative log-likelihoods."""
    x = logits.astype(np.float64)
    mx = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - mx).sum(axis=1)) + mx[:, 0]
    return lse - x[np.arange(len(targets)), targets]


async def perplexity(folder: Path, level: int, ids: np.ndarray, chunk: int,
                     kv_dtype: str = "float32") -> tuple[float, float]:
    """(perplexity, seconds) of ``ids`` (1-D int64) under ``folder``'s graph at
    ``level``, its KV cache contiguous float32 or paged float16 (``kv_dtype``)."""
    import onnx

    from actorrt import SessionOptions, open_session
    from actorrt.genai.models import model_file

    path = model_file(folder, level)
    proto = onnx.load(str(path), load_external_data=False)
    kv_inputs = [(i.name, [d.dim_value for d in i.type.tensor_type.shape.dim])
                 for i in proto.graph.input if i.name.startswith("past_key_values.")]
    outputs = ["logits"] + [n.replace("past_key_values.", "present.") for n, _ in kv_inputs]
    past = {n: np.zeros((1, shape[1], 0, shape[3]), np.float32) for n, shape in kv_inputs}
    cache = None
    if kv_dtype == "float16":
        from actorrt.genai.kv_cache import KVCache
        from actorrt.providers._memory import MemoryAccountant
        kvh, d = kv_inputs[0][1][1], kv_inputs[0][1][3]
        cache = KVCache([n for n, _ in kv_inputs], kvh, d, -(-len(ids) // 16) + 1,
                        memory=MemoryAccountant("cpu"), dtype=np.float16)
        blocks: list[int] = []
    nll = []
    t0 = time.perf_counter()
    async with open_session(path, options=SessionOptions(parallel_execution=False)) as s:
        done = 0
        while done < len(ids) - 1:
            piece = ids[done:done + chunk]
            if cache is not None:  # the pools are the past and the present
                cache.grow(blocks, done + len(piece))
                past = cache.bind([blocks], len(piece))
            feeds = {"input_ids": piece[None, :],
                     "attention_mask": np.ones((1, done + len(piece)), np.int64), **past}
            res = await s.run(outputs, feeds,
                              donate=[n for n, _ in kv_inputs] if cache is not None else ())
            logits = np.asarray(res[0])[0]
            targets = ids[done + 1:done + 1 + len(piece)]
            nll.append(_log_softmax_nll(logits[:len(targets)], targets))
            if cache is None:
                past = {n: np.asarray(v) for (n, _), v in zip(kv_inputs, res[1:])}
            done += len(piece)
    nll = np.concatenate(nll)
    return math.exp(nll.mean()), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--text", default=str(TEXT))
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=0)
    ap.add_argument("--kv-dtype", default="float32",
                    help="comma-separated: float32 (contiguous), float16 (paged)")
    args = ap.parse_args()

    from actorrt.genai.models import prepare_model
    from actorrt.genai.tokenizer import load_tokenizer

    folder = Path(prepare_model(args.model))
    tok = load_tokenizer(folder)
    ids = np.asarray(tok.encode(Path(args.text).read_text()), np.int64)
    if args.max_tokens:
        ids = ids[:args.max_tokens]
    print(f"{folder.name}: {len(ids)} tokens of {Path(args.text).name}")
    result = {}
    kinds = args.kv_dtype.split(",")
    for level in (0, 4):
        for kv in kinds:
            ppl, sec = trio.run(perplexity, folder, level, ids, args.chunk, kv)
            result[level, kv] = ppl
            print(f"accuracy_level {level}, KV {kv}: perplexity {ppl:.4f} ({sec:.1f} s)",
                  flush=True)
    base = result[0, kinds[0]]
    for (level, kv), ppl in result.items():
        print(f"level {level} KV {kv} / level 0 KV {kinds[0]}: {ppl / base:.4f}")


if __name__ == "__main__":
    main()
