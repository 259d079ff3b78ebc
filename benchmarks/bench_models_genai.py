"""Second-model benchmark: Gemma 3 270M (Q4_K_M GGUF -> ONNX) prompt and
decode tok/s, actorrt (MatMulNBits accuracy levels 0 and 4) against llama.cpp
on the same GGUF, same run, 2 threads. Rounds interleave ours and llama.cpp's
so machine drift hits both; medians are printed with the same-run ratios.

    python benchmarks/bench_models_genai.py [--model gemma3-270m] [--new-tokens 64]
        [--rounds 3] [--llama-python PATH] [--levels 0,4,4u]

``4u``: level 4 with the gemma3/qwen2 variant blocks left unfused (the plan
before _fusion_variants); ``4f``: level 4 with them fused (off by default:
``_fusion_variants.VARIANT_BLOCKS``), for a same-run A/B.
"""

from __future__ import annotations

import argparse

import trio

from actorrt.genai import SamplingParams, open_engine, prepare_model

import genai_peers

PROMPT = ("The history of the city of Paris begins in the 3rd century BC, when a Celtic "
          "people called the Parisii settled on an island in the river Seine. The Romans "
          "conquered the area in 52 BC and built a town they called Lutetia. In the")


async def ours_once(folder, level, new_tokens: int):
    """level: 0, 4, or "4u" (level 4 with the variant blocks (gemma3, qwen2,
    block-16 projections) left unfused: the plan before that fusion)."""
    from actorrt.providers.cpu.llm import _fusion_variants
    match, on = _fusion_variants.match_variant, _fusion_variants.VARIANT_BLOCKS
    if level == "4u":
        _fusion_variants.match_variant = lambda g, gqa, why=None: None
    if level == "4f":  # the variant blocks fused (off by default)
        _fusion_variants.VARIANT_BLOCKS = True
    try:
        return await _ours_once(folder, 4 if level in ("4u", "4f") else level, new_tokens)
    finally:
        _fusion_variants.match_variant, _fusion_variants.VARIANT_BLOCKS = match, on


async def _ours_once(folder, level: int, new_tokens: int):
    # prefix caching off: the prompt repeats, and its tok/s is what is measured
    async with open_engine(folder, max_batch=1, accuracy_level=level,
                           prefix_caching=False) as engine:
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=4))  # warm-up
        r = await engine.generate(PROMPT, SamplingParams(max_new_tokens=new_tokens,
                                                         ignore_eos=True))
        p = [r.prompt_tokens_per_s]
        for _ in range(3):
            p.append((await engine.generate(PROMPT, SamplingParams(max_new_tokens=1)))
                     .prompt_tokens_per_s)
        return sorted(p)[len(p) // 2], r.decode_tokens_per_s, list(r.token_ids)


def med(xs):
    return sorted(xs)[len(xs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-python", default=None)
    ap.add_argument("--levels", default="0,4",
                    help="comma-separated: 0, 4, 4u (level 4 without the variant-block "
                         "fusion), 4f (level 4 with it; off by default)")
    args = ap.parse_args()
    levels = [x if x in ("4u", "4f") else int(x) for x in args.levels.split(",")]
    from actorrt.genai.models import _source_gguf, model_home
    from actorrt.genai.tokenizer import load_tokenizer
    from actorrt.providers.cpu.llm import _contrib_numba
    threads = _contrib_numba.set_num_threads(2)
    folder = prepare_model(args.model)
    gguf = _source_gguf(args.model, model_home(), False)[0]
    ids = load_tokenizer(folder).encode(PROMPT)
    res = {lv: [] for lv in levels}
    res["llama"] = []
    for _ in range(max(1, args.rounds)):
        for lv in levels:
            res[lv].append(trio.run(ours_once, folder, lv, args.new_tokens))
        r = genai_peers.llama_cpp_greedy(gguf, ids, args.new_tokens, threads=2,
                                         python=args.llama_python, rounds=1)
        if r is not None:
            res["llama"].append((r["prompt"], r["decode"], r["ids"]))
    print(f"{args.model}: prompt {len(ids)} tokens, {args.new_tokens} greedy tokens, "
          f"{threads} threads, medians of {args.rounds} interleaved rounds")
    print(f"{'':28} {'prompt tok/s':>13} {'decode tok/s':>13}")
    rows = {}
    names = {0: "actorrt accuracy_level 0", 4: "actorrt accuracy_level 4",
             "4u": "level 4, variant unfused", "4f": "level 4, variant fused"}
    for key, name in [(lv, names[lv]) for lv in levels] + [("llama", "llama.cpp, same GGUF")]:
        if not res[key]:
            print(f"{name:28} not installed")
            continue
        rows[key] = (med([x[0] for x in res[key]]), med([x[1] for x in res[key]]))
        print(f"{name:28} {rows[key][0]:13.1f} {rows[key][1]:13.1f}")
    if 4 in rows and "4u" in rows:
        print(f"{'ratio level 4 / 4u':28} {rows[4][0] / rows['4u'][0]:13.2f} "
              f"{rows[4][1] / rows['4u'][1]:13.2f}")
    if "llama" in rows:
        for lv in levels:
            print(f"{f'ratio level {lv} / llama.cpp':28} {rows[lv][0] / rows['llama'][0]:13.2f} "
                  f"{rows[lv][1] / rows['llama'][1]:13.2f}")
        lids = res["llama"][0][2]
        for lv in levels:
            same = next((i for i, (a, b) in enumerate(zip(res[lv][0][2], lids)) if a != b),
                        min(len(lids), len(res[lv][0][2])))
            print(f"  greedy ids of level {lv} equal llama.cpp's for the first {same}")


if __name__ == "__main__":
    main()
