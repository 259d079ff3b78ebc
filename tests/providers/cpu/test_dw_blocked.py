"""The channel-blocked depthwise kernel of small planes (:mod:`._dw_blocked`)
against a float64 numpy reference and, through a session, onnxruntime:
strides, dilations, asymmetric pads, kernel sizes, channel counts that leave
a partial block, batches, a residual, the epilogue's clamps, one and two
threads; and which shapes take it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _dw_blocked, _threads

RNG = np.random.default_rng(7)

pytestmark = pytest.mark.skipif(not _dw_blocked.HAVE_KERNEL,
                                reason="no AVX-512 16-lane kernels on this host")

# (n, c, h, w, (kh, kw), strides, dilations, pads (top, left, bottom, right))
CASES = [
    (1, 32, 7, 7, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (2, 40, 9, 6, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),     # a partial block, a batch
    (1, 48, 14, 14, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    (1, 16, 11, 13, (5, 5), (1, 2), (1, 1), (2, 1, 2, 3)),   # asymmetric pads
    (1, 64, 10, 10, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),   # dilated
    (2, 30, 5, 8, (3, 1), (2, 1), (1, 1), (0, 0, 1, 0)),
    (1, 16, 4, 4, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),     # 16-pixel planes: no tail
    (1, 96, 6, 17, (7, 7), (1, 1), (1, 1), (3, 3, 3, 3)),
    (1, 32, 45, 50, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # 2,250 pixels: many transposes
    (1, 20, 12, 19, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),   # the unrolled 5x5 windows
    (2, 32, 21, 22, (5, 5), (2, 2), (1, 1), (2, 2, 2, 2)),
]


def _out(case):
    n, c, h, w, (kh, kw), (sh, sw), (dh, dw), (t, l, b, r) = case
    return (h + t + b - (kh - 1) * dh - 1) // sh + 1, (w + l + r - (kw - 1) * dw - 1) // sw + 1


def _reference(x, w, bias, case, z=None, alpha=1.0, lo=-np.inf, hi=np.inf):
    n, c, h, wd, (kh, kw), (sh, sw), (dh, dw), (t, l, b, r) = case
    oh, ow = _out(case)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, b), (l, r)))
    y = np.zeros((n, c, oh, ow)) + bias.astype(np.float64)[None, :, None, None]
    for i in range(kh):
        for j in range(kw):
            y += w[None, :, 0, i, j, None, None] * \
                xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
    if z is not None:
        y += z
    y = np.where(y < 0, alpha * y, y)
    return np.minimum(np.maximum(y, lo), hi)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("epilogue", ["none", "leaky-clip", "residual"])
@pytest.mark.parametrize("case", CASES)
def test_blocked_kernel_matches_the_reference(case, epilogue, threads):
    n, c, h, wd, k, s, d, p = case
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = RNG.standard_normal((c, 1, *k)).astype(np.float32)
    bias = RNG.standard_normal(c).astype(np.float32)
    oh, ow = _out(case)
    z = RNG.standard_normal((n, c, oh, ow)).astype(np.float32) if epilogue == "residual" else None
    alpha, lo, hi = (0.1, -0.5, 0.8) if epilogue == "leaky-clip" else (1.0, -np.inf, np.inf)
    wt, bt = _dw_blocked.pack(w, bias)
    y = _dw_blocked.run(x, wt, bt, k, s, d, p[:2], (oh, ow), z, alpha, lo, hi, threads)
    np.testing.assert_allclose(y, _reference(x, w, bias, case, z, alpha, lo, hi),
                               rtol=1e-5, atol=1e-5)


def test_which_shapes_take_it():
    """Depthwise (multiplier 1) with at most MAX_PIXELS output pixels and
    channels filling MIN_FILL of their blocks."""
    side = int(np.sqrt(_dw_blocked.MAX_PIXELS))
    assert _dw_blocked.applies((1, 64, 7, 7), (64, 1, 3, 3), 64, (7, 7))
    assert _dw_blocked.applies((1, 64, side, side), (64, 1, 3, 3), 64, (side, side))
    assert not _dw_blocked.applies((1, 64, side + 1, side + 1), (64, 1, 3, 3), 64,
                                   (side + 1, side + 1))
    assert not _dw_blocked.applies((1, 32, 7, 7), (64, 1, 3, 3), 32, (7, 7))  # multiplier 2
    assert not _dw_blocked.applies((1, 64, 7, 7), (64, 2, 3, 3), 32, (7, 7))  # grouped, not dw
    assert not _dw_blocked.applies((1, 17, 7, 7), (17, 1, 3, 3), 17, (7, 7))  # 17 of 32 lanes
    assert _dw_blocked.applies((1, 24, 7, 7), (24, 1, 3, 3), 24, (7, 7))      # 24 of 32
    # planes under 16 pixels (in or out) decline: a chunk is 16 pixels of one plane
    assert not _dw_blocked.applies((1, 64, 3, 5), (64, 1, 3, 3), 64, (3, 5))
    assert not _dw_blocked.applies((1, 64, 8, 8), (64, 1, 3, 3), 64, (3, 3))
    assert _dw_blocked.pool_applies((1, 64, 8, 8), (4, 4))
    assert not _dw_blocked.pool_applies((1, 64, 8, 8), (3, 5))
    with pytest.raises(ValueError):
        _dw_blocked.pool(np.zeros((1, 16, 3, 3), np.float32), True, (1, 1), (1, 1), (1, 1),
                         (0, 0), (3, 3))


def _dw_model(case, act):
    n, c, h, wd, k, s, d, p = case
    inits = [numpy_helper.from_array(RNG.standard_normal((c, 1, *k)).astype(np.float32), "W"),
             numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=list(k),
                              strides=list(s), dilations=list(d), group=c,
                              pads=[p[0], p[1], p[2], p[3]])]
    nodes.append(helper.make_node(act, ["c"], ["y"]) if act else
                 helper.make_node("Identity", ["c"], ["y"]))
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", TP.FLOAT, [n, c, h, wd])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), \
        RNG.standard_normal((n, c, h, wd)).astype(np.float32)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", ["", "Relu"])
@pytest.mark.parametrize("case", CASES[:6])
def test_sessions_take_the_blocked_kernel_with_onnxruntimes_values(case, act, threads):
    model, x = _dw_model(case, act)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    opts = actorrt.SessionOptions(trace="ops", intra_op_num_threads=threads)
    with actorrt.InferenceSession(model, opts) as s:
        got = [s.run(None, {"x": x}) for _ in range(2)]
        details = [sp.args.get("kernel_variant.conv", {}).get("reason", "")
                   for sp in s.session.tracer.spans if sp.cat == "op"]
    for g in got:
        np.testing.assert_allclose(g[0], want[0], rtol=1e-5, atol=1e-5)
    assert any("channel blocks" in str(d) for d in details), details


def test_two_threads_run_the_blocks_on_the_partners(monkeypatch):
    """At two threads the channel blocks go to the compiled partners (one
    per-call block posted) with one thread's bits."""
    from actorrt.providers.cpu import _conv_split
    if not (_conv_split.HAVE_SPLIT and _conv_split.DWB_ITEMS):
        pytest.skip("no compiled partners")
    case = CASES[2]
    n, c, h, wd, k, s, d, p = case
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = RNG.standard_normal((c, 1, *k)).astype(np.float32)
    wt, bt = _dw_blocked.pack(w, RNG.standard_normal(c).astype(np.float32))
    posted = []
    real = _conv_split._run_addr

    def spy(team, fn, addr, items, threads):
        posted.append((fn, items))
        return real(team, fn, addr, items, threads)

    monkeypatch.setattr(_conv_split, "_run_addr", spy)
    two = _dw_blocked.run(x, wt, bt, k, s, d, p[:2], _out(case), threads=2)
    assert posted == [(_conv_split.DWB_ITEMS, 3)]
    np.testing.assert_array_equal(two, _dw_blocked.run(x, wt, bt, k, s, d, p[:2], _out(case)))


