"""MatMulNBits ``accuracy_level=4`` with ``block_size=16`` (GGUF Q2_K, Q3_K,
Q6_K): the int8-activation kernels of ``_contrib_int8_b16``.

Oracle: a numpy evaluation of the arithmetic the op allows: A quantized per
32-value block to ``round_half_even(a / s)``, ``s = max|a| / 127``
(``int8_activations``, written from that definition), then the float64
product with the weight dequantized by the op's definition ``(q - zp) *
scale`` per 16-value block. The float32 kernels' error is ~1e-7 of
``|A| @ |W|``; the int8 rounding itself is ~1e-3, so a kernel that kept
float32 activations fails the tight check.
"""

import numpy as np
import pytest

from actorrt.providers.cpu.llm import _contrib_int8 as ci
from actorrt.providers.cpu.llm import _contrib_int8_b16 as b16
from actorrt.providers.cpu.llm import _contrib_quant as cq
from tests.oracle import run_actorrt
from tests.providers.cpu.llm.test_contrib_int8 import _node, dequantized, int8_activations
from tests.providers.cpu.llm.test_contrib_matmulnbits import mnb_model, quantized

needs_int8 = pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")


def _check(got, a, w, tol=1e-6):
    want = int8_activations(a) @ w.T
    scale = np.abs(a).astype(np.float64) @ np.abs(w).T + 1e-30
    assert np.max(np.abs(got - want) / scale) < tol
    exact = a.astype(np.float64) @ w.T  # and it is the int8 arithmetic
    assert np.max(np.abs(got - exact) / scale) > 1e-4


@needs_int8
@pytest.mark.parametrize("bits,zp_kind", [(4, "none"), (4, "packed"), (4, "float"),
                                          (8, "none"), (8, "packed")])
@pytest.mark.parametrize("m,n,k", [(1, 70, 96), (3, 8, 48), (4, 13, 80), (5, 64, 256),
                                   (9, 7, 16), (1, 1030, 4096), (8, 516, 1024)])
def test_block16_int8_equals_int8_activation_product(bits, zp_kind, m, n, k):
    # odd numbers of 16-value blocks (48, 80, 16: a padded block), K not a
    # multiple of 32, N % 4 tails, row tiles 4/3/2/1, the parallel column
    # chunks (8-bit float zero points: the builder never emits them)
    rng = np.random.default_rng(bits * 1000 + m * 7 + n + k)
    b, s, zp = quantized(rng, n, k, bits, 16, zp_kind)
    a = (rng.standard_normal((m, k)) * rng.choice([0.1, 1.0, 30.0], (m, k))).astype(np.float32)
    model, feeds = mnb_model(a, b, s, zp, K=k, N=n, bits=bits, block_size=16, accuracy_level=4)
    (got,) = run_actorrt(model, feeds)
    _check(got, a, dequantized(b, s, zp, n=n, k=k, bits=bits, block_size=16))


@needs_int8
@pytest.mark.parametrize("bits", [4, 8])
def test_block16_rows_do_not_depend_on_the_batch(bits):
    rng = np.random.default_rng(11)
    k, n = 160, 36
    b, s, zp = quantized(rng, n, k, bits, 16, "packed")
    p = cq.pack_nbits(b, s, zp, k=k, n=n, bits=bits, block_size=16, use_numba=True, int8=True)
    a = rng.standard_normal((13, k)).astype(np.float32)
    whole = cq.matmul_nbits_numba(a, p)
    for lo, hi in [(0, 1), (3, 5), (5, 12), (12, 13)]:
        assert np.array_equal(cq.matmul_nbits_numba(a[lo:hi], p), whole[lo:hi])


@needs_int8
def test_block16_takes_the_int8_layout_and_compiled_closure():
    rng = np.random.default_rng(12)
    k, n = 64, 12
    for attrs, i16 in [(dict(accuracy_level=4, block_size=16), True),
                       (dict(accuracy_level=0, block_size=16), False),
                       (dict(accuracy_level=4, block_size=16, bits=2), False)]:
        bits = attrs.pop("bits", 4)
        b, s, zp = quantized(rng, n, k, bits, 16, "packed")
        kern = cq.MatMulNBits(_node(K=k, N=n, bits=bits, **attrs))
        kern.prepare({1: b, 2: s, 3: zp}, {})
        assert (kern.packed.i16 is not None) is i16, attrs
        assert kern.packed.qi is None  # the fused blocks' block-32 layout stays unset
        if not i16:
            continue
        fn = kern.compile()
        assert fn != kern.run
        w = dequantized(b, s, zp, n=n, k=k, bits=bits, block_size=16)
        for shape in [(1, k), (2, 3, k), (0, k)]:
            a = rng.standard_normal(shape).astype(np.float32)
            y = fn(a, b, s, zp)
            assert y.shape == shape[:-1] + (n,) and y.dtype == np.float32
            if a.size:
                _check(y.reshape(-1, n), a.reshape(-1, k), w)
        with pytest.raises(ValueError, match="K=64"):
            fn(np.zeros((1, k + 1), np.float32), b, s, zp)


@needs_int8
def test_block16_non_finite_activations_give_nan_rows():
    rng = np.random.default_rng(13)
    k, n = 64, 8
    b, s, zp = quantized(rng, n, k, 8, 16, "packed")
    w = dequantized(b, s, zp, n=n, k=k, bits=8, block_size=16)
    for bad in (np.nan, np.inf):
        a = rng.standard_normal((2, k)).astype(np.float32)
        a[0, 20] = bad
        model, feeds = mnb_model(a, b, s, zp, K=k, N=n, bits=8, block_size=16, accuracy_level=4)
        (got,) = run_actorrt(model, feeds)
        assert np.isnan(got[0]).all()
        _check(got[1:], a[1:], w)


@needs_int8
def test_sub_block_sums_are_the_halves_of_each_block():
    rng = np.random.default_rng(14)
    a = rng.standard_normal((3, 96)).astype(np.float32)
    xq, sx, xsum = ci.quantize_rows(a)
    xs16 = b16.sub_block_sums(xq, sx)
    # the quantized values back in natural order (per block: even, then odd)
    nat = np.empty_like(xq).reshape(3, 3, 32)
    nat[..., 0::2], nat[..., 1::2] = xq.reshape(3, 3, 32)[..., :16], xq.reshape(3, 3, 32)[..., 16:]
    halves = nat.reshape(3, 3, 2, 16).astype(np.int64).sum(-1).astype(np.float32)
    np.testing.assert_array_equal(xs16.reshape(3, 3, 2), sx[..., None] * halves)
    np.testing.assert_allclose(xs16.reshape(3, 3, 2).sum(-1), xsum, rtol=1e-6, atol=1e-6)


def test_pack_b16_refuses_other_bit_widths():
    with pytest.raises(ValueError, match="bits=2"):
        b16.pack_b16(np.zeros((4, 1, 4), np.uint8), np.ones((4, 1), np.float32),
                     np.zeros((4, 1), np.float32), 2)
