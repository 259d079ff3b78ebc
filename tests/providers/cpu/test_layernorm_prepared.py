"""The per-node prepared (Skip)LayerNormalization call
(:class:`actorrt.providers.cpu._layernorm_numba.RowsCall`): kept after a shape's first
call, it gives the general compiled path's bits and onnxruntime's values on every later
call, follows a shape change, and declines operands it was not made for."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _layernorm_numba as ln

pytestmark = pytest.mark.skipif(not ln.HAVE_NUMBA, reason="numba not installed")

RNG = np.random.default_rng(3)
MS = "com.microsoft"


def _f(shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale + 0.25).astype(np.float32)


def _model(d, with_beta, with_bias, stats):
    """x -> LayerNormalization (constant scale / bias) -> y0; SkipLayerNormalization
    (x, y0 [, beta] [, bias]) -> y, mean, inv, sum."""
    inits = [numpy_helper.from_array(_f((d,)), "g0"), numpy_helper.from_array(_f((d,)), "b0"),
             numpy_helper.from_array(_f((d,)), "g")]
    ln_outs = ["y0", "m0", "i0"] if stats else ["y0"]
    nodes = [helper.make_node("LayerNormalization", ["x", "g0", "b0"], ln_outs, axis=-1,
                              epsilon=1e-5)]
    ins = ["x", "y0", "g"]
    if with_beta or with_bias:
        ins.append("be" if with_beta else "")
        if with_beta:
            inits.append(numpy_helper.from_array(_f((d,)), "be"))
    if with_bias:
        ins.append("bi")
        inits.append(numpy_helper.from_array(_f((d,)), "bi"))
    nodes.append(helper.make_node("SkipLayerNormalization", ins, ["y", "m", "i", "s"],
                                  domain=MS, epsilon=1e-5))
    outs = ["y", "m", "i", "s"] + (["m0", "i0"] if stats else [])
    g = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", TP.FLOAT, None)],
                          [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outs],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid(MS, 1)]).SerializeToString()


@pytest.mark.parametrize("shape", [(1, 1, 256), (1, 3, 64), (2, 5), (4, 7), (1, 1, 33)])
@pytest.mark.parametrize("with_beta,with_bias", [(False, False), (True, False), (False, True),
                                                 (True, True)])
@pytest.mark.parametrize("stats", [False, True])
def test_later_calls_equal_onnxruntime_and_the_general_path(shape, with_beta, with_bias, stats,
                                                            monkeypatch):
    model = _model(shape[-1], with_beta, with_bias, stats)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    peer = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    calls = []
    real = ln.RowsCall.run
    monkeypatch.setattr(ln.RowsCall, "run", lambda self, x, skip: (calls.append(1),
                                                                    real(self, x, skip))[1])
    with actorrt.InferenceSession(model) as sess:
        for i in range(3):
            x = _f(shape, 2.0)
            got = sess.run(None, {"x": x})
            want = peer.run(None, {"x": x})
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == np.float32
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
            if i == 0:
                assert not calls  # the first call of a shape takes the general path
                first = got
        assert len(calls) == 4  # both nodes, the second and third runs
        # the prepared call's bits are the general path's: run the first input again
        monkeypatch.setattr(ln.RowsCall, "fits", lambda self, *a: False)
    with actorrt.InferenceSession(model) as general:
        again = general.run(None, {"x": x})
    with actorrt.InferenceSession(model) as sess:
        sess.run(None, {"x": x})
        monkeypatch.undo()
        kept = sess.run(None, {"x": x})
    for a, b in zip(kept, again):
        np.testing.assert_array_equal(a, b)
    assert len(first) == len(kept)


def test_a_shape_change_prepares_again():
    model = _model(48, True, True, False)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    peer = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    with actorrt.InferenceSession(model) as sess:
        for shape in [(1, 1, 48), (1, 1, 48), (1, 7, 48), (1, 7, 48), (1, 1, 48), (3, 48)]:
            x = _f(shape)
            for g, w in zip(sess.run(None, {"x": x}), peer.run(None, {"x": x})):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        kernels = [st.kernel for st in sess.session.plan.steps]
        assert all(k._rows is not None and k._rows.shape == (3, 48) for k in kernels)


def test_fits_declines_other_operands(monkeypatch):
    x, skip, g, b = _f((1, 2, 16)), _f((1, 2, 16)), _f((16,)), _f((16,))
    call = ln.prepare(x, g, b, 1e-5, skip)
    assert call is not None and call.fits(x, skip, g, b, None)
    assert not call.fits(x, skip, g.copy(), b, None)  # another scale array
    assert not call.fits(x, skip, g, None, None)  # beta absent now
    assert not call.fits(x, None, g, b, None)  # the skip absent
    assert not call.fits(_f((1, 3, 16)), _f((1, 3, 16)), g, b, None)  # another shape
    wide = _f((1, 2, 32))
    assert not call.fits(wide[..., ::2], skip, g, b, None)  # strided
    assert not call.fits(x.astype(np.float64), skip, g, b, None)
    monkeypatch.setattr(ln, "COMPILED", False)
    assert not call.fits(x, skip, g, b, None)  # the compiled path switched off
    monkeypatch.undo()
    y, mean, inv, s = call.run(x, skip)
    ref = ln.layer_norm(x, g, b, 1e-5, -1, skip, None, keep_sum=True)
    np.testing.assert_array_equal(y, ref[0])
    np.testing.assert_array_equal(mean.reshape(-1), ref[1])
    np.testing.assert_array_equal(inv.reshape(-1), ref[2])
    np.testing.assert_array_equal(s, ref[3])
    assert mean.shape == inv.shape == (1, 2, 1)


def test_prepare_declines_what_the_row_split_or_numpy_takes():
    g = _f((64,))
    assert ln.prepare(_f((512, 64)), g, None, 1e-5) is None  # rows for the partner split
    assert ln.prepare(_f((4, 64)).T.copy().T, g, None, 1e-5) is None  # not C-contiguous
    assert ln.prepare(_f((4, 64)), g.astype(np.float64), None, 1e-5) is None
    assert ln.prepare(_f((4, 64)), g, None, 1e-5, skip=_f((64,))) is None  # a broadcast skip
    assert ln.prepare(np.zeros((0, 64), np.float32), g, None, 1e-5) is None
    assert ln.prepare(_f((4, 64)), g, None, 1e-5) is not None
