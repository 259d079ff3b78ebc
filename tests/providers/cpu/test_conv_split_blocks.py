"""The template parameter blocks of ``_conv_split`` (``SPLIT_BLOCKS``) and the
pooled phase-split buffers of ``_conv_direct`` (``REUSE_BUFFERS``): a plan's
block and buffer reused across calls with different input arrays give the
same bits as the per-call blocks (``SPLIT_BLOCKS`` off), as one thread, and
onnxruntime's values: odd sizes, groups, strides, pads, dilations, depthwise,
1x1 in place, a residual Z, MaxPool."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _conv_direct, _conv_numba, _conv_split, _dw_blocked, _pool_direct, \
    _pool_flat, _pool_rows

from .test_conv_compiled import _model
from .test_conv_split import MORE_CONV_CASES

RNG = np.random.default_rng(77)

needs_split = pytest.mark.skipif(not _conv_split.HAVE_SPLIT,
                                 reason="no compiled partners / direct kernels")


def _force_split(monkeypatch):
    """The split at any size (the thresholds 0); depthwise convs on the plane
    kernel, whose template blocks these tests check (the channel-blocked
    kernel posts a per-call block: tests/providers/cpu/test_dw_blocked.py)."""
    monkeypatch.setattr(_dw_blocked, "ENABLED", False)
    monkeypatch.setattr(_conv_direct, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(_conv_direct, "MIN_REDUCTION", 1)
    monkeypatch.setattr(_conv_numba, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(_conv_numba, "USE_NUMBA_POOL", False)
    monkeypatch.setattr(_pool_direct, "PARALLEL_MIN_WORK", 0)
    for name in ("MIN_CONV_FLOPS", "MIN_DEPTHWISE_WORK", "MIN_POOL_WORK"):
        monkeypatch.setattr(_conv_split, name, 0)


def _runs(model, feeds_list, threads, blocks, monkeypatch):
    """Outputs of one session over several feeds (its plans, blocks and
    buffers reused from the second feed on)."""
    monkeypatch.setattr(_conv_split, "SPLIT_BLOCKS", blocks)
    monkeypatch.setattr(_conv_direct, "REUSE_BUFFERS", blocks)
    opts = actorrt.SessionOptions(intra_op_num_threads=threads)
    with actorrt.InferenceSession(model, opts) as s:
        return [s.run(None, f)[0] for f in feeds_list]


def _check(model, feeds_list, monkeypatch, tol):
    raw = model.SerializeToString()
    o = ort.InferenceSession(raw, providers=["CPUExecutionProvider"])
    want = [o.run(None, f)[0] for f in feeds_list]
    posted = []
    real = _conv_split._run_addr

    def spy(team, fn, addr, items, threads):
        posted.append(addr)
        return real(team, fn, addr, items, threads)

    monkeypatch.setattr(_conv_split, "_run_addr", spy)
    new = _runs(model, feeds_list, 2, True, monkeypatch)
    assert posted  # the template blocks went to the partners
    monkeypatch.setattr(_conv_split, "_run_addr", real)
    old = _runs(model, feeds_list, 2, False, monkeypatch)
    one = _runs(model, feeds_list, 1, True, monkeypatch)
    for a, b, c, w in zip(new, old, one, want):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_allclose(a, w, rtol=tol, atol=tol)
    # different inputs: different outputs (a stale block would repeat one)
    assert not np.array_equal(new[0], new[1])


@needs_split
@pytest.mark.parametrize("case", MORE_CONV_CASES + [
    (3, 5, 9, 27, 7, (3, 2), (2, 3), (1, 0, 2, 1), (2, 1), 1, None),    # odd everything
    (2, 6, 11, 10, 9, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 3, "SAME_UPPER"),
])
def test_conv_blocks_reused_match(case, monkeypatch):
    """Direct / depthwise convolutions over three inputs through one session:
    bit-equal to the per-call blocks and one thread, close to onnxruntime."""
    _force_split(monkeypatch)
    model, x = _model(case)
    feeds = [{"x": x}] + [{"x": RNG.standard_normal(x.shape).astype(np.float32)} for _ in range(2)]
    _check(model, feeds, monkeypatch, 1e-4)


@needs_split
@pytest.mark.parametrize("kind", ["direct", "pointwise", "dw"])
def test_fused_conv_blocks_with_new_residuals(kind, monkeypatch):
    """FusedConv (bias, Clip) with a fresh residual Z each call: the template's
    per-call slots follow Z and x."""
    _force_split(monkeypatch)
    n, c, h, w, m, k, group = 2, 8, 13, 11, 12, 3, 1
    if kind == "pointwise":
        k = 1
    elif kind == "dw":
        m, group = 16, 8
    node = helper.make_node("FusedConv", ["x", "W", "B", "Z"], ["y"], domain="com.microsoft",
                            kernel_shape=[k, k], pads=[k // 2] * 4, group=group,
                            activation="Clip", activation_params=[-0.5, 0.7])
    inits = [numpy_helper.from_array(RNG.standard_normal((m, c // group, k, k)).astype(np.float32), "W"),
             numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "B")]
    vis = [helper.make_tensor_value_info("x", TP.FLOAT, [n, c, h, w]),
           helper.make_tensor_value_info("Z", TP.FLOAT, [n, m, h, w])]
    g = helper.make_graph([node], "fc", vis, [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)])
    feeds = [{"x": RNG.standard_normal((n, c, h, w)).astype(np.float32),
              "Z": RNG.standard_normal((n, m, h, w)).astype(np.float32)} for _ in range(3)]
    _check(model, feeds, monkeypatch, 1e-5)


@needs_split
@pytest.mark.parametrize("shape,attrs", [
    ((2, 16, 57, 57), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 7, 33, 35), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((3, 5, 20, 17), {"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [2, 1]}),
])
def test_maxpool_blocks_reused_match(shape, attrs, monkeypatch):
    """The direct MaxPool over three inputs through one session: exactly
    onnxruntime's values whichever block path."""
    _force_split(monkeypatch)
    monkeypatch.setattr(_pool_direct, "ENABLED", True)
    monkeypatch.setattr(_pool_flat, "ENABLED", False)  # stride-1 pools: the direct kernel here
    monkeypatch.setattr(_pool_rows, "ENABLED", False)  # (and wide planes)
    monkeypatch.setattr(_pool_direct, "MAX_ELEMENTS", 1 << 62)
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    g = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", TP.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    feeds = [{"x": RNG.standard_normal(shape).astype(np.float32)} for _ in range(3)]
    _check(model, feeds, monkeypatch, 0)


