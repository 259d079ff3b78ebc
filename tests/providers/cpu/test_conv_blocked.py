"""The channel-blocked direct convolution of small planes
(:mod:`._conv_blocked`) against a float64 numpy reference and, through a
session, onnxruntime: kernel sizes, strides, dilations, asymmetric pads,
channel counts that leave partial blocks, batches, a residual, the
epilogue's clamps, reductions in several blocks, stems read as channel
planes, one and two threads (both partner splits: whole images and per
image); and which shapes take it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _conv_blocked

RNG = np.random.default_rng(11)

pytestmark = pytest.mark.skipif(not _conv_blocked.HAVE_KERNEL,
                                reason="no AVX-512 16-lane kernels on this host")

# (n, c, m, h, w, (kh, kw), strides, dilations, pads (top, left, bottom, right))
CASES = [
    (1, 64, 64, 7, 7, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),      # 4 output blocks: one group
    (4, 16, 16, 16, 16, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),    # resnetish: 1-block groups
    (3, 32, 48, 9, 11, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),     # a 3-block group, odd planes
    (1, 40, 80, 10, 10, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),    # partial input / output blocks
    (2, 32, 32, 12, 12, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    (1, 24, 96, 13, 9, (3, 3), (1, 2), (2, 2), (2, 1, 3, 2)),     # dilated, asymmetric pads
    (1, 256, 208, 7, 7, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),    # 1x1, 4 + 4 + 4 + 1 blocks
    (1, 128, 64, 30, 30, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),   # 900 pixels: many items
    (2, 64, 160, 8, 6, (3, 1), (1, 1), (1, 1), (1, 0, 1, 0)),     # 4 + 4 + 2 blocks
]


# stems read as channel planes (few input channels, strided)
PLANE_CASES = [
    (1, 3, 64, 64, 64, (7, 7), (2, 2), (1, 1), (3, 3, 3, 3)),
    (2, 3, 32, 33, 35, (7, 7), (2, 2), (1, 1), (3, 3, 2, 3)),     # a batch, odd planes
    (1, 3, 96, 50, 50, (11, 11), (4, 4), (1, 1), (2, 2, 2, 2)),   # alexnet-style
    (1, 4, 32, 40, 40, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    (1, 2, 48, 30, 30, (5, 5), (2, 2), (2, 1), (2, 2, 2, 2)),     # dilated, two channels
]


def _out(case):
    n, c, m, h, w, (kh, kw), (sh, sw), (dh, dw), (t, l, b, r) = case
    return (h + t + b - (kh - 1) * dh - 1) // sh + 1, (w + l + r - (kw - 1) * dw - 1) // sw + 1


def _reference(x, w, bias, case, z=None, alpha=1.0, lo=-np.inf, hi=np.inf):
    n, c, m, h, wd, (kh, kw), (sh, sw), (dh, dw), (t, l, b, r) = case
    oh, ow = _out(case)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, b), (l, r)))
    y = np.zeros((n, m, oh, ow)) + bias.astype(np.float64)[None, :, None, None]
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
            y += np.einsum("nchw,mc->nmhw", win, w[:, :, i, j].astype(np.float64))
    if z is not None:
        y += z
    y = np.where(y < 0, alpha * y, y)
    return np.minimum(np.maximum(y, lo), hi)


def _operands(case, residual):
    n, c, m, h, wd, k = case[:6]
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = (RNG.standard_normal((m, c, *k)) / np.sqrt(c * k[0] * k[1])).astype(np.float32)
    bias = RNG.standard_normal(m).astype(np.float32)
    z = RNG.standard_normal((n, m, *_out(case))).astype(np.float32) if residual else None
    return x, w, bias, z


def _run(case, x, w, bias, z, alpha, lo, hi, threads, planes=False):
    wt, groups, bt = _conv_blocked.pack(w, bias, planes)
    return _conv_blocked.run(x, wt, groups, bt, case[5], case[6], case[7], case[8][:2], case[2],
                             _out(case), z, alpha, lo, hi, threads, planes)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("epilogue", ["none", "leaky-clip", "residual"])
@pytest.mark.parametrize("case", CASES)
def test_blocked_kernel_matches_the_reference(case, epilogue, threads):
    x, w, bias, z = _operands(case, epilogue == "residual")
    alpha, lo, hi = (0.1, -0.5, 0.8) if epilogue == "leaky-clip" else (1.0, -np.inf, np.inf)
    y = _run(case, x, w, bias, z, alpha, lo, hi, threads)
    np.testing.assert_allclose(y, _reference(x, w, bias, case, z, alpha, lo, hi),
                               rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("epilogue", ["none", "residual"])
@pytest.mark.parametrize("case", PLANE_CASES)
def test_input_planes_match_the_reference(case, epilogue, threads):
    """Stems: the input read as zero-padded channel planes (no transposes),
    the same tiles and output transposes."""
    x, w, bias, z = _operands(case, epilogue == "residual")
    assert _conv_blocked.planes_fit(x.shape, w.shape, 1, _out(case), case[6])
    y = _run(case, x, w, bias, z, 1.0, 0.0, np.inf, threads, planes=True)
    np.testing.assert_allclose(y, _reference(x, w, bias, case, z, 1.0, 0.0, np.inf),
                               rtol=1e-5, atol=2e-5)
    if threads == 2:
        np.testing.assert_array_equal(y, _run(case, x, w, bias, z, 1.0, 0.0, np.inf, 1, True))


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[7]])
def test_two_threads_give_one_threads_bits(case, monkeypatch):
    """Both partner splits (whole images; per image the input blocks, then
    (group, pixel range) items) compute every output pixel as one thread
    does: the same bits."""
    from actorrt.providers.cpu import _conv_split
    if not (_conv_split.HAVE_SPLIT and _conv_split.CB_IN):
        pytest.skip("no compiled partners")
    x, w, bias, z = _operands(case, True)
    one = _run(case, x, w, bias, z, 1.0, 0.0, np.inf, 1)
    posted = []
    real = _conv_split._run_addr

    def spy(team, fn, addr, items, threads):
        posted.append(fn)
        return real(team, fn, addr, items, threads)

    monkeypatch.setattr(_conv_split, "_run_addr", spy)
    two = _run(case, x, w, bias, z, 1.0, 0.0, np.inf, 2)
    np.testing.assert_array_equal(two, one)
    want = {_conv_split.CB_IMAGES} if case[0] >= 2 else {_conv_split.CB_IN, _conv_split.CB_TILES}
    assert set(posted) == want


def test_reduction_blocks_give_the_same_values(monkeypatch):
    """A group's reduction cut into blocks (K_BLOCK_BYTES: the partial sums
    stored and read back) gives the unblocked values."""
    case = CASES[0]
    x, w, bias, z = _operands(case, True)
    whole = _run(case, x, w, bias, z, 1.0, -np.inf, np.inf, 1)
    monkeypatch.setattr(_conv_blocked, "K_BLOCK_BYTES", 4096)  # 64 * 9 * 16 in 36 blocks
    np.testing.assert_allclose(_run(case, x, w, bias, z, 1.0, -np.inf, np.inf, 1), whole,
                               rtol=1e-6, atol=1e-6)


def test_input_and_residual_ending_at_a_page_end():
    """Operands that end exactly at the end of their mapping: values as the
    reference (the input's tail chunk is read as its plane's last 16
    pixels; the residual is read where the output is stored)."""
    import mmap
    case = CASES[3]
    x, w, bias, z = _operands(case, True)

    def at_page_end(a):
        buf = mmap.mmap(-1, (a.nbytes // 4096 + 2) * 4096)
        view = np.frombuffer(buf, np.float32)
        out = view[view.size - a.size:].reshape(a.shape)
        out[...] = a
        return out

    xe, ze = at_page_end(x), at_page_end(z)
    y = _run(case, xe, w, bias, ze, 1.0, -np.inf, np.inf, 1)
    np.testing.assert_allclose(y, _reference(x, w, bias, case, z), rtol=1e-5, atol=2e-5)


def test_which_shapes_take_it():
    """One group, 16 to MAX_PIXELS output pixels, channels filling MIN_FILL
    of their blocks, MIN_INTENSITY multiply-adds per transposed value (1x1:
    MIN_INTENSITY_1X1)."""
    a = _conv_blocked.applies
    assert a((1, 64, 14, 14), (64, 64, 3, 3), 1, (14, 14))
    assert a((4, 16, 16, 16), (16, 16, 3, 3), 1, (16, 16))           # 72 per value
    assert not a((1, 64, 14, 14), (64, 32, 3, 3), 2, (14, 14))       # grouped
    assert not a((1, 64, 3, 5), (64, 64, 3, 3), 1, (3, 5))           # 15 pixels
    assert not a((1, 64, 8, 8), (64, 64, 3, 3), 1, (3, 3))
    side = int(np.sqrt(_conv_blocked.MAX_PIXELS))
    assert a((1, 64, side, side), (64, 64, 3, 3), 1, (side, side))
    assert not a((1, 64, side + 1, side + 1), (64, 64, 3, 3), 1, (side + 1, side + 1))
    assert not a((1, 17, 7, 7), (64, 17, 3, 3), 1, (7, 7))           # 17 of 32 input lanes
    assert not a((1, 64, 7, 7), (20, 64, 3, 3), 1, (7, 7))           # 20 of 32 output lanes
    assert not a((1, 3, 64, 64), (16, 3, 7, 7), 1, (32, 32))         # an RGB stem
    assert not a((1, 64, 56, 56), (256, 64, 1, 1), 1, (56, 56))      # 1x1, 51 per value
    assert a((1, 128, 28, 28), (512, 128, 1, 1), 1, (28, 28))        # 1x1, 102 per value
    p = _conv_blocked.planes_fit
    assert p((1, 3, 224, 224), (64, 3, 7, 7), 1, (112, 112), (2, 2))
    assert not p((1, 3, 224, 224), (64, 3, 3, 3), 1, (224, 224), (1, 1))  # stride 1
    assert not p((1, 3, 224, 224), (24, 3, 3, 3), 1, (112, 112), (2, 2))  # 24 channels
    assert not p((1, 3, 64, 64), (16, 3, 7, 7), 1, (32, 32), (2, 2))      # one block
    assert not p((1, 16, 64, 64), (64, 16, 7, 7), 1, (32, 32), (2, 2))    # 16 channels
    assert not p((1, 1, 64, 64), (64, 1, 3, 3), 1, (32, 32), (2, 2))      # 9 values
    with pytest.raises(ValueError):
        _run((1, 16, 16, 3, 3, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
             *_operands((1, 16, 16, 3, 3, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)), False),
             1.0, -np.inf, np.inf, 1)


def _conv_model(case, act, residual):
    n, c, m, h, wd, k, s, d, p = case
    inits = [numpy_helper.from_array(RNG.standard_normal((m, c, *k)).astype(np.float32) * 0.1, "W"),
             numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=list(k),
                              strides=list(s), dilations=list(d), pads=list(p))]
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT, [n, c, h, wd])]
    feeds = {"x": RNG.standard_normal((n, c, h, wd)).astype(np.float32)}
    last = "c"
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TP.FLOAT, [n, m, *_out(case)]))
        feeds["r"] = RNG.standard_normal((n, m, *_out(case))).astype(np.float32)
        nodes.append(helper.make_node("Add", ["c", "r"], ["a"]))
        last = "a"
    nodes.append(helper.make_node(act, [last], ["y"]) if act else
                 helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(nodes, "conv", inputs,
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act,residual", [("", False), ("Relu", True), ("LeakyRelu", False)])
@pytest.mark.parametrize("case", [CASES[i] for i in (0, 2, 3, 5, 6)] + PLANE_CASES[:3])
def test_sessions_take_the_blocked_kernel_with_onnxruntimes_values(case, act, residual, threads):
    model, feeds = _conv_model(case, act, residual)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    opts = actorrt.SessionOptions(trace="ops", intra_op_num_threads=threads)
    with actorrt.InferenceSession(model, opts) as s:
        got = [s.run(None, feeds) for _ in range(2)]
        details = [sp.args.get("kernel_variant.conv", {}).get("reason", "")
                   for sp in s.session.tracer.spans if sp.cat == "op"]
    for g in got:
        np.testing.assert_allclose(g[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got[1][0], got[0][0])
    assert any("channel blocks" in str(d) for d in details), details


def test_sessions_without_it_give_the_same_values(monkeypatch):
    """ENABLED off: the direct kernel / GEMM paths, within float rounding of
    the blocked one."""
    model, feeds = _conv_model(CASES[0], "Relu", True)
    with actorrt.InferenceSession(model) as s:
        blocked = s.run(None, feeds)[0]
    monkeypatch.setattr(_conv_blocked, "ENABLED", False)
    with actorrt.InferenceSession(model) as s:
        other = s.run(None, feeds)[0]
    np.testing.assert_allclose(blocked, other, rtol=1e-5, atol=1e-5)
