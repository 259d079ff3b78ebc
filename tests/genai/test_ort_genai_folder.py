"""onnxruntime-genai model folders (genai_config.json in its format,
model.onnx + external data, tokenizer.json) run by actorrt's engine.

Oracle: onnxruntime-genai itself on the same folder (greedy ids). The folder
is a tiny random llama built by our builder, with the genai_config.json that
onnxruntime-genai's own builder writes for a llama (the format
benchmarks/genai_peers.py writes for its int4 peer).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
og = pytest.importorskip("onnxruntime_genai")

from actorrt.genai.models import (is_ort_genai_folder, prepare_model,  # noqa: E402
                                  sampling_defaults)
from tests.genai.test_builder import write_tiny_gguf  # noqa: E402


def ort_genai_folder(src, out, search):
    """Our built folder re-described in onnxruntime-genai's genai_config.json format."""
    top = json.loads((src / "genai_config.json").read_text())
    m = top["model"]
    out.mkdir()
    for f in ("model.onnx", "model.onnx.data", "tokenizer.json"):
        shutil.copy(src / f, out / f)
    cfg = {
        "model": {
            "type": "llama", "bos_token_id": top["bos_token_id"],
            "eos_token_id": top["eos_token_ids"], "pad_token_id": top["pad_token_id"],
            "context_length": m["context_length"], "vocab_size": m["vocab_size"],
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": [],
                                    "intra_op_num_threads": 2},
                "filename": "model.onnx", "head_size": m["head_dim"],
                "hidden_size": m["hidden_size"], "num_attention_heads": m["num_heads"],
                "num_hidden_layers": m["num_layers"], "num_key_value_heads": m["num_kv_heads"],
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key",
                           "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {"max_length": 128, "min_length": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": False,
                   "early_stopping": True, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
                   "diversity_penalty": 0.0, **search},
    }
    (out / "genai_config.json").write_text(json.dumps(cfg, indent=1))
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ortgenai")
    ours = prepare_model(write_tiny_gguf(tmp / "tiny.gguf"), home=tmp / "home", progress=False)
    return ort_genai_folder(ours, tmp / "genai", {"do_sample": False, "top_k": 1,
                                                  "top_p": 1.0, "temperature": 1.0,
                                                  "repetition_penalty": 1.0})


def _og_greedy(folder, ids, n):
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + n, min_length=len(ids) + n, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray(ids, np.int32))
    out = []
    while len(out) < n:
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


def test_engine_greedy_ids_equal_onnxruntime_genai(folder):
    import trio

    from actorrt.genai.engine import open_engine
    from actorrt.genai.sampling import SamplingParams

    assert is_ort_genai_folder(folder) and prepare_model(folder) == folder
    ids = [3 + 84, 260, 261, 3 + 32, 3 + 97, 259]
    theirs = _og_greedy(folder, ids, 16)

    async def go():
        async with open_engine(folder) as eng:
            assert eng.default_params.temperature == 0.0
            return await eng.generate(ids, SamplingParams(max_new_tokens=16, ignore_eos=True))

    assert trio.run(go).token_ids == theirs


def test_sampling_defaults_come_from_the_search_section(tmp_path, folder):
    other = ort_genai_folder(folder.parent / "home" / "models" / next(
        p.name for p in (folder.parent / "home" / "models").iterdir()), tmp_path / "s",
        {"do_sample": True, "top_k": 7, "top_p": 0.8, "temperature": 0.6,
         "repetition_penalty": 1.1})
    assert sampling_defaults(other) == {"temperature": 0.6, "top_k": 7, "top_p": 0.8,
                                        "repetition_penalty": 1.1}
    assert sampling_defaults(folder) == {"temperature": 0.0}
