"""Every GGUF weight type the builder reads (actorrt.genai._gguf.split_blocks,
actorrt.genai.builder.nbits_parts).

Oracles: ``gguf.quants.dequantize`` (the ``gguf`` package's own reading of
the blocks) for the unpacked weights, bit for bit; onnxruntime's
``MatMulNBits`` on our packed initializers against ``x @ dequantize(W).T``
(float64) for the repacking; actorrt's own ``MatMulNBits`` kernels (float32
and int8 activations) against the same float64 product. Tensors: awkward
shapes (odd row counts, several blocks / super-blocks), quantized with
``gguf.quants.quantize`` where the package can, else random raw blocks with
finite float16 scales (the K-quants).
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
ort = pytest.importorskip("onnxruntime")

from gguf.quants import dequantize, quantize  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from actorrt import InferenceSession  # noqa: E402
from actorrt.genai._gguf import QUANTIZED_TYPES, split_blocks  # noqa: E402
from actorrt.genai.builder import GraphWriter, emit_matmul_nbits, nbits_parts  # noqa: E402

Q = gguf.GGMLQuantizationType
SIZES = gguf.GGML_QUANT_SIZES
#: types gguf.quants can quantize (the others get random raw blocks)
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
#: byte offsets of the float16 scales in one block (randomized to finite values)
F16_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _int8_available() -> bool:
    from actorrt.providers.cpu.llm import _contrib_int8
    return _contrib_int8.HAVE_INT8_DOT


def raw_tensor(kind: str, rows: int, cols: int, seed: int = 0, d_max: float = 0.02) -> np.ndarray:
    """(rows, cols // block * bytes) uint8 blocks of GGML type ``kind``."""
    rng = np.random.default_rng(seed)
    if kind in QUANTIZABLE:
        return quantize(rng.standard_normal((rows, cols)).astype(np.float32), Q[kind])
    per, nbytes = SIZES[Q[kind]]
    raw = rng.integers(0, 256, (rows, cols // per, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[kind]:
        d = (rng.random((rows, cols // per)) * d_max + 1e-4).astype(np.float16)
        d[0, 0] = 0  # a zero scale (and a zero dmin for the K types with one)
        raw[..., off:off + 2] = d[..., None].view(np.uint8).reshape(rows, cols // per, 2)
    return raw.reshape(rows, -1)


def shapes(kind: str) -> list[tuple[int, int]]:
    per = SIZES[Q[kind]][0]
    return [(7, per * 3), (1, per), (33, per * 5)]


def _split(kind, raw, rows, cols):
    per, nbytes = SIZES[Q[kind]]
    return split_blocks(kind, raw.reshape(rows, cols // per, nbytes))


@pytest.mark.parametrize("kind", QUANTIZED_TYPES)
def test_dequantize_equals_gguf_bit_for_bit(kind):
    for seed, (rows, cols) in enumerate(shapes(kind)):
        raw = raw_tensor(kind, rows, cols, seed)
        ours = _split(kind, raw, rows, cols).dequantize()
        theirs = dequantize(raw, Q[kind]).reshape(rows, cols)
        assert ours.dtype == np.float32 and ours.shape == (rows, cols)
        assert np.array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32)), \
            (kind, rows, cols)


def _nbits_model(tmp_path, qr, m: int, accuracy_level: int) -> str:
    """A one-projection model written by the builder's own emitter."""
    import onnx

    tmp_path.mkdir(parents=True, exist_ok=True)
    g = GraphWriter(tmp_path / "w.data")
    n, k = qr.shape
    try:
        emit_matmul_nbits(g, "A", "proj", qr, "Y", accuracy_level)
    finally:
        g.close()
    graph = helper.make_graph(g.nodes, "nbits", [helper.make_tensor_value_info(
        "A", TensorProto.FLOAT, [1, m, k])], [helper.make_tensor_value_info(
            "Y", TensorProto.FLOAT, [1, m, n])], g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    onnx.checker.check_model(str(path))
    return str(path)


@pytest.mark.parametrize("kind", QUANTIZED_TYPES)
def test_matmul_nbits_on_packed_weights_equals_dequantized_product(kind, tmp_path):
    rng = np.random.default_rng(3)
    rows, cols = shapes(kind)[2]
    raw = raw_tensor(kind, rows, cols, 5)
    w = dequantize(raw, Q[kind]).reshape(rows, cols).astype(np.float64)
    qr = _split(kind, raw, rows, cols)
    parts = nbits_parts(qr)
    assert parts["bits"] in (4, 8) and parts["block_size"] in (16, 32)
    for m in (1, 3):
        x = rng.standard_normal((1, m, cols)).astype(np.float32)
        ref = x.astype(np.float64) @ w.T
        scale = np.abs(x).astype(np.float64) @ np.abs(w).T + 1e-30
        model = _nbits_model(tmp_path / f"l0m{m}", qr, m, 0)
        got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"A": x})[0]
        assert np.max(np.abs(got - ref) / scale) < 1e-5, (kind, m, "onnxruntime")
        for level, tol in ((0, 1e-5), (4, 2e-2)):
            with InferenceSession(_nbits_model(tmp_path / f"l{level}m{m}", qr, m, level)) as sess:
                ours = sess.run(None, {"A": x})[0]
            # int8 activations: per-32-block int8 rounding of x (relative ~1/254 a block)
            assert np.max(np.abs(ours - ref) / scale) < tol, (kind, m, level)


@pytest.mark.skipif(not _int8_available(), reason="needs numba and an AVX2 CPU")
@pytest.mark.parametrize("kind", QUANTIZED_TYPES)
async def test_accuracy_level_4_runs_every_type_on_the_int8_kernels(kind, tmp_path):
    """Level 4: the MatMulNBits of every type runs the int8-activation kernels
    (block 32 and block 16 alike) and computes exactly the product of the
    int8-rounded activations (per 32 values, the op's definition, in numpy)
    with the file's weights; the 8-bit affine types' correction term stays
    float32 (``x @ correction``)."""
    import actorrt
    from tests.providers.cpu.llm.test_contrib_int8 import int8_activations

    rng = np.random.default_rng(9)
    rows, cols = shapes(kind)[2]
    raw = raw_tensor(kind, rows, cols, 7)
    w = dequantize(raw, Q[kind]).reshape(rows, cols).astype(np.float64)
    qr = _split(kind, raw, rows, cols)
    parts = nbits_parts(qr)
    corr = np.zeros_like(w)
    if parts["correction"] is not None:  # (n_blocks, N): per 32-value block of K
        corr = np.repeat(parts["correction"].T.astype(np.float64), qr.block, axis=1)
    for m in (1, 5):
        x = (rng.standard_normal((1, m, cols)) * rng.choice([0.1, 1.0, 30.0], (1, m, cols))
             ).astype(np.float32)
        x2 = x.reshape(m, cols)
        ref = int8_activations(x2) @ (w - corr).T + x2.astype(np.float64) @ corr.T
        scale = np.abs(x2).astype(np.float64) @ np.abs(w).T + 1e-30
        async with actorrt.open_session(_nbits_model(tmp_path / f"m{m}", qr, m, 4),
                                        options=actorrt.SessionOptions(trace="ops")) as sess:
            (got,) = await sess.run(None, {"A": x})
            variants = [s.args.get("kernel_variant.matmul", {}).get("variant")
                        for s in sess.tracer.spans]
        assert "int8-dot" in variants and "f32-numba" not in variants, (kind, variants)
        assert np.max(np.abs(got.reshape(m, rows) - ref) / scale) < 1e-5, (kind, m)
