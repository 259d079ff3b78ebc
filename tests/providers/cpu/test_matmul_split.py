"""MatMul / Gemm / MatMulEpilogue split over the intra-op threads
(``_matmul_split``): per-thread blocks of one-thread BLAS calls against numpy
(float64 reference) for every split path — row blocks, column blocks, GEMV
column blocks, batched blocks with broadcast batch dims, transposed operands,
odd sizes — with the split forced (threshold 0) and with it off; and whole
models at ``intra_op_num_threads`` 1 and 2 against onnxruntime, int dtypes
included."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import threadpoolctl
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _matmul_split, _parallel, _threads

RNG = np.random.default_rng(2121)


@pytest.fixture
def two_threads(monkeypatch):
    """``_threads.current()`` = 2 for the test, the BLAS pool restored after."""
    before = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    prev = _threads.blas_threads()
    _threads.apply(2)
    yield
    if prev is not None:
        _threads.apply(prev)
    else:
        _threads.apply(before[0] if before else 1)


@pytest.fixture
def blas_only(monkeypatch):
    """The compiled float32 GEMM (``_sgemm_numba``) off: the BLAS paths."""
    from actorrt.providers.cpu import _sgemm_numba
    monkeypatch.setattr(_sgemm_numba, "ENABLED", False)


def _chunks_seen(monkeypatch):
    seen = []
    real = _parallel.run_chunks

    def spy(fn, n, threads):
        seen.append((n, threads))
        return real(fn, n, threads)
    monkeypatch.setattr(_parallel, "run_chunks", spy)
    return seen


CASES = [
    ((64, 100), (100, 37)),          # rows >= cols: row blocks
    ((7, 33), (33, 301)),            # few rows: column blocks (odd N)
    ((1, 513), (513, 1029)),         # one row: GEMV column blocks
    ((513,), (513, 130)),            # 1-D a: GEMV
    ((2, 3, 5, 31), (31, 17)),       # 4-D a, 2-D b: rows as one matrix
    ((5, 31, 17), (17, 9)),
    ((3, 1, 7, 12), (4, 12, 5)),     # broadcast batch dims
    ((1, 4, 9, 16), (2, 1, 16, 11)),
    ((6, 10, 8), (8, 3)),
    ((4, 9, 16), (4, 16, 11)),       # batched, equal batch
    ((1, 1, 9, 16), (1, 16, 11)),    # batch of one
    ((3, 16), (2, 16, 5)),           # 2-D a, batched b
    ((0, 16), (16, 5)),              # empty
]


@pytest.mark.parametrize("a_shape,b_shape", CASES)
@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("forced", [True, False])
def test_split_product_equals_numpy(a_shape, b_shape, dt, forced, two_threads, monkeypatch):
    if forced:
        monkeypatch.setattr(_matmul_split, "PARALLEL_MIN_FLOPS", 0)
        monkeypatch.setattr(_matmul_split, "_OPENBLAS_SERIAL_MNK", 0)
        monkeypatch.setattr(_matmul_split, "_OPENBLAS_SERIAL_GEMV", 0)
    seen = _chunks_seen(monkeypatch)
    a = RNG.standard_normal(a_shape).astype(dt)
    b = RNG.standard_normal(b_shape).astype(dt)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = _matmul_split.matmul(a, b)
    assert got.shape == want.shape and got.dtype == dt
    np.testing.assert_allclose(got, want, rtol=1e-4 if dt == np.float32 else 1e-10,
                               atol=1e-4 if dt == np.float32 else 1e-10)
    if not forced:
        assert not seen  # small products: one call
    elif a.size and b.size:
        assert seen and all(t == 2 for _, t in seen)


@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_split_of_transposed_views(trans, two_threads, monkeypatch):
    monkeypatch.setattr(_matmul_split, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(_matmul_split, "_OPENBLAS_SERIAL_MNK", 0)
    for m, k, n in [(70, 45, 33), (5, 45, 301), (1, 45, 300)]:
        a = RNG.standard_normal((k, m) if trans[0] else (m, k)).astype(np.float32)
        b = RNG.standard_normal((n, k) if trans[1] else (k, n)).astype(np.float32)
        aa = a.T if trans[0] else a
        bb = b.T if trans[1] else b
        want = aa.astype(np.float64) @ bb.astype(np.float64)
        np.testing.assert_allclose(_matmul_split.matmul(aa, bb), want, rtol=1e-4, atol=1e-4)


def test_large_product_splits_without_forcing(two_threads, monkeypatch):
    seen = _chunks_seen(monkeypatch)
    a = RNG.standard_normal((64, 256)).astype(np.float32)
    b = RNG.standard_normal((256, 256)).astype(np.float32)  # 8.4 MFLOP
    np.testing.assert_allclose(_matmul_split.matmul(a, b), a.astype(np.float64) @ b,
                               rtol=1e-4, atol=1e-4)
    assert seen == [(2, 2)]


def test_one_thread_never_splits(monkeypatch):
    monkeypatch.setattr(_matmul_split, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(_threads, "current", lambda: 1)
    seen = _chunks_seen(monkeypatch)
    a = RNG.standard_normal((64, 256)).astype(np.float32)
    b = RNG.standard_normal((256, 256)).astype(np.float32)
    np.testing.assert_allclose(_matmul_split.matmul(a, b), a @ b, rtol=1e-6)
    assert not seen


def test_mismatched_shapes_raise_numpy_error(two_threads):
    with pytest.raises(ValueError):
        _matmul_split.matmul(np.ones((3, 4), np.float32), np.ones((5, 2), np.float32))


def test_split_restores_the_blas_pool(two_threads, monkeypatch):
    monkeypatch.setattr(_matmul_split, "PARALLEL_MIN_FLOPS", 0)
    a = RNG.standard_normal((64, 256)).astype(np.float32)
    _matmul_split.matmul(a, a.T.copy())
    assert all(i["num_threads"] == 2 for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")


# ------------------------------------------------------------- whole models vs onnxruntime

def _model(nodes, inputs, inits, out_type=TP.FLOAT):
    g = helper.make_graph(nodes, "t", inputs, [helper.make_tensor_value_info("y", out_type, None)],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _both(model, feeds, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=threads)) as s:
        got = s.run(None, feeds)[0]
    return got, want


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("a_shape,b_shape", [((64, 300), (300, 257)), ((1, 1, 700), (700, 1500)),
                                              ((2, 4, 70, 64), (2, 4, 64, 70)),
                                              ((3, 1, 90, 64), (1, 5, 64, 80)), ((200,), (200, 3000))])
def test_matmul_model_equals_onnxruntime(a_shape, b_shape, threads):
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
               [helper.make_tensor_value_info("a", TP.FLOAT, list(a_shape)),
                helper.make_tensor_value_info("b", TP.FLOAT, list(b_shape))], [])
    got, want = _both(m, {"a": a, "b": b}, threads)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n,ta,tb", [(64, 512, 257, 0, 1), (33, 512, 513, 1, 0), (1, 1024, 2049, 0, 1),
                                         (300, 100, 200, 1, 1)])
def test_gemm_and_epilogue_models_equal_onnxruntime(m, k, n, ta, tb, threads):
    a = RNG.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    w = RNG.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c = RNG.standard_normal(n).astype(np.float32)
    gm = _model([helper.make_node("Gemm", ["a", "w", "c"], ["g"], transA=ta, transB=tb, alpha=0.5, beta=2.0),
                 helper.make_node("Relu", ["g"], ["y"])],
                [helper.make_tensor_value_info("a", TP.FLOAT, list(a.shape))],
                [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")])
    got, want = _both(gm, {"a": a}, threads)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    # MatMul + bias Add + Relu -> MatMulEpilogue, 3-D input
    x = RNG.standard_normal((2, max(m, 1), k)).astype(np.float32)
    wk = RNG.standard_normal((k, n)).astype(np.float32)
    em = _model([helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "c"], ["q"]),
                 helper.make_node("Relu", ["q"], ["y"])],
                [helper.make_tensor_value_info("x", TP.FLOAT, list(x.shape))],
                [numpy_helper.from_array(wk, "w"), numpy_helper.from_array(c, "c")])
    got, want = _both(em, {"x": x}, threads)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dt,tp", [(np.int32, TP.INT32), (np.int64, TP.INT64), (np.float64, TP.DOUBLE),
                                   (np.float16, TP.FLOAT16)])
def test_matmul_other_dtypes_equal_onnxruntime(dt, tp, threads):
    if dt in (np.int32, np.int64):
        a = RNG.integers(-9, 9, (3, 40, 70)).astype(dt)
        b = RNG.integers(-9, 9, (70, 90)).astype(dt)
    else:
        a = RNG.standard_normal((3, 40, 700)).astype(dt)
        b = RNG.standard_normal((700, 90)).astype(dt)
    m = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
               [helper.make_tensor_value_info("a", tp, list(a.shape)),
                helper.make_tensor_value_info("b", tp, list(b.shape))], [], out_type=tp)
    got, want = _both(m, {"a": a, "b": b}, threads)
    assert got.dtype == want.dtype
    if dt == np.float16:
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=0.25)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# -------------------------------------------- constant B, transposed layout for one-row products

@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("forced", [True, False])
@pytest.mark.parametrize("a_shape,b_shape", [((1, 1, 1027), (1027, 257)), ((1, 513), (513, 129)),
                                              ((1, 1, 1, 300), (300, 200))])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_constant_operand_one_row_uses_the_transposed_copy(a_shape, b_shape, dt, threads, forced,
                                                           two_threads, blas_only, monkeypatch):
    if threads == 1:
        _threads.apply(1)
        monkeypatch.setattr(_threads, "current", lambda: 1)
    if forced:
        monkeypatch.setattr(_matmul_split, "PARALLEL_MIN_FLOPS", 0)
    seen = _chunks_seen(monkeypatch)
    b = RNG.standard_normal(b_shape).astype(dt)
    const = _matmul_split.ConstantOperand(b)
    assert const.transposed and const.transposed_copy is None
    a = RNG.standard_normal(a_shape).astype(dt)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = const.product(a)
    assert got.shape == want.shape and got.dtype == dt
    tol = 1e-4 if dt == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert const.transposed_copy is not None and const.transposed_copy.shape == b_shape[::-1]
    assert bool(seen) == (threads == 2 and forced)
    # more rows: the original layout, the same values as numpy
    a2 = RNG.standard_normal((3,) + a_shape[1:]).astype(dt)
    np.testing.assert_allclose(const.product(a2), np.matmul(a2.astype(np.float64), b),
                               rtol=tol, atol=tol)


def test_constant_operand_keeps_the_layout_when_k_is_not_larger():
    for shape in [(256, 1024), (300, 300), (100, 50)]:  # K <= N, or too small to matter
        const = _matmul_split.ConstantOperand(RNG.standard_normal(shape).astype(np.float32))
        assert not const.transposed
    assert not _matmul_split.ConstantOperand(np.ones((1000, 100), np.int64)).transposed


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_shaped_matmul_and_epilogue_models_equal_onnxruntime(threads, blas_only):
    """One-row MatMul and MatMul + bias (+ Gelu) against constant K > N weights
    (the FFN down-projection of a decode step), then the same session at
    several rows: onnxruntime's values, the transposed copy made by the plan
    (the BLAS path: the compiled sgemm switched off)."""
    k, n = 1031, 259
    w = RNG.standard_normal((k, n)).astype(np.float32) / 30
    c = RNG.standard_normal(n).astype(np.float32)
    x_info = [helper.make_tensor_value_info("x", TP.FLOAT, [1, "S", k])]
    mm = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], x_info,
                [numpy_helper.from_array(w, "w")])
    em = _model([helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "c"], ["q"]),
                 helper.make_node("Gelu", ["q"], ["y"], domain="com.microsoft")], x_info,
                [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    for model in (mm, em):
        peer = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        with actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=threads)) as s:
            for rows in (1, 5, 1):
                x = RNG.standard_normal((1, rows, k)).astype(np.float32)
                np.testing.assert_allclose(s.run(None, {"x": x})[0], peer.run(None, {"x": x})[0],
                                           rtol=1e-4, atol=1e-4)
            consts = [st.kernel.constant_b for st in s.session.plan.steps
                      if getattr(st.kernel, "constant_b", None) is not None]
            assert consts and all(cb.transposed_copy is not None for cb in consts)
