"""Reading llama-family GGUF files: hyper-parameters, tokenizer fields and
quantized tensors, split into the pieces the ONNX builder re-packs.

Only the layouts the builder understands are decoded here (see
:data:`SUPPORTED_WEIGHT_TYPES`); anything else raises
:class:`~actorrt._errors.ModelLoadError` naming the tensor and its type.

GGUF block layouts (32 weights per block, rows are output features):

* ``Q4_0``: ``d: f16``, ``qs: 16 bytes`` -> ``w = d * (q - 8)``;
* ``Q4_1``: ``d: f16``, ``m: f16``, ``qs: 16 bytes`` -> ``w = d * q + m``;
* ``Q8_0``: ``d: f16``, ``qs: 32 x int8`` -> ``w = d * q``.

In the 4-bit layouts byte ``j`` of ``qs`` holds element ``j`` in its low
nibble and element ``j + 16`` in its high nibble.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from .._errors import ModelLoadError

__all__ = [
    "GGUFFile",
    "LlamaHParams",
    "QuantizedRows",
    "SUPPORTED_ARCHS",
    "SUPPORTED_WEIGHT_TYPES",
    "open_gguf",
    "unpermute_rope_rows",
]

#: ``general.architecture`` values built as llama graphs.
SUPPORTED_ARCHS = ("llama",)
#: GGML tensor types the builder can turn into ONNX initializers.
SUPPORTED_WEIGHT_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0")

QK = 32  # weights per block for every supported quantized type


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


@attrs.frozen
class QuantizedRows:
    """A weight matrix ``(rows, cols)`` split into its quantization parts.

    Attributes:
        qtype: ``"Q4_0"``, ``"Q4_1"`` or ``"Q8_0"``.
        q: unpacked quantized values, ``(rows, cols)`` uint8 for 4-bit types
            (``0..15``) and int8 for ``Q8_0``.
        d: block scales ``(rows, cols // 32)`` float32 (exactly the f16 values).
        m: block minimums ``(rows, cols // 32)`` float32 for ``Q4_1``, else ``None``.
    """

    qtype: str
    q: np.ndarray
    d: np.ndarray
    m: np.ndarray | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    def take_rows(self, order: np.ndarray) -> QuantizedRows:
        """Returns the same matrix with its rows reordered by ``order`` (exact)."""
        return QuantizedRows(self.qtype, self.q[order], self.d[order],
                             None if self.m is None else self.m[order])

    def dequantize(self) -> np.ndarray:
        """Float32 ``(rows, cols)`` exactly as GGUF defines it (used by tests)."""
        rows, cols = self.q.shape
        q = self.q.astype(np.float32).reshape(rows, cols // QK, QK)
        if self.qtype == "Q4_0":
            q = q - 8
        w = self.d[:, :, None] * q
        if self.m is not None:
            w = w + self.m[:, :, None]
        return w.reshape(rows, cols)


_MAGIC = b"GGUF"
# metadata value types: id -> (struct format, size); 8 = string, 9 = array
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
            6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_NP_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
               10: "<u8", 11: "<i8", 12: "<f8"}
# ggml tensor types: id -> (name, elements per block, bytes per block)
_GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
               8: ("Q8_0", 32, 34), 30: ("BF16", 1, 2)}


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
        hp = LlamaHParams(
            arch=arch,
            name=str(self.get("general.name", self.path.stem)),
            n_layer=int(self.require(p + "block_count")),
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
        )
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
        """Splits a ``Q4_0`` / ``Q4_1`` / ``Q8_0`` matrix into its parts.

        Raises:
            ModelLoadError: missing tensor, or a type that is not one of those.
        """
        info = self._tensor(name)
        kind = info.type_name
        if kind not in ("Q4_0", "Q4_1", "Q8_0"):
            raise ModelLoadError(
                f"tensor {name!r} has unsupported quantization type {kind} "
                f"(supported: {', '.join(SUPPORTED_WEIGHT_TYPES)})", model=str(self.path))
        if len(info.shape) != 2:
            raise ModelLoadError(f"tensor {name!r} has shape {info.shape}, expected a matrix",
                                 model=str(self.path))
        rows, cols = info.shape
        blocks = self._raw(info).reshape(rows, cols // QK, -1)
        if kind in ("Q4_0", "Q4_1"):
            off = 2 if kind == "Q4_0" else 4
            d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)
            m = (blocks[..., 2:4].copy().view("<f2")[..., 0].astype(np.float32)
                 if kind == "Q4_1" else None)
            qs = blocks[..., off:off + 16]
            q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, cols)
            return QuantizedRows(kind, q, d, m)
        d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)  # Q8_0
        q = blocks[..., 2:34].copy().view(np.int8).reshape(rows, cols)
        return QuantizedRows(kind, q, d, None)


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
