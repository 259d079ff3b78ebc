"""Convolution kernels against the ONNX reference evaluator and onnxruntime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import actorrt
from tests.oracle import (assert_close, check_model, check_node, run_actorrt, run_onnxruntime)

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def const_model(op, x, consts, outputs=("y",), opset=22, **attrs):
    """One-node model: ``x`` a graph input, ``consts`` (name -> array, None to omit)
    initializers, so the kernel's prepare() sees them as constants."""
    names = ["x"] + [n if v is not None else "" for n, v in consts.items()]
    node = helper.make_node(op, names, list(outputs), **attrs)
    inits = [numpy_helper.from_array(v, n) for n, v in consts.items() if v is not None]
    vi = helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    g = helper.make_graph([node], op, [vi], outs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


# ------------------------------------------------------------------------- Conv
CONV_CASES = [
    # x shape, w shape, attrs
    ((1, 3, 9, 9), (4, 3, 3, 3), {}),
    ((2, 3, 9, 8), (4, 3, 3, 2), {"pads": [1, 0, 2, 1], "strides": [2, 1]}),
    ((1, 4, 10, 10), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1], "pads": [1, 1, 1, 1]}),
    ((2, 4, 8, 8), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),  # depthwise
    ((1, 4, 8, 8), (8, 1, 3, 3), {"group": 4, "strides": [2, 2]}),  # depthwise x2
    ((1, 3, 7, 7), (5, 3, 1, 1), {}),  # 1x1
    ((1, 4, 7, 7), (6, 2, 1, 1), {"group": 2, "strides": [2, 2]}),  # 1x1 strided grouped
    ((1, 3, 7, 8), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 7, 8), (4, 3, 4, 4), {"auto_pad": "SAME_LOWER"}),
    ((1, 3, 7, 8), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 3]}),
    ((2, 3, 11), (4, 3, 3), {"pads": [2, 1], "dilations": [2]}),  # 1-D
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"strides": [1, 2, 1], "pads": [0, 1, 1, 1, 0, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
def test_conv_matches_reference(xs, ws, attrs):
    check_node("Conv", {"x": rand(*xs), "w": rand(*ws), "b": rand(ws[0])}, opset=22, **attrs)


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES[:8])
def test_conv_prepacked_constant_weight_matches_ort(xs, ws, attrs):
    x = rand(*xs)
    model = const_model("Conv", x, {"w": rand(*ws), "b": rand(ws[0])}, opset=11, **attrs)
    check_model(model, {"x": x}, peer="ort")


def test_conv_without_bias_and_double():
    check_node("Conv", {"x": rand(1, 2, 6, 6, dtype=np.float64),
                        "w": rand(3, 2, 3, 3, dtype=np.float64)}, kernel_shape=[3, 3])


def test_conv_float16_accumulates_in_float32():
    x, w = rand(1, 8, 6, 6, dtype=np.float16), rand(4, 8, 3, 3, dtype=np.float16)
    got = run_actorrt(const_model("Conv", x, {"w": w}), {"x": x})[0]
    want = run_onnxruntime(const_model("Conv", x.astype(np.float32),
                                       {"w": w.astype(np.float32)}), {"x": x.astype(np.float32)})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want[0], rtol=1e-2, atol=1e-2)


async def test_conv_records_kernel_variant():
    x = rand(1, 4, 8, 8)
    model = const_model("Conv", x, {"w": rand(4, 1, 3, 3)}, group=4)
    async with actorrt.open_session(model, options=actorrt.SessionOptions(trace="ops")) as s:
        await s.run(None, {"x": x})
        (span,) = s.tracer.spans
    assert span.args["kernel_variant.conv"]["variant"] == "depthwise"


# ---------------------------------------------------------------- ConvTranspose
CT_CASES = [
    ((1, 2, 3, 3), (2, 3, 3, 3), {}),
    ((2, 2, 4, 3), (2, 2, 3, 2), {"strides": [2, 3], "pads": [1, 0, 0, 1]}),
    ((1, 4, 3, 3), (4, 2, 3, 3), {"group": 2, "strides": [2, 2], "output_padding": [1, 0]}),
    ((1, 1, 3, 3), (1, 2, 2, 2), {"dilations": [2, 2]}),
    ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 1, 3, 4), (1, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 5), (2, 3, 3), {"strides": [2]}),
    ((1, 2, 3, 4, 2), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CT_CASES)
def test_convtranspose_matches_reference(xs, ws, attrs):
    # the reference evaluator mishandles group > 1 with several outputs per group
    peer, opset = ("ort", 11) if attrs.get("group", 1) > 1 else ("reference", 22)
    check_node("ConvTranspose", {"x": rand(*xs), "w": rand(*ws),
                                 "b": rand(ws[1] * attrs.get("group", 1))}, opset=opset,
               peer=peer, **attrs)


