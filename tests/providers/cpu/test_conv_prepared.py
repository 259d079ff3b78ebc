"""Conv / FusedConv through their per-shape prepared calls
(``conv.PREPARED_CALLS``: the shape work, packed weights and bias kept after
a shape's first call): the channel-blocked conv, the direct kernel, the
blocked depthwise conv and a stem, with the bias constant, fed as a graph
input (new values each run) or absent, with and without a residual; equal to
the full path bit for bit and to onnxruntime; a kernel switched off after
the prepared call was kept is honoured."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _conv_blocked, _conv_direct, _conv_prepared, _dw_blocked, conv

RNG = np.random.default_rng(21)

pytestmark = pytest.mark.skipif(not (_conv_blocked.HAVE_KERNEL and _conv_direct.HAVE_KERNEL),
                                reason="no AVX-512 16-lane kernels on this host")

CASES = {  # name: (x shape, W shape, attrs, the variant traced)
    "blocked": ((2, 16, 8, 8), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "direct"),
    "direct-1x1": ((1, 32, 14, 14), (48, 32, 1, 1), {}, "direct"),
    "depthwise": ((1, 32, 14, 14), (32, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 32},
                  "depthwise"),
    "stem": ((1, 3, 32, 32), (32, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}, "direct"),
}


def _model(case: str, bias: str, residual: bool):
    """Conv [+ Add(z)] + Relu (the optimizer makes it a FusedConv); ``bias``
    ``"const"``, ``"input"`` or ``"none"``."""
    xs, ws, attrs, _ = CASES[case]
    m = ws[0]
    inits = [numpy_helper.from_array(RNG.standard_normal(ws).astype(np.float32) * 0.2, "W")]
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT, xs)]
    conv_in = ["x", "W"]
    if bias == "const":
        inits.append(numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "B"))
        conv_in.append("B")
    elif bias == "input":
        inputs.append(helper.make_tensor_value_info("B", TP.FLOAT, [m]))
        conv_in.append("B")
    nodes = [helper.make_node("Conv", conv_in, ["c"], kernel_shape=list(ws[2:]), **attrs)]
    last = "c"
    if residual:
        oh = (xs[2] + sum(attrs.get("pads", [0, 0, 0, 0])[::2]) - ws[2]) // \
            attrs.get("strides", [1, 1])[0] + 1
        ow = (xs[3] + sum(attrs.get("pads", [0, 0, 0, 0])[1::2]) - ws[3]) // \
            attrs.get("strides", [1, 1])[1] + 1
        inputs.append(helper.make_tensor_value_info("z", TP.FLOAT, [xs[0], m, oh, ow]))
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        last = "s"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(model):
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = RNG.standard_normal(shape).astype(np.float32)
    return out


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("bias", ["const", "input", "none"])
@pytest.mark.parametrize("case", list(CASES))
def test_prepared_call_equals_the_full_path(case, bias, residual, monkeypatch):
    """Four runs with new inputs (and new bias values when fed): runs 2-4 go
    through the prepared call, equal to a session with prepared calls off bit
    for bit, and to onnxruntime."""
    model = _model(case, bias, residual)
    calls = []
    real = _conv_prepared.Prepared.call

    def spy(self, x, b, z):
        y = real(self, x, b, z)
        calls.append(y is not None)
        consts.append(b is not None and b is self.b_const and self.bt_const is not None)
        return y

    consts = []

    monkeypatch.setattr(_conv_prepared.Prepared, "call", spy)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    opts = actorrt.SessionOptions(trace="ops")
    with actorrt.InferenceSession(model, opts) as on, actorrt.InferenceSession(model) as off:
        for _ in range(4):
            feeds = _feeds(model)
            got = on.run(None, feeds)[0]
            monkeypatch.setattr(conv, "PREPARED_CALLS", False)
            full = off.run(None, feeds)[0]
            monkeypatch.setattr(conv, "PREPARED_CALLS", True)
            np.testing.assert_array_equal(got, full)
            np.testing.assert_allclose(got, ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
        variants = [(sp.args.get("kernel_variant.conv") or {}).get("variant")
                    for sp in on.session.tracer.spans if sp.cat == "op"]
    assert calls.count(True) == 3  # every run after the first
    assert all(consts) if bias == "const" else not any(consts)  # the constant bias kept packed
    assert variants.count(CASES[case][3]) == 4


@pytest.mark.parametrize("case,module", [("blocked", _conv_blocked), ("direct-1x1", _conv_direct),
                                         ("depthwise", _dw_blocked)])
def test_switch_off_after_the_prepared_call(case, module, monkeypatch):
    """A kernel switched off once its prepared call was kept: the next run
    takes another path (still onnxruntime's values)."""
    model = _model(case, "const", False)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with actorrt.InferenceSession(model, actorrt.SessionOptions(trace="ops")) as s:
        for _ in range(2):
            feeds = _feeds(model)
            s.run(None, feeds)
        monkeypatch.setattr(module, "ENABLED", False)
        feeds = _feeds(model)
        got = s.run(None, feeds)[0]
        spans = [sp.args for sp in s.session.tracer.spans if sp.cat == "op"]
    np.testing.assert_allclose(got, ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    last = (spans[-1].get("kernel_variant.conv") or {})
    if module is _conv_blocked:
        assert "channel blocks" not in last.get("reason", "")
    elif module is _conv_direct:
        assert last.get("variant") != "direct"
    else:
        assert "channel blocks" not in last.get("reason", "")


@pytest.mark.parametrize("batch", [4, 1])
def test_kept_partner_blocks_across_calls(batch, monkeypatch):
    """The channel-blocked conv's partner split at two threads (batch 4: whole
    images; 1: input blocks, then tiles) with its parameter blocks kept
    across calls (the per-call slots rewritten): new inputs, fed bias and
    residual each run give one thread's values bit for bit."""
    from actorrt.providers.cpu import _conv_split
    if not _conv_split.HAVE_SPLIT:
        pytest.skip("no compiled partner threads")
    monkeypatch.setattr(_conv_split, "MIN_CONV_FLOPS", 0)
    CASES["batch4"] = ((batch, 16, 8, 8), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "direct")
    try:
        model = _model("batch4", "input", True)
    finally:
        del CASES["batch4"]
    posted = []
    from actorrt.providers.cpu import _partner
    real = _partner.run_items
    monkeypatch.setattr(_partner, "run_items", lambda t, fn, p, items, chunks, linger=0:
                        posted.append(fn) or real(t, fn, p, items, chunks, linger))
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=2)) as two, \
            actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=1)) as one:
        for _ in range(4):
            feeds = _feeds(model)
            got = two.run(None, feeds)[0]
            np.testing.assert_array_equal(got, one.run(None, feeds)[0])
            np.testing.assert_allclose(got, ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    if batch == 4:
        assert posted.count(_conv_split.CB_IMAGES) == 4
    else:
        assert posted.count(_conv_split.CB_IN) == posted.count(_conv_split.CB_TILES) == 4
