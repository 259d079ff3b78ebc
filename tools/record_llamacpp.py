"""Records llama.cpp's outputs for the tests (tests/genai/data/*.json), so the
tests compare against llama.cpp without needing it installed.

Run with a Python that has ``llama-cpp-python`` (and numpy, gguf), from the
repository root::

    python tools/record_llamacpp.py --write-tiny /tmp/tiny        # needs gguf
    /work/peers/.venv/bin/python tools/record_llamacpp.py --tiny /tmp/tiny --gemma PATH

* ``--gemma PATH`` (the gemma-3-270m-q4_k_m.gguf): per prompt, llama.cpp's
  token ids of the text, the top-1 id of its teacher-forced logits at each of
  the first 256 positions, and 32 greedy ids with each step's top-2 margin
  (logit units) -> ``llamacpp_gemma3_270m.json``; plus its tokenization of
  tricky strings -> ``llamacpp_gemma3_tokens.json``.
* ``--write-tiny DIR`` then ``--tiny DIR``: the tiny random GGUFs of
  tests/genai/test_archs.py (written from the same seeds; their sha256 is
  recorded so the test can tell if they changed), llama.cpp's teacher-forced
  top-1 ids and top-2 margins -> ``llamacpp_tiny_archs.json``.

llama.cpp runs on 2 threads, one sequence, its default CPU kernels.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "genai" / "data"

PROMPTS = [
    "The history of the city begins with a small settlement on the river, where traders met to "
    "exchange salt, wool and grain. Over the centuries it grew into a market town, then a "
    "regional capital with a cathedral, a university and a busy port. ",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"
    "        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\nclass Stack:\n"
    "    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon "
    "dioxide to make glucose and oxygen. It takes place mainly in the leaves, inside "
    "chloroplasts, which contain the pigment chlorophyll. ",
    "Q: What is the tallest mountain in the world?\nA: Mount Everest, at 8,849 metres.\n"
    "Q: Which planet is closest to the sun?\nA: Mercury.\nQ: How many legs does a spider have?"
    "\nA: Eight.\n",
]
GREEDY = ["The capital of France is", "Once upon a time,", "The three primary colors are",
          "import numpy as np\n"]
TINY_STRINGS = ["the theme", "hello the", "  the  t", "ünï 🤖", "t\nh\te", "thethe the",
                "<|end|> <bos>", "", "Hello 123456 world!!\n\n  x", "it's 12 !!!\n\n\n   end",
                "a1234b 12345 1 1234567", "x  \n\n\t !!\n!! the", "DON'T 's 'S"]
TOKEN_STRINGS = ["Hello world", "  two leading spaces", "tabs\tand\nnewlines\n\n\n",
                 "ünïcödé 你好 🤖 emoji", "<b>bold</b> and <start_of_turn>user", "1234567 3.14159",
                 "don't won't I'm", "    indented code()", "", " ", "a" * 40]


def _llama(path: Path, n_ctx: int = 1024):
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=n_ctx, n_threads=2, n_threads_batch=2,
                 logits_all=True, verbose=False, seed=0)


def _teacher_forced(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)], dtype=np.float32)


def _top2(row: np.ndarray) -> tuple[int, float]:
    order = np.argsort(row)[::-1]
    return int(order[0]), float(row[order[0]] - row[order[1]])


def record_gemma(path: Path) -> None:
    llm = _llama(path)
    out = {"model": path.name, "llama_cpp": __import__("llama_cpp").__version__,
           "prompts": [], "greedy": []}
    for text in PROMPTS:
        text = text * 8
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)[:256]
        logits = _teacher_forced(llm, ids)
        top = [_top2(r) for r in logits]
        out["prompts"].append({"text": text, "ids": ids, "top1": [t for t, _ in top],
                               "margins": [round(m, 4) for _, m in top]})
    for text in GREEDY:
        prompt = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(prompt)
        ids, margins = [], []
        for _ in range(32):
            t, m = _top2(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
            ids.append(t)
            margins.append(round(m, 4))
            llm.eval([t])
        out["greedy"].append({"text": text, "prompt_ids": prompt, "ids": ids,
                              "margins": margins})
    (DATA / "llamacpp_gemma3_270m.json").write_text(json.dumps(out))
    toks = {"model": path.name, "cases": [
        {"text": s, "ids": llm.tokenize(s.encode(), add_bos=True, special=False),
         "ids_special": llm.tokenize(s.encode(), add_bos=True, special=True)}
        for s in TOKEN_STRINGS]}
    (DATA / "llamacpp_gemma3_tokens.json").write_text(json.dumps(toks, ensure_ascii=False,
                                                                  indent=0))


def write_tiny(folder: Path) -> None:
    """Phase 1 (a Python with gguf and the test suite's imports): writes the
    tiny GGUFs and ``manifest.json`` into ``folder``."""
    sys.path.insert(0, str(ROOT))
    from tests.genai.test_archs import CASES, IDS, write_arch_gguf

    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"ids": IDS, "cases": {}}
    for case, kw in CASES.items():
        path = write_arch_gguf(folder / f"{case}.gguf", **kw)
        manifest["cases"][case] = {"path": str(path),
                                   "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=0))


def record_tiny(folder: Path) -> None:
    """Phase 2 (a Python with llama-cpp-python): llama.cpp on each tiny GGUF."""
    manifest = json.loads((folder / "manifest.json").read_text())
    ids = manifest["ids"]
    out = {"llama_cpp": __import__("llama_cpp").__version__, "ids": ids, "cases": {}}
    for case, entry in manifest["cases"].items():
        try:
            llm = _llama(Path(entry["path"]), n_ctx=64)
        except ValueError as exc:  # llama.cpp refused the file: say so in the record
            out["cases"][case] = {"sha256": entry["sha256"], "error": str(exc)}
            print(f"{case}: llama.cpp cannot load it: {exc}", file=sys.stderr)
            continue
        top = [_top2(r) for r in _teacher_forced(llm, ids)]
        out["cases"][case] = {"sha256": entry["sha256"], "top1": [t for t, _ in top],
                              "margins": [round(m, 4) for _, m in top],
                              "tokens": [{"text": t, "ids": llm.tokenize(
                                  t.encode(), add_bos=True, special=False)}
                                  for t in TINY_STRINGS]}
        del llm
    (DATA / "llamacpp_tiny_archs.json").write_text(json.dumps(out, indent=0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemma", type=Path, help="gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--write-tiny", type=Path, metavar="DIR",
                    help="phase 1: write the tiny architecture GGUFs into DIR")
    ap.add_argument("--tiny", type=Path, metavar="DIR",
                    help="phase 2: record llama.cpp on the GGUFs in DIR")
    args = ap.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    if args.write_tiny:
        write_tiny(args.write_tiny)
    if args.tiny:
        record_tiny(args.tiny)
    if args.gemma:
        record_gemma(args.gemma)


if __name__ == "__main__":
    main()