@pytest.mark.parametrize("xs,ws,attrs", CT_CASES[:4])
def test_convtranspose_prepacked_matches_ort(xs, ws, attrs):
    x = rand(*xs)
    model = const_model("ConvTranspose", x, {"w": rand(*ws)}, opset=11, **attrs)
    check_model(model, {"x": x}, peer="ort")


@pytest.mark.parametrize("output_shape", [[5, 6], [6, 5]])
def test_convtranspose_output_shape_crops_like_ort(output_shape):
    # natural size 7x7: the spec's pads put the odd crop at the beginning
    check_node("ConvTranspose", {"x": rand(1, 2, 3, 3), "w": rand(2, 1, 3, 3)}, opset=11,
               peer="ort", strides=[2, 2], output_shape=output_shape)


# ------------------------------------------------------- integer convolutions
def test_convinteger_per_channel_zero_point():
    x = RNG.integers(0, 255, (1, 3, 6, 6), dtype=np.uint8)
    w = RNG.integers(0, 255, (4, 3, 3, 3), dtype=np.uint8)
    check_node("ConvInteger", {"x": x, "w": w, "xz": np.array(7, np.uint8),
                               "wz": np.array([1, 2, 3, 4], np.uint8)},
               opset=10, pads=[1, 1, 1, 1])


def test_convinteger_int8_constant_weight_matches_ort():
    x = RNG.integers(-128, 127, (1, 2, 5, 5), dtype=np.int8)
    w = RNG.integers(-128, 127, (3, 2, 2, 2), dtype=np.int8)
    model = const_model("ConvInteger", x, {"w": w, "xz": np.array(-3, np.int8)}, opset=10,
                        strides=[2, 2])
    check_model(model, {"x": x}, peer="ort")


@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinearconv_matches_ort(per_channel):
    x = RNG.integers(0, 255, (1, 4, 7, 7), dtype=np.uint8)
    w = RNG.integers(-127, 127, (6, 2, 3, 3), dtype=np.int8)
    ws = (np.array([0.01, 0.02, 0.03, 0.01, 0.02, 0.05], np.float32) if per_channel
          else np.array(0.02, np.float32))
    wz = np.zeros(6, np.int8) if per_channel else np.array(0, np.int8)
    inputs = {"x": x, "xs": np.array(0.05, np.float32), "xz": np.array(128, np.uint8),
              "w": w, "ws": ws, "wz": wz, "ys": np.array(0.3, np.float32),
              "yz": np.array(100, np.uint8), "b": RNG.integers(-500, 500, 6).astype(np.int32)}
    # onnxruntime's u8s8 GEMM saturates int16 pairs on AVX2, so the reference is the peer
    check_node("QLinearConv", inputs, opset=10, group=2, pads=[1, 1, 1, 1])


def test_qlinearconv_uint8_weights_match_ort():
    x = RNG.integers(0, 255, (1, 3, 6, 6), dtype=np.uint8)
    w = RNG.integers(0, 255, (4, 3, 3, 3), dtype=np.uint8)
    inputs = {"x": x, "xs": np.array(0.02, np.float32), "xz": np.array(120, np.uint8),
              "w": w, "ws": np.array(0.01, np.float32), "wz": np.array(130, np.uint8),
              "ys": np.array(0.5, np.float32), "yz": np.array(90, np.uint8)}
    check_node("QLinearConv", inputs, opset=10, strides=[2, 2], peer="ort")


# ---------------------------------------------------------------- DeformConv
@pytest.mark.parametrize("attrs,with_mask", [({}, True), ({"group": 2, "offset_group": 2,
                                                           "pads": [1, 1, 1, 1]}, False),
                                              ({"strides": [2, 1], "dilations": [1, 2]}, True)])
