"""The NCHWc kernels (:mod:`actorrt.providers.cpu._nchwc`, :mod:`._nchwc_window`): the
reorders against numpy's reshape / transpose, the blocked convolution and depthwise calls
against the ONNX reference evaluator, the pools and global mean against numpy, the lanes
past the channel count zero (also where the epilogue's lower bound is above 0), one and
two threads giving the same bits."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from actorrt.providers.cpu import _conv_blocked as cb, _conv_split as cs, _dw_blocked as dwb
from actorrt.providers.cpu import _nchwc as nc, _nchwc_window as ncw, _threads

pytestmark = pytest.mark.skipif(not nc.HAVE_KERNEL, reason="no NCHWc kernels (AVX-512)")

RNG = np.random.default_rng(11)


def _blocks_ref(x):
    n, c, h, w = x.shape
    cb_ = -(-c // 16)
    p = np.zeros((n, cb_ * 16, h, w), np.float32)
    p[:, :c] = x
    return p.reshape(n, cb_, 16, h, w).transpose(0, 1, 3, 4, 2)


def _conv_ref(x, w, b, strides, pads, dil, group):
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=strides, pads=pads,
                            dilations=dil, group=group)
    g = helper.make_graph([node], "c", [], [helper.make_tensor_value_info("y", 1, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    g.input.append(helper.make_tensor_value_info("x", 1, x.shape))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return ReferenceEvaluator(m).run(None, {"x": x})[0]


@pytest.mark.parametrize("shape", [(1, 16, 4, 4), (2, 20, 5, 7), (1, 33, 17, 3), (3, 3, 8, 9),
                                   (2, 40, 40, 41)])  # (the last split over the partners)
@pytest.mark.parametrize("threads", [1, 2])
def test_reorders_match_numpy(shape, threads):
    _threads.apply(threads)
    x = RNG.standard_normal(shape).astype(np.float32)
    xb = nc.to_blocks(x, threads)
    np.testing.assert_array_equal(xb, _blocks_ref(x))
    np.testing.assert_array_equal(nc.from_blocks(xb, shape[1], threads), x)


def test_reorders_reject_other_shapes():
    with pytest.raises(ValueError):
        nc.to_blocks(np.zeros((1, 16, 3, 3), np.float32))  # planes under 16 pixels
    with pytest.raises(ValueError):
        nc.from_blocks(np.zeros((1, 2, 4, 4, 16), np.float32), 40)


@pytest.mark.parametrize("n,c,m,hw,k,s,p,d", [
    (1, 32, 48, 14, 3, 1, 1, 1), (2, 24, 37, 11, 3, 2, 1, 1), (1, 64, 16, 9, 1, 1, 0, 1),
    (1, 28, 40, 13, 3, 1, 2, 2), (1, 3, 32, 33, 3, 2, 1, 1), (2, 48, 80, 7, 1, 2, 0, 1),
])
def test_conv_call_matches_reference(n, c, m, hw, k, s, p, d, monkeypatch):
    monkeypatch.setattr(cs, "MIN_CONV_FLOPS", 0)  # two threads split even these
    monkeypatch.setattr(nc, "MIN_IMAGES_FLOPS", 0)
    x = RNG.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = (RNG.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    ref = _conv_ref(x, w, b, [s, s], [p] * 4, [d, d], 1)
    z = RNG.standard_normal(ref.shape).astype(np.float32)
    lo, hi = 0.25, 1.5  # the padded lanes must stay 0 although lo > 0
    want = np.clip(ref + z, lo, hi)
    planes = c <= 8
    wt, groups, bt = cb.pack(w, b, planes)
    outs = []
    for threads in (1, 2):
        _threads.apply(threads)
        xin = x if planes else nc.to_blocks(x)
        call = nc.ConvCall(xin.shape, c, wt, groups, m, (k, k), (s, s), (d, d), (p, p),
                           ref.shape[2:], planes, threads)
        y = call(xin, bt, nc.to_blocks(z), np.float32(1), np.float32(lo), np.float32(hi))
        assert y.shape == nc.blocked_shape(*ref.shape)
        np.testing.assert_allclose(nc.from_blocks(y, m), want, rtol=1e-5, atol=2e-5)
        flat = y.transpose(0, 2, 3, 1, 4).reshape(-1, y.shape[1] * 16)
        assert not flat[:, m:].any()
        outs.append(y)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("n,c,hw,k,s,p", [(1, 32, 20, 3, 1, 1), (2, 40, 11, 3, 2, 1),
                                          (1, 26, 16, 5, 1, 2), (2, 48, 40, 3, 2, 1),
                                          (1, 64, 40, 5, 1, 2), (1, 40, 37, 3, 1, 1),
                                          (2, 40, 70, 3, 2, 1), (1, 16, 67, 5, 2, 2)])
@pytest.mark.parametrize("direct", [True, False])
def test_depthwise_call_matches_reference(n, c, hw, k, s, p, direct, monkeypatch):
    # (the last two read their rows in place where ``direct``, short windows past a row's
    # end included: the last block's last rows take the tap loop instead)
    monkeypatch.setattr(cs, "MIN_DEPTHWISE_WORK", 0)  # two threads split even these
    monkeypatch.setattr(ncw, "DIRECT", direct)
    x = RNG.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = RNG.standard_normal((c, 1, k, k)).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    ref = _conv_ref(x, w, b, [s, s], [p] * 4, [1, 1], c)
    wt, bt = dwb.pack(w, b)
    outs = []
    for threads in (1, 2):
        call = ncw.DepthwiseCall(nc.blocked_shape(n, c, hw, hw), c, wt, (k, k), (s, s), (1, 1),
                                (p, p), ref.shape[2:], 0, None, threads)
        y = call(nc.to_blocks(x), bt, np.float32(0.1), np.float32(0.5), np.float32(np.inf))
        v = np.where(ref < 0, 0.1 * ref, ref)
        np.testing.assert_allclose(nc.from_blocks(y, c), np.maximum(v, 0.5), rtol=1e-5, atol=1e-5)
        flat = y.transpose(0, 2, 3, 1, 4).reshape(-1, y.shape[1] * 16)
        assert not flat[:, c:].any()
        outs.append(y)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("c", [16, 40, 13])
@pytest.mark.parametrize("threads", [1, 2])
def test_channel_affine_matches_numpy(c, threads):
    x = RNG.standard_normal((2, c, 45, 47)).astype(np.float32)
    a = RNG.standard_normal(c).astype(np.float32)
    t = RNG.standard_normal(c).astype(np.float32)
    pad = -(-c // 16) * 16
    ap, tp = np.zeros(pad, np.float32), np.zeros(pad, np.float32)
    ap[:c], tp[:c] = a, t
    y = nc.channel_affine(nc.to_blocks(x), ap, tp, c, np.float32(0.2), np.float32(-0.3),
                          np.float32(1.0), threads)
    v = x * a[:, None, None] + t[:, None, None]
    want = np.clip(np.where(v < 0, np.float32(0.2) * v, v), -0.3, 1.0)
    np.testing.assert_allclose(nc.from_blocks(y, c), want, rtol=1e-6, atol=1e-6)
    flat = y.transpose(0, 2, 3, 1, 4).reshape(-1, y.shape[1] * 16)
    assert not flat[:, c:].any()


@pytest.mark.parametrize("n,c,h,w", [(1, 1000, 13, 13), (3, 40, 2, 3), (2, 16, 7, 7),
                                     (1, 13, 1, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_global_mean_matches_numpy(n, c, h, w, threads, monkeypatch):
    monkeypatch.setattr(nc, "MIN_SPLIT_VALUES", 0)  # two threads split even these
    _threads.apply(threads)
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    xb = np.ascontiguousarray(_blocks_ref(x))
    y = nc.global_mean(xb, c, threads)
    assert y.shape == (n, c) and y.dtype == np.float32
    np.testing.assert_allclose(y, x.astype(np.float64).mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        nc.global_mean(xb, c + 16, threads)


def _windows(x, k, s, p, d, fill):
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=fill)
    e = (k - 1) * d + 1
    v = np.lib.stride_tricks.sliding_window_view(xp, (e, e), axis=(2, 3))
    return v[:, :, ::s, ::s, ::d, ::d]


@pytest.mark.parametrize("n,c,hw,k,s,p,d", [
    (1, 40, 21, 3, 2, 0, 1), (2, 16, 18, 3, 2, 1, 1), (1, 33, 20, 3, 1, 1, 1),
    (2, 20, 16, 2, 2, 0, 1), (1, 16, 23, 3, 2, 1, 2), (1, 48, 30, 5, 3, 2, 1),
    (1, 32, 25, 5, 1, 2, 1), (2, 20, 29, 5, 2, 2, 1)])
@pytest.mark.parametrize("direct", [True, False])
def test_pool_calls_match_numpy(n, c, hw, k, s, p, d, direct, monkeypatch):
    """MaxPool is IEEE maxNum over the window (numpy's fmax: a NaN loses to a
    number, a window of only NaNs gives NaN, -inf stays); AveragePool divides
    by the window (count_include_pad). The in-place reads and the band
    scratch, one and two threads: the same bits."""
    monkeypatch.setattr(ncw, "DIRECT", direct)
    monkeypatch.setattr(cs, "MIN_POOL_WORK", 0)
    x = RNG.standard_normal((n, c, hw, hw)).astype(np.float32)
    x[0, 0, 2:2 + 3 * d, 2:2 + 3 * d] = np.nan  # windows of only NaNs
    x[0, 1, ::3, ::2] = np.nan  # NaNs among numbers
    x[-1, 2, :4, :4] = -np.inf
    x[-1, 3, 5, 5] = np.inf
    oh = (hw + 2 * p - ((k - 1) * d + 1)) // s + 1
    want_max = np.fmax.reduce(np.fmax.reduce(_windows(x, k, s, p, d, -np.inf), axis=-1), axis=-1)
    xa = np.where(np.isfinite(x), x, 0).astype(np.float32)
    want_avg = _windows(xa, k, s, p, d, 0).astype(np.float64).sum(axis=(-1, -2)) / (k * k)
    counts = (np.full(oh, k, np.float32), np.full(oh, k, np.float32))
    # count_include_pad = 0: each output row's / column's taps inside the input
    taps = np.arange(oh)[:, None] * s - p + np.arange(k)[None, :] * d
    rows_in = cols_in = ((taps >= 0) & (taps < hw)).sum(axis=1).astype(np.float32)
    want_avg0 = _windows(xa, k, s, p, d, 0).astype(np.float64).sum(axis=(-1, -2)) / \
        np.multiply.outer(rows_in, cols_in)
    for mode, want, cnts in ((1, want_max, None), (2, want_avg, counts),
                             (2, want_avg0, (rows_in, cols_in))):
        xin = x if mode == 1 else xa
        outs = []
        for threads in (1, 2):
            _threads.apply(threads)
            call = ncw.DepthwiseCall(nc.blocked_shape(n, c, hw, hw), c, None, (k, k), (s, s),
                                     (d, d), (p, p), (oh, oh), mode, cnts, threads)
            y = call(nc.to_blocks(xin), None)
            got = nc.from_blocks(y, c)
            if mode == 1:
                np.testing.assert_array_equal(got, want.astype(np.float32))
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            outs.append(y)
        np.testing.assert_array_equal(outs[0], outs[1])
