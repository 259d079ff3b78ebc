"""The per-shape prepared call of the compiled float32 GEMM
(:class:`actorrt.providers.cpu._sgemm_numba.GemmCall`, kept by
:class:`~actorrt.providers.cpu._matmul_split.ConstantOperand`): the same bits as
:func:`~actorrt.providers.cpu._sgemm_numba.run` on one thread and over the partners,
numpy's values, and a decline for whatever it was not made for."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _matmul_split, _partner, _threads
from actorrt.providers.cpu import _sgemm_numba as sg
from tests.providers.cpu.test_sgemm_compiled import _ref

pytestmark = pytest.mark.skipif(not sg.HAVE_SGEMM,
                                reason="the compiled sgemm needs numba on AVX-512")

RNG = np.random.default_rng(17)


_want = _ref  # act(a @ b + bias) in float64


@pytest.mark.parametrize("a_shape,n", [((1, 1, 256), 768), ((1, 1, 1024), 256), ((1, 5, 33), 70),
                                       ((7, 64), 31), ((1, 256), 2048), ((3,), 9)])
@pytest.mark.parametrize("act", ["", "Relu", "Gelu"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_kept_calls_equal_run_and_numpy(a_shape, n, act, with_bias, threads, monkeypatch):
    if threads == 2:
        monkeypatch.setattr(sg, "PARTNER_MIN_FLOPS", 0)  # every product over the partners
    _threads.apply(threads)
    k = a_shape[-1]
    b = RNG.standard_normal((k, n)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32) if with_bias else None
    const = _matmul_split.ConstantOperand(b)
    runs = []
    real = sg.GemmCall.run
    monkeypatch.setattr(sg.GemmCall, "run", lambda self, a: (runs.append(self), real(self, a))[1])
    for i in range(3):
        a = RNG.standard_normal(a_shape).astype(np.float32)
        got = const.compiled(a, bias, act)
        assert got.shape == a_shape[:-1] + (n,) and got.dtype == np.float32
        np.testing.assert_allclose(got, _want(a, b, bias, act), rtol=2e-5, atol=2e-5)
        np.testing.assert_array_equal(got, sg.run(a, const._packed, bias, sg.ACT_CODES[act],
                                                  threads))
    assert len(runs) == 2  # the second and third calls took the kept call
    if threads == 2 and const._packed.panels.shape[0] > 1 and _partner.AVAILABLE:
        assert runs[0].team_chunks  # and it splits over the partners as run does


def test_fits_declines_other_operands(monkeypatch):
    _threads.apply(1)
    b = RNG.standard_normal((64, 96)).astype(np.float32)
    bias = RNG.standard_normal(96).astype(np.float32)
    const = _matmul_split.ConstantOperand(b)
    a = RNG.standard_normal((1, 1, 64)).astype(np.float32)
    const.compiled(a, bias, "Relu")
    call = const._call
    assert call is not None and call.fits(a, bias, "Relu", 1)
    assert not call.fits(a, bias.copy(), "Relu", 1)  # another bias array
    assert not call.fits(a, bias, "", 1)  # another activation
    assert not call.fits(a, bias, "Relu", 2)  # another thread count
    assert not call.fits(RNG.standard_normal((1, 2, 64)).astype(np.float32), bias, "Relu", 1)
    wide = RNG.standard_normal((1, 1, 128)).astype(np.float32)
    assert not call.fits(wide[..., ::2], bias, "Relu", 1)  # strided
    assert not call.fits(a.astype(np.float64), bias, "Relu", 1)
    monkeypatch.setattr(sg, "USE_PARTNERS", not sg.USE_PARTNERS)
    assert not call.fits(a, bias, "Relu", 1)  # made under the other split switch
    monkeypatch.undo()
    monkeypatch.setattr(sg, "ENABLED", False)
    assert not call.fits(a, bias, "Relu", 1)
    assert const.compiled(a, bias, "Relu") is None  # the caller's numpy path then


def test_prepare_call_declines_what_run_routes_elsewhere():
    packed = sg.PackedB(RNG.standard_normal((16, 40)).astype(np.float32))
    a = RNG.standard_normal((2, 16)).astype(np.float32)
    assert sg.prepare_call(a, packed, None, "", 1) is not None
    assert sg.prepare_call(a.T.copy().T, packed, None, "", 1) is None  # not C-contiguous
    assert sg.prepare_call(np.zeros((0, 16), np.float32), packed, None, "", 1) is None
    assert sg.prepare_call(RNG.standard_normal((2, 8)).astype(np.float32), packed, None, "",
                           1) is None  # K differs


@pytest.mark.parametrize("threads", [1, 2])
def test_a_decode_step_model_equals_onnxruntime_on_every_run(threads):
    d, n = 256, 768
    w = RNG.standard_normal((d, n)).astype(np.float32) / 16
    bias = RNG.standard_normal(n).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["q"]),
         helper.make_node("Relu", ["q"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TP.FLOAT, [1, "S", d])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    peer = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    with actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=threads)) as s:
        assert [st.node.op_type for st in s.session.plan.steps] == ["MatMulEpilogue"]
        for rows in (1, 1, 1, 4, 4, 1):
            x = RNG.standard_normal((1, rows, d)).astype(np.float32)
            np.testing.assert_allclose(s.run(None, {"x": x})[0], peer.run(None, {"x": x})[0],
                                       rtol=1e-5, atol=1e-5)
