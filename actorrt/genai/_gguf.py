"""Reading llama-family GGUF files: hyper-parameters, tokenizer fields and
quantized tensors, split into the pieces the ONNX builder re-packs.

Only the layouts the builder understands are decoded here (see
:data:`SUPPORTED_WEIGHT_TYPES`); anything else raises
:class:`~actorrt._errors.ModelLoadError` naming the tensor and its type.

GGUF block layouts (rows are output features; :func:`split_blocks` follows
``gguf.quants``' dequantization exactly):

* ``Q4_0`` / ``Q5_0`` / ``Q8_0``: 32 weights, ``w = d * (q - z)`` with ``z``
  8 / 16 / 0 (int8 ``q``; stored here as ``q + 128``, ``z = 128``);
* ``Q4_1`` / ``Q5_1``: 32 weights, ``w = d * q + m``;
* ``Q4_K`` / ``Q5_K``: super-blocks of 256 = 8 sub-blocks of 32 with 6-bit
  scales and mins, ``w = (d * sc) * q - dmin * mn``;
* ``Q6_K``: 16 sub-blocks of 16, int8 scales, ``w = (d * sc) * (q - 32)``;
* ``Q3_K``: 16 sub-blocks of 16, 6-bit scales, ``w = (d * (sc - 32)) * (q - 4)``;
* ``Q2_K``: 16 sub-blocks of 16, 4-bit scales and mins,
  ``w = (d * sc) * q - dmin * mn``.

In the 32-weight layouts byte ``j`` of ``qs`` holds element ``j`` in its low
nibble and element ``j + 16`` in its high nibble.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from .._errors import ModelLoadError

__all__ = [
    "GGUFFile",
    "LlamaHParams",
    "FLOAT_TYPES",
    "QUANTIZED_TYPES",
    "QuantizedRows",
    "SUPPORTED_ARCHS",
    "SUPPORTED_WEIGHT_TYPES",
    "open_gguf",
    "split_blocks",
    "unpermute_rope_rows",
]

#: ``general.architecture`` values the builder turns into decoder graphs.
SUPPORTED_ARCHS = ("llama", "qwen2", "phi3", "gemma3")
#: architectures whose GGUF stores Q/K rows permuted for llama.cpp's
#: interleaved ("normal") RoPE; the others use NeoX (rotate-half) RoPE as is
PERMUTED_ROPE_ARCHS = ("llama",)
#: architectures whose ``attention.sliding_window`` llama.cpp applies. For
#: ``llama`` (Mistral 7B v0.1 and kin), ``qwen2`` and ``phi3`` llama.cpp ignores
#: the key (it warns "Phi SWA is currently disabled" for phi3) and attends to
#: the whole context; so does this builder, so that the file means one thing.
SWA_ARCHS = ("gemma3",)
#: GGML tensor types the builder can turn into ONNX initializers.
SUPPORTED_WEIGHT_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                          "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
#: the quantized ones among them (:meth:`GGUFFile.quantized`)
QUANTIZED_TYPES = SUPPORTED_WEIGHT_TYPES[3:]
#: the float ones (:meth:`GGUFFile.float_tensor`)
FLOAT_TYPES = SUPPORTED_WEIGHT_TYPES[:3]

QK = 32  # weights per block of the legacy types (Q4_0 .. Q8_0)
QK_K = 256  # weights per super-block of the K-quants


@attrs.frozen
class LlamaHParams:
    """Hyper-parameters of a llama-family model, read from GGUF metadata.

    Attributes:
        arch: ``general.architecture`` (``"llama"``).
        name: ``general.name`` or the file stem.
        n_layer: number of transformer blocks.
        hidden: embedding width.
        n_head: query heads.
        n_head_kv: key/value heads (grouped-query attention).
        head_dim: width of one head.
        ffn: hidden width of the SiLU-gated MLP.
        vocab: vocabulary size (rows of the token embedding).
        context_length: trained context window, in tokens.
        rope_theta: RoPE frequency base.
        rms_eps: epsilon of the RMS norms.
        rope_dim: how many of each head's channels RoPE rotates.
        sliding_window: tokens a local layer attends to (itself included),
            0 for none.
        local_layers: per layer, whether it is a sliding-window layer.
        rope_theta_local: RoPE base of the local layers.
        attn_scale: the factor of ``q . k`` (``1 / sqrt(head_dim)`` unless the
            architecture says otherwise).
        attn_softcap / final_softcap: ``c * tanh(x / c)`` caps on the
            attention scores / the logits, 0 for none.
        embed_scale: factor on the token embedding (Gemma: ``sqrt(hidden)``), 1 else.
    """

    arch: str
    name: str
    n_layer: int
    hidden: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ffn: int
    vocab: int
    context_length: int
    rope_theta: float
    rms_eps: float
    rope_dim: int
    sliding_window: int = 0
    local_layers: tuple[bool, ...] = ()
    rope_theta_local: float = 10000.0
    attn_scale: float = 0.0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    embed_scale: float = 1.0


@attrs.frozen
class QuantizedRows:
    """A weight matrix ``(rows, cols)`` split into its quantization parts:
    unsigned codes ``q``, one float32 scale per sub-block of ``block`` values,
    and either one integer zero point for the whole type (``w = scale * (q -
    zero)``) or a float32 bias per sub-block (``w = scale * q + bias``).

    Attributes:
        qtype: the GGML type name (``"Q4_K"``...).
        q: ``(rows, cols)`` uint8 codes, ``0 .. 2**bits - 1``.
        scale: ``(rows, cols // block)`` float32, the file's per-sub-block scale
            exactly as ``gguf.quants`` computes it (``d``, or ``d * sc`` for
            K-quants, a float32 product).
        block: values per sub-block (32, or 16 for Q2_K / Q3_K / Q6_K).
        bits: ``MatMulNBits`` bit width that holds the codes (4 or 8).
        zero: the integer zero point of symmetric types, else ``None``.
        bias: ``(rows, cols // block)`` float32 (``m``, or ``-dmin * m`` for
            K-quants) for affine types, else ``None``.
    """

    qtype: str
    q: np.ndarray
    scale: np.ndarray
    block: int
    bits: int
    zero: int | None = None
    bias: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    def take_rows(self, order: np.ndarray) -> QuantizedRows:
        """Returns the same matrix with its rows reordered by ``order`` (exact)."""
        return attrs.evolve(self, q=self.q[order], scale=self.scale[order],
                            bias=None if self.bias is None else self.bias[order])

    @staticmethod
    def stack(parts: list[QuantizedRows]) -> QuantizedRows:
        """The matrices' rows one after the other (all of one type and width)."""
        first = parts[0]
        if any((p.qtype, p.q.shape[1]) != (first.qtype, first.q.shape[1]) for p in parts):
            raise ValueError("QuantizedRows.stack: parts differ in type or width")
        return attrs.evolve(first, q=np.concatenate([p.q for p in parts]),
                            scale=np.concatenate([p.scale for p in parts]),
                            bias=None if first.bias is None
                            else np.concatenate([p.bias for p in parts]))

    def dequantize(self) -> np.ndarray:
        """Float32 ``(rows, cols)`` bit for bit as ``gguf.quants.dequantize``."""
        rows, cols = self.q.shape
        nb = cols // self.block
        sc = self.scale[:, :, None]
        if self.zero is not None:
            q = (self.q.astype(np.int16) - self.zero).astype(np.float32)
            w = sc * q.reshape(rows, nb, self.block)
        else:
            w = sc * self.q.astype(np.float32).reshape(rows, nb, self.block) + self.bias[:, :, None]
        return w.reshape(rows, cols)


_MAGIC = b"GGUF"
# metadata value types: id -> (struct format, size); 8 = string, 9 = array
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
            6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_NP_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
               10: "<u8", 11: "<i8", 12: "<f8"}
