"""The compiled float32 row softmax (``_softmax_numba``) against a float64
numpy reference (odd row lengths, scales, broadcast masks, ``-inf`` / NaN /
``+inf`` rows as numpy gives them), the operands it declines, and the ONNX
Softmax and fused attention models using it against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper

import actorrt
from actorrt.providers.cpu import _softmax_numba

pytestmark = pytest.mark.skipif(not _softmax_numba.HAVE_NUMBA, reason="numba not installed")

RNG = np.random.default_rng(2151)


def _reference(s, scale, mask):
    x = s.astype(np.float64) * scale
    if mask is not None:
        x = x + mask
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape,mask_shape", [
    ((1, 4, 128, 128), (1, 1, 1, 128)),
    ((3, 5, 7), None),
    ((2, 3, 17, 33), (2, 1, 17, 33)),    # a mask that is not a view of rows: copied
    ((1, 4, 1, 65), (1, 1, 1, 65)),
    ((5, 1), None),
    ((4, 9), (9,)),
    ((2, 3, 1031), (2, 3, 1031)),
    ((2, 3, 5, 11), (3, 5, 11)),         # trailing dims: a view, rows repeat
    ((2, 3, 5, 11), (2, 3, 5, 1)),       # broadcast along the row: copied
    ((2, 3, 5, 11), (1, 3, 1, 11)),
])
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_rows_equal_float64_numpy(shape, mask_shape, scale):
    s = (RNG.standard_normal(shape) * 4).astype(np.float32)
    mask = None
    if mask_shape is not None:
        mask = np.where(RNG.random(mask_shape) < 0.2, -1e4, 0).astype(np.float32)
        if mask_shape[-1] == 1:  # one value a row (-1e4 + s would round in float32)
            mask = RNG.standard_normal(mask_shape).astype(np.float32)
        if mask_shape[-1] > 1:
            mask[..., 0] = -np.inf  # masked-out entries give exactly 0
    want = _reference(s, scale, mask)
    got = s.copy()
    assert _softmax_numba.softmax_rows_f32(got, scale, mask)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    if mask is not None and mask_shape[-1] > 1:
        assert np.all(got[..., 0] == 0)


def test_strided_mask():
    s = RNG.standard_normal((3, 4, 10)).astype(np.float32)
    mask = RNG.standard_normal((4, 20)).astype(np.float32)[:, ::2]
    got = s.copy()
    assert _softmax_numba.softmax_rows_f32(got, 0.5, mask)
    np.testing.assert_allclose(got, _reference(s, 0.5, mask), rtol=2e-6, atol=1e-7)


def test_nonfinite_rows_as_numpy():
    x = np.array([[1, 2, np.nan, 0], [0, -np.inf, 1, 2], [-np.inf] * 4, [1, np.inf, 2, 0],
                  [3e38, 3e38, -3e38, 0], [-100, -300, -200, -100]], np.float32)
    got = x.copy()
    assert _softmax_numba.softmax_rows_f32(got)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    # NaN where numpy has NaN; terms below e^-87.3 (numpy: subnormals) flush to 0
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-37)
    assert got[5, 2] == 0 and want[5, 2] < 1e-37


def test_declines_what_it_does_not_compile():
    x64 = np.zeros((2, 3))
    assert not _softmax_numba.softmax_rows_f32(x64)
    strided = np.zeros((4, 6), np.float32)[:, ::2]
    assert not _softmax_numba.softmax_rows_f32(strided)
    ro = np.zeros((2, 3), np.float32)
    ro.flags.writeable = False
    assert not _softmax_numba.softmax_rows_f32(ro)
    s = np.zeros((2, 1, 3), np.float32)
    assert not _softmax_numba.softmax_rows_f32(s, 1.0, np.zeros((2, 4, 3), np.float32))  # enlarges
    assert not _softmax_numba.softmax_rows_f32(s, 1.0, np.zeros(3, np.float64))
    assert np.all(s == 0)


def _ort(model, feeds):
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("opset,axis,shape", [(13, -1, (3, 7, 129)), (13, 1, (3, 7, 5)),
                                              (11, 1, (3, 7, 5)), (13, -1, (1, 1))])
@pytest.mark.parametrize("threads", [1, 2])
def test_softmax_model_equals_onnxruntime(opset, axis, shape, threads, monkeypatch):
    monkeypatch.setattr(_softmax_numba, "PARTNER_MIN_ELEMENTS", 0)  # split whatever the size
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], "t",
                          [helper.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()
    x = (RNG.standard_normal(shape) * 5).astype(np.float32)
    with actorrt.InferenceSession(m, actorrt.SessionOptions(intra_op_num_threads=threads)) as s:
        got = s.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, _ort(m, {"x": x}), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_attention_model_equals_onnxruntime(threads):
    """MatMul - scale - Add mask - Softmax - MatMul (fused to ScaledDotAttention,
    scores through the compiled pass) at odd sizes and a -inf mask column."""
    b, h, sq, t, d = 1, 3, 19, 37, 24
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Add", ["ss", "mask"], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    g = helper.make_graph(nodes, "t", [
        helper.make_tensor_value_info("q", TP.FLOAT, [b, h, sq, d]),
        helper.make_tensor_value_info("kt", TP.FLOAT, [b, h, d, t]),
        helper.make_tensor_value_info("v", TP.FLOAT, [b, h, t, d]),
        helper.make_tensor_value_info("mask", TP.FLOAT, [b, 1, 1, t])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [helper.make_tensor("scale", TP.FLOAT, [], [d ** -0.5])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    mask = np.zeros((b, 1, 1, t), np.float32)
    mask[..., -5:] = -1e4
    mask[..., 3] = -np.inf
    feeds = {"q": RNG.standard_normal((b, h, sq, d)).astype(np.float32),
             "kt": RNG.standard_normal((b, h, d, t)).astype(np.float32),
             "v": RNG.standard_normal((b, h, t, d)).astype(np.float32), "mask": mask}
    with actorrt.InferenceSession(m, actorrt.SessionOptions(intra_op_num_threads=threads)) as s:
        assert "ScaledDotAttention" in [st.node.op_type for st in s.session.plan.steps]
        got = s.run(None, feeds)[0]
    np.testing.assert_allclose(got, _ort(m, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,mask_shape", [((1, 4, 128, 128), (1, 1, 1, 128)), ((3, 5, 7), None),
                                              ((2, 3, 17, 33), (2, 1, 17, 33)),
                                              ((2, 3, 5, 11), (3, 5, 11))])
@pytest.mark.parametrize("use_partners", [True, False])
def test_two_threads_equal_one_thread(shape, mask_shape, use_partners, monkeypatch):
    """threads=2: rows over the compiled partner threads (or, switched off,
    one thread): the same bits as threads=1, and the float64 reference."""
    monkeypatch.setattr(_softmax_numba, "PARTNER_MIN_ELEMENTS", 0)
    monkeypatch.setattr(_softmax_numba, "USE_PARTNERS", use_partners)
    s = (RNG.standard_normal(shape) * 4).astype(np.float32)
    mask = None if mask_shape is None else \
        np.where(RNG.random(mask_shape) < 0.2, -1e4, 0).astype(np.float32)
    one, two = s.copy(), s.copy()
    assert _softmax_numba.softmax_rows_f32(one, 0.125, mask, 1)
    assert _softmax_numba.softmax_rows_f32(two, 0.125, mask, 2)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(two, _reference(s, 0.125, mask), rtol=2e-6, atol=1e-7)
