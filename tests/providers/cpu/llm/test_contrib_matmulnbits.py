"""com.microsoft MatMulNBits against onnxruntime, numba path against numpy path."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from actorrt.providers.cpu.llm import _contrib_numba as nbk
from actorrt.providers.cpu.llm import _contrib_quant as cq
from tests.oracle import assert_close, run_actorrt, run_onnxruntime


def quantized(rng, n, k, bits, block_size, zp_kind, scale_dtype=np.float32):
    """Random packed B, scales and zero points in MatMulNBits layout."""
    nb = -(-k // block_size)
    blob = block_size * bits // 8
    b = rng.integers(0, 256, (n, nb, blob), dtype=np.uint8)
    scales = (rng.random((n, nb)) * 0.02 + 0.001).astype(scale_dtype)
    if zp_kind == "none":
        zp = None
    elif zp_kind == "packed":
        zp = rng.integers(0, 256, (n, -(-nb * bits // 8)), dtype=np.uint8)
    else:
        zp = (rng.random((n, nb)) * (1 << bits)).astype(scale_dtype)
    return b, scales, zp


def mnb_model(a, b, scales, zp=None, bias=None, *, const=True, **attrs):
    names = ["A", "B", "scales", "zp" if zp is not None else "", "", "bias" if bias is not None else ""]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", **attrs)
    arrays = {"B": b, "scales": scales, "zp": zp, "bias": bias}
    inits, ins = [], [helper.make_tensor_value_info("A", helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)]
    feeds = {"A": a}
    for name, arr in arrays.items():
        if arr is None:
            continue
        if const:
            inits.append(numpy_helper.from_array(arr, name))
        else:
            ins.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
            feeds[name] = arr
    g = helper.make_graph([node], "mnb", ins, [helper.make_empty_tensor_value_info("Y")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return m, feeds


def check(a, b, scales, zp=None, bias=None, *, const=True, rtol=1e-4, atol=1e-4, **attrs):
    m, feeds = mnb_model(a, b, scales, zp, bias, const=const, **attrs)
    want = run_onnxruntime(m, feeds)
    got = run_actorrt(m, feeds)
    assert_close(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
@pytest.mark.parametrize("m", [1, 3, 7])
def test_matmulnbits_vs_ort(bits, block_size, zp_kind, m):
    if bits == 8 and zp_kind == "float":
        pytest.skip("onnxruntime's CPU kernel rejects 8-bit weights with float zero points")
    rng = np.random.default_rng(bits * 1000 + block_size + m)
    k, n = 96, 40  # K not a multiple of the larger block sizes
    b, s, zp = quantized(rng, n, k, bits, block_size, zp_kind)
    a = rng.standard_normal((m, k)).astype(np.float32)
    check(a, b, s, zp, K=k, N=n, bits=bits, block_size=block_size)


def test_matmulnbits_bias_rank3_and_runtime_weights():
    rng = np.random.default_rng(1)
    k, n = 64, 24
    b, s, zp = quantized(rng, n, k, 4, 32, "packed")
    a = rng.standard_normal((2, 3, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    check(a, b, s, zp, bias, K=k, N=n, bits=4, block_size=32)
    check(a[:1, :1], b, s, zp, bias, const=False, K=k, N=n, bits=4, block_size=32)


def test_matmulnbits_2bit():
    rng = np.random.default_rng(2)
    k, n = 64, 16
    b, s, zp = quantized(rng, n, k, 2, 16, "packed")
    a = rng.standard_normal((1, k)).astype(np.float32)
    check(a, b, s, zp, K=k, N=n, bits=2, block_size=16)
    check(a, b, s, None, K=k, N=n, bits=2, block_size=16)


def test_matmulnbits_float16():
    rng = np.random.default_rng(3)
    k, n = 64, 32
    b, s, zp = quantized(rng, n, k, 4, 32, "packed", np.float16)
    a = rng.standard_normal((2, k)).astype(np.float16)
    check(a, b, s, zp, K=k, N=n, bits=4, block_size=32, rtol=2e-2, atol=2e-2)
    b, s, zp = quantized(rng, n, k, 8, 32, "packed", np.float16)
    check(a, b, s, zp, K=k, N=n, bits=8, block_size=32, rtol=2e-2, atol=2e-2)


def test_matmulnbits_empty_projection():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 32)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    b = np.zeros((8, 0, 16), np.uint8)
    s = np.zeros((0,), np.float32)
    check(a, b, s, None, bias, K=32, N=8, bits=4, block_size=32)


@pytest.mark.skipif(not nbk.HAVE_NUMBA, reason="numba not installed")
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("m,n", [(1, 50), (2, 51), (4, 50), (5, 3), (9, 51), (16, 130)])
def test_numba_matches_numpy(bits, m, n):
    # odd N and M exercise the kernels' remainder paths; (16, 130) runs the
    # parallel GEMM (M * N * K above the serial threshold)
    rng = np.random.default_rng(bits + m)
    k, bs = 200 if m < 16 else 520, 64
    b, s, zp = quantized(rng, n, k, bits, bs, "packed")
    a = rng.standard_normal((m, k)).astype(np.float32)
    pn = cq.pack_nbits(b, s, zp, k=k, n=n, bits=bits, block_size=bs, use_numba=False)
    pb = cq.pack_nbits(b, s, zp, k=k, n=n, bits=bits, block_size=bs, use_numba=True)
    assert pn.w is not None and pb.q is not None
    np.testing.assert_allclose(cq.matmul_nbits_numba(a, pb), cq.matmul_nbits_numpy(a, pn),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not nbk.HAVE_NUMBA, reason="numba not installed")
@pytest.mark.parametrize("m", [1, 3])
def test_parallel_kernels_match_numpy(m):
    # N x K (x M) above PARALLEL_MIN_WEIGHTS: the column-chunked parallel GEMV
    # (M = 1) and GEMM, with N not a multiple of the chunk count
    rng = np.random.default_rng(10 + m)
    k, n, bs = 512, 517, 32
    assert n * k >= nbk.PARALLEL_MIN_WEIGHTS
    b, s, zp = quantized(rng, n, k, 4, bs, "float")
    a = rng.standard_normal((m, k)).astype(np.float32)
    pn = cq.pack_nbits(b, s, zp, k=k, n=n, bits=4, block_size=bs, use_numba=False)
    pb = cq.pack_nbits(b, s, zp, k=k, n=n, bits=4, block_size=bs, use_numba=True)
    try:
        for threads in (1, 2, 3):
            nbk.set_num_threads(threads)
            np.testing.assert_allclose(cq.matmul_nbits_numba(a, pb), cq.matmul_nbits_numpy(a, pn),
                                       rtol=1e-4, atol=1e-4)
    finally:
        nbk.set_num_threads(None)


def test_numpy_path_vs_ort(monkeypatch):
    monkeypatch.setattr(nbk, "HAVE_NUMBA", False)
    rng = np.random.default_rng(5)
    k, n = 128, 48
    for bits in (4, 8):
        b, s, zp = quantized(rng, n, k, bits, 32, "packed")
        a = rng.standard_normal((1, k)).astype(np.float32)
        check(a, b, s, zp, K=k, N=n, bits=bits, block_size=32)


def test_prepare_prepacks_constant_weights():
    from actorrt.providers import NodeSpec
    rng = np.random.default_rng(6)
    k, n = 64, 16
    b, s, zp = quantized(rng, n, k, 4, 32, "packed")
    node = NodeSpec(name="m", op_type="MatMulNBits", domain="com.microsoft", opset=1,
                    attrs=dict(K=k, N=n, bits=4, block_size=32, accuracy_level=1),
                    inputs=("A", "B", "s", "zp"), outputs=("Y",))
    kern = cq.MatMulNBits(node)
    shared = {}
    kern.prepare({1: b, 2: s, 3: zp}, shared)
    assert kern.packed is not None and shared
    if nbk.HAVE_NUMBA:
        assert kern.packed.q is not None and kern.packed.w is None  # no float copy kept
    a = rng.standard_normal((1, k)).astype(np.float32)
    # the hot path uses the prepacked weight, not the B passed in
    y = kern.run(a, np.zeros_like(b), s, zp)
    want = cq.matmul_nbits_numpy(a, cq.pack_nbits(b, s, zp, k=k, n=n, bits=4, block_size=32,
                                                  use_numba=False))
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not nbk.HAVE_NUMBA, reason="numba not installed")
def test_compiled_fast_path_matches_numpy_and_falls_back():
    from actorrt.providers import NodeSpec
    rng = np.random.default_rng(9)
    k, n = 96, 40
    b, s, zp = quantized(rng, n, k, 4, 32, "packed")
    node = NodeSpec(name="m", op_type="MatMulNBits", domain="com.microsoft", opset=1,
                    attrs=dict(K=k, N=n, bits=4, block_size=32),
                    inputs=("A", "B", "s", "zp"), outputs=("Y",))
    kern = cq.MatMulNBits(node)
    kern.prepare({1: b, 2: s, 3: zp}, {})
    fn = kern.compile()
    assert fn != kern.run  # the closure, not the generic method
    w = cq.pack_nbits(b, s, zp, k=k, n=n, bits=4, block_size=32, use_numba=False).w
    for shape in [(1, k), (1, 1, k), (2, 3, k), (5, k), (0, k)]:
        a = rng.standard_normal(shape).astype(np.float32)
        y = fn(a, b, s, zp)
        assert y.shape == shape[:-1] + (n,) and y.dtype == np.float32
        np.testing.assert_allclose(y, a @ w.T, rtol=1e-4, atol=1e-4)
    a = rng.standard_normal((4, 2 * k)).astype(np.float32)[:, ::2]  # not contiguous
    np.testing.assert_allclose(fn(a, b, s, zp), a @ w.T, rtol=1e-4, atol=1e-4)
    a16 = rng.standard_normal((2, k)).astype(np.float16)
    y16 = fn(a16, b, s, zp)
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16, a16.astype(np.float32) @ w.T, rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="K=96"):
        fn(np.zeros((1, k + 1), np.float32), b, s, zp)


@pytest.mark.skipif(not nbk.HAVE_NUMBA, reason="numba not installed")
def test_thread_setting_applies_from_any_thread():
    import threading
    rng = np.random.default_rng(8)
    k, n, m = 512, 160, 16  # parallel GEMM size
    b, s, zp = quantized(rng, n, k, 4, 32, "packed")
    a = rng.standard_normal((m, k)).astype(np.float32)
    pb = cq.pack_nbits(b, s, zp, k=k, n=n, bits=4, block_size=32, use_numba=True)
    want = cq.matmul_nbits_numpy(a, cq.pack_nbits(b, s, zp, k=k, n=n, bits=4, block_size=32,
                                                  use_numba=False))
    try:
        assert nbk.set_num_threads(1) == 1 == nbk.num_threads()
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("y", cq.matmul_nbits_numba(a, pb)))
        t.start()
        t.join()
        np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)
        assert nbk.set_num_threads(10 ** 6) == nbk.num_threads() >= 1  # capped at the cores
    finally:
        nbk.set_num_threads(None)