# ggml tensor types: id -> (name, elements per block, bytes per block)
_GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
               6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34),
               10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
               13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 30: ("BF16", 1, 2)}


def _ggml_type_name(type_id: int) -> str:
    if type_id in _GGML_TYPES:
        return _GGML_TYPES[type_id][0]
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(type_id).name
    except Exception:  # gguf missing or an id it does not know
        return f"ggml type {type_id}"


@attrs.frozen
class _TensorInfo:
    name: str
    type_id: int
    shape: tuple[int, ...]  # numpy order (rows last-dim-fastest reversed)
    offset: int  # absolute file offset

    @property
    def type_name(self) -> str:
        return _ggml_type_name(self.type_id)


class _Cursor:
    """Little-endian reader over a memory map."""

    def __init__(self, buf: memoryview):
        self.buf = buf
        self.pos = 0

    def scalar(self, fmt: str, size: int) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self) -> int:
        return self.scalar("<I", 4)

    def u64(self) -> int:
        return self.scalar("<Q", 8)

    def string(self) -> str:
        n = self.u64()
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int) -> Any:
        if vtype == 8:
            return self.string()
        if vtype == 9:
            item, count = self.u32(), self.u64()
            if item == 8:
                return [self.string() for _ in range(count)]
            if item == 9:
                return [self.value(9) for _ in range(count)]
            dtype = np.dtype(_NP_SCALARS[item])
            arr = np.frombuffer(self.buf, dtype, count, self.pos).copy()
            self.pos += dtype.itemsize * count
            return arr
        if vtype not in _SCALARS:
            raise ValueError(f"unknown GGUF metadata value type {vtype}")
        return self.scalar(*_SCALARS[vtype])


