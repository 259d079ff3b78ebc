"""GGUF (llama, qwen2, phi3, gemma3) -> ONNX decoder graph with a KV cache,
weights kept quantized.

The graph follows onnxruntime-genai's conventions so the same model runs in
onnxruntime and in actorrt:

* inputs: ``input_ids`` int64 ``(batch, seq)``, ``attention_mask`` int64
  ``(batch, total_seq)``, ``past_key_values.{i}.key`` / ``.value`` float32
  ``(batch, n_head_kv, past_seq, head_dim)``;
* outputs: ``logits`` float32 ``(batch, seq, vocab)``, ``present.{i}.key`` /
  ``.value`` float32 ``(batch, n_head_kv, total_seq, head_dim)``.

Operators: ai.onnx opset 21 (``Gather``, ``Cast``, ``Sub``, ``Mul``,
``Unsqueeze``, ``Reshape``, ``ReduceSum``, ``Shape``, ``Sigmoid``, ``MatMul``
for float weights) plus ``SimplifiedLayerNormalization`` (onnxruntime's
contrib op in the default domain, as onnxruntime-genai emits it) and, in
``com.microsoft`` opset 1, ``MatMulNBits``, ``GroupQueryAttention`` and
``SkipSimplifiedLayerNormalization``.

How each GGUF weight type becomes a ``MatMulNBits`` weight so that ORT's
dequantization ``(q - zp) * scale`` equals GGUF's (:func:`nbits_parts`;
docs/model_breadth.md has the table):

* symmetric types (Q4_0, Q5_0, Q8_0, Q3_K, Q6_K): the codes with uint8
  zero points 8 / 16 / 128 / 4 / 32 (exact), 4 or 8 bits, blocks of 32 or 16;
* 4-bit affine types (``d * q + m``: Q4_1, Q4_K, Q2_K): float32 zero point
  ``-m / d`` (equal within float32 rounding; a block with ``d == 0`` becomes
  ``q = 0, zp = -1, scale = m``, exact);
* 8-bit affine types (Q5_1, Q5_K): uint8 zero point 16 plus a correction
  ``sum(x over each block) @ (m + 16 d)`` (onnxruntime refuses 8-bit float
  zero points).

Architectures: ``llama``, ``qwen2`` (q/k/v biases), ``phi3`` (fused qkv and
gate_up), ``gemma3`` (embedding scale, q/k head norms, sandwich norms,
GELU-tanh MLP, sliding-window local layers with their own RoPE base).

A ``Q8_0`` token embedding is gathered straight from the same uint8 blocks the
tied ``lm_head`` uses (``Gather`` + ``Cast`` + ``Sub`` + ``Mul``: exact), so
the 8-bit table is stored once.

llama.cpp stores ``attn_q`` / ``attn_k`` rows permuted for its interleaved
RoPE; the builder puts them back in rotate-half order and uses
``rotary_interleaved=0``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .._errors import ModelLoadError
from ._gguf import (FLOAT_TYPES, PERMUTED_ROPE_ARCHS, QK, QUANTIZED_TYPES, GGUFFile,
                    LlamaHParams, QuantizedRows, open_gguf, unpermute_rope_rows)

__all__ = ["BUILDER_VERSION", "OPSET", "MS_OPSET", "GraphWriter", "build_onnx", "emit_matmul_nbits",
           "io_names", "nbits_parts"]

#: Bump when the produced graph changes; cached models are rebuilt on mismatch.
BUILDER_VERSION = 2
OPSET = 21
MS_OPSET = 1
MS = "com.microsoft"

_ALIGN = 4096  # external-data alignment (lets onnxruntime memory-map tensors)
_INLINE_LIMIT = 256  # tensors smaller than this many bytes stay in model.onnx


def io_names(n_layer: int) -> dict[str, Any]:
    """Input/output names of a built model, as onnxruntime-genai spells them.

    Returns:
        ``{"input_ids", "attention_mask", "past_key", "past_value", "logits",
        "present_key", "present_value"}``; the four KV entries are format
        strings taking the layer index, e.g. ``"past_key_values.%d.key"``.
    """
    del n_layer
    return {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "past_key": "past_key_values.%d.key",
        "past_value": "past_key_values.%d.value",
        "logits": "logits",
        "present_key": "present.%d.key",
        "present_value": "present.%d.value",
    }


class GraphWriter:
    """Accumulates nodes, streams big initializers into one external-data file."""

    def __init__(self, data_file: Path):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._names: set[str] = set()
        self._counter = 0
        self._data_file = data_file
        self._fh = open(data_file, "wb")
        self._offset = 0

    def close(self) -> None:
        self._fh.close()

    def fresh(self, base: str) -> str:
        self._counter += 1
        return f"{base}_{self._counter}"

    def const(self, name: str, array: np.ndarray) -> str:
        """Adds an initializer; big ones go to the external-data file."""
        if name in self._names:
            raise ValueError(f"duplicate initializer {name}")
        self._names.add(name)
        array = np.ascontiguousarray(array)
        if array.nbytes < _INLINE_LIMIT:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        pad = (-self._offset) % _ALIGN
        if pad:
            self._fh.write(b"\0" * pad)
            self._offset += pad
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        self._fh.write(data)
        tensor = TensorProto()
        tensor.name = name
        tensor.dims.extend(array.shape)
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        for key, value in (("location", self._data_file.name), ("offset", str(self._offset)),
                           ("length", str(len(data)))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        tensor.data_location = TensorProto.EXTERNAL
        self.initializers.append(tensor)
        self._offset += len(data)
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, *, domain: str = "",
             name: str | None = None, outputs: list[str] | None = None, **attrs: Any) -> list[str]:
        name = name or self.fresh(op)
        outs = outputs or [f"{name}/out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain or None,
                                           **attrs))
        return outs


def _pack_codes(q: np.ndarray, bits: int, block: int) -> np.ndarray:
    """``(rows, cols)`` uint8 codes -> ``MatMulNBits``' B: ``(rows, cols // block,
    block * bits // 8)`` uint8; 4-bit: element ``2i`` in the low nibble of byte ``i``."""
    rows, cols = q.shape
    if bits == 8:
        return np.ascontiguousarray(q.reshape(rows, cols // block, block), np.uint8)
    q = q.reshape(rows, cols // block, block // 2, 2)
    return (q[..., 0] | (q[..., 1] << 4)).astype(np.uint8)


def nbits_parts(qr: QuantizedRows) -> dict[str, Any]:
    """``MatMulNBits`` initializers and attributes reproducing ``qr``.

    * symmetric types (``w = scale * (q - z)``: Q4_0, Q5_0, Q8_0, Q3_K, Q6_K):
      the codes, the scales and packed uint8 zero points ``z`` (exact);
    * 4-bit affine types (``w = scale * q + bias``: Q4_1, Q4_K, Q2_K): float32
      zero points ``-bias / scale`` (equal within float32 rounding); a
      sub-block with ``scale == 0`` becomes ``q = 0, zp = -1, scale = bias``
      (exact);
    * 8-bit affine types (Q5_1, Q5_K; onnxruntime's CPU kernel refuses float
      zero points with 8 bits): uint8 zero point 16 and a correction
      ``bias + 16 * scale`` per sub-block, returned as ``correction``
      (``(n_blocks, N)`` float32) for the caller to add as
      ``sum(x over each sub-block) @ correction``.

    Returns:
        ``{"B": (N, n_blocks, blob) uint8, "scales": (N * n_blocks,) float32,
        "zero_points": uint8 or float32, "correction": array or None,
        "bits", "block_size", "N", "K"}``.
    """
    n, k = qr.shape
    nb = k // qr.block
    q, scales, correction = qr.q, qr.scale, None
    zero = qr.zero
    if zero is None and qr.bits == 8:
        zero = 16
        correction = np.ascontiguousarray((qr.bias + np.float32(zero) * scales).T, np.float32)
    if zero is not None:
        if qr.bits == 8:
            zp = np.full(n * nb, zero, np.uint8)
        else:
            zp = np.full((n, (nb + 1) // 2), zero | (zero << 4), np.uint8).reshape(-1)
    else:
        zero_scale = scales == 0
        with np.errstate(divide="ignore", invalid="ignore"):
            zp = np.where(zero_scale, np.float32(-1), -qr.bias / scales).astype(np.float32)
        scales = np.where(zero_scale, qr.bias, scales).astype(np.float32)
        if zero_scale.any():
            q = np.where(np.repeat(zero_scale, qr.block, axis=1), 0, q).astype(np.uint8)
        zp = zp.reshape(-1)
    return {"B": _pack_codes(q, qr.bits, qr.block), "scales": scales.reshape(-1).astype(np.float32),
            "zero_points": zp, "correction": correction, "bits": qr.bits,
            "block_size": qr.block, "N": n, "K": k}


def emit_matmul_nbits(g: GraphWriter, x: str, key: str, qr: QuantizedRows, out: str | None,
                      accuracy_level: int) -> str:
    """Adds ``x @ dequantize(qr).T`` to ``g``: one ``MatMulNBits`` node (see
    :func:`nbits_parts`), plus, for 8-bit affine types, ``Reshape`` ->
    ``ReduceSum`` (the sub-block sums of ``x``) -> ``MatMul`` (correction)
    -> ``Add``. ``x``: float32 ``(..., K)``; returns the ``(..., N)`` output name."""
    parts = nbits_parts(qr)
    b = g.const(key + ".qweight", parts["B"])
    s = g.const(key + ".scales", parts["scales"])
    z = g.const(key + ".qzeros", parts["zero_points"])
    corr = parts["correction"]
    y = g.node("MatMulNBits", [x, b, s, z], domain=MS, name=key + "/MatMulNBits",
               outputs=[out] if out and corr is None else None, K=parts["K"], N=parts["N"],
               bits=parts["bits"], block_size=parts["block_size"],
               accuracy_level=accuracy_level)[0]
    if corr is None:
        return y
    k, blk = parts["K"], parts["block_size"]
    shape = g.const(key + ".block_shape", np.array([0, 0, k // blk, blk], np.int64))
    xb = g.node("Reshape", [x, shape], name=key + "/blocks")[0]
    axis = g.const(key + ".axis_last", np.array([-1], np.int64))
    xs = g.node("ReduceSum", [xb, axis], name=key + "/block_sums", keepdims=0)[0]
    c = g.node("MatMul", [xs, g.const(key + ".correction", corr)], name=key + "/correction")[0]
    return g.node("Add", [y, c], name=key + "/add_correction",
                  outputs=[out] if out else None)[0]


class _LlamaBuilder:
    def __init__(self, gguf: GGUFFile, hp: LlamaHParams, g: GraphWriter, max_position: int,
                 accuracy_level: int):
        self.gguf = gguf
        self.hp = hp
        self.g = g
        self.max_position = max_position
        self.accuracy_level = accuracy_level
        self._embed_q8: tuple[str, str] | None = None  # (uint8 blocks, scales) shared w/ lm_head
        #: stack Q, K, V into one projection when they share a type
        self.pack_qkv = True

    # -- weights ------------------------------------------------------------
    def _check_shape(self, tensor: str, expected: tuple[int, int]) -> None:
        got = self.gguf.tensor_shape(tensor)
        if got != expected:
            raise ModelLoadError(f"tensor {tensor!r} has shape {got}, expected {expected}",
                                 model=str(self.gguf.path))

    def _matmul_nbits(self, x: str, key: str, qr: QuantizedRows, out: str | None) -> str:
        return emit_matmul_nbits(self.g, x, key, qr, out, self.accuracy_level)

    def _q8_blocks(self, key: str, qr: QuantizedRows) -> tuple[str, str, str]:
        parts = nbits_parts(qr)
        return (self.g.const(key + ".qweight", parts["B"]),
                self.g.const(key + ".scales", parts["scales"]),
                self.g.const(key + ".qzeros", parts["zero_points"]))

    def linear(self, x: str, tensor: str, key: str, shape: tuple[int, int],
               row_order: np.ndarray | None = None, out: str | None = None) -> str:
        """``x @ W.T`` for GGUF matrix ``tensor`` of numpy shape ``(out, in)``."""
        self._check_shape(tensor, shape)
        kind = self.gguf.tensor_type(tensor)
        if kind in FLOAT_TYPES:
            w = self.gguf.float_tensor(tensor)
            if row_order is not None:
                w = w[row_order]
            wt = self.g.const(key + ".weight", np.ascontiguousarray(w.T))
            return self.g.node("MatMul", [x, wt], name=key + "/MatMul",
                               outputs=[out] if out else None)[0]
        qr = self.gguf.quantized(tensor)
        if row_order is not None:
            qr = qr.take_rows(row_order)
        return self._matmul_nbits(x, key, qr, out)

    def qkv(self, h: str, blk: str, pre: str, q_order: np.ndarray | None,
            k_order: np.ndarray | None) -> list[str]:
        """GroupQueryAttention's first three inputs. When Q, K and V share one
        quantization type (or come as one fused ``attn_qkv`` tensor, phi3): one
        projection over their rows stacked (``qkv_proj``, N = (heads + 2 *
        kv_heads) * head_dim) feeding the op's packed-QKV form, ``[qkv, "",
        ""]``, as onnxruntime-genai packs them: one weight pass and one kernel
        call instead of three. Else three projections. Biases (qwen2:
        ``attn_{q,k,v}.bias``) are added after the projection."""
        hp, g = self.hp, self.g
        kv = hp.n_head_kv * hp.head_dim
        width = (hp.n_head + 2 * hp.n_head_kv) * hp.head_dim
        if self.gguf.has_tensor(blk + "attn_qkv.weight"):
            qkv = self.linear(h, blk + "attn_qkv.weight", pre + ".attn.qkv_proj",
                              (width, hp.hidden))
            if self.gguf.has_tensor(blk + "attn_qkv.bias"):
                qkv = g.node("Add", [qkv, self.vector(blk + "attn_qkv.bias", pre + ".attn.qkv_proj.bias",
                                                      width)], name=pre + "/attn/qkv_bias")[0]
            return [qkv, "", ""]
        specs = [(blk + "attn_q.weight", pre + ".attn.q_proj", (hp.n_head * hp.head_dim, hp.hidden),
                  q_order),
                 (blk + "attn_k.weight", pre + ".attn.k_proj", (kv, hp.hidden), k_order),
                 (blk + "attn_v.weight", pre + ".attn.v_proj", (kv, hp.hidden), None)]
        biases = [t.replace(".weight", ".bias") for t, _, _, _ in specs]
        has_bias = [self.gguf.has_tensor(b) for b in biases]
        kinds = {self.gguf.tensor_type(t) for t, _, _, _ in specs}
        if self.pack_qkv and len(kinds) == 1 and kinds <= set(QUANTIZED_TYPES):
            parts = []
            for tensor, _, shape, order in specs:
                self._check_shape(tensor, shape)
                qr = self.gguf.quantized(tensor)
                parts.append(qr if order is None else qr.take_rows(order))
            out = self._matmul_nbits(h, pre + ".attn.qkv_proj", QuantizedRows.stack(parts), None)
            if any(has_bias):
                vec = np.concatenate([
                    self._vector_array(b, shape[0], order) if hb else np.zeros(shape[0], np.float32)
                    for b, hb, (_, _, shape, order) in zip(biases, has_bias, specs)])
                out = g.node("Add", [out, g.const(pre + ".attn.qkv_proj.bias", vec)],
                             name=pre + "/attn/qkv_bias")[0]
            return [out, "", ""]
        outs = []
        for (tensor, key, shape, order), b, hb in zip(specs, biases, has_bias):
            y = self.linear(h, tensor, key, shape, order)
            if hb:
                y = g.node("Add", [y, g.const(key + ".bias", self._vector_array(b, shape[0], order))],
                           name=key + "/bias")[0]
            outs.append(y)
        return outs

    def _vector_array(self, tensor: str, n: int, order: np.ndarray | None = None) -> np.ndarray:
        w = self.gguf.float_tensor(tensor)
        if w.shape != (n,):
            raise ModelLoadError(f"tensor {tensor!r} has shape {w.shape}, expected ({n},)",
                                 model=str(self.gguf.path))
        return (w if order is None else w[order]).astype(np.float32)

    def vector(self, tensor: str, key: str, n: int) -> str:
        """A float vector initializer (norm weights, biases) checked to be ``(n,)``."""
        return self.g.const(key, self._vector_array(tensor, n))

    def norm_weight(self, tensor: str, key: str, n: int | None = None) -> str:
        return self.vector(tensor, key, n or self.hp.hidden)

    # -- graph pieces -------------------------------------------------------
    def embedding(self, ids: str) -> str:
        hp, g = self.hp, self.g
        name = "token_embd.weight"
        self._check_shape(name, (hp.vocab, hp.hidden))
        if self.gguf.tensor_type(name) == "Q8_0":
            qr = self.gguf.quantized(name)
            b, s, z = self._q8_blocks("model.embed_tokens", qr)
            self._embed_q8 = (b, s, z)
            nb = hp.hidden // QK
            s2 = g.node("Reshape", [s, g.const("const.vocab_blocks", np.array([hp.vocab, nb]))],
                        name="embed/scales_reshape")[0]
            rows = g.node("Gather", [b, ids], name="embed/gather_q")[0]
            rows = g.node("Cast", [rows], name="embed/cast", to=TensorProto.FLOAT)[0]
            rows = g.node("Sub", [rows, g.const("const.128", np.array(128, np.float32))],
                          name="embed/sub_zero")[0]
            sc = g.node("Gather", [s2, ids], name="embed/gather_scales")[0]
            sc = g.node("Unsqueeze", [sc, g.const("const.axis_last", np.array([-1]))],
                        name="embed/unsqueeze")[0]
            rows = g.node("Mul", [rows, sc], name="embed/scale")[0]
            shape = g.const("const.embed_shape", np.array([0, 0, hp.hidden]))
            return g.node("Reshape", [rows, shape], name="embed/reshape")[0]
        kind = self.gguf.tensor_type(name)
        table = (self.gguf.float_tensor(name) if kind in FLOAT_TYPES
                 else self.gguf.quantized(name).dequantize())
        w = g.const("model.embed_tokens.weight", table.astype(np.float32))
        return g.node("Gather", [w, ids], name="embed/gather")[0]

    def lm_head(self, x: str, out: str = "logits") -> str:
        hp, g = self.hp, self.g
        if self.gguf.has_tensor("output.weight"):
            return self.linear(x, "output.weight", "lm_head", (hp.vocab, hp.hidden), out=out)
        if self._embed_q8 is not None:  # tied: reuse the embedding's 8-bit blocks
            b, s, z = self._embed_q8
            return g.node("MatMulNBits", [x, b, s, z], domain=MS, name="lm_head/MatMulNBits",
                          outputs=[out], K=hp.hidden, N=hp.vocab, bits=8,
                          block_size=QK, accuracy_level=self.accuracy_level)[0]
        return self.linear(x, "token_embd.weight", "lm_head", (hp.vocab, hp.hidden), out=out)

    def rope_caches(self, base: float, suffix: str = "") -> tuple[str, str]:
        """cos/sin caches ``(max_position, head_dim / 2)`` float32 for RoPE base ``base``."""
        hp = self.hp
        inv = 1.0 / (base ** (np.arange(0, hp.head_dim, 2, dtype=np.float64) / hp.head_dim))
        ang = np.arange(self.max_position, dtype=np.float64)[:, None] * inv[None, :]
        return (self.g.const("cos_cache" + suffix, np.cos(ang).astype(np.float32)),
                self.g.const("sin_cache" + suffix, np.sin(ang).astype(np.float32)))

    def head_norm(self, x: str, n_heads: int, tensor: str, key: str) -> str:
        """RMS norm of each head of ``x`` (B, S, n_heads * head_dim) with a
        ``(head_dim,)`` weight (gemma3's q/k norms)."""
        hp, g = self.hp, self.g
        split = g.const(key + ".heads_shape", np.array([0, 0, n_heads, hp.head_dim], np.int64))
        flat = g.const(key + ".flat_shape", np.array([0, 0, n_heads * hp.head_dim], np.int64))
        y = g.node("Reshape", [x, split], name=key + "/split_heads")[0]
        y = g.node("SimplifiedLayerNormalization", [y, self.norm_weight(tensor, key + ".weight",
                                                                       hp.head_dim)],
                   name=key + "/norm", axis=-1, epsilon=hp.rms_eps, stash_type=1)[0]
        return g.node("Reshape", [y, flat], name=key + "/merge_heads")[0]

    def plain_norm(self, x: str, tensor: str, key: str) -> str:
        return self.g.node("SimplifiedLayerNormalization", [x, self.norm_weight(tensor, key)],
                           name=key.rsplit(".weight", 1)[0], axis=-1, epsilon=self.hp.rms_eps,
                           stash_type=1)[0]

    def mlp(self, h: str, blk: str, pre: str) -> str:
        """The gated MLP: SiLU (llama, qwen2, phi3 with a fused ``ffn_up`` of
        gate then up rows) or GELU-tanh (gemma3)."""
        hp, g = self.hp, self.g
        if not self.gguf.has_tensor(blk + "ffn_gate.weight"):  # phi3: ffn_up = [gate; up]
            self._check_shape(blk + "ffn_up.weight", (2 * hp.ffn, hp.hidden))
            qr = None if self.gguf.tensor_type(blk + "ffn_up.weight") in FLOAT_TYPES else \
                self.gguf.quantized(blk + "ffn_up.weight")
            if qr is None:
                w = self.gguf.float_tensor(blk + "ffn_up.weight")
                gate = g.node("MatMul", [h, g.const(pre + ".mlp.gate_proj.weight",
                                                    np.ascontiguousarray(w[:hp.ffn].T))],
                              name=pre + ".mlp.gate_proj/MatMul")[0]
                up = g.node("MatMul", [h, g.const(pre + ".mlp.up_proj.weight",
                                                  np.ascontiguousarray(w[hp.ffn:].T))],
                            name=pre + ".mlp.up_proj/MatMul")[0]
            else:
                gate = self._matmul_nbits(h, pre + ".mlp.gate_proj",
                                          qr.take_rows(np.arange(hp.ffn)), None)
                up = self._matmul_nbits(h, pre + ".mlp.up_proj",
                                        qr.take_rows(np.arange(hp.ffn, 2 * hp.ffn)), None)
        else:
            gate = self.linear(h, blk + "ffn_gate.weight", pre + ".mlp.gate_proj",
                               (hp.ffn, hp.hidden))
            up = self.linear(h, blk + "ffn_up.weight", pre + ".mlp.up_proj", (hp.ffn, hp.hidden))
        if hp.arch == "gemma3":
            act = g.node("Gelu", [gate], name=pre + "/mlp/act/Gelu", approximate="tanh")[0]
        else:
            sig = g.node("Sigmoid", [gate], name=pre + "/mlp/act/Sigmoid")[0]
            act = g.node("Mul", [gate, sig], name=pre + "/mlp/act/Mul")[0]
        act = g.node("Mul", [act, up], name=pre + "/mlp/Mul")[0]
        return self.linear(act, blk + "ffn_down.weight", pre + ".mlp.down_proj",
                           (hp.hidden, hp.ffn))

    def build(self, progress: Any) -> onnx.ModelProto:
        hp, g = self.hp, self.g
        names = io_names(hp.n_layer)
        kv = hp.n_head_kv * hp.head_dim
        inputs = [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                          ["batch_size", "sequence_length"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                          ["batch_size", "total_sequence_length"]),
        ]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                 ["batch_size", "sequence_length", hp.vocab])]

        # seqlens_k = sum(mask) - 1 and total_sequence_length, as onnxruntime-genai computes them
        msum = g.node("ReduceSum", ["attention_mask", g.const("const.axis1", np.array([1]))],
                      name="mask/reduce_sum", keepdims=0)[0]
        msub = g.node("Sub", [msum, g.const("const.one", np.array(1, np.int64))], name="mask/sub")[0]
        seqlens_k = g.node("Cast", [msub], name="mask/seqlens_k", to=TensorProto.INT32)[0]
        mshape = g.node("Shape", ["attention_mask"], name="mask/shape")[0]
        total = g.node("Gather", [mshape, g.const("const.idx1", np.array(1, np.int64))],
                       name="mask/gather_total", axis=0)[0]
        total_len = g.node("Cast", [total], name="mask/total_seq_len", to=TensorProto.INT32)[0]
        caches = {False: self.rope_caches(hp.rope_theta)}
        if any(hp.local_layers) and hp.rope_theta_local != hp.rope_theta:
            caches[True] = self.rope_caches(hp.rope_theta_local, "_local")
        else:
            caches[True] = caches[False]
        gemma = hp.arch == "gemma3"
        # per-head q/k norms sit between the projections and attention: no packed QKV
        self.pack_qkv = not self.gguf.has_tensor("blk.0.attn_q_norm.weight")
        if hp.arch == "phi3" and self.gguf.has_tensor("rope_factors_long.weight"):
            raise ModelLoadError("phi3 LongRoPE (rope_factors_long) is not supported",
                                 model=str(self.gguf.path))

        x = self.embedding("input_ids")
        if hp.embed_scale != 1.0:
            x = g.node("Mul", [x, g.const("const.embed_scale", np.array(hp.embed_scale,
                                                                          np.float32))],
                       name="embed/scale_sqrt_hidden")[0]
        progress.update(1)
        residual = x
        h = g.node("SimplifiedLayerNormalization", [x, self.norm_weight(
            "blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight")],
            name="layers.0/input_layernorm", axis=-1, epsilon=hp.rms_eps, stash_type=1)[0]
        permuted = hp.arch in PERMUTED_ROPE_ARCHS
        q_order = unpermute_rope_rows(hp.n_head * hp.head_dim, hp.n_head) if permuted else None
        k_order = unpermute_rope_rows(kv, hp.n_head_kv) if permuted else None
        for i in range(hp.n_layer):
            blk, pre = f"blk.{i}.", f"model.layers.{i}"
            past_k, past_v = names["past_key"] % i, names["past_value"] % i
            pres_k, pres_v = names["present_key"] % i, names["present_value"] % i
            for nm in (past_k, past_v):
                inputs.append(helper.make_tensor_value_info(
                    nm, TensorProto.FLOAT,
                    ["batch_size", hp.n_head_kv, "past_sequence_length", hp.head_dim]))
            for nm in (pres_k, pres_v):
                outputs.append(helper.make_tensor_value_info(
                    nm, TensorProto.FLOAT,
                    ["batch_size", hp.n_head_kv, "total_sequence_length", hp.head_dim]))
            qkv = self.qkv(h, blk, pre, q_order, k_order)
            if self.gguf.has_tensor(blk + "attn_q_norm.weight"):  # gemma3: per-head q/k RMS norms
                qkv[0] = self.head_norm(qkv[0], hp.n_head, blk + "attn_q_norm.weight",
                                        pre + ".attn.q_norm")
                qkv[1] = self.head_norm(qkv[1], hp.n_head_kv, blk + "attn_k_norm.weight",
                                        pre + ".attn.k_norm")
            local = hp.local_layers[i]
            cos, sin = caches[local]
            extra: dict[str, Any] = {}
            if local and hp.sliding_window:
                extra["local_window_size"] = hp.sliding_window
            if hp.attn_softcap:
                extra["softcap"] = hp.attn_softcap
            attn = g.node("GroupQueryAttention",
                          [*qkv, past_k, past_v, seqlens_k, total_len, cos, sin],
                          domain=MS, name=pre + "/attn/GroupQueryAttention",
                          outputs=[pre + "/attn/out", pres_k, pres_v],
                          num_heads=hp.n_head, kv_num_heads=hp.n_head_kv, do_rotary=1,
                          rotary_interleaved=0, scale=hp.attn_scale, **extra)[0]
            o = self.linear(attn, blk + "attn_output.weight", pre + ".attn.o_proj",
                            (hp.hidden, hp.n_head * hp.head_dim))
            if gemma:  # sandwich norm: normalize the attention output before the residual add
                o = self.plain_norm(o, blk + "post_attention_norm.weight",
                                    pre + ".post_attention_norm.weight")
            h, _, _, residual = g.node(
                "SkipSimplifiedLayerNormalization",
                [o, residual, self.norm_weight(blk + "ffn_norm.weight",
                                               pre + ".post_attention_layernorm.weight")],
                4, domain=MS, name=pre + "/post_attention_layernorm", epsilon=hp.rms_eps)
            down = self.mlp(h, blk, pre)
            if gemma:
                down = self.plain_norm(down, blk + "post_ffw_norm.weight",
                                       pre + ".post_feedforward_norm.weight")
            if i + 1 < hp.n_layer:
                gamma = self.norm_weight(f"blk.{i + 1}.attn_norm.weight",
                                         f"model.layers.{i + 1}.input_layernorm.weight")
                nm = f"model.layers.{i + 1}/input_layernorm"
            else:
                gamma = self.norm_weight("output_norm.weight", "model.norm.weight")
                nm = "model.norm"
            h, _, _, residual = g.node("SkipSimplifiedLayerNormalization", [down, residual, gamma],
                                       4, domain=MS, name=nm, epsilon=hp.rms_eps)
            progress.update(1)
        if hp.final_softcap:
            raw = self.lm_head(h, out="logits_raw")
            c = g.const("const.final_softcap", np.array(hp.final_softcap, np.float32))
            y = g.node("Div", [raw, c], name="logits/softcap_div")[0]
            y = g.node("Tanh", [y], name="logits/softcap_tanh")[0]
            g.node("Mul", [y, c], name="logits/softcap_mul", outputs=["logits"])
        else:
            self.lm_head(h)
        progress.update(1)

        graph = helper.make_graph(g.nodes, "actorrt_llama", inputs, outputs, g.initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS, MS_OPSET)],
            producer_name="actorrt.genai.builder", producer_version=str(BUILDER_VERSION))
        model.ir_version = 10
        return model


def build_onnx(gguf_path: str | Path, out_dir: str | Path, *, progress: bool = True,
               max_position: int | None = None, accuracy_level: int = 0) -> dict[str, Any]:
    """Converts a GGUF (see :data:`~actorrt.genai._gguf.SUPPORTED_ARCHS`) into
    ``out_dir/model.onnx`` + ``model.onnx.data``.

    Args:
        gguf_path: the ``.gguf`` file.
        out_dir: existing folder to write into (files are overwritten).
        progress: show a tqdm progress bar on stderr.
        max_position: rows of the RoPE cos/sin caches; defaults to the GGUF's
            context length.
        accuracy_level: ``MatMulNBits`` ``accuracy_level`` attribute (0 keeps
            activations in float32; 4 lets onnxruntime quantize them to int8).

    Returns:
        A dict describing the graph: ``hparams`` (dict), ``io`` (see
        :func:`io_names`), ``files``, ``opsets``, ``builder_version``, ``seconds``.

    Raises:
        ModelLoadError: unreadable GGUF, unsupported architecture or tensor
            type, missing tensors or wrong shapes.
    """
    from tqdm.auto import tqdm

    start = time.perf_counter()
    gguf = gguf_path if isinstance(gguf_path, GGUFFile) else open_gguf(gguf_path)
    hp = gguf.hparams()
    out = Path(out_dir)
    data_file = out / "model.onnx.data"
    g = GraphWriter(data_file)
    try:
        with tqdm(total=hp.n_layer + 2, desc=f"building {hp.name} ONNX",
                  unit="step", disable=not progress) as bar:
            model = _LlamaBuilder(gguf, hp, g, max_position or hp.context_length,
                                  accuracy_level).build(bar)
    finally:
        g.close()
    # onnx.save_model would walk (and try to re-write) the external tensors; the
    # data file is already complete, so write the protobuf as is.
    (out / "model.onnx").write_bytes(model.SerializeToString())
    return {
        "builder_version": BUILDER_VERSION,
        "hparams": {f.name: getattr(hp, f.name) for f in hp.__attrs_attrs__},
        "io": io_names(hp.n_layer),
        "files": {"model": "model.onnx", "external_data": data_file.name},
        "opsets": {"": OPSET, MS: MS_OPSET},
        "max_position": max_position or hp.context_length,
        "seconds": time.perf_counter() - start,
    }
