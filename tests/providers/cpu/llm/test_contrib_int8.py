"""MatMulNBits with ``accuracy_level=4``: the int8-activation kernels.

Oracles: onnxruntime's own int8 path (CompInt8: used by onnxruntime 1.32 for
4/8-bit weights without float zero points), and for float zero points (which
onnxruntime computes in float32 instead) a numpy evaluation of the same
arithmetic: A quantized per 32-value block to ``round_half_even(a / s)``,
``s = max|a| / 127``, then the float64 product with the dequantized weight.
"""

import numpy as np
import pytest

from actorrt.providers.cpu.llm import _contrib_int8 as ci
from actorrt.providers.cpu.llm import _contrib_numba as nbk
from actorrt.providers.cpu.llm import _contrib_quant as cq
from tests.oracle import run_actorrt, run_onnxruntime
from tests.providers.cpu.llm.test_contrib_matmulnbits import mnb_model, quantized

needs_int8 = pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")


def dequantized(b, scales, zp, *, n, k, bits, block_size=32):
    """(N, K) float64 weight from MatMulNBits inputs (the op's definition)."""
    nb = -(-k // block_size)
    q = cq.unpack_bits(b.reshape(n, nb, -1), bits, block_size).astype(np.float64)
    z = cq._zero_points(zp, n=n, nb=nb, bits=bits).astype(np.float64)
    w = (q - z[..., None]) * scales.astype(np.float64).reshape(n, nb)[..., None]
    return w.reshape(n, nb * block_size)[:, :k]


def int8_activations(a):
    """A after the block-32 int8 round trip, float64 (zero-padded K kept out)."""
    m, k = a.shape
    kp = -(-k // 32) * 32
    blocks = np.zeros((m, kp), np.float32)
    blocks[:, :k] = a
    blocks = blocks.reshape(m, kp // 32, 32)
    s = np.abs(blocks).max(-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), s, out=np.zeros_like(s), where=s > 0)
    q = np.clip(np.rint(blocks * inv), -127, 127)
    return (q.astype(np.float64) * s).reshape(m, kp)[:, :k]


@needs_int8
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp_kind", ["none", "packed"])
@pytest.mark.parametrize("m,k", [(1, 96), (3, 576), (4, 64), (5, 80), (8, 576), (13, 1536),
                                 (16, 96), (21, 80)])
def test_int8_matches_onnxruntime_int8(bits, zp_kind, m, k):
    # 4-row groups, their remainders, and K = 80 (zero-padded last block)
    rng = np.random.default_rng(bits * 100 + m + k)
    n = 70
    b, s, zp = quantized(rng, n, k, bits, 32, zp_kind)
    a = (rng.standard_normal((m, k)) * rng.choice([0.1, 1.0, 30.0], (m, k))).astype(np.float32)
    model, feeds = mnb_model(a, b, s, zp, K=k, N=n, bits=bits, block_size=32, accuracy_level=4)
    (want,) = run_onnxruntime(model, feeds)
    (got,) = run_actorrt(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # and it is the int8 arithmetic, not float32 activations
    exact = a.astype(np.float64) @ dequantized(b, s, zp, n=n, k=k, bits=bits).T
    assert np.abs(got - exact).max() > 1e-4 * np.abs(exact).max()


def half_exact(rng, n, k, bits, zp_kind):
    """MatMulNBits inputs whose scales are float16 values (and, for float zero
    points, whose scale * zero point is one up to float32 rounding: a GGUF
    Q4_1 block's d and m, as the builder writes zp = -m / d)."""
    b, s, zp = quantized(rng, n, k, bits, 32, zp_kind)
    s = s.astype(np.float16).astype(np.float32)
    if zp_kind == "float":
        m = (-(rng.random(s.shape) * 0.05)).astype(np.float16).astype(np.float32)
        zp = (-m / s).astype(np.float32)
    return b, s, zp


@needs_int8
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m,n", [(1, 70), (3, 8), (4, 70), (9, 5), (13, 70)])
def test_int8_float16_scales_embedded_match_onnxruntime_int8(bits, m, n):
    # float16-exact scales (symmetric: scale * zero point is a power-of-two
    # multiple) are stored as float16 inside the weight stream (0.625 bytes
    # per 4-bit weight); four-column groups and their tails. 8-bit blocks
    # with the default zero point (128: every scale * (zp - 128) zero) leave
    # the zero-point terms out (34 bytes a block, GGUF Q8_0's size)
    rng = np.random.default_rng(bits * 1000 + m * 10 + n)
    k = 576
    b, s, zp = half_exact(rng, n, k, bits, "none")
    p = cq.pack_nbits(b, s, zp, k=k, n=n, bits=bits, block_size=32, use_numba=True, int8=True)
    assert p.qi is p.scales
    if bits == 8:
        assert p.dz is ci.NO_ZERO_POINTS and p.qi.shape == (n, (k // 32) * 34)
    else:
        assert p.dz is p.qi and p.qi.shape == (n, (k // 32) * 20)
    a = (rng.standard_normal((m, k)) * rng.choice([0.1, 1.0, 30.0], (m, k))).astype(np.float32)
    model, feeds = mnb_model(a, b, s, zp, K=k, N=n, bits=bits, block_size=32, accuracy_level=4)
    (want,) = run_onnxruntime(model, feeds)
    (got,) = run_actorrt(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@needs_int8
@pytest.mark.parametrize("m", [1, 4, 9])
@pytest.mark.parametrize("zeros", ["all", "one", "none"])
def test_int8_8bit_zero_point_terms_kept_unless_all_zero(m, zeros):
    # 8-bit, float16 scales: packed zero points 128 + 2^j make every scale *
    # (zp - 128) a float16 value (36 bytes a block, terms embedded); with
    # every zero point 128 but one the terms stay; all 128: left out
    rng = np.random.default_rng(60 + m)
    k, n = 576, 70
    b, s, _ = quantized(rng, n, k, 8, 32, "none")
    s = s.astype(np.float16).astype(np.float32)
    zp = np.full((n, k // 32), 128, np.uint8)
    if zeros == "none":
        zp = (128 + rng.choice([-4, -1, 1, 2, 8], zp.shape)).astype(np.uint8)
    elif zeros == "one":
        zp[n - 1, 3] = 130  # in the tail column (70 = 17 groups of four + 2)
    p = cq.pack_nbits(b, s, zp, k=k, n=n, bits=8, block_size=32, use_numba=True, int8=True)
    assert p.qi is p.scales
    assert (p.dz is ci.NO_ZERO_POINTS) == (zeros == "all")
    assert p.qi.shape == (n, (k // 32) * (34 if zeros == "all" else 36))
    a = (rng.standard_normal((m, k)) * rng.choice([0.1, 1.0, 30.0], (m, k))).astype(np.float32)
    model, feeds = mnb_model(a, b, s, zp, K=k, N=n, bits=8, block_size=32, accuracy_level=4)
    (want,) = run_onnxruntime(model, feeds)
    (got,) = run_actorrt(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@needs_int8
@pytest.mark.parametrize("m", [1, 5, 8])
def test_int8_float16_zero_points_match_the_int8_arithmetic(m):
    rng = np.random.default_rng(40 + m)
    k, n = 576, 22
    b, s, zp = half_exact(rng, n, k, 4, "float")
    p = cq.pack_nbits(b, s, zp, k=k, n=n, bits=4, block_size=32, use_numba=True, int8=True)
    assert p.qi is p.scales
    a = rng.standard_normal((m, k)).astype(np.float32)
    model, feeds = mnb_model(a, b, s, zp, K=k, N=n, bits=4, block_size=32, accuracy_level=4)
    (got,) = run_actorrt(model, feeds)
    want = int8_activations(a) @ dequantized(b, s, zp, n=n, k=k, bits=4).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_int8_scales_that_are_not_float16_keep_float32():
    rng = np.random.default_rng(5)
    b, s, zp = quantized(rng, 8, 64, 4, 32, "float")
    s = s.astype(np.float16).astype(np.float32)
    s[3, 1] = np.nextafter(s[3, 1], np.float32(1))  # one scale that float16 cannot hold
    w, d, dz = ci.pack_i8(b.reshape(8, 2, 16), s, zp, 4)
    assert d.dtype == np.float32 and d is not w
    s2 = s.copy()
    s2[3, 1] = np.float16(s2[3, 1] * 2)
    zp2 = zp.copy()
    zp2[0, 0] = np.float32(0.1234567)  # scale * zero point off a float16 value
    w, d, dz = ci.pack_i8(b.reshape(8, 2, 16), s2, zp2, 4)
    assert d.dtype == np.float32
    # integer zero points: scale * zero point needs more than float16's 11 bits
    b, s, zp = quantized(rng, 8, 64, 4, 32, "packed")
    p = cq.pack_nbits(b, s.astype(np.float16).astype(np.float32), zp, k=64, n=8, bits=4,
                      block_size=32, use_numba=True, int8=True)
    assert p.scales.dtype == np.float32


@needs_int8
@pytest.mark.parametrize("m", [1, 4, 6])
def test_int8_float_zero_points_match_the_int8_arithmetic(m):
    # onnxruntime keeps float32 activations for float zero points (Q4_1-style
    # weights); actorrt quantizes there too, as llama.cpp's Q4_1 x Q8_1 does
    rng = np.random.default_rng(20 + m)
    k, n = 576, 96
    b, s, zp = quantized(rng, n, k, 4, 32, "float")
    a = rng.standard_normal((m, k)).astype(np.float32)
    model, feeds = mnb_model(a, b, s, zp, K=k, N=n, bits=4, block_size=32, accuracy_level=4)
    (got,) = run_actorrt(model, feeds)
    w = dequantized(b, s, zp, n=n, k=k, bits=4)
    want = int8_activations(a) @ w.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    (f32,) = run_onnxruntime(model, feeds)  # float32 activations
    err = np.abs(got - f32).max() / np.abs(f32).max()
    assert 1e-5 < err < 2e-2  # the int8 rounding, and no more


@needs_int8
@pytest.mark.parametrize("bits", [4, 8])
def test_parallel_and_serial_kernels_agree(bits):
    rng = np.random.default_rng(bits)
    n, k = 517, 576  # N not a multiple of the chunk count
    b, s, zp = quantized(rng, n, k, bits, 32, "packed")
    p = cq.pack_nbits(b, s, zp, k=k, n=n, bits=bits, block_size=32, use_numba=True, int8=True)
    assert p.qi is not None and p.q is None and p.w is None
    for m in (1, 2, 7, 8, 13, 16, 21):  # 8-row, 4-row and single-row passes
        a = rng.standard_normal((m, k)).astype(np.float32)
        serial = np.empty((m, n), np.float32)
        (ci._serial_q4 if bits == 4 else ci._serial_q8)(a, p.qi, p.scales, p.dz, serial)
        for threads in (1, 2, 3):
            nbk.set_num_threads(threads)
            try:
                par = np.empty((m, n), np.float32)
                nbk._parallel(ci._par_q4 if bits == 4 else ci._par_q8, a, p.qi, p.scales, p.dz,
                              par, 2 * threads)
            finally:
                nbk.set_num_threads(None)
            np.testing.assert_allclose(par, serial, rtol=1e-6, atol=1e-6)
        want = int8_activations(a) @ dequantized(b, s, zp, n=n, k=k, bits=bits).T
        np.testing.assert_allclose(serial, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@needs_int8
def test_quantize_rows_is_the_block_int8_round_trip():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 96)).astype(np.float32) * 5
    a[1, 32:64] = 0  # an all-zero block: scale 0, values 0
    a[2, 5] = 1e4  # one outlier takes its block's scale
    xq, sx, xsum = ci.quantize_rows(a)
    assert xq.dtype == np.int8 and sx.shape == xsum.shape == (3, 3)
    # per block: even-indexed values first, then odd-indexed
    blocks = xq.reshape(3, 3, 2, 16).astype(np.float64)
    natural = np.empty((3, 3, 32))
    natural[..., 0::2] = blocks[:, :, 0]
    natural[..., 1::2] = blocks[:, :, 1]
    np.testing.assert_allclose(natural.reshape(3, 96) * np.repeat(sx, 32, axis=1),
                               int8_activations(a), rtol=1e-6, atol=0)
    assert np.abs(xq).max() <= 127 and sx[1, 1] == 0 and not xq[1, 32:64].any()
    np.testing.assert_allclose(xsum, sx * natural.sum(-1), rtol=1e-6)


def _node(**attrs):
    from actorrt.providers import NodeSpec
    return NodeSpec(name="m", op_type="MatMulNBits", domain="com.microsoft", opset=1,
                    attrs=dict(attrs), inputs=("A", "B", "s", "zp"), outputs=("Y",))


@needs_int8
def test_only_accuracy_level_4_with_block_32_takes_the_int8_path():
    rng = np.random.default_rng(4)
    k, n = 64, 16
    for attrs, int8 in [(dict(accuracy_level=4, block_size=32), True),
                        (dict(accuracy_level=0, block_size=32), False),
                        (dict(block_size=32), False),
                        (dict(accuracy_level=4, block_size=64), False),
                        (dict(accuracy_level=4, block_size=32, bits=2), False)]:
        bits = attrs.pop("bits", 4)
        b, s, zp = quantized(rng, n, k, bits, attrs["block_size"], "packed")
        kern = cq.MatMulNBits(_node(K=k, N=n, bits=bits, **attrs))
        kern.prepare({1: b, 2: s, 3: zp}, {})
        assert (kern.packed.qi is not None) is int8, attrs
        assert (kern.packed.q is not None) is (not int8), attrs


@needs_int8
def test_compiled_int8_closure_shapes_and_fallbacks():
    rng = np.random.default_rng(5)
    k, n = 96, 40
    b, s, zp = quantized(rng, n, k, 4, 32, "packed")
    kern = cq.MatMulNBits(_node(K=k, N=n, bits=4, block_size=32, accuracy_level=4))
    kern.prepare({1: b, 2: s, 3: zp}, {})
    fn = kern.compile()
    assert fn != kern.run
    w = dequantized(b, s, zp, n=n, k=k, bits=4)
    for shape in [(1, k), (1, 1, k), (2, 3, k), (5, k), (0, k)]:
        a = rng.standard_normal(shape).astype(np.float32)
        y = fn(a, b, s, zp)
        assert y.shape == shape[:-1] + (n,) and y.dtype == np.float32
        want = int8_activations(a.reshape(-1, k)) @ w.T
        np.testing.assert_allclose(y.reshape(-1, n), want, rtol=1e-5, atol=1e-5)
    a = rng.standard_normal((4, 2 * k)).astype(np.float32)[:, ::2]  # not contiguous: run()
    np.testing.assert_allclose(fn(a, b, s, zp), int8_activations(a) @ w.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="K=96"):
        fn(np.zeros((1, k + 1), np.float32), b, s, zp)


@needs_int8
async def test_int8_path_is_recorded_on_the_trace_span():
    import actorrt
    rng = np.random.default_rng(6)
    k, n = 64, 8
    b, s, zp = quantized(rng, n, k, 4, 32, "packed")
    a = rng.standard_normal((1, k)).astype(np.float32)
    spans = {}
    for level in (0, 4):
        model, feeds = mnb_model(a, b, s, zp, K=k, N=n, bits=4, block_size=32,
                                 accuracy_level=level)
        async with actorrt.open_session(model,
                                        options=actorrt.SessionOptions(trace="ops")) as sess:
            await sess.run(None, feeds)
            (spans[level],) = sess.tracer.spans
    assert spans[4].args["kernel_variant.matmul"]["variant"] == "int8-dot"
    assert spans[0].args["kernel_variant.matmul"]["variant"] == "f32-numba"


def test_without_avx2_accuracy_level_4_keeps_float32_activations(monkeypatch):
    monkeypatch.setattr(ci, "HAVE_INT8_DOT", False)
    rng = np.random.default_rng(7)
    k, n = 64, 24
    b, s, zp = quantized(rng, n, k, 4, 32, "packed")
    a = rng.standard_normal((2, k)).astype(np.float32)
    model, feeds = mnb_model(a, b, s, zp, K=k, N=n, bits=4, block_size=32, accuracy_level=4)
    (got,) = run_actorrt(model, feeds)
    exact = a.astype(np.float64) @ dequantized(b, s, zp, n=n, k=k, bits=4).T
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-4)


@needs_int8
def test_non_finite_and_tiny_activations():
    """NaN or infinity in a block makes the outputs NaN (as float32 activations
    do), never finite garbage; a block too small for a float32 reciprocal of
    its scale is still quantized (in float64), not turned into NaN or zeros."""
    rng = np.random.default_rng(8)
    k, n = 64, 4
    b, s, zp = quantized(rng, n, k, 4, 32, "packed")
    w = dequantized(b, s, zp, n=n, k=k, bits=4)
    for bad in (np.nan, np.inf, -np.inf):
        a = rng.standard_normal((2, k)).astype(np.float32)
        a[0, 3] = bad
        model, feeds = mnb_model(a, b, s, zp, K=k, N=n, bits=4, block_size=32, accuracy_level=4)
        (got,) = run_actorrt(model, feeds)
        assert np.isnan(got[0]).all()  # a NaN product (inf * 0 weights included)
        np.testing.assert_allclose(got[1:], int8_activations(a[1:]) @ w.T, rtol=1e-5, atol=1e-5)
    a = np.zeros((1, k), np.float32)
    a[0, 5], a[0, 40] = 1e-42, -3e-39  # subnormal magnitudes
    xq, sx, xsum = ci.quantize_rows(a)
    assert np.isfinite(sx).all() and np.isfinite(xsum).all()
    assert xq[0, 16 + 2] == 127 and xq[0, 32 + 4] == -127  # a[5] (odd), a[40] (even)
    amax = np.float32([1e-42, 3e-39])
    np.testing.assert_array_equal(sx[0], amax / np.float32(127))  # subnormal, as float32 has it
    np.testing.assert_array_equal(xsum[0], sx[0] * np.float32([127, -127]))


TIE_SCRIPT = """
import numpy as np
from actorrt.providers.cpu.llm import _contrib_int8 as ci
a = np.zeros((1, 32), np.float32)
a[0, 3], a[0, 26] = np.float32(2.1359084), np.float32(1.4884087)
w = np.zeros((4, 16), np.uint8)
w[0, 13] = 1  # column 0 reads value 26 only (low nibble of byte 13)
d = np.ones((4, 1), np.float32)
out = np.empty((1, 4), np.float32)
ci._serial_q4(a, w, d, np.zeros_like(d), out)  # compiles the quantizer from its fastmath caller
print(repr(float(out[0, 0])))
"""


@needs_int8
def test_rounding_ties_are_half_even_in_float32_however_the_quantizer_was_compiled(tmp_path):
    """a * (1 / scale) landing exactly on k + 0.5 in float32 rounds to even, as
    onnxruntime does. numba had compiled the quantizer with the flags of the
    fastmath kernel that called it first (max|a| / 127 came out one ulp off
    and flipped such ties); a fresh process with an empty numba cache calls
    that kernel first."""
    import os
    import subprocess
    import sys
    a = np.zeros((1, 32), np.float32)
    a[0, 3], a[0, 26] = np.float32(2.1359084), np.float32(1.4884087)
    scale = a[0, 3] / np.float32(127)
    assert a[0, 26] * (np.float32(1) / scale) == np.float32(88.5)  # a tie in float32
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", TIE_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) == pytest.approx(88 * float(scale), rel=1e-6)  # not 89 * scale


def _root(a):
    while a.base is not None:
        a = a.base
    return a


def test_packed_weights_share_a_huge_page_slab(monkeypatch):
    # prepacked weights below a quarter slab are copied into one shared,
    # 2 MiB-aligned buffer (transparent huge pages), 64-byte aligned each;
    # same values as their own allocations; a slab dies with its arrays
    import gc
    rng = np.random.default_rng(7)
    mats = [quantized(rng, n, 64, bits, 32, "packed") for n, bits in ((8, 4), (12, 8), (5, 4))]

    def pack_all():
        out = []
        for (b, s, zp), bits in zip(mats, (4, 8, 4)):
            nb = 2
            z = cq._zero_points(zp, n=b.shape[0], nb=nb, bits=bits)
            out.append(ci.pack_i8(b.reshape(b.shape[0], nb, -1), s, z, bits))
        return out

    monkeypatch.setattr(ci, "_slab", [None, 0])
    packed = pack_all()
    roots = {id(_root(a)) for triple in packed for a in triple}
    assert len(roots) == 1
    slab = _root(packed[0][0])
    assert slab.nbytes == ci.SLAB_BYTES + 2 ** 21
    for triple in packed:
        for a in triple:
            assert a.ctypes.data % 64 == 0 and a.flags.c_contiguous
    monkeypatch.setattr(ci, "SLAB_BYTES", 0)  # every array its own allocation
    alone = pack_all()
    for x, y in zip(packed, alone):
        for a, b in zip(x, y):
            assert _root(b) is not slab
            np.testing.assert_array_equal(a, b)
    ref = ci._slab[0]
    del packed, slab, roots, x, a, triple
    gc.collect()
    assert ref() is None
