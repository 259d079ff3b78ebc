"""The LLM peers of ``bench_genai.py`` besides onnxruntime on our own file,
each measured in the same run on the same machine:

* **onnxruntime-genai on an int4 re-quantization** of the model, the file
  its model builder makes for ``-p int4 -e cpu``: every MatMul (the LM head
  included) quantized by onnxruntime's own ``MatMulNBitsQuantizer`` (round to
  nearest, block 32, symmetric, ``accuracy_level`` 4). Its builder fails on
  the GGUF itself (it reads the quantized bytes as floats) and needs torch
  for a Hugging Face folder, so the float weights come from our ONNX file,
  dequantized by onnxruntime running each MatMulNBits on an identity matrix.
  The re-quantized file drops Q4_1's per-block minimum and the Q8_0 head's
  8 bits: about 17 MB fewer bytes a token, other numbers than the GGUF's.
  Needs ``pip install onnxruntime-genai``.
* **llama.cpp** on the GGUF itself, through llama-cpp-python (``pip install
  llama-cpp-python`` builds llama.cpp from source, ~10 minutes), timed in a
  subprocess (its OpenMP pool and ours apart) the way ours is: wall clock of
  a greedy loop, one ``llama_decode`` a token.

Each function returns ``None`` when its peer is not installed.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: onnxruntime-genai's builder settings for ``-p int4 -e cpu``
INT4_BLOCK, INT4_SYMMETRIC, INT4_ACCURACY = 32, True, 4
PEER_DIR = "peer-ort-genai-int4"


def _dequantized_by_ort(node, inits: dict) -> np.ndarray:
    """The (K, N) float32 weight onnxruntime's MatMulNBits multiplies by:
    the node run on a K x K identity matrix."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    at = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    k, n = at["K"], at["N"]
    names = [x for x in node.input[1:] if x]
    g = helper.make_graph(
        [helper.make_node("MatMulNBits", ["A", *node.input[1:]], ["Y"], domain="com.microsoft",
                          **at)],
        "dequantize", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [k, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [k, n])],
        [numpy_helper.from_array(inits[x], x) for x in dict.fromkeys(names)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"A": np.eye(k, dtype=np.float32)})[0]


def ort_genai_int4_folder(folder: Path, threads: int) -> Path:
    """Build (once; cached in ``folder / PEER_DIR``) onnxruntime-genai's int4
    CPU model of ``folder``'s ``model.onnx``: a genai_config.json in its
    format, the tokenizer, and ``model.onnx`` + external data."""
    import onnx
    from onnx import helper, numpy_helper
    root = logging.getLogger().level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from onnxruntime.quantization.quant_utils import QuantFormat

    # its module sets the root logger to INFO (logging.basicConfig) and logs every node
    logging.getLogger().setLevel(root)
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)

    out = folder / PEER_DIR
    cfg_path = out / "genai_config.json"
    top = json.loads((folder / "genai_config.json").read_text())
    ours = top["model"]
    if not (out / "model.onnx").exists():
        out.mkdir(exist_ok=True)
        m = onnx.load(str(folder / "model.onnx"))
        inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
        nodes, used = [], set()
        for node in m.graph.node:
            if node.op_type != "MatMulNBits":
                nodes.append(node)
                continue
            w = f"{node.name or node.output[0]}.float_weight"
            inits[w] = _dequantized_by_ort(node, inits)
            nodes.append(helper.make_node("MatMul", [node.input[0], w], list(node.output),
                                          name=node.name))
        for node in nodes:
            used.update(node.input)
        m.graph.ClearField("node")
        m.graph.node.extend(nodes)
        m.graph.ClearField("initializer")
        m.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items()
                                   if k in used)
        q = MatMulNBitsQuantizer(m, bits=4, block_size=INT4_BLOCK, is_symmetric=INT4_SYMMETRIC,
                                 accuracy_level=INT4_ACCURACY, quant_format=QuantFormat.QOperator,
                                 op_types_to_quantize=("MatMul",))
        q.process()
        onnx.save(q.model.model, str(out / "model.onnx"), save_as_external_data=True,
                  all_tensors_to_one_file=True, location="model.onnx.data")
        (out / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    cfg = {
        "model": {
            "type": "llama", "bos_token_id": top["bos_token_id"],
            "eos_token_id": top["eos_token_ids"], "pad_token_id": top["pad_token_id"],
            "context_length": ours["context_length"], "vocab_size": ours["vocab_size"],
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": [],
                                    "intra_op_num_threads": threads},
                "filename": "model.onnx", "head_size": ours["head_dim"],
                "hidden_size": ours["hidden_size"], "num_attention_heads": ours["num_heads"],
                "num_hidden_layers": ours["num_layers"],
                "num_key_value_heads": ours["num_kv_heads"],
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key",
                           "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {"do_sample": False, "num_beams": 1, "max_length": 512, "min_length": 0,
                   "past_present_share_buffer": True, "num_return_sequences": 1,
                   "top_k": 1, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.0,
                   "early_stopping": True, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
                   "diversity_penalty": 0.0},
    }
    cfg_path.write_text(json.dumps(cfg, indent=1))
    return out


