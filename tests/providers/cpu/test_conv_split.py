"""The direct convolution, depthwise convolution and direct MaxPool work
items on the compiled partner threads (``_conv_split``), on the Python chunk
loop (``_parallel.run_chunks``, the fallback) and on one thread, against
onnxruntime: odd sizes, strides, pads (asymmetric, SAME), dilations, groups,
depthwise channel multipliers, 1x1, a residual Z and the fused activations."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _conv_blocked, _conv_direct, _conv_numba, _conv_split, _dw_blocked, \
    _partner, _pool_direct, _pool_flat, _pool_rows

from .test_conv_compiled import CASES as CONV_CASES, WIDE_CASES, _model
from .test_pool_compiled import CASES as POOL_CASES

RNG = np.random.default_rng(2024)

MODES = ["partners", "python", "one"]

MORE_CONV_CASES = [  # (n, c, h, w, m, (kh, kw), strides, pads, dilations, group, auto_pad)
    (2, 16, 23, 19, 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None),
    (1, 24, 31, 33, 24, (3, 3), (2, 2), (0, 1, 1, 0), (1, 1), 24, None),    # depthwise, stride 2
    (1, 12, 17, 15, 36, (5, 5), (1, 2), (2, 2, 2, 2), (1, 1), 12, None),    # depthwise x3
    (2, 8, 13, 21, 16, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 8, None),      # depthwise x2, dilated
    (1, 32, 14, 14, 48, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, None),     # 1x1 in place
    (1, 16, 15, 15, 16, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, None),     # 1x1 strided
    (1, 12, 19, 17, 20, (3, 3), (2, 1), (1, 1, 1, 1), (1, 1), 4, None),     # groups
]


def _mode(mode, monkeypatch):
    """The intra-op thread count of ``mode``; the split forced at any size."""
    monkeypatch.setattr(_conv_split, "ENABLED", mode == "partners")
    monkeypatch.setattr(_conv_direct, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(_conv_numba, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(_conv_numba, "USE_NUMBA_POOL", False)
    monkeypatch.setattr(_pool_direct, "PARALLEL_MIN_WORK", 0)
    for name in ("MIN_CONV_FLOPS", "MIN_DEPTHWISE_WORK", "MIN_POOL_WORK"):
        monkeypatch.setattr(_conv_split, name, 0)
    return 1 if mode == "one" else 2


@pytest.fixture
def posted(monkeypatch):
    """The kernel addresses posted to :func:`._partner.run_items`."""
    seen = []
    real = _partner.run_items

    def spy(t, fn, params, items, chunks, linger=0):
        seen.append(fn)
        return real(t, fn, params, items, chunks, linger)

    monkeypatch.setattr(_partner, "run_items", spy)
    return seen


def _session_run(model, feeds, threads):
    opts = actorrt.SessionOptions(trace="ops", intra_op_num_threads=threads)
    with actorrt.InferenceSession(model, opts) as s:
        got = s.run(None, feeds)
        got2 = s.run(None, feeds)
        spans = [sp.args for sp in s.session.tracer.spans if sp.cat == "op"]
    return got[0], got2[0], spans


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CONV_CASES + WIDE_CASES + MORE_CONV_CASES)
def test_conv_split_matches_onnxruntime(case, mode, monkeypatch, posted):
    """Direct and depthwise convolutions with their items (and the direct
    kernel's phase copy) on the partners, the chunk loop or one thread."""
    if not _conv_direct.HAVE_KERNEL:
        pytest.skip("no numba / AVX2+FMA: the direct kernels are not built")
    threads = _mode(mode, monkeypatch)
    monkeypatch.setattr(_conv_direct, "MIN_REDUCTION", 1)  # the small cases on the kernel too
    model, x = _model(case)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got, got2, spans = _session_run(model, {"x": x}, threads)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got2, got)
    n, c, m, g = case[0], case[1], case[4], case[9]
    depthwise = g > 1 and c == g
    direct = any(a.get("kernel_variant.conv", {}).get("variant") == "direct" for a in spans)
    fns = set(posted)
    if mode != "partners" or not _conv_split.HAVE_SPLIT:
        assert not fns
    elif depthwise:
        oh, ow = want.shape[2:]
        if _dw_blocked.applies(x.shape, (m, 1, *case[5]), g, (oh, ow)):  # 16-channel blocks
            assert fns == ({_conv_split.DWB_ITEMS} if n * -(-c // 16) > 1 else set())
        else:
            assert fns == ({_conv_split.DW_ITEMS} if n * m > 1 else set())
    elif direct and _conv_blocked.applies(x.shape, (m, c // g, *case[5]), g, want.shape[2:]):
        assert fns <= {_conv_split.CB_IMAGES, _conv_split.CB_IN, _conv_split.CB_TILES}, fns
    elif direct:  # (one work item, as a 3x3 output in one tile: nothing to split)
        assert fns <= {_conv_split.CONV_ITEMS, _conv_split.COPY_ITEMS}
        if case in MORE_CONV_CASES:
            assert _conv_split.CONV_ITEMS in fns
            in_place = case[5] == (1, 1) and case[6] == (1, 1) and not any(case[7])
            assert (_conv_split.COPY_ITEMS in fns) != in_place


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["direct", "pointwise", "dw"])
@pytest.mark.parametrize("act,params", [("Relu", []), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.7]),
                                        ("", [])])
def test_fused_conv_split_with_residual(kind, act, params, mode, monkeypatch, posted):
    """FusedConv with bias, a residual Z and the activation in the store, the
    items on the partners, the chunk loop or one thread."""
    if not _conv_direct.HAVE_KERNEL:
        pytest.skip("no numba / AVX2+FMA: the direct kernels are not built")
    threads = _mode(mode, monkeypatch)
    n, c, h, w, m, k, group = 2, 8, 13, 11, 12, 3, 1
    if kind == "pointwise":
        k = 1
    elif kind == "dw":
        m, group = 16, 8
    attrs = {"kernel_shape": [k, k], "pads": [k // 2] * 4, "group": group}
    if act:
        attrs["activation"] = act
    if params:
        attrs["activation_params"] = params
    node = helper.make_node("FusedConv", ["x", "W", "B", "Z"], ["y"], domain="com.microsoft", **attrs)
    inits = [numpy_helper.from_array(RNG.standard_normal((m, c // group, k, k)).astype(np.float32), "W"),
             numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "B")]
    vis = [helper.make_tensor_value_info("x", TP.FLOAT, [n, c, h, w]),
           helper.make_tensor_value_info("Z", TP.FLOAT, [n, m, h, w])]
    feeds = {"x": RNG.standard_normal((n, c, h, w)).astype(np.float32),
             "Z": RNG.standard_normal((n, m, h, w)).astype(np.float32)}
    g = helper.make_graph([node], "fc", vis, [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)])
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got, got2, _ = _session_run(model, feeds, threads)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got2, got)
    if mode == "partners" and _conv_split.HAVE_SPLIT:
        assert (_conv_split.DW_ITEMS if kind == "dw" else _conv_split.CONV_ITEMS) in posted
    else:
        assert not posted


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,attrs", POOL_CASES + [
    ((2, 16, 57, 57), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 7, 33, 35), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
])
def test_maxpool_split_matches_onnxruntime(shape, attrs, mode, monkeypatch, posted):
    """The direct MaxPool's planes (copy and tiles) on the partners, the
    chunk loop or one thread: exactly onnxruntime's values."""
    if not _pool_direct.HAVE_KERNEL:
        pytest.skip("no numba / AVX2: the direct MaxPool is not built")
    threads = _mode(mode, monkeypatch)
    monkeypatch.setattr(_pool_direct, "ENABLED", True)
    monkeypatch.setattr(_pool_flat, "ENABLED", False)  # stride-1 pools: the direct kernel here
    monkeypatch.setattr(_pool_rows, "ENABLED", False)  # (and wide planes)
    monkeypatch.setattr(_dw_blocked, "ENABLED", False)  # (and mid-sized planes)
    monkeypatch.setattr(_pool_direct, "MAX_ELEMENTS", 1 << 62)
    x = RNG.standard_normal(shape).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    g = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", TP.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got, got2, spans = _session_run(model, {"x": x}, threads)
    assert any((a.get("kernel_variant.pool") or {}).get("variant") == "direct" for a in spans)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got2, got)
    planes = shape[0] * shape[1]
    if mode == "partners" and _conv_split.HAVE_SPLIT and planes > 1:
        assert set(posted) == {_conv_split.POOL_ITEMS}
    else:
        assert not posted


def test_split_needs_a_team(monkeypatch):
    """One thread, or the split switched off: every entry point declines
    (False, nothing written) and the callers keep their own paths."""
    x = np.ones((1, 2, 4, 4), np.float32)
    y = np.full((1, 2, 4, 4), 7.0, np.float32)
    b = np.zeros(2, np.float32)
    ep = np.array([1, -np.inf, np.inf], np.float32)
    w = np.ones((2, 1, 1, 1), np.float32)
    args = (x, w, b, np.zeros((1, 1, 1, 1), np.float32), y, (1, 1), (1, 1), (0, 0), ep, False, True)
    assert not _conv_split.depthwise(*args, 1)
    monkeypatch.setattr(_conv_split, "ENABLED", False)
    assert not _conv_split.depthwise(*args, 2)
    assert _conv_split.team_for(2) is None
    assert (y == 7).all()
    monkeypatch.setattr(_conv_split, "ENABLED", True)
    # float64 depthwise stays on the chunk loop
    args64 = tuple(a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in args)
    assert not _conv_split.depthwise(*args64, 2)
