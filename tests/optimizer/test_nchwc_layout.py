"""The NCHWc layout pass (:func:`actorrt.optimizer.layout.nchwc_layout`, level 99):
chains of convolutions, pools and channel Concats run on 16-channel blocks, their
outputs equal onnxruntime's on the unoptimized model (random shapes: odd channel
counts, strides, pads, dilations, auto_pad, residuals, activations, stems, batches,
one and two threads), lone convolutions and the extended level stay NCHW."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import nchwc

pytestmark = pytest.mark.skipif(not nchwc.available(), reason="no NCHWc kernels (AVX-512)")

RNG = np.random.default_rng(7)


def _w(name, shape, scale=None):
    fan = int(np.prod(shape[1:]))
    w = (RNG.standard_normal(shape) * (scale or 1.0 / np.sqrt(fan))).astype(np.float32)
    return numpy_helper.from_array(w, name)


def _b(name, m):
    return numpy_helper.from_array((RNG.standard_normal(m) * 0.1).astype(np.float32), name)


def _model(nodes, x_shape, inits, outputs=("y",)):
    g = helper.make_graph(nodes, "n", [helper.make_tensor_value_info("x", TP.FLOAT, x_shape)],
                          [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _want(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _ours(model, feeds, threads=1, level="ORT_ENABLE_ALL"):
    opts = actorrt.SessionOptions(graph_optimization_level=level, intra_op_num_threads=threads)
    with actorrt.InferenceSession(model, opts) as s:
        got = s.run(None, feeds)
        again = s.run(None, feeds)  # the kept calls give the same bits
        for a, b in zip(got, again):
            np.testing.assert_array_equal(a, b)
        return got, [st.node.op_type for st in s.session.plan.steps]


def _close(got, want):
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(w).max()))


def _conv(x, w, y, b=None, **kw):
    return helper.make_node("Conv", [x, w] + ([b] if b else []), [y], **kw)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,c,m,h,w,conv_kw", [
    (1, 32, 48, 14, 14, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    (2, 24, 40, 9, 11, dict(kernel_shape=[3, 3], pads=[1, 2, 0, 1], strides=[2, 1])),
    (1, 28, 37, 13, 17, dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2])),
    (3, 64, 16, 8, 8, dict(kernel_shape=[1, 1], strides=[2, 2])),
    (1, 48, 64, 10, 9, dict(kernel_shape=[5, 5], auto_pad="SAME_UPPER")),
    (1, 16, 32, 6, 7, dict(kernel_shape=[2, 2], auto_pad="VALID")),
])
def test_conv_chains_equal_onnxruntime(threads, n, c, m, h, w, conv_kw):
    # conv -> relu -> conv (+ residual of the first) -> relu -> conv -> clip
    nodes = [_conv("x", "w1", "a", "b1", kernel_shape=[1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]),
             _conv("ar", "w2", "c", "b2", **conv_kw),
             helper.make_node("LeakyRelu", ["c"], ["cr"], alpha=0.2),
             _conv("cr", "w3", "d", None, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["d", "lo", "hi"], ["y"])]
    model0 = _model(nodes, [n, c, h, w], [_w("w1", (c, c, 1, 1)), _b("b1", c),
                                         _w("w2", (m, c) + tuple(conv_kw["kernel_shape"])),
                                         _b("b2", m), _w("w3", (m, m, 3, 3)),
                                         numpy_helper.from_array(np.float32(-0.5), "lo"),
                                         numpy_helper.from_array(np.float32(0.7), "hi")])
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    got, ops = _ours(model0, {"x": x}, threads)
    assert ops.count("NchwcConv") == 3 and ops[0] == "ReorderInput" and ops[-1] == "ReorderOutput"
    _close(got, _want(model0, {"x": x}))
    got2, ops2 = _ours(model0, {"x": x}, threads, level="ORT_ENABLE_EXTENDED")
    assert "NchwcConv" not in ops2
    _close(got, got2)


@pytest.mark.parametrize("threads", [1, 2])
def test_residual_stem_depthwise_and_graph_outputs(threads):
    # an RGB stem (NCHW planes in), a depthwise conv, a residual Add + Relu,
    # a blocked value that is also a graph output and read by a non-blocked op
    nodes = [_conv("x", "ws", "s", "bs", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["s"], ["sr"]),
             _conv("sr", "wd", "d", "bd", kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=48),
             helper.make_node("Clip", ["d", "lo", "hi"], ["dr"]),
             _conv("dr", "wp", "p", "bp", kernel_shape=[1, 1]),
             helper.make_node("Add", ["p", "sr"], ["q"]),
             helper.make_node("Relu", ["q"], ["y"]),
             helper.make_node("ReduceMean", ["y"], ["mean"], axes=[2, 3])]
    inits = [_w("ws", (48, 3, 3, 3)), _b("bs", 48), _w("wd", (48, 1, 3, 3)), _b("bd", 48),
             _w("wp", (48, 48, 1, 1)), _b("bp", 48),
             numpy_helper.from_array(np.float32(0.0), "lo"),
             numpy_helper.from_array(np.float32(6.0), "hi")]
    model = _model(nodes, [2, 3, 33, 30], inits, outputs=("y", "mean", "dr"))
    x = RNG.standard_normal((2, 3, 33, 30)).astype(np.float32)
    got, ops = _ours(model, {"x": x}, threads)
    assert ops.count("NchwcConv") == 3 and "ReorderInput" not in ops
    assert ops.count("ReorderOutput") == 2  # y (output, ReduceMean) and dr (output)
    _close(got, _want(model, {"x": x}))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,stride", [(16, 1), (24, 2), (64, 1)])
def test_stems_read_nchw_planes(threads, m, stride):
    nodes = [_conv("x", "ws", "s", "bs", kernel_shape=[3, 3], strides=[stride] * 2,
                   pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["s"], ["sr"]),
             _conv("sr", "w2", "y", None, kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    model = _model(nodes, [2, 3, 21, 18], [_w("ws", (m, 3, 3, 3)), _b("bs", m),
                                           _w("w2", (32, m, 3, 3))])
    x = RNG.standard_normal((2, 3, 21, 18)).astype(np.float32)
    got, ops = _ours(model, {"x": x}, threads)
    assert ops.count("NchwcConv") == 2 and "ReorderInput" not in ops
    _close(got, _want(model, {"x": x}))


@pytest.mark.parametrize("pool,kw", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], dilations=[1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 1, 2, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 0, 2, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 3], strides=[2, 2])),
])
@pytest.mark.parametrize("threads", [1, 2])
def test_pools_between_convs(pool, kw, threads):
    c = 36
    nodes = [_conv("x", "w1", "a", "b1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node(pool, ["ar"], ["p"], **kw),
             _conv("p", "w2", "y", None, kernel_shape=[1, 1])]
    model = _model(nodes, [2, c, 15, 16], [_w("w1", (c, c, 3, 3)), _b("b1", c),
                                            _w("w2", (c, c, 1, 1))])
    x = RNG.standard_normal((2, c, 15, 16)).astype(np.float32)
    got, ops = _ours(model, {"x": x}, threads)
    assert "NchwcPool" in ops and ops.count("NchwcConv") == 2
    _close(got, _want(model, {"x": x}))


def test_channel_concat_stays_blocked():
    nodes = [_conv("x", "w1", "a", None, kernel_shape=[1, 1]),
             _conv("x", "w2", "b", None, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
             _conv("cat", "w3", "y", None, kernel_shape=[1, 1])]
    model = _model(nodes, [1, 32, 12, 12], [_w("w1", (16, 32, 1, 1)), _w("w2", (32, 32, 3, 3)),
                                            _w("w3", (24, 48, 1, 1))])
    x = RNG.standard_normal((1, 32, 12, 12)).astype(np.float32)
    got, ops = _ours(model, {"x": x})
    assert ops.count("Concat") == 1 and ops.count("ReorderOutput") == 1
    assert ops.count("ReorderInput") == 1  # x once, for both readers
    _close(got, _want(model, {"x": x}))


def test_lone_and_declined_convolutions_stay_nchw():
    # one conv alone; a conv with a Sigmoid epilogue; planes under 16 pixels
    nodes = [_conv("x", "w1", "a", None, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["a"], ["s"]),
             _conv("s", "w2", "y", None, kernel_shape=[1, 1])]
    model = _model(nodes, [1, 32, 12, 12], [_w("w1", (32, 32, 3, 3)), _w("w2", (32, 32, 1, 1))])
    x = RNG.standard_normal((1, 32, 12, 12)).astype(np.float32)
    got, ops = _ours(model, {"x": x})
    assert not {"NchwcConv", "ReorderInput", "ReorderOutput"} & set(ops)
    _close(got, _want(model, {"x": x}))
    nodes = [_conv("x", "w1", "a", None, kernel_shape=[1, 1]),
             _conv("a", "w2", "y", None, kernel_shape=[1, 1])]
    model = _model(nodes, [1, 32, 3, 3], [_w("w1", (32, 32, 1, 1)), _w("w2", (32, 32, 1, 1))])
    x = RNG.standard_normal((1, 32, 3, 3)).astype(np.float32)
    got, ops = _ours(model, {"x": x})
    assert "NchwcConv" not in ops
    _close(got, _want(model, {"x": x}))


def test_wrong_input_shape_is_a_named_error():
    nodes = [_conv("x", "w1", "a", None, kernel_shape=[1, 1]),
             _conv("a", "w2", "y", None, kernel_shape=[1, 1])]
    model = _model(nodes, [1, 32, 8, 8], [_w("w1", (32, 32, 1, 1)), _w("w2", (32, 32, 1, 1))])
    with actorrt.InferenceSession(model) as s:
        with pytest.raises(actorrt.ActorRTError):
            s.run(None, {"x": np.zeros((1, 16, 8, 8), np.float32)})


def _bn(name, x, y, c):
    nodes = [helper.make_node("BatchNormalization", [x, f"{name}_s", f"{name}_b", f"{name}_m",
                                                     f"{name}_v"], [y], epsilon=1e-5)]
    inits = [numpy_helper.from_array((RNG.random(c) + 0.5).astype(np.float32), f"{name}_s"),
             numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32) * 0.1, f"{name}_b"),
             numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32) * 0.1, f"{name}_m"),
             numpy_helper.from_array((RNG.random(c) + 0.5).astype(np.float32), f"{name}_v")]
    return nodes, inits


@pytest.mark.parametrize("threads", [1, 2])
def test_densenet_style_pre_activation_block(threads):
    # concat -> BN + Relu -> 1x1 conv -> BN + Relu -> 3x3 conv -> concat, twice:
    # the BatchNormalization + Relu pairs (ChannelAffine) stay blocked too
    c0, growth, mid = 32, 16, 40
    nodes, inits = [], []
    feats = ["x"]
    cin = c0
    for i in range(2):
        cat = feats[0] if len(feats) == 1 else f"cat{i}"
        if len(feats) > 1:
            nodes.append(helper.make_node("Concat", list(feats), [cat], axis=1))
        n1, i1 = _bn(f"bn{i}a", cat, f"n{i}a", cin)
        n2, i2 = _bn(f"bn{i}b", f"c{i}a", f"n{i}b", mid)
        nodes += n1 + [helper.make_node("Relu", [f"n{i}a"], [f"r{i}a"]),
                       _conv(f"r{i}a", f"w{i}a", f"c{i}a", None, kernel_shape=[1, 1])]
        nodes += n2 + [helper.make_node("LeakyRelu", [f"n{i}b"], [f"r{i}b"], alpha=0.1),
                       _conv(f"r{i}b", f"w{i}b", f"f{i}", None, kernel_shape=[3, 3],
                             pads=[1, 1, 1, 1])]
        inits += i1 + i2 + [_w(f"w{i}a", (mid, cin, 1, 1)), _w(f"w{i}b", (growth, mid, 3, 3))]
        feats.append(f"f{i}")
        cin += growth
    nodes.append(helper.make_node("Concat", list(feats), ["y"], axis=1))
    model = _model(nodes, [2, c0, 9, 10], inits)
    x = RNG.standard_normal((2, c0, 9, 10)).astype(np.float32)
    got, ops = _ours(model, {"x": x}, threads)
    # (the BatchNormalization after each 1x1 conv folds into it)
    assert ops.count("NchwcAffine") == 2 and ops.count("NchwcConv") == 4
    assert ops.count("ReorderInput") == 1 and ops.count("ReorderOutput") == 1
    _close(got, _want(model, {"x": x}))


@pytest.mark.parametrize("seed", range(12))
def test_random_chains_equal_onnxruntime(seed):
    # random chains: convs of random kernels / strides / pads / dilations,
    # depthwise convs, pools, residual adds, epilogues, batch and threads
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 4))
    c = int(rng.choice([16, 24, 32, 48]))
    h, w = int(rng.integers(6, 20)), int(rng.integers(6, 20))
    nodes, inits, cur, shape = [], [], "x", (n, c, h, w)
    for i in range(int(rng.integers(3, 6))):
        op = rng.choice(["conv", "conv", "depthwise", "pool", "residual"])
        cc, hh, ww = shape[1:]
        if op == "pool" and hh >= 6 and ww >= 6:
            kind = rng.choice(["MaxPool", "AveragePool"])
            k = int(rng.integers(2, 4))
            kw = dict(kernel_shape=[k, k], strides=[int(rng.integers(1, 3))] * 2,
                      pads=[int(rng.integers(0, k))] * 4)
            if kind == "AveragePool":
                kw["count_include_pad"] = int(rng.integers(0, 2))
            nodes.append(helper.make_node(kind, [cur], [f"p{i}"], **kw))
            s = kw["strides"][0]
            pd = kw["pads"][0]
            shape = (n, cc, (hh + 2 * pd - k) // s + 1, (ww + 2 * pd - k) // s + 1)
            cur = f"p{i}"
            continue
        if op == "residual":
            nodes += [_conv(cur, f"w{i}", f"a{i}", f"b{i}", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                      helper.make_node("Add", [f"a{i}", cur], [f"s{i}"]),
                      helper.make_node("Relu", [f"s{i}"], [f"r{i}"])]
            inits += [_w(f"w{i}", (cc, cc, 3, 3)), _b(f"b{i}", cc)]
            cur = f"r{i}"
            continue
        k = int(rng.choice([1, 3, 5]))
        s = int(rng.integers(1, 3))
        d = 1 if k == 1 else int(rng.integers(1, 3))
        p = int(rng.integers(0, (k // 2) * d + 1))
        m = cc if op == "depthwise" else int(rng.choice([16, 32, 40, 64]))
        g = cc if op == "depthwise" else 1
        oh = (hh + 2 * p - d * (k - 1) - 1) // s + 1
        ow = (ww + 2 * p - d * (k - 1) - 1) // s + 1
        if oh < 1 or ow < 1:
            continue
        nodes.append(_conv(cur, f"w{i}", f"a{i}", f"b{i}", kernel_shape=[k, k], strides=[s, s],
                           dilations=[d, d], pads=[p, p, p, p], group=g))
        inits += [_w(f"w{i}", (m, cc // g, k, k)), _b(f"b{i}", m)]
        act = rng.choice(["Relu", "LeakyRelu", "Clip", "none"])
        out = f"a{i}"
        if act == "Relu":
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"]))
            out = f"r{i}"
        elif act == "LeakyRelu":
            nodes.append(helper.make_node("LeakyRelu", [out], [f"r{i}"], alpha=0.3))
            out = f"r{i}"
        elif act == "Clip":
            nodes.append(helper.make_node("Clip", [out, "lo", "hi"], [f"r{i}"]))
            out = f"r{i}"
        shape, cur = (n, m, oh, ow), out
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    inits += [numpy_helper.from_array(np.float32(-0.25), "lo"),
              numpy_helper.from_array(np.float32(1.5), "hi")]
    model = _model(nodes, [n, c, h, w], inits)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    want = _want(model, {"x": x})
    for threads in (1, 2):
        got, ops = _ours(model, {"x": x}, threads)
        _close(got, want)


@pytest.mark.parametrize("tail,opset", [("gap", 17), ("mean_keep", 13), ("mean_flat", 13),
                                        ("mean_flat", 18)])
@pytest.mark.parametrize("c", [32, 40])
def test_global_means_read_the_blocks(tail, opset, c):
    nodes = [_conv("x", "w1", "a", None, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]),
             _conv("ar", "w2", "b", None, kernel_shape=[1, 1])]
    inits = [_w("w1", (c, 32, 3, 3)), _w("w2", (c, c, 1, 1))]
    if tail == "gap":
        nodes.append(helper.make_node("GlobalAveragePool", ["b"], ["y"]))
    elif opset < 18:
        nodes.append(helper.make_node("ReduceMean", ["b"], ["y"], axes=[-1, 2],
                                      keepdims=int(tail == "mean_keep")))
    else:
        nodes.append(helper.make_node("ReduceMean", ["b", "axes"], ["y"],
                                      keepdims=int(tail == "mean_keep")))
        inits.append(numpy_helper.from_array(np.array([2, 3], np.int64), "axes"))
    g = helper.make_graph(nodes, "n", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 32, 9, 7])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()
    x = RNG.standard_normal((2, 32, 9, 7)).astype(np.float32)
    got, ops = _ours(model, {"x": x})
    assert ops[-1] == "NchwcGlobalAveragePool" and "ReorderOutput" not in ops
    _close(got, _want(model, {"x": x}))