def nbits_weight_bytes(path: Path) -> int:
    """Bytes of an ONNX file's MatMulNBits weights, scales and zero points
    (each initializer counted once): what a decode step streams from them."""
    import onnx
    m = onnx.load(str(path), load_external_data=False)
    size = {}
    for t in m.graph.initializer:
        n = int(np.prod(t.dims, dtype=np.int64))
        size[t.name] = n * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    names = {x for node in m.graph.node if node.op_type == "MatMulNBits"
             for x in node.input[1:4] if x}
    return sum(size.get(x, 0) for x in names)


def ort_genai_greedy(folder: Path, ids: list[int], new_tokens: int, threads: int,
                     rounds: int = 3) -> dict | None:
    """onnxruntime-genai greedy decode of ``new_tokens`` after ``ids`` on the
    int4 re-quantization (built on first use): decode tok/s of the run of
    median decode speed, its token ids, the median prompt tok/s, and the
    bytes its weights stream a token; None without the package."""
    try:
        import onnxruntime_genai as og
    except ImportError:
        return None
    peer = ort_genai_int4_folder(folder, threads)
    model = og.Model(str(peer))
    runs = []
    for _ in range(rounds + 1):  # the first warms up
        params = og.GeneratorParams(model)
        # min_length: EOS held off, as ours and llama.cpp's loops ignore it
        params.set_search_options(max_length=len(ids) + new_tokens + 1,
                                  min_length=len(ids) + new_tokens + 1, do_sample=False)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(np.asarray(ids, np.int32))  # the prompt's forward pass
        gen.generate_next_token()  # samples the first new token from its logits
        out = [int(gen.get_next_tokens()[0])]
        t1 = time.perf_counter()
        for _ in range(new_tokens - 1):  # a forward pass and a sample each
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        t2 = time.perf_counter()
        # as ours and llama.cpp's: the tokens after the first over the time after it
        runs.append({"prompt": len(ids) / (t1 - t0), "decode": (new_tokens - 1) / (t2 - t1),
                     "ids": out})
        del gen
    runs = sorted(runs[1:], key=lambda r: r["decode"])
    prompt = sorted(r["prompt"] for r in runs)[len(runs) // 2]
    return {**runs[len(runs) // 2], "prompt": prompt, "bytes": nbits_weight_bytes(peer / "model.onnx")}


_LLAMA_SCRIPT = r"""
import json, sys, time
import numpy as np
import llama_cpp as L
path, ids, n, threads, rounds = (sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]),
                                 int(sys.argv[4]), int(sys.argv[5]))
llm = L.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=512,
              verbose=False)
ctx, nv = llm.ctx, llm.n_vocab()
def decode(toks):
    arr = (L.llama_token * len(toks))(*toks)
    if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(toks))) != 0:
        raise RuntimeError("llama_decode failed")
    p = L.llama_get_logits_ith(ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(p, shape=(nv,))))
mem = L.llama_get_memory(ctx)
runs = []
for _ in range(rounds + 1):
    L.llama_memory_clear(mem, True)
    t0 = time.perf_counter(); tok = decode(ids); t1 = time.perf_counter()
    out = [tok]
    for _ in range(n - 1):
        tok = decode([tok]); out.append(tok)
    t2 = time.perf_counter()
    runs.append({"prompt": len(ids) / (t1 - t0), "decode": (n - 1) / (t2 - t1), "ids": out})
runs = sorted(runs[1:], key=lambda r: r["decode"])
prompt = sorted(r["prompt"] for r in runs)[len(runs) // 2]
print(json.dumps({**runs[len(runs) // 2], "prompt": prompt, "version": L.__version__}))
"""


def llama_cpp_greedy(gguf: Path, ids: list[int], new_tokens: int, threads: int,
                     python: str | None = None, rounds: int = 3) -> dict | None:
    """llama.cpp (through llama-cpp-python, in a subprocess of ``python``,
    default this interpreter) greedy decode on the GGUF: decode tok/s of the
    run of median decode speed, its token ids, the median prompt tok/s and the
    llama-cpp-python version; None when ``llama_cpp`` is not importable.

    Raises:
        RuntimeError: the subprocess failed (its stderr in the message).
    """
    python = python or sys.executable
    probe = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True)
    if probe.returncode != 0:
        return None
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    r = subprocess.run([python, "-c", _LLAMA_SCRIPT, str(gguf), json.dumps(ids),
                        str(new_tokens), str(threads), str(rounds)],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp peer failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- batched
# The concurrency curve and prefill table: each engine in a
# subprocess of its own (its thread pool apart, its peak RSS its own), given
# the same token ids: ``n`` streams of the same prompt decoded together for
# ``new_tokens`` greedy tokens (aggregate decode tok/s: the tokens after each
# stream's first over the wall time of those steps, prefill excluded), and
# prefill tok/s of one prompt of each length (to its first token's logits).
# Each prints one JSON line: {"curve": {n: tok/s}, "prefill": {length:
# tok/s}, "rss_mb": peak RSS, "version": ...}. Peak RSS is the process's
# VmHWM (Linux), which starts afresh at exec (``ru_maxrss`` would carry the
# parent's peak over the fork).

_LLAMA_BATCH_SCRIPT = r"""
import json, sys, time
import numpy as np
import llama_cpp as L
path, job = sys.argv[1], json.loads(sys.argv[2])
ids, new, threads = job["ids"], job["new_tokens"], job["threads"]
L.llama_backend_init()
mp = L.llama_model_default_params()
model = L.llama_model_load_from_file(path.encode(), mp)
nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))

def context(n_seq, n_ctx, n_batch):
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, min(n_batch, 512)
    cp.n_seq_max, cp.n_threads, cp.n_threads_batch = n_seq, threads, threads
    cp.no_perf = True
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed")
    return ctx

def run(ctx, batch, rows):
    # rows: (token, position, sequence, logits wanted); returns argmax per wanted row
    batch.n_tokens = len(rows)
    for i, (t, p, s, want) in enumerate(rows):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, p, 1
        batch.seq_id[i][0], batch.logits[i] = s, 1 if want else 0
    if L.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")
    return [int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(nv,))))
            for i, r in enumerate(rows) if r[3]]

curve = {}
for n in job["levels"]:
    ctx = context(n, n * (len(ids) + new + 8), max(512, n * len(ids)))
    batch = L.llama_batch_init(max(512, n * len(ids)), 0, 1)
    best = 0.0
    for _ in range(job["rounds"]):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        toks = run(ctx, batch, [(t, p, s, p == len(ids) - 1) for s in range(n)
                                for p, t in enumerate(ids)])
        t0 = time.perf_counter()
        for step in range(new - 1):
            toks = run(ctx, batch, [(toks[s], len(ids) + step, s, True) for s in range(n)])
        best = max(best, n * (new - 1) / (time.perf_counter() - t0))
    curve[n] = best
    L.llama_batch_free(batch)
    L.llama_free(ctx)
prefill = {}
for length, p_ids in job["prefill"].items():
    ctx = context(1, len(p_ids) + 8, len(p_ids))
    batch = L.llama_batch_init(len(p_ids), 0, 1)
    best = 0.0
    for _ in range(job["rounds"]):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        run(ctx, batch, [(t, p, 0, p == len(p_ids) - 1) for p, t in enumerate(p_ids)])
        best = max(best, len(p_ids) / (time.perf_counter() - t0))
    prefill[length] = best
    L.llama_batch_free(batch)
    L.llama_free(ctx)
rss = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
print(json.dumps({"curve": curve, "prefill": prefill, "rss_mb": rss, "version": L.__version__}))
"""

_ORT_GENAI_BATCH_SCRIPT = r"""
import json, sys, time
import numpy as np
import onnxruntime_genai as og
folder, job = sys.argv[1], json.loads(sys.argv[2])
ids, new = job["ids"], job["new_tokens"]
model = og.Model(folder)

def generator(rows, length):
    params = og.GeneratorParams(model)
    # min_length: EOS held off, as the other engines' loops ignore it
    params.set_search_options(batch_size=len(rows), max_length=length, min_length=length,
                              do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray(rows, np.int32))
    return gen

curve = {}
for n in job["levels"]:
    best = 0.0
    for _ in range(job["rounds"]):
        gen = generator([ids] * n, len(ids) + new)
        gen.generate_next_token()  # the first token, from the prompts' logits
        gen.get_next_tokens()
        t0 = time.perf_counter()
        for _ in range(new - 1):
            gen.generate_next_token()
            gen.get_next_tokens()
        best = max(best, n * (new - 1) / (time.perf_counter() - t0))
        del gen
    curve[n] = best
prefill = {}
for length, p_ids in job["prefill"].items():
    best = 0.0
    for _ in range(job["rounds"]):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(p_ids) + 2, min_length=len(p_ids) + 2,
                                  do_sample=False)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(np.asarray([p_ids], np.int32))  # the prompt's forward pass
        gen.generate_next_token()
        gen.get_next_tokens()
        best = max(best, len(p_ids) / (time.perf_counter() - t0))
        del gen
    prefill[length] = best
rss = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
print(json.dumps({"curve": curve, "prefill": prefill, "rss_mb": rss, "version": og.__version__}))
"""


def _worker(python: str, script: list[str], env: dict | None = None) -> dict:
    r = subprocess.run([python, *script], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise RuntimeError(f"{script[0] if script[0] != '-c' else 'peer'} failed: "
                           f"{r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["curve"] = {int(k): v for k, v in out["curve"].items()}
    out["prefill"] = {int(k): v for k, v in out["prefill"].items()}
    return out


def batch_job(ids: list[int], prefill: dict[int, list[int]], levels: list[int],
              new_tokens: int, threads: int, rounds: int = 1) -> dict:
    """The job every batched worker runs (JSON-able): ``ids`` the streams'
    prompt, ``prefill`` length -> prompt ids; each measurement the best of
    ``rounds`` in the worker."""
    return {"ids": ids, "prefill": {str(k): v for k, v in prefill.items()}, "levels": levels,
            "new_tokens": new_tokens, "threads": threads, "rounds": rounds}


def llama_cpp_batched(gguf: Path, job: dict, python: str | None = None) -> dict | None:
    """llama.cpp's concurrency curve (one ``llama_batch`` of n sequences a
    step, ``n_seq_max = n``) and prefill table on the GGUF, in a subprocess
    of ``python``; None when ``llama_cpp`` is not importable there.

    Raises:
        RuntimeError: the subprocess failed (its stderr in the message).
    """
    python = python or sys.executable
    if subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode:
        return None
    return _worker(python, ["-c", _LLAMA_BATCH_SCRIPT, str(gguf), json.dumps(job)],
                   {"OMP_NUM_THREADS": str(job["threads"])})


def ort_genai_batched(folder: Path, job: dict) -> dict | None:
    """onnxruntime-genai's concurrency curve (one Generator with
    ``batch_size = n``) and prefill table on its int4 re-quantization of the
    model (built on first use), in a subprocess; None without the package.

    Raises:
        RuntimeError: the subprocess failed (its stderr in the message).
    """
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return None
    peer = ort_genai_int4_folder(folder, job["threads"])
    return _worker(sys.executable, ["-c", _ORT_GENAI_BATCH_SCRIPT, str(peer), json.dumps(job)])