def _direct_case():
    n, c, h, w, m = 2, 12, 17, 19, 20
    x_shape, wpack_shape = (n, c, h, w), (1, m, c * 9)
    plan = _conv_direct.make_plan(x_shape, wpack_shape, 1, (3, 3), (1, 1), (1, 1), (1, 1), (h, w))
    wpack = RNG.standard_normal(wpack_shape).astype(np.float32)
    wp = _conv_direct.pack_weights(wpack, w, plan.mr)
    bias = RNG.standard_normal(m).astype(np.float32)
    return plan, wpack, wp, bias


@needs_split
def test_plan_keeps_one_block_and_buffer(monkeypatch):
    """Sequential calls of one plan take the same template copy and the same
    phase-split buffer back from the plan's free lists, and each call's result
    is the one-thread result of its own input."""
    _force_split(monkeypatch)
    monkeypatch.setattr(_conv_direct, "current_threads", lambda: 2)
    plan, wpack, wp, bias = _direct_case()
    seen_blocks, seen_bufs = set(), set()
    for _ in range(3):
        x = RNG.standard_normal(plan.key[0]).astype(np.float32)
        got = _conv_direct.run(plan, x, wp, bias, None, 1.0, -np.inf, np.inf)
        seen_blocks.add(id(plan.blocks["conv"][1][0]))
        seen_bufs.add(id(plan.bufs[0]))
        assert len(plan.blocks["conv"][1]) == 1 and len(plan.bufs) == 1
        monkeypatch.setattr(_conv_split, "ENABLED", False)
        monkeypatch.setattr(_conv_direct, "current_threads", lambda: 1)
        want = _conv_direct.run(plan, x, wp, bias, None, 1.0, -np.inf, np.inf)
        monkeypatch.setattr(_conv_split, "ENABLED", True)
        monkeypatch.setattr(_conv_direct, "current_threads", lambda: 2)
        np.testing.assert_array_equal(got, want)
    assert len(seen_blocks) == 1 and len(seen_bufs) == 1


@needs_split
def test_plan_shared_by_concurrent_callers(monkeypatch):
    """Two threads running one plan at once (each with its partner team) each
    take their own block and buffer: every result is its input's."""
    _force_split(monkeypatch)
    plan, wpack, wp, bias = _direct_case()
    xs = [RNG.standard_normal(plan.key[0]).astype(np.float32) for _ in range(8)]
    monkeypatch.setattr(_conv_split, "ENABLED", False)
    monkeypatch.setattr(_conv_direct, "current_threads", lambda: 1)
    want = [_conv_direct.run(plan, x, wp, bias, None, 1.0, -np.inf, np.inf) for x in xs]
    monkeypatch.setattr(_conv_split, "ENABLED", True)
    monkeypatch.setattr(_conv_direct, "current_threads", lambda: 2)
    got = [[None] * len(xs) for _ in range(2)]

    def work(k):
        for _ in range(5):
            for i, x in enumerate(xs):
                got[k][i] = _conv_direct.run(plan, x, wp, bias, None, 1.0, -np.inf, np.inf)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for k in range(2):
        for g_, w_ in zip(got[k], want):
            np.testing.assert_array_equal(g_, w_)