class GGUFFile:
    """A memory-mapped GGUF file (version 2 or 3), parsed without the ``gguf``
    package (whose reader takes tens of seconds on a 49k-token vocabulary).

    Args:
        path: the ``.gguf`` file.

    Raises:
        ModelLoadError: the file is missing or is not a readable GGUF file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"GGUF file not found: {self.path}", model=str(path))
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
            self._fields, self._tensors = self._parse(memoryview(self._map))
        except ModelLoadError:
            raise
        except Exception as exc:  # struct.error, ValueError, UnicodeError, OSError
            raise ModelLoadError(f"not a readable GGUF file: {exc!r}", model=str(path)) from exc

    def _parse(self, buf: memoryview) -> tuple[dict[str, Any], dict[str, _TensorInfo]]:
        cur = _Cursor(buf)
        if bytes(buf[:4]) != _MAGIC:
            raise ModelLoadError("not a GGUF file (bad magic)", model=str(self.path))
        cur.pos = 4
        version = cur.u32()
        if version not in (2, 3):
            raise ModelLoadError(f"unsupported GGUF version {version}", model=str(self.path))
        n_tensors, n_kv = cur.u64(), cur.u64()
        fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            fields[key] = cur.value(cur.u32())
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = [cur.u64() for _ in range(cur.u32())]
            type_id, offset = cur.u32(), cur.u64()
            infos.append((name, type_id, tuple(reversed(dims)), offset))
        align = int(fields.get("general.alignment", 32))
        base = cur.pos + (-cur.pos) % align
        tensors = {n: _TensorInfo(n, t, s, base + o) for n, t, s, o in infos}
        return fields, tensors

    # -- metadata ---------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self._fields

    def get(self, key: str, default: Any = None) -> Any:
        """The value of metadata ``key`` (str, number, list or numpy array), or ``default``."""
        return self._fields.get(key, default)

    def require(self, key: str) -> Any:
        """Like :meth:`get` but raises :class:`ModelLoadError` when missing."""
        if key not in self._fields:
            raise ModelLoadError(f"GGUF metadata key {key!r} is missing", model=str(self.path))
        return self._fields[key]

    def token_types(self) -> np.ndarray:
        """``tokenizer.ggml.token_type`` as int32 (1 normal, 3 control, 4 user-defined...)."""
        types = self.get("tokenizer.ggml.token_type")
        if types is None:
            return np.ones(len(self.require("tokenizer.ggml.tokens")), np.int32)
        return np.asarray(types, dtype=np.int32)

    def hparams(self) -> LlamaHParams:
        """Reads and validates the llama hyper-parameters.

        Raises:
            ModelLoadError: unsupported architecture, or a required key missing.
        """
        arch = self.require("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise ModelLoadError(
                f"unsupported GGUF architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})",
                model=str(self.path))
        p = f"{arch}."
        hidden = int(self.require(p + "embedding_length"))
        n_head = int(self.require(p + "attention.head_count"))
        head_dim = int(self.get(p + "attention.key_length", hidden // n_head))
        vocab = self.get(p + "vocab_size")
        if vocab is None:
            vocab = len(self.require("tokenizer.ggml.tokens"))
        n_layer = int(self.require(p + "block_count"))
        window = int(self.get(p + "attention.sliding_window", 0) or 0)
        if arch not in SWA_ARCHS:
            window = 0
        if arch == "gemma3":
            # llama.cpp: every 6th layer global (set_swa_pattern(6)), local RoPE base 10000,
            # q scaled by 1/sqrt(head_dim) (27B: 1/sqrt(hidden / heads)), embeddings by sqrt(hidden)
            pattern = self.get(p + "attention.sliding_window_pattern")
            if pattern is None or isinstance(pattern, (int, np.integer)):
                period = int(pattern or 6)
                local = tuple(window > 0 and (i + 1) % period != 0 for i in range(n_layer))
            else:
                local = tuple(bool(x) for x in np.asarray(pattern).reshape(-1))
            embed_scale = math.sqrt(hidden)
            local_base = float(self.get(p + "rope.freq_base_swa", 10000.0))
        else:
            local = (window > 0,) * n_layer
            embed_scale = 1.0
            local_base = float(self.get(p + "rope.freq_base", 10000.0))
        if len(local) != n_layer:
            raise ModelLoadError(f"sliding-window pattern has {len(local)} entries for "
                                 f"{n_layer} layers", model=str(self.path))
        hp = LlamaHParams(
            arch=arch,
            name=str(self.get("general.name", self.path.stem)),
            n_layer=n_layer,
            hidden=hidden,
            n_head=n_head,
            n_head_kv=int(self.get(p + "attention.head_count_kv", n_head)),
            head_dim=head_dim,
            ffn=int(self.require(p + "feed_forward_length")),
            vocab=int(vocab),
            context_length=int(self.get(p + "context_length", 2048)),
            rope_theta=float(self.get(p + "rope.freq_base", 10000.0)),
            rms_eps=float(self.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
            rope_dim=int(self.get(p + "rope.dimension_count", head_dim)),
            sliding_window=window if any(local) else 0,
            local_layers=local,
            rope_theta_local=local_base,
            attn_scale=1.0 / math.sqrt(head_dim),
            attn_softcap=float(self.get(p + "attn_logit_softcapping", 0.0) or 0.0),
            final_softcap=float(self.get(p + "final_logit_softcapping", 0.0) or 0.0),
            embed_scale=embed_scale,
        )
        if int(self.get(p + "attention.value_length", head_dim)) != head_dim:
            raise ModelLoadError("attention value length differs from key length (not "
                                 "supported)", model=str(self.path))
        if hp.rope_dim != hp.head_dim:
            raise ModelLoadError(f"partial rotary embedding (rope dim {hp.rope_dim} of head dim "
                                 f"{hp.head_dim}) is not supported", model=str(self.path))
        if self.get(p + "rope.scaling.type", "none") not in ("none", None):
            raise ModelLoadError("RoPE scaling is not supported", model=str(self.path))
        return hp

    # -- tensors ----------------------------------------------------------
    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor_type(self, name: str) -> str:
        """The GGML type name, e.g. ``"Q4_1"``."""
        return self._tensor(name).type_name

    def _tensor(self, name: str) -> _TensorInfo:
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelLoadError(f"GGUF tensor {name!r} is missing", model=str(self.path)) from None

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Numpy-order shape (``(rows, cols)`` for a matrix: rows are output features)."""
        return self._tensor(name).shape

    def _raw(self, info: _TensorInfo) -> np.ndarray:
        """The tensor's bytes as ``(rows..., bytes per row)`` uint8 (a view of the map)."""
        if info.type_id not in _GGML_TYPES:
            raise ModelLoadError(
                f"tensor {info.name!r} has unsupported type {info.type_name} "
                f"(supported: {', '.join(SUPPORTED_WEIGHT_TYPES)})", model=str(self.path))
        _, per_block, block_bytes = _GGML_TYPES[info.type_id]
        *outer, inner = info.shape or (1,)
        if inner % per_block:
            raise ModelLoadError(f"tensor {info.name!r} row length {inner} is not a multiple "
                                 f"of the block size {per_block}", model=str(self.path))
        row_bytes = inner // per_block * block_bytes
        count = int(np.prod(outer, dtype=np.int64)) * row_bytes
        if info.offset + count > self._map.size:
            raise ModelLoadError(f"tensor {info.name!r} runs past the end of the file",
                                 model=str(self.path))
        return self._map[info.offset:info.offset + count].reshape(*outer, row_bytes)

    def float_tensor(self, name: str) -> np.ndarray:
        """A float tensor (F32/F16/BF16) as float32, in numpy order.

        Raises:
            ModelLoadError: missing tensor or not a float type.
        """
        info = self._tensor(name)
        kind = info.type_name
        shape = info.shape
        if kind == "F32":
            out = self._raw(info).view("<f4").astype(np.float32)
        elif kind == "F16":
            out = self._raw(info).view("<f2").astype(np.float32)
        elif kind == "BF16":
            out = (self._raw(info).view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ModelLoadError(f"tensor {name!r} has type {kind}, expected a float type",
                                 model=str(self.path))
        return out.reshape(shape)

    def quantized(self, name: str) -> QuantizedRows:
        """Splits a quantized matrix (any of :data:`QUANTIZED_TYPES`) into its parts.

        Raises:
            ModelLoadError: missing tensor, not a matrix, or a type that is not
                one of those.
        """
        info = self._tensor(name)
        kind = info.type_name
        if kind not in QUANTIZED_TYPES:
            raise ModelLoadError(
                f"tensor {name!r} has unsupported quantization type {kind} "
                f"(supported: {', '.join(SUPPORTED_WEIGHT_TYPES)})", model=str(self.path))
        if len(info.shape) != 2:
            raise ModelLoadError(f"tensor {name!r} has shape {info.shape}, expected a matrix",
                                 model=str(self.path))
        rows, cols = info.shape
        _, per_block, block_bytes = _GGML_TYPES[info.type_id]
        raw = self._raw(info).reshape(rows, cols // per_block, block_bytes)
        return split_blocks(kind, raw)


def _f16(b: np.ndarray) -> np.ndarray:
    """(..., 2) uint8 -> (...) float32 of the little-endian f16 they hold."""
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K 12-byte packed 6-bit scales and mins -> two (..., 8) uint8."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def split_blocks(kind: str, blocks: np.ndarray) -> QuantizedRows:
    """Unpacks raw GGML blocks into codes, scales and zero point / bias.

    Args:
        kind: GGML type name, one of :data:`QUANTIZED_TYPES`.
        blocks: ``(rows, n_blocks, bytes per block)`` uint8, the file's bytes.

    Returns:
        The :class:`QuantizedRows` whose :meth:`~QuantizedRows.dequantize`
        equals ``gguf.quants.dequantize`` of the same bytes bit for bit.

    Raises:
        ValueError: ``kind`` is not a quantized type handled here.
    """
    rows, nb, _ = blocks.shape
    u8 = np.uint8
    if kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        d = _f16(blocks[..., 0:2])
        off = 2 if kind in ("Q4_0", "Q5_0") else 4
        bias = _f16(blocks[..., 2:4]) if off == 4 else None
        if kind.startswith("Q5"):
            qh = np.ascontiguousarray(blocks[..., off:off + 4]).view("<u4")[..., 0]
            high = ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(u8) << 4
            off += 4
        qs = blocks[..., off:off + 16]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
        if kind.startswith("Q5"):
            q = q | high
        zero = {"Q4_0": 8, "Q5_0": 16}.get(kind)
        return QuantizedRows(kind, q.reshape(rows, nb * 32).astype(u8), d, 32,
                             4 if kind.startswith("Q4") else 8, zero, bias)
    if kind == "Q8_0":
        d = _f16(blocks[..., 0:2])
        q = (np.ascontiguousarray(blocks[..., 2:34]).view(np.int8).astype(np.int16) + 128)
        return QuantizedRows(kind, q.astype(u8).reshape(rows, nb * 32), d, 32, 8, 128)
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
        sc, mn = _k_scale_min(blocks[..., 4:16])
        scale = d[..., None] * sc.astype(np.float32)  # (rows, nb, 8)
        bias = -(dmin[..., None] * mn.astype(np.float32))
        qs = blocks[..., 16:144] if kind == "Q4_K" else blocks[..., 48:176]
        qs = qs.reshape(rows, nb, 4, 1, 32) >> np.array([0, 4], u8).reshape(2, 1)
        q = (qs & 0x0F).reshape(rows, nb, 8, 32)
        if kind == "Q5_K":
            qh = blocks[..., 16:48].reshape(rows, nb, 1, 32) >> np.arange(8, dtype=u8).reshape(8, 1)
            q = q | ((qh & 1) << 4)
        return QuantizedRows(kind, q.reshape(rows, nb * 256).astype(u8),
                             scale.reshape(rows, nb * 8), 32, 4 if kind == "Q4_K" else 8,
                             None, bias.reshape(rows, nb * 8))
    if kind == "Q6_K":
        ql, qh = blocks[..., 0:128], blocks[..., 128:192]
        sc = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).astype(np.float32)
        d = _f16(blocks[..., 208:210])
        ql = (ql.reshape(rows, nb, 2, 1, 64) >> np.array([0, 4], u8).reshape(2, 1)) & 0x0F
        qh = (qh.reshape(rows, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], u8).reshape(4, 1)) & 0x03
        q = ql.reshape(rows, nb, 8, 32) | (qh.reshape(rows, nb, 8, 32) << 4)
        return QuantizedRows(kind, q.reshape(rows, nb * 256).astype(u8),
                             (d[..., None] * sc).reshape(rows, nb * 16), 16, 8, 32)
    if kind == "Q3_K":
        hmask, qs, s = blocks[..., 0:32], blocks[..., 32:96], blocks[..., 96:108]
        d = _f16(blocks[..., 108:110])
        lo = (s[..., 0:8].reshape(rows, nb, 1, 8) >> np.array([0, 4], u8).reshape(2, 1))
        hi = (s[..., 8:12].reshape(rows, nb, 1, 4) >> np.array([0, 2, 4, 6], u8).reshape(4, 1))
        sc = (lo.reshape(rows, nb, 16) & 0x0F) | ((hi.reshape(rows, nb, 16) & 0x03) << 4)
        sc = (sc.astype(np.int8) - np.int8(32)).astype(np.float32)
        ql = (qs.reshape(rows, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], u8).reshape(4, 1)) & 3
        qb = (hmask.reshape(rows, nb, 1, 32) >> np.arange(8, dtype=u8).reshape(8, 1)) & 1
        q = ql.reshape(rows, nb, 8, 32) | (qb.reshape(rows, nb, 8, 32) << 2)  # 0..7, zero 4
        return QuantizedRows(kind, q.reshape(rows, nb * 256).astype(u8),
                             (d[..., None] * sc).reshape(rows, nb * 16), 16, 4, 4)
    if kind == "Q2_K":
        s, qs = blocks[..., 0:16], blocks[..., 16:80]
        d, dmin = _f16(blocks[..., 80:82]), _f16(blocks[..., 82:84])
        scale = d[..., None] * (s & 0x0F).astype(np.float32)
        bias = -(dmin[..., None] * (s >> 4).astype(np.float32))
        q = (qs.reshape(rows, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], u8).reshape(4, 1)) & 3
        return QuantizedRows(kind, q.reshape(rows, nb * 256).astype(u8),
                             scale.reshape(rows, nb * 16), 16, 4, None, bias.reshape(rows, nb * 16))
    raise ValueError(f"not a quantized type handled here: {kind}")


def open_gguf(path: str | Path) -> GGUFFile:
    """Opens a GGUF file (memory-mapped). See :class:`GGUFFile` for errors."""
    return GGUFFile(path)


def unpermute_rope_rows(rows: int, n_head: int) -> np.ndarray:
    """Row order that undoes llama.cpp's Q/K permutation.

    ``convert_hf_to_gguf.py`` permutes the rows of ``attn_q`` / ``attn_k`` per
    head so that llama.cpp's interleaved RoPE (pairs ``(2i, 2i+1)``) sees what
    Hugging Face's rotate-half RoPE (pairs ``(i, i + d/2)``) saw. Taking the GGUF
    rows in the returned order gives back the rotate-half layout.

    Args:
        rows: number of rows (``n_head * head_dim``).
        n_head: heads in the matrix (query heads for Q, KV heads for K).

    Returns:
        int64 ``(rows,)``: GGUF row index for each output row.
    """
    half = rows // n_head // 2
    idx = np.arange(rows).reshape(n_head, half, 2)  # GGUF row = (head, i, which half)
    return idx.swapaxes(1, 2).reshape(rows)