@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (3, 1, 1), (2, 2, 0)])
@pytest.mark.parametrize("threads", [1, 2])
def test_maxpool_is_maxnum_with_nans(k, s, p, threads):
    """IEEE maxNum (numpy's fmax): a NaN loses to a number, a window of only
    NaNs gives NaN, -inf and +inf stay (the one-max-a-tap pass, then the
    exact loop on pixels with a lane at -inf)."""
    _threads.apply(threads)
    x = np.random.default_rng(5).standard_normal((2, 20, 17, 18)).astype(np.float32)
    x[0, 0, 3:8, 3:8] = np.nan
    x[0, 1, ::3, ::2] = np.nan
    x[1, 2, :5, :5] = -np.inf
    x[1, 3, 6, 6] = np.inf
    oh, ow = (17 + 2 * p - k) // s + 1, (18 + 2 * p - k) // s + 1
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf)
    v = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s]
    want = np.fmax.reduce(np.fmax.reduce(v, axis=-1), axis=-1)[:, :, :oh, :ow]
    got = _dw_blocked.pool(x, True, (k, k), (s, s), (1, 1), (p, p), (oh, ow), None, threads)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("k,s,p", [(3, 1, 1), (3, 2, 1), (5, 1, 2), (5, 2, 2), (2, 2, 0)])
@pytest.mark.parametrize("include_pad", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_avgpool_matches_numpy(k, s, p, include_pad, threads):
    """AveragePool: the window's sum divided by the taps counted (pads or
    not); 3x3 / 5x5 at strides 1 / 2 run the unrolled windows with weights
    of 1, the 2x2 the tap loop."""
    _threads.apply(threads)
    x = np.random.default_rng(6).standard_normal((2, 40, 19, 17)).astype(np.float32)
    oh, ow = (19 + 2 * p - k) // s + 1, (17 + 2 * p - k) // s + 1
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    v = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s]
    sums = v.sum(axis=(-1, -2))[:, :, :oh, :ow]

    def inside(n, o):
        t = np.arange(o)[:, None] * s - p + np.arange(k)[None, :]
        return ((t >= 0) & (t < n)).sum(axis=1).astype(np.float32)
    counts = (np.full(oh, k, np.float32), np.full(ow, k, np.float32)) if include_pad else \
        (inside(19, oh), inside(17, ow))
    got = _dw_blocked.pool(x, False, (k, k), (s, s), (1, 1), (p, p), (oh, ow), counts, threads)
    np.testing.assert_allclose(got, sums / np.multiply.outer(*counts), rtol=1e-5, atol=1e-6)
