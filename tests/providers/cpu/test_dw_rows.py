"""The row depthwise convolution (``_dw_rows``: NCHW rows of a zero-padded
plane, 16-output vectors) against onnxruntime: row widths under, at and
past 16 and 64 (masked vectors, the recomputed last vector, several calls a
row), kernel sizes, strides 1-3 down and 1-2 along the plane, asymmetric /
SAME pads, batches, bias absent or fed, a residual and the clamps (FusedConv
Relu / Clip / LeakyRelu), one and two threads (partners and the chunk loop);
which shapes take it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _conv_split, _dw_rows

from .test_conv_prepared import _feeds

RNG = np.random.default_rng(33)

pytestmark = pytest.mark.skipif(not _dw_rows.HAVE_KERNEL,
                                reason="no AVX-512 16-lane kernels on this host")

# (n, c, h, w, (kh, kw), strides, pads (t, l, b, r) or an auto_pad)
CASES = [
    (1, 8, 20, 80, (3, 3), (1, 1), (1, 1, 1, 1)),      # 80 = 64 + 16: two calls a row
    (2, 5, 12, 40, (3, 3), (1, 1), (1, 1, 1, 1)),      # 40: 3 vectors, the last recomputed
    (1, 6, 15, 33, (3, 3), (2, 2), (1, 1, 1, 1)),      # stride 2: 17 outputs
    (1, 4, 9, 16, (3, 3), (1, 1), (1, 1, 1, 1)),       # exactly 16
    (1, 3, 10, 12, (3, 3), (1, 1), (0, 0, 0, 0)),      # 10 outputs: masked
    (1, 4, 14, 70, (5, 5), (1, 2), (2, 2, 2, 2)),      # 5x5, column stride 2: 35 outputs
    (1, 3, 11, 67, (3, 1), (3, 1), (1, 0, 2, 0)),      # row stride 3, 3x1, 67 outputs
    (1, 2, 7, 130, (1, 3), (1, 1), (0, 1, 0, 1)),      # 1x3, 130 outputs: 64 + 64 + 2
    (1, 5, 13, 50, (7, 7), (2, 2), (3, 3, 3, 3)),
    (2, 3, 8, 36, (3, 3), (2, 2), "SAME_UPPER"),
    (1, 3, 9, 34, (2, 3), (1, 2), "SAME_LOWER"),
    (1, 4, 6, 48, (3, 3), (1, 1), (0, 2, 1, 0)),       # asymmetric pads
]


def _model(case, bias: str, act: str, residual: bool):
    n, c, h, w, k, s, pads = case
    attrs = {"kernel_shape": list(k), "strides": list(s), "group": c}
    if isinstance(pads, str):
        attrs["auto_pad"] = pads
    else:
        attrs["pads"] = list(pads)
    inits = [numpy_helper.from_array(RNG.standard_normal((c, 1, *k)).astype(np.float32), "W")]
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT, [n, c, h, w])]
    conv_in = ["x", "W"]
    if bias == "const":
        inits.append(numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32), "B"))
        conv_in.append("B")
    elif bias == "input":
        inputs.append(helper.make_tensor_value_info("B", TP.FLOAT, [c]))
        conv_in.append("B")
    nodes = [helper.make_node("Conv", conv_in, ["c"], **attrs)]
    last = "c"
    if residual:
        probe = helper.make_node("Conv", ["x", "W"], ["c"], **attrs)  # the output's shape
        ref = ort.InferenceSession(helper.make_model(helper.make_graph(
            [probe], "g", inputs[:1], [helper.make_tensor_value_info("c", TP.FLOAT, None)],
            inits[:1]), opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
            providers=["CPUExecutionProvider"])
        oshape = ref.run(None, {"x": np.zeros((n, c, h, w), np.float32)})[0].shape
        inputs.append(helper.make_tensor_value_info("z", TP.FLOAT, list(oshape)))
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        last = "s"
    if act == "Relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    elif act == "Clip":
        inits += [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    elif act == "LeakyRelu":
        nodes.append(helper.make_node("LeakyRelu", [last], ["y"], alpha=0.1))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _force(monkeypatch, mode):
    monkeypatch.setattr(_dw_rows, "ENABLED", True)
    monkeypatch.setattr(_dw_rows, "MIN_WIDTH", 1)
    monkeypatch.setattr(_dw_rows, "PREFER_WIDTH", 1)
    monkeypatch.setattr(_dw_rows, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(_conv_split, "ENABLED", mode == "partners")
    return 1 if mode == "one" else 2


def _run(model, feeds, threads):
    opts = actorrt.SessionOptions(trace="ops", intra_op_num_threads=threads)
    with actorrt.InferenceSession(model, opts) as s:
        got = [s.run(None, feeds)[0] for _ in range(3)]  # the later runs: the prepared call
        reasons = [(sp.args.get("kernel_variant.conv") or {}).get("reason", "")
                   for sp in s.session.tracer.spans if sp.cat == "op"]
    return got, reasons


@pytest.mark.parametrize("mode", ["one", "partners", "python"])
@pytest.mark.parametrize("case", CASES)
def test_row_depthwise_matches_onnxruntime(case, mode, monkeypatch):
    """Constant bias, Relu: onnxruntime's values; three runs equal."""
    threads = _force(monkeypatch, mode)
    model = _model(case, "const", "Relu", False)
    feeds = _feeds(model)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got, reasons = _run(model, feeds, threads)
    assert all("rows" in r for r in reasons if r), reasons
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], got[0])
    np.testing.assert_array_equal(got[2], got[0])


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("act", ["", "Clip", "LeakyRelu"])
@pytest.mark.parametrize("bias", ["none", "input"])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[4]])
def test_row_depthwise_epilogue(case, bias, act, residual, monkeypatch):
    """No bias / a fed bias, a residual, Clip / LeakyRelu / none: onnxruntime's
    values; one thread and the partners bit-equal."""
    model = _model(case, bias, act, residual)
    feeds = _feeds(model)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    one, _ = _run(model, feeds, _force(monkeypatch, "one"))
    two, _ = _run(model, feeds, _force(monkeypatch, "partners"))
    np.testing.assert_allclose(one[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(two[0], one[0])


def test_row_depthwise_posts_planes(monkeypatch):
    """Two threads with the partners: the planes go out as the row-depthwise job."""
    if not _conv_split.HAVE_SPLIT:
        pytest.skip("no compiled partner threads")
    from actorrt.providers.cpu import _partner
    seen = []
    real = _partner.run_items
    monkeypatch.setattr(_partner, "run_items",
                        lambda t, fn, p, items, chunks, linger=0:
                        seen.append((fn, items)) or real(t, fn, p, items, chunks, linger))
    case = CASES[0]
    model = _model(case, "const", "Relu", False)
    _run(model, _feeds(model), _force(monkeypatch, "partners"))
    assert seen and all(fn == _conv_split.ROWDW_ITEMS and items == case[0] * case[1]
                        for fn, items in seen)


def test_plane_range_writes_only_its_planes():
    """:func:`planes_range` over planes ``[1, 3)`` leaves the others'
    outputs untouched (rows under 16 outputs store masked vectors)."""
    x = RNG.standard_normal((1, 5, 9, 20)).astype(np.float32)
    w = RNG.standard_normal((5, 1, 3, 3)).astype(np.float32)
    plan = _dw_rows.make_plan(x.shape, (3, 3), (2, 2), (1, 1), (5, 10))
    y = np.full((1, 5, 5, 10), 7.0, np.float32)
    ints = [int(v) for v in plan.ints]
    bias = np.zeros(5, np.float32)
    yf = y.reshape(-1)
    _dw_rows.planes_range(x.reshape(-1), w.reshape(-1), bias, yf, 0, yf, *ints, np.float32(1),
                          np.float32(-np.inf), np.float32(np.inf), 1, 3)
    full = _dw_rows.run(plan, x, w, bias)
    np.testing.assert_array_equal(y[:, 1:3], full[:, 1:3])
    assert np.all(y[:, :1] == 7.0) and np.all(y[:, 3:] == 7.0)


def test_applies():
    """Depthwise (one channel per group, multiplier 1), dilations 1, column
    stride 1-2, output rows from MIN_WIDTH."""
    x, w = (1, 8, 40, 40), (8, 1, 3, 3)
    assert _dw_rows.applies(x, w, 8, (40, 40), (1, 1), (1, 1))
    assert _dw_rows.applies(x, w, 8, (20, 40), (2, 1), (1, 1))
    assert not _dw_rows.applies(x, w, 8, (40, 14), (1, 3), (1, 1))     # column stride 3
    assert not _dw_rows.applies(x, w, 8, (38, 38), (1, 1), (2, 2))     # dilated
    assert not _dw_rows.applies(x, (16, 1, 3, 3), 8, (40, 40), (1, 1), (1, 1))  # multiplier 2
    assert not _dw_rows.applies(x, (8, 8, 3, 3), 1, (40, 40), (1, 1), (1, 1))   # not depthwise
    assert not _dw_rows.applies(x, w, 8, (40, _dw_rows.MIN_WIDTH - 1), (1, 1), (1, 1))