def test_deform_conv_matches_reference(attrs, with_mask):
    x = rand(1, 4, 5, 6)
    w = rand(4, 4 // attrs.get("group", 1), 2, 2)
    og = attrs.get("offset_group", 1)
    pads = attrs.get("pads", [0, 0, 0, 0])
    s, d = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    oh = (5 + pads[0] + pads[2] - (d[0] + 1)) // s[0] + 1
    ow = (6 + pads[1] + pads[3] - (d[1] + 1)) // s[1] + 1
    inputs = {"x": x, "w": w, "offset": rand(1, og * 8, oh, ow), "b": rand(4),
              "mask": RNG.random((1, og * 4, oh, ow)).astype(np.float32) if with_mask else None}
    check_node("DeformConv", inputs, opset=22, kernel_shape=[2, 2], **attrs)


# ------------------------------------------------------ CausalConvWithState
@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("with_state", [False, True])
def test_causal_conv_with_state_matches_reference(activation, with_state):
    b, c, length, k = 2, 3, 5, 4
    inputs = {"x": rand(b, c, length), "w": rand(c, 1, k), "bias": rand(c),
              "past": rand(b, c, k - 1) if with_state else None}
    check_node("CausalConvWithState", inputs, ("y", "state"), opset=27, activation=activation)


# ------------------------------------------------------------------- Col2Im
@pytest.mark.parametrize("image,block,attrs", [
    ([5, 5], [2, 2], {}),
    ([6, 5], [3, 2], {"strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2]}),
    ([3, 4, 3], [2, 2, 1], {}),
])
def test_col2im_matches_reference(image, block, attrs):
    import math
    nd = len(image)
    s = attrs.get("strides", [1] * nd)
    d = attrs.get("dilations", [1] * nd)
    p = attrs.get("pads", [0] * 2 * nd)
    L = math.prod((image[i] + p[i] + p[i + nd] - d[i] * (block[i] - 1) - 1) // s[i] + 1
                  for i in range(nd))
    check_node("Col2Im", {"x": rand(2, 3 * math.prod(block), L),
                          "image": np.array(image, np.int64),
                          "block": np.array(block, np.int64)}, opset=18, **attrs)


# ---------------------------------------------------------------- small CNN
def test_small_cnn_matches_onnxruntime():
    w1, b1 = rand(8, 3, 3, 3) * 0.3, rand(8)
    w2, b2 = rand(4, 8, 3, 3) * 0.3, rand(4)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["y"], strides=[2, 2])]
    inits = [numpy_helper.from_array(v, n) for n, v in
             {"w1": w1, "b1": b1, "w2": w2, "b2": b2}.items()]
    g = helper.make_graph(nodes, "cnn",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4, 3, 3])],
                          initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    x = rand(2, 3, 16, 16)
    got = run_actorrt(model, {"x": x})
    assert_close(got, run_onnxruntime(model, {"x": x}), rtol=1e-4, atol=1e-4)
    assert got[0].shape == (2, 4, 3, 3)


async def test_constant_conv_weight_is_prepacked_once_for_three_input_shapes():
    """A prepacked Conv weight is computed once however many input shapes run."""
    import onnx
    from onnx import TensorProto as TP, helper, numpy_helper

    import actorrt

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "c",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    calls = []
    from actorrt.providers.cpu import CPU_KERNELS
    kernel_cls = CPU_KERNELS.lookup("", "Conv", 17)
    orig = kernel_cls.prepare

    def counting(self, constants, shared):
        calls.append(1)
        return orig(self, constants, shared)

    kernel_cls.prepare = counting
    try:
        async with actorrt.open_session(m) as s:
            for shape in ((1, 3, 8, 8), (2, 3, 5, 7), (1, 3, 16, 4)):
                x = rng.standard_normal(shape).astype(np.float32)
                (y,) = await s.run(None, {"x": x})
                want = run_onnxruntime(m, {"x": x})[0]
                np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    finally:
        kernel_cls.prepare = orig
    assert calls == [1]


async def test_im2col_scratch_is_handed_over_by_the_executor_exactly(monkeypatch):
    """Conv asks for exact workspace (padded input + patch matrix); the executor
    hands it over from the provider's arena, accounted as ``workspace``. (The
    direct kernel, which asks for none, is off here; on, the request is empty.)"""
    from onnx import TensorProto as TP, helper, numpy_helper

    import actorrt
    from actorrt.providers.cpu import _conv_direct

    monkeypatch.setattr(_conv_direct, "ENABLED", False)

    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "c",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    async with actorrt.open_session(m, options=actorrt.SessionOptions(workers=1)) as s:
        (step,) = s.plan.steps
        reqs = step.kernel.workspace([(2, 3, 10, 12), w.shape])
        # padded input (2, 3, 12, 14) and the patch matrix (2 images, 27 x 120) in float32
        assert [r.nbytes for r in reqs] == [2 * 3 * 12 * 14 * 4, 2 * 27 * 120 * 4]
        x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
        (y,) = await s.run(None, {"x": x})
        np.testing.assert_allclose(y, run_onnxruntime(m, {"x": x})[0], rtol=1e-4, atol=1e-5)
        mem = s._providers[0].statistics().memory
        assert mem.live_by_role["workspace"] == sum(r.nbytes + r.alignment for r in reqs)
        # a smaller input reuses the arena: nothing new is reserved
        await s.run(None, {"x": x[:1, :, :5, :6]})
        assert s._providers[0].statistics().memory.live_by_role["workspace"] == \
            mem.live_by_role["workspace"]
    assert s._providers[0].statistics().memory.live_by_role["workspace"] == 0
    if _conv_direct.HAVE_KERNEL:
        monkeypatch.setattr(_conv_direct, "ENABLED", True)
        monkeypatch.setattr(_conv_direct, "MIN_REDUCTION", 1)
        async with actorrt.open_session(m, options=actorrt.SessionOptions(workers=1)) as s:
            (step,) = s.plan.steps
            assert step.kernel.workspace([(2, 3, 10, 12), w.shape]) == []
            (y,) = await s.run(None, {"x": x})
            np.testing.assert_allclose(y, run_onnxruntime(m, {"x": x})[0], rtol=1e-4, atol=1e-5)
