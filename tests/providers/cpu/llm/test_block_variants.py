"""The variant decoder block's own row-wise steps (``_block_variants``)
against the ONNX kernels the unfused graph runs: Gelu (approximate=tanh) and
Mul, SimplifiedLayerNormalization over each head; and ``_cols_any`` picking
the block-16 or block-32 int8 kernel by the scales' rank. The whole block is
checked against the unfused graph and onnxruntime in tests/genai/test_archs.py."""

import numpy as np
import pytest

from actorrt.providers.cpu import activation, contrib
from actorrt.providers.cpu.llm import _contrib_int8 as ci
from actorrt.providers.cpu.llm import _contrib_quant as cq

needs_int8 = pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")


@needs_int8
def test_gelu_tanh_mul_equals_the_onnx_gelu_and_mul():
    from actorrt.providers.cpu.llm import _block_variants as bv
    rng = np.random.default_rng(0)
    gate = (rng.standard_normal((5, 300)) * 3).astype(np.float32)
    up = rng.standard_normal((5, 300)).astype(np.float32)
    want = activation.Gelu(gate, approximate="tanh") * up
    got = gate.copy()
    bv._gelu_tanh_mul(got, up, 1, 4)  # rows 1..3 only
    np.testing.assert_array_equal(got[[0, 4]], gate[[0, 4]])
    np.testing.assert_allclose(got[1:4], want[1:4], rtol=2e-6, atol=1e-6)


@needs_int8
def test_head_norms_equal_simplified_layer_normalization_per_head():
    from actorrt.providers.cpu.llm import _block_variants as bv
    rng = np.random.default_rng(1)
    heads, d, off = 3, 32, 16
    x = rng.standard_normal((4, off + heads * d + 8)).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    seg = x[:, off:off + heads * d].reshape(4, heads, d)
    want = contrib.SimplifiedLayerNormalization(seg, gamma, axis=-1, epsilon=1e-6)
    want = (want[0] if isinstance(want, tuple) else want).reshape(4, heads * d)
    got = x.copy()
    bv._head_norms(got, 0, 4, off, heads, d, gamma, np.float32(1e-6))
    np.testing.assert_array_equal(got[:, :off], x[:, :off])
    np.testing.assert_array_equal(got[:, off + heads * d:], x[:, off + heads * d:])
    np.testing.assert_allclose(got[:, off:off + heads * d], want, rtol=1e-5, atol=1e-6)


@needs_int8
@pytest.mark.parametrize("block_size", [16, 32])
def test_cols_any_runs_either_int8_layout(block_size):
    from actorrt.providers.cpu.llm import _block_variants as bv
    from actorrt.providers.cpu.llm import _fusion_variants as fv
    from tests.providers.cpu.llm.test_contrib_int8 import _node
    from tests.providers.cpu.llm.test_contrib_matmulnbits import quantized
    rng = np.random.default_rng(2)
    k, n = 96, 40
    b, s, zp = quantized(rng, n, k, 8, block_size, "packed")
    kern = cq.MatMulNBits(_node(K=k, N=n, bits=8, block_size=block_size, accuracy_level=4))
    kern.prepare({1: b, 2: s, 3: zp}, {})
    w, d, dz = fv._layout(kern)
    assert d.ndim == (3 if block_size == 16 else 2)
    a = rng.standard_normal((3, k)).astype(np.float32)
    xq, sx, xsum = ci.quantize_rows(a)
    t = np.zeros((0, sx.shape[1], 8), np.float32)
    out = np.zeros((3, n), np.float32)
    bv._cols_any(xq, sx, xsum, t, t, w, d, dz, out, 0, n, 0)
    np.testing.assert_array_equal(out, cq.matmul_nbits_numba(a, kern.packed))
