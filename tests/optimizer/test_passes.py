"""Graph optimizer passes (actorrt.optimizer): each fusion fires on the pattern
its exporter emits and the optimized plan's outputs equal onnxruntime's on the
unoptimized model (ORT_DISABLE_ALL), over random shapes incl. odd sizes,
strides, padding, dilations and groups; patterns that must not fuse don't."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.optimizer import parse_level

RNG = np.random.default_rng(1234)


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, dt=TP.FLOAT):
    return helper.make_tensor_value_info(name, dt, shape)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _ours(model, feeds, level="ORT_ENABLE_ALL"):
    with actorrt.InferenceSession(model, actorrt.SessionOptions(graph_optimization_level=level)) as s:
        ops = [st.node.op_type for st in s.session.plan.steps]
        return s.run(None, feeds), ops, list(s.session.plan.fusions)


def _check(model, feeds, fused_op, *, rtol=1e-4, atol=1e-5, absent=()):
    want = _ort(model, feeds)
    got, ops, fusions = _ours(model, feeds)
    assert fused_op in ops, ops
    assert fusions
    for op in absent:
        assert op not in ops, ops
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * max(1.0, float(np.max(np.abs(w)))))
    got0, ops0, fusions0 = _ours(model, feeds, 0)
    assert fused_op not in ops0 and not fusions0
    for g, w in zip(got0, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * max(1.0, float(np.max(np.abs(w)))))
    return ops


def _bn_inits(p, c):
    return [_init(f"{p}s", (1 + 0.2 * RNG.standard_normal(c)).astype(np.float32)),
            _init(f"{p}b", RNG.standard_normal(c).astype(np.float32)),
            _init(f"{p}m", RNG.standard_normal(c).astype(np.float32)),
            _init(f"{p}v", (0.5 + RNG.random(c)).astype(np.float32))]


CONV_CASES = [  # (n, c, h, w, m, k, stride, pad, dilation, group)
    (1, 3, 17, 13, 5, 3, 1, 1, 1, 1),
    (2, 4, 11, 9, 6, 3, 2, 0, 1, 2),
    (1, 6, 15, 15, 6, 3, 1, 2, 2, 6),   # depthwise, dilated
    (1, 5, 7, 10, 7, 1, 1, 0, 1, 1),    # 1x1
    (1, 4, 9, 8, 4, 5, 3, 2, 1, 1),
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("act", ["Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"])
def test_conv_bn_activation(case, act):
    n, c, h, w, m, k, s, p, d, g = case
    inits = [_init("W", RNG.standard_normal((m, c // g, k, k)).astype(np.float32)),
             _init("B", RNG.standard_normal(m).astype(np.float32))] + _bn_inits("bn", m)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], kernel_shape=[k, k], strides=[s, s],
                              pads=[p] * 4, dilations=[d, d], group=g),
             helper.make_node("BatchNormalization", ["y", "bns", "bnb", "bnm", "bnv"], ["z"], epsilon=1e-3)]
    if act == "Clip":
        inits += [_init("lo", np.float32(-0.5)), _init("hi", np.float32(1.5))]
        nodes.append(helper.make_node("Clip", ["z", "lo", "hi"], ["out"]))
    elif act == "LeakyRelu":
        nodes.append(helper.make_node(act, ["z"], ["out"], alpha=0.07))
    elif act == "HardSigmoid":
        nodes.append(helper.make_node(act, ["z"], ["out"], alpha=0.3, beta=0.4))
    else:
        nodes.append(helper.make_node(act, ["z"], ["out"]))
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    m_ = _model(nodes, [_vi("x", list(x.shape))], [_vi("out", None)], inits)
    ops = _check(m_, {"x": x}, "FusedConv", absent=("BatchNormalization", act))
    assert ops == ["FusedConv"]


@pytest.mark.parametrize("case", CONV_CASES[:3])
def test_conv_mul_add_fold_basic(case):
    n, c, h, w, m, k, s, p, d, g = case
    inits = [_init("W", RNG.standard_normal((m, c // g, k, k)).astype(np.float32)),
             _init("mul", RNG.standard_normal((m, 1, 1)).astype(np.float32)),
             _init("add", RNG.standard_normal((1, m, 1, 1)).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[k, k], strides=[s, s],
                              pads=[p] * 4, dilations=[d, d], group=g),
             helper.make_node("Mul", ["y", "mul"], ["z"]),
             helper.make_node("Add", ["add", "z"], ["out"])]
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    m_ = _model(nodes, [_vi("x", list(x.shape))], [_vi("out", None)], inits)
    want = _ort(m_, {"x": x})
    got, ops, fusions = _ours(m_, {"x": x}, "basic")
    assert ops == ["Conv"] and len(fusions) == 1
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_conv_add_relu_residual():
    """ResNet's Conv -> Add(skip) -> Relu becomes FusedConv with Z; a skip that
    broadcasts does not fuse into Z."""
    x = RNG.standard_normal((2, 8, 9, 11)).astype(np.float32)
    inits = [_init("W", RNG.standard_normal((8, 8, 3, 3)).astype(np.float32)),
             _init("B", RNG.standard_normal(8).astype(np.float32))] + _bn_inits("bn", 8)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("BatchNormalization", ["y", "bns", "bnb", "bnm", "bnv"], ["z"]),
             helper.make_node("Sum", ["z", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["out"])]
    m_ = _model(nodes, [_vi("x", list(x.shape))], [_vi("out", list(x.shape))], inits)
    ops = _check(m_, {"x": x}, "FusedConv")
    assert ops == ["FusedConv"]
    # skip of shape (1, 8, 1, 1): broadcasts, so no Z fusion (Conv + BN still fold)
    inits2 = inits + [_init("sk", RNG.standard_normal((1, 8, 1, 1)).astype(np.float32))]
    nodes2 = nodes[:2] + [helper.make_node("Add", ["z", "xs"], ["s"]), nodes[3]]
    m2 = _model(nodes2, [_vi("x", list(x.shape)), _vi("xs", [1, 8, 1, 1])], [_vi("out", None)], inits)
    feeds = {"x": x, "xs": RNG.standard_normal((1, 8, 1, 1)).astype(np.float32)}
    got, ops2, _ = _ours(m2, feeds)
    np.testing.assert_allclose(got[0], _ort(m2, feeds)[0], rtol=1e-4, atol=1e-4)
    assert "Add" in ops2 and "FusedConv" not in ops2


def test_conv_output_read_twice_not_folded():
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    inits = [_init("W", RNG.standard_normal((4, 3, 3, 3)).astype(np.float32))] + _bn_inits("bn", 4)
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[3, 3]),
             helper.make_node("BatchNormalization", ["y", "bns", "bnb", "bnm", "bnv"], ["z"]),
             helper.make_node("Add", ["y", "z"], ["out"])]
    m_ = _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("out", None)], inits)
    got, ops, fusions = _ours(m_, {"x": x})
    assert "BatchNormalization" in ops and "Conv" in ops
    np.testing.assert_allclose(got[0], _ort(m_, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("act", [None, "Relu", "Clip", "LeakyRelu", "Sigmoid"])
def test_bn_mul_add_activation(act, compiled, monkeypatch):
    """DenseNet's pre-activation BN -> Mul -> Add -> Relu becomes one ChannelAffine
    (its compiled one-pass kernel and the numpy one)."""
    from actorrt.providers.cpu import _conv_numba, normalization
    monkeypatch.setattr(normalization, "COMPILED_AFFINE", compiled)
    monkeypatch.setattr(_conv_numba, "PARALLEL_MIN_WORK", 0)  # plane ranges across threads
    x = RNG.standard_normal((2, 7, 5, 3)).astype(np.float32)
    inits = _bn_inits("bn", 7) + [_init("mul", RNG.standard_normal((7, 1, 1)).astype(np.float32)),
                                  _init("add", RNG.standard_normal((7, 1, 1)).astype(np.float32))]
    nodes = [helper.make_node("BatchNormalization", ["x", "bns", "bnb", "bnm", "bnv"], ["z"]),
             helper.make_node("Mul", ["z", "mul"], ["u"]),
             helper.make_node("Add", ["u", "add"], ["v"])]
    last = "v"
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["v"], ["out"]))
        last = "out"
    elif act == "Clip":
        nodes.append(helper.make_node("Clip", ["v"], ["out"], min=-0.2, max=0.9))
        last = "out"
    elif act:
        nodes.append(helper.make_node(act, ["v"], ["out"], **({"alpha": 0.3} if act == "LeakyRelu" else {})))
        last = "out"
    m_ = _model(nodes, [_vi("x", list(x.shape))], [_vi(last, None)], inits, opset=17 if act != "Clip" else 9)
    ops = _check(m_, {"x": x}, "ChannelAffine")
    assert ops == ["ChannelAffine"]


def _gelu_nodes(variant: str, x: str, out: str):
    c = {"sq2": np.float32(math.sqrt(2)), "isq2": np.float32(1 / math.sqrt(2)),
         "one": np.float32(1), "half": np.float32(0.5)}
    inits = [_init(k, v) for k, v in c.items()]
    first = helper.make_node("Div", [x, "sq2"], ["g0"]) if variant != "mul_first" else \
        helper.make_node("Mul", ["isq2", x], ["g0"])
    nodes = [first, helper.make_node("Erf", ["g0"], ["g1"]), helper.make_node("Add", ["g1", "one"], ["g2"])]
    if variant in ("torch", "mul_first"):
        nodes += [helper.make_node("Mul", [x, "g2"], ["g3"]), helper.make_node("Mul", ["g3", "half"], [out])]
    elif variant == "half_x":
        nodes += [helper.make_node("Mul", [x, "half"], ["gh"]), helper.make_node("Mul", ["gh", "g2"], [out])]
    else:  # half_erf
        nodes += [helper.make_node("Mul", ["g2", "half"], ["g3"]), helper.make_node("Mul", ["g3", x], [out])]
    return nodes, inits


@pytest.mark.parametrize("variant", ["torch", "mul_first", "half_x", "half_erf"])
def test_gelu_and_matmul_epilogue(variant):
    """MatMul + bias + erf-GELU (each exported order) -> one MatMulEpilogue;
    a bare GELU (no MatMul before it) -> com.microsoft Gelu."""
    k, n = 37, 53
    a = RNG.standard_normal((2, 5, k)).astype(np.float32)
    inits = [_init("W", RNG.standard_normal((k, n)).astype(np.float32) / 5),
             _init("b", RNG.standard_normal(n).astype(np.float32))]
    g, gi = _gelu_nodes(variant, "h", "out")
    nodes = [helper.make_node("MatMul", ["a", "W"], ["p"]), helper.make_node("Add", ["p", "b"], ["h"])] + g
    m_ = _model(nodes, [_vi("a", list(a.shape))], [_vi("out", None)], inits + gi)
    assert _check(m_, {"a": a}, "MatMulEpilogue") == ["MatMulEpilogue"]
    g, gi = _gelu_nodes(variant, "a", "out")
    m2 = _model(g, [_vi("a", list(a.shape))], [_vi("out", None)], gi)
    assert _check(m2, {"a": a}, "Gelu") == ["Gelu"]


def test_matmul_bias_variants():
    a = RNG.standard_normal((3, 19)).astype(np.float32)
    inits = [_init("W", RNG.standard_normal((19, 11)).astype(np.float32)),
             _init("b", RNG.standard_normal((1, 11)).astype(np.float32)),
             _init("b2", RNG.standard_normal((3, 11)).astype(np.float32))]
    nodes = [helper.make_node("MatMul", ["a", "W"], ["p"]), helper.make_node("Add", ["b", "p"], ["h"]),
             helper.make_node("Relu", ["h"], ["out"])]
    m_ = _model(nodes, [_vi("a", [3, 19])], [_vi("out", None)], inits)
    assert _check(m_, {"a": a}, "MatMulEpilogue") == ["MatMulEpilogue"]
    # a (3, 11) addend is no bias: stays MatMul + Add
    nodes2 = [nodes[0], helper.make_node("Add", ["p", "b2"], ["out"])]
    m2 = _model(nodes2, [_vi("a", [3, 19])], [_vi("out", None)], inits)
    got, ops, _ = _ours(m2, {"a": a})
    assert ops == ["MatMul", "Add"]
    np.testing.assert_allclose(got[0], _ort(m2, {"a": a})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", ["Relu", "Sigmoid"])
def test_gemm_activation(act):
    a = RNG.standard_normal((6, 13)).astype(np.float32)
    inits = [_init("W", RNG.standard_normal((7, 13)).astype(np.float32)),
             _init("c", RNG.standard_normal(7).astype(np.float32))]
    nodes = [helper.make_node("Gemm", ["a", "W", "c"], ["y"], transB=1, alpha=0.5, beta=2.0),
             helper.make_node(act, ["y"], ["out"])]
    m_ = _model(nodes, [_vi("a", [6, 13])], [_vi("out", None)], inits)
    assert _check(m_, {"a": a}, "FusedGemm") == ["FusedGemm"]


@pytest.mark.parametrize("with_mask,scale_op", [(True, "Div"), (False, "Mul"), (True, None)])
def test_attention(with_mask, scale_op):
    b, h, s, t, d = 2, 3, 5, 7, 9
    q = RNG.standard_normal((b, h, s, d)).astype(np.float32)
    k = RNG.standard_normal((b, h, d, t)).astype(np.float32)
    v = RNG.standard_normal((b, h, t, d + 2)).astype(np.float32)
    mask = np.where(RNG.random((b, 1, 1, t)) < 0.3, -1e4, 0).astype(np.float32)
    inits = [_init("sc", np.float32(math.sqrt(d) if scale_op == "Div" else 0.3))]
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s0"])]
    cur = "s0"
    if scale_op:
        nodes.append(helper.make_node(scale_op, [cur, "sc"], ["s1"]))
        cur = "s1"
    if with_mask:
        nodes.append(helper.make_node("Add", [cur, "mask"], ["s2"]))
        cur = "s2"
    nodes += [helper.make_node("Softmax", [cur], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["out"])]
    ins = [_vi("q", list(q.shape)), _vi("k", list(k.shape)), _vi("v", list(v.shape))]
    feeds = {"q": q, "k": k, "v": v}
    if with_mask:
        ins.append(_vi("mask", list(mask.shape)))
        feeds["mask"] = mask
    m_ = _model(nodes, ins, [_vi("out", None)], inits)
    assert _check(m_, feeds, "ScaledDotAttention") == ["ScaledDotAttention"]


def _ms(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, domain="com.microsoft", **attrs)


@pytest.mark.parametrize("trans_b,with_mask,div", [(1, True, False), (0, False, True),
                                                   (1, False, True), (0, True, False)])
def test_attention_from_onnxruntimes_fused_matmul(trans_b, with_mask, div):
    """onnxruntime saves its MatMul + Transpose + scale fusions as
    com.microsoft FusedMatMul(q, k, alpha, transB): the attention fusion
    takes it as the first product (alpha times any later scale)."""
    b, h, s, t, d = 2, 3, 5, 7, 9
    q = RNG.standard_normal((b, h, s, d)).astype(np.float32)
    k = RNG.standard_normal((b, h, t, d) if trans_b else (b, h, d, t)).astype(np.float32)
    v = RNG.standard_normal((b, h, t, d + 2)).astype(np.float32)
    mask = np.where(RNG.random((b, 1, 1, t)) < 0.3, -1e4, 0).astype(np.float32)
    nodes = [_ms("FusedMatMul", ["q", "k"], ["s0"], alpha=0.37, transB=trans_b)]
    cur, inits = "s0", []
    if div:
        inits.append(_init("sc", np.float32(1.7)))
        nodes.append(helper.make_node("Div", [cur, "sc"], ["s1"]))
        cur = "s1"
    if with_mask:
        nodes.append(helper.make_node("Add", [cur, "mask"], ["s2"]))
        cur = "s2"
    nodes += [helper.make_node("Softmax", [cur], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["out"])]
    ins = [_vi("q", list(q.shape)), _vi("k", list(k.shape)), _vi("v", list(v.shape))]
    feeds = {"q": q, "k": k, "v": v}
    if with_mask:
        ins.append(_vi("mask", list(mask.shape)))
        feeds["mask"] = mask
    m_ = _model(nodes, ins, [_vi("out", None)], inits)
    assert _check(m_, feeds, "ScaledDotAttention") == ["ScaledDotAttention"]


@pytest.mark.parametrize("first,keys_read_elsewhere", [("MatMul", False), ("MatMul", True),
                                                        ("FusedMatMul", False)])
def test_attention_absorbs_the_keys_transpose(first, keys_read_elsewhere):
    """GPT-2's exports transpose the cached keys (b, h, t, d) -> (b, h, d, t)
    for the scores: a Transpose of the last two axes read only by the product
    joins the attention (transpose_k flips; twice with FusedMatMul's transB
    cancels); read elsewhere too, it stays."""
    b, h, s, t, d = 1, 3, 2, 11, 8
    q = RNG.standard_normal((b, h, s, d)).astype(np.float32)
    kin = (b, h, d, t) if first == "FusedMatMul" else (b, h, t, d)
    k = RNG.standard_normal(kin).astype(np.float32)
    v = RNG.standard_normal((b, h, t, d)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    if first == "FusedMatMul":
        nodes.append(_ms("FusedMatMul", ["q", "kt"], ["s0"], alpha=0.3, transB=1))
    else:
        nodes += [helper.make_node("MatMul", ["q", "kt"], ["s"]),
                  helper.make_node("Mul", ["s", "sc"], ["s0"])]
    nodes += [helper.make_node("Softmax", ["s0"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["out"])]
    outs = [_vi("out", None)] + ([_vi("kt", None)] if keys_read_elsewhere else [])
    m_ = _model(nodes, [_vi("q", list(q.shape)), _vi("k", list(k.shape)), _vi("v", list(v.shape))],
                outs, [_init("sc", np.float32(0.3))])
    ops = _check(m_, {"q": q, "k": k, "v": v}, "ScaledDotAttention")
    assert ("Transpose" in ops) == keys_read_elsewhere, ops


def test_fused_matmul_with_transposed_a_is_not_taken_as_attention():
    q = RNG.standard_normal((2, 9, 5)).astype(np.float32)  # (batch, D, S): transA
    k = RNG.standard_normal((2, 9, 7)).astype(np.float32)
    v = RNG.standard_normal((2, 7, 4)).astype(np.float32)
    nodes = [_ms("FusedMatMul", ["q", "k"], ["s"], alpha=0.5, transA=1),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["out"])]
    m_ = _model(nodes, [_vi("q", [2, 9, 5]), _vi("k", [2, 9, 7]), _vi("v", [2, 7, 4])],
                [_vi("out", None)], [])
    feeds = {"q": q, "k": k, "v": v}
    got, ops, _ = _ours(m_, feeds)
    assert "ScaledDotAttention" not in ops and "FusedMatMul" in ops
    np.testing.assert_allclose(got[0], _ort(m_, feeds)[0], rtol=1e-5, atol=1e-5)


def test_matmul_then_onnxruntimes_bias_gelu_is_one_epilogue():
    k, n = 37, 53
    a = RNG.standard_normal((2, 5, k)).astype(np.float32)
    inits = [_init("W", RNG.standard_normal((k, n)).astype(np.float32) / 5),
             _init("b", RNG.standard_normal(n).astype(np.float32))]
    nodes = [helper.make_node("MatMul", ["a", "W"], ["p"]), _ms("BiasGelu", ["p", "b"], ["out"])]
    m_ = _model(nodes, [_vi("a", list(a.shape))], [_vi("out", None)], inits)
    assert _check(m_, {"a": a}, "MatMulEpilogue") == ["MatMulEpilogue"]


def test_attention_probs_read_elsewhere_not_fused():
    q = RNG.standard_normal((1, 4, 6)).astype(np.float32)
    k = RNG.standard_normal((1, 6, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "q"], ["out"])]
    m_ = _model(nodes, [_vi("q", [1, 4, 6]), _vi("k", [1, 6, 4])], [_vi("out", None), _vi("p", None)], [])
    got, ops, _ = _ours(m_, {"q": q, "k": k})
    assert "ScaledDotAttention" not in ops
    for g, w in zip(got, _ort(m_, {"q": q, "k": k})):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sum_used", [False, True])
def test_skip_layer_norm(sum_used):
    x = RNG.standard_normal((2, 3, 29)).astype(np.float32)
    r = RNG.standard_normal((2, 3, 29)).astype(np.float32)
    inits = [_init("g", RNG.standard_normal(29).astype(np.float32)),
             _init("bb", RNG.standard_normal(29).astype(np.float32))]
    nodes = [helper.make_node("Add", ["x", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "bb"], ["y"], axis=-1, epsilon=1e-5)]
    outs = [_vi("y", None)]
    if sum_used:
        nodes.append(helper.make_node("Mul", ["s", "y"], ["z"]))
        outs.append(_vi("z", None))
    m_ = _model(nodes, [_vi("x", [2, 3, 29]), _vi("r", [2, 3, 29])], outs, inits)
    _check(m_, {"x": x, "r": r}, "SkipLayerNormalization", absent=("LayerNormalization",))


def test_graph_output_intermediate_kept():
    """An intermediate that is a graph output is never fused away."""
    x = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
    inits = [_init("W", RNG.standard_normal((3, 2, 3, 3)).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[3, 3]), helper.make_node("Relu", ["y"], ["out"])]
    m_ = _model(nodes, [_vi("x", [1, 2, 6, 6])], [_vi("out", None), _vi("y", None)], inits)
    got, ops, fusions = _ours(m_, {"x": x})
    assert ops == ["Conv", "Relu"] and not fusions
    for g, w in zip(got, _ort(m_, {"x": x})):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_parse_level():
    assert parse_level(ort.GraphOptimizationLevel.ORT_ENABLE_ALL) == 99
    assert parse_level(ort.GraphOptimizationLevel.ORT_DISABLE_ALL) == 0
    assert parse_level("ORT_ENABLE_BASIC") == 1 and parse_level("extended") == 2 and parse_level(0) == 0
    for bad in ("fast", 5, True, None):
        with pytest.raises(ValueError):
            parse_level(bad)
    with pytest.raises(actorrt.InvalidArgumentError):
        actorrt.InferenceSession(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])],
                                        [_vi("y", [2])], []),
                                 actorrt.SessionOptions(graph_optimization_level="fast"))
