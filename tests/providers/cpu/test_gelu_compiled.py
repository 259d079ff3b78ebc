"""com.microsoft Gelu (and the GELU epilogue the optimizer's fusions use): the
one-pass compiled float32 path and the numpy path, both against onnxruntime's
contrib Gelu, above and below the compiled path's size threshold, odd sizes and
non-contiguous inputs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper

import actorrt
from actorrt.providers.cpu import _epilogue, _gelu_numba

RNG = np.random.default_rng(5)


def _gelu_model(shape):
    node = helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")
    g = helper.make_graph([node], "gelu", [helper.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("shape", [(7, 13), (1, 1, 1024), (3, 129, 37), (1, 64, 1024), (2, 40000),
                                   (3, 43691)])
@pytest.mark.parametrize("threads", [1, 2])
def test_gelu_matches_onnxruntime(shape, compiled, threads, monkeypatch):
    if compiled and not _gelu_numba.HAVE_NUMBA:
        pytest.skip("numba not installed")
    monkeypatch.setattr(_epilogue, "COMPILED_GELU", compiled)
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[:3] = [0.0, -9.0, 9.0]
    m = _gelu_model(shape)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    from actorrt.providers.cpu import _parallel
    real, seen = _parallel.run_chunks, []
    monkeypatch.setattr(_parallel, "run_chunks", lambda fn, n, th: (seen.append(n), real(fn, n, th)))
    with actorrt.InferenceSession(m, actorrt.SessionOptions(intra_op_num_threads=threads)) as s:
        got = s.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    # split in per-thread blocks (odd sizes: a short last block) only at 2 threads, large arrays
    assert bool(seen) == (compiled and threads == 2 and x.size >= _gelu_numba.PARALLEL_MIN_ELEMENTS)


def test_compiled_gelu_declines_what_it_cannot_take():
    if not _gelu_numba.HAVE_NUMBA:
        pytest.skip("numba not installed")
    big = RNG.standard_normal((64, 128)).astype(np.float32)
    small = big[:, ::2].copy()[:1, :7]  # one serial compiled pass
    want_small = _epilogue.gelu_inplace(small.copy(order="F"))       # numpy path
    assert _gelu_numba.gelu_inplace_f32(small)
    np.testing.assert_allclose(small, want_small, rtol=2e-6, atol=2e-6)
    assert not _gelu_numba.gelu_inplace_f32(np.zeros(5, np.float32)[::2])  # strided
    ro = np.zeros(5, np.float32)
    ro.flags.writeable = False
    assert not _gelu_numba.gelu_inplace_f32(ro)
    assert not _gelu_numba.gelu_inplace_f32(big[:, ::2])               # not contiguous
    assert not _gelu_numba.gelu_inplace_f32(big.astype(np.float64))    # not float32
    strided = big[:, ::2]
    want = _epilogue.gelu_inplace(np.ascontiguousarray(strided))
    got = _epilogue.gelu_inplace(strided.copy(order="F"))             # numpy path
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("rows,n", [(1, 1031), (7, 13), (129, 1024), (3, 33331)])
@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_bias_gelu_epilogue_matches_onnxruntime(rows, n, compiled, threads, monkeypatch):
    """MatMul + bias Add + Gelu (one MatMulEpilogue: the bias add and GELU in
    one compiled pass) against onnxruntime, split by rows only at 2 threads on
    large outputs. (The BLAS product's epilogue: the compiled sgemm, which
    applies the GELU in its own store, is switched off here and tested in
    test_sgemm_compiled.py.)"""
    if compiled and not _gelu_numba.HAVE_NUMBA:
        pytest.skip("numba not installed")
    from onnx import numpy_helper
    from actorrt.providers.cpu import _sgemm_numba
    monkeypatch.setattr(_sgemm_numba, "ENABLED", False)
    monkeypatch.setattr(_epilogue, "COMPILED_GELU", compiled)
    k = 24
    w = RNG.standard_normal((k, n)).astype(np.float32)
    c = (RNG.standard_normal(n) * 3).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "c"], ["q"]),
             helper.make_node("Gelu", ["q"], ["y"], domain="com.microsoft")]
    g = helper.make_graph(nodes, "mbg", [helper.make_tensor_value_info("x", TP.FLOAT, [1, rows, k])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)]).SerializeToString()
    x = RNG.standard_normal((1, rows, k)).astype(np.float32)
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    blocks = []
    if compiled:
        real = _gelu_numba._bias_gelu_rows
        monkeypatch.setattr(_gelu_numba, "_bias_gelu_rows", lambda y, b: (blocks.append(y.shape[0]), real(y, b)))
    with actorrt.InferenceSession(m, actorrt.SessionOptions(intra_op_num_threads=threads)) as s:
        assert [st.node.op_type for st in s.session.plan.steps] == ["MatMulEpilogue"]
        got = s.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    big = rows > 1 and rows * n >= _gelu_numba.PARALLEL_MIN_ELEMENTS
    if compiled:  # one compiled pass, or one per row block (2 threads, large outputs)
        assert sum(blocks) == rows and len(blocks) == (2 if threads == 2 and big else 1)


def test_bias_gelu_declines_what_it_cannot_take():
    if not _gelu_numba.HAVE_NUMBA:
        pytest.skip("numba not installed")
    y = RNG.standard_normal((4, 6)).astype(np.float32)
    assert not _gelu_numba.bias_gelu_inplace_f32(y, np.zeros(5, np.float32))     # wrong length
    assert not _gelu_numba.bias_gelu_inplace_f32(y, np.zeros(6, np.float64))     # wrong dtype
    assert not _gelu_numba.bias_gelu_inplace_f32(y, np.zeros((1, 6), np.float32))  # not 1-D
    assert not _gelu_numba.bias_gelu_inplace_f32(y[:, ::2], np.zeros(3, np.float32))  # strided
    before = y.copy()
    got = _epilogue.bias_gelu_inplace(y, np.zeros((1, 6), np.float32))         # numpy path
    np.testing.assert_allclose(got, _epilogue.gelu_inplace(before.astype(np.float64)), rtol=1e-6,
                               atol=1e-6)
