"""The compiled float32 GEMM of constant right operands (``_sgemm_numba``):
packed panels times row tiles with bias and activation in the store, against
numpy float64, odd sizes (partial panels, 1-7 row tails, K of 1), one and two
threads (the panel split forced); its use by MatMul / Gemm / MatMulEpilogue
against onnxruntime with it on and off (the BLAS path kept), and what it
declines."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _conv_tiles as _ct, _matmul_split, _parallel, _sgemm_numba as sg

RNG = np.random.default_rng(777)
needs = pytest.mark.skipif(not sg.HAVE_SGEMM, reason="the compiled sgemm needs numba on AVX-512")
_erf = np.vectorize(math.erf)


def _ref(a, b, bias, act):
    y = a.astype(np.float64) @ b.astype(np.float64)
    if bias is not None:
        y = y + bias
    if act == "Relu":
        y = np.maximum(y, 0)
    elif act == "Gelu":
        y = 0.5 * y * (1 + _erf(y / np.sqrt(2)))
    return y


SHAPES = [((64, 1024), 1024), ((13, 37), 45), ((1, 256), 768), ((3, 1), 17), ((130, 256), 1000),
          ((9, 300), 33), ((2, 5, 7, 64), 96), ((1, 1, 1031), 259), ((8, 16), 32), ((600, 40), 70)]


@needs
@pytest.mark.parametrize("threads,partners", [(1, False), (2, False), (2, True)])
@pytest.mark.parametrize("act", ["", "Relu", "Gelu"])
@pytest.mark.parametrize("a_shape,n", SHAPES)
def test_gemm_equals_numpy_float64(a_shape, n, act, threads, partners, monkeypatch):
    """One thread; two through the Python chunk loop; two through the
    compiled partners (``_partner``, tested on their own in test_partner.py)."""
    monkeypatch.setattr(sg, "USE_PARTNERS", partners)
    if threads == 2:
        monkeypatch.setattr(sg, "PARALLEL_MIN_FLOPS", 0)
        monkeypatch.setattr(sg, "PARTNER_MIN_FLOPS", 0)
    seen = []
    real = _parallel.run_chunks
    monkeypatch.setattr(_parallel, "run_chunks",
                        lambda fn, k, t: (seen.append(k), real(fn, k, t))[1])
    k = a_shape[-1]
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    for bias in (None, RNG.standard_normal(n).astype(np.float32)):
        got = sg.gemm(a, sg.PackedB(b), bias, act, threads)
        want = _ref(a, b, bias, act)
        assert got.shape == a_shape[:-1] + (n,) and got.dtype == np.float32
        assert got.flags.c_contiguous
        # slack past the last row for the masked store's masked-off lanes
        if got.nbytes >= _ct.SLACK_MIN_BYTES:
            assert got.base is not None and got.base.nbytes >= got.nbytes + _ct.OVERRUN_BYTES
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    assert bool(seen) == (threads == 2 and n > sg.NR and not partners)


@needs
def test_gemm_of_strided_and_empty_operands():
    b = RNG.standard_normal((40, 50)).astype(np.float32)
    p = sg.PackedB(b)
    a = RNG.standard_normal((40, 23)).astype(np.float32).T  # (23, 40), not contiguous
    np.testing.assert_allclose(sg.gemm(a, p), _ref(a, b, None, ""), rtol=2e-5, atol=2e-5)
    assert sg.gemm(np.zeros((0, 40), np.float32), p).shape == (0, 50)
    z = sg.PackedB(np.zeros((0, 5), np.float32))
    bias = RNG.standard_normal(5).astype(np.float32)
    np.testing.assert_array_equal(sg.gemm(np.zeros((3, 0), np.float32), z, bias, "Relu"),
                                  np.broadcast_to(np.maximum(bias, 0), (3, 5)))


@needs
def test_gemm_raises_typed_errors():
    p = sg.PackedB(np.ones((4, 3), np.float32))
    with pytest.raises(ValueError):
        sg.gemm(np.ones((2, 5), np.float32), p)
    with pytest.raises(ValueError):
        sg.gemm(np.ones((2, 4), np.float64), p)
    with pytest.raises(ValueError):
        sg.gemm(np.ones((2, 4), np.float32), p, act="Tanh")
    with pytest.raises(ValueError):
        sg.gemm(np.ones((2, 4), np.float32), p, np.ones(4, np.float32))
    with pytest.raises(ValueError):
        sg.PackedB(np.ones((4, 3), np.float64))


def test_constant_operand_declines_what_the_kernel_cannot_take(monkeypatch):
    b = RNG.standard_normal((16, 8)).astype(np.float32)
    c = _matmul_split.ConstantOperand(b)
    assert c.compiled(np.ones((2, 16), np.float64)) is None          # dtype
    assert c.compiled(np.ones((2, 15), np.float32)) is None          # K
    assert c.compiled(np.ones((2, 16), np.float32), act="Tanh") is None
    assert c.compiled(np.ones((2, 16), np.float32), np.ones((1, 8), np.float32)) is None
    assert _matmul_split.ConstantOperand(b.astype(np.float64)).compiled(np.ones((2, 16))) is None
    monkeypatch.setattr(sg, "ENABLED", False)
    assert c.compiled(np.ones((2, 16), np.float32)) is None
    monkeypatch.setattr(sg, "ENABLED", True)
    got = c.compiled(np.ones((2, 16), np.float32))
    assert (got is None) == (not sg.HAVE_SGEMM)


def _model(nodes, inputs, inits):
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def _both(model, feeds, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=threads)) as s:
        got = s.run(None, feeds)[0]
    return got, want


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", [(64, 512, 257), (1, 300, 700), (5, 33, 31)])
def test_models_equal_onnxruntime(m, k, n, threads, enabled, monkeypatch):
    monkeypatch.setattr(sg, "ENABLED", enabled)
    a = RNG.standard_normal((m, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    wt = np.ascontiguousarray(w.T)
    c = RNG.standard_normal(n).astype(np.float32)
    xi = [helper.make_tensor_value_info("a", TP.FLOAT, [m, k])]
    models = [
        _model([helper.make_node("Gemm", ["a", "w", "c"], ["y"])], xi,
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")]),
        _model([helper.make_node("Gemm", ["a", "w"], ["y"], transB=1)], xi, [numpy_helper.from_array(wt, "w")]),
        _model([helper.make_node("Gemm", ["a", "w", "c"], ["y"], alpha=0.5)], xi,
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c.reshape(1, n), "c")]),
        _model([helper.make_node("MatMul", ["a", "w"], ["y"])], xi, [numpy_helper.from_array(w, "w")]),
        _model([helper.make_node("FusedGemm", ["a", "w", "c"], ["y"], domain="com.microsoft",
                                 activation="Relu")], xi,
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")]),
        _model([helper.make_node("FusedGemm", ["a", "w", "c"], ["y"], domain="com.microsoft",
                                 activation="Tanh")], xi,
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")]),
        _model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "c"], ["q"]),
                helper.make_node("Relu", ["q"], ["y"])], xi,
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")]),
        _model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "c"], ["q"]),
                helper.make_node("Gelu", ["q"], ["y"], domain="com.microsoft")], xi,
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")]),
    ]
    for model in models:
        got, want = _both(model, {"a": a}, threads)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------ batched products, B packed per entry

def _away_from_page_end(shape) -> np.ndarray:
    """A float32 array of ``shape`` whose last byte lies more than
    OVERRUN_BYTES before a page end (a view into a larger buffer): where it
    lands does not depend on the allocator (``empty_with_slack`` gives small
    arrays no slack)."""
    n = int(np.prod(shape))
    buf = np.empty(n + 1100, np.float32)
    for off in range(0, 1100, 32):
        view = buf[off:off + n]
        if not _ct.overrun_leaves_page(view):
            return view.reshape(shape)
    raise AssertionError("no offset keeps the overrun inside the page")


@needs
@pytest.mark.parametrize("a_shape,b_shape,perm", [
    ((2, 3, 27, 40), (2, 3, 40, 33), None),
    ((1, 4, 128, 64), (1, 4, 64, 128), None),
    ((5, 31, 7), (5, 7, 65), None),
    ((1, 128, 4, 64), (1, 128, 4, 64), "attention"),   # q / k^T as transposed views
])
def test_bmm_equals_numpy_float64(a_shape, b_shape, perm):
    if perm == "attention":
        x = RNG.standard_normal(a_shape).astype(np.float32)
        a, b = x.transpose(0, 2, 1, 3), x.transpose(0, 2, 3, 1)
    else:
        a = RNG.standard_normal(a_shape).astype(np.float32)
        b = RNG.standard_normal(b_shape).astype(np.float32)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = sg.bmm(a, b)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)
    out = _away_from_page_end(want.shape)  # (an out near a page end declines: below)
    assert sg.bmm(a, b, out) is out
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-4)


@needs
def test_bmm_declines_what_it_cannot_take(monkeypatch):
    assert sg.bmm(np.ones((2, sg.BMM_MIN_ROWS - 1, 4), np.float32), np.ones((2, 4, 5), np.float32)) is None
    monkeypatch.setattr(sg, "BMM_MIN_ROWS", 1)
    a = np.ones((2, 3, 4), np.float32)
    assert sg.bmm(a, np.ones((1, 4, 5), np.float32)) is None          # broadcast batch
    assert sg.bmm(a, np.ones((2, 4, 5), np.float64)) is None          # dtype
    assert sg.bmm(a[:, :, :0], np.ones((2, 0, 5), np.float32)) is None  # empty
    assert sg.bmm(a, np.ones((2, 4, 5), np.float32), np.empty((2, 5, 3), np.float32)[:, :, :].transpose(0, 2, 1)) is None
    # an out that ends within OVERRUN_BYTES of a page end (the masked store
    # would address the next page): declined, the caller's matmul writes it
    raw = np.empty(3 * 4096 // 4, np.float32)
    base = (-raw.ctypes.data) % 4096 // 4  # to a page start
    out = raw[base + 1024 - 30:base + 1024].reshape(2, 3, 5)
    assert _ct.overrun_leaves_page(out)
    assert sg.bmm(a, np.ones((2, 4, 5), np.float32), out) is None
    ok = raw[base + 512 - 30:base + 512].reshape(2, 3, 5)
    assert sg.bmm(a, np.ones((2, 4, 5), np.float32), ok) is ok
    monkeypatch.setattr(sg, "ENABLED", False)
    assert sg.bmm(a, np.ones((2, 4, 5), np.float32)) is None


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_and_batched_matmul_models_equal_onnxruntime(threads, enabled, monkeypatch):
    """The encoder's attention pattern (fused to ScaledDotAttention) and a
    plain batched MatMul, with the compiled batched product on and off."""
    monkeypatch.setattr(sg, "ENABLED", enabled)
    x = RNG.standard_normal((1, 37, 4, 16)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["q"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["x"], ["k"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["q", "k"], ["s"]),
             helper.make_node("Mul", ["s", "sc"], ["t"]),
             helper.make_node("Softmax", ["t"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "q"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, list(x.shape))],
               [numpy_helper.from_array(np.array(0.25, np.float32), "sc")])
    got, want = _both(m, {"x": x}, threads)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    a = RNG.standard_normal((3, 5, 40, 70)).astype(np.float32)
    b = RNG.standard_normal((3, 5, 70, 33)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
               [helper.make_tensor_value_info("a", TP.FLOAT, list(a.shape)),
                helper.make_tensor_value_info("b", TP.FLOAT, list(b.shape))], [])
    got, want = _both(m, {"a": a, "b": b}, threads)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@needs
@pytest.mark.parametrize("k, n, split", [(256, 768, True), (1024, 256, True), (256, 256, False)])
def test_decode_sized_products_split_over_the_partners_by_default(k, n, split, monkeypatch):
    """At two threads and the default thresholds a one-row product from
    PARTNER_MIN_FLOPS (2^18: a decode step's QKV / FFN GEMVs, not its 256 x
    256 projection) goes to the compiled partners; the values equal the
    one-thread product bit for bit."""
    from actorrt.providers.cpu import _partner
    if not _partner.AVAILABLE:
        pytest.skip("no compiled partners here")
    posted = []
    real = _partner.gemm_panels
    monkeypatch.setattr(_partner, "gemm_panels", lambda *a: (posted.append(a[-1]), real(*a))[1])
    a = RNG.standard_normal((1, k)).astype(np.float32)
    b = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    packed = sg.PackedB(b)
    assert (2 * k * n >= sg.PARTNER_MIN_FLOPS) == split
    two = sg.gemm(a, packed, bias, "Gelu", 2)
    one = sg.gemm(a, packed, bias, "Gelu", 1)
    assert bool(posted) == split, posted
    np.testing.assert_array_equal(two, one)
