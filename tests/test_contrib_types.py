"""Value types behind com.microsoft nodes (actorrt._loading.contrib_types):
every shape the loader infers past the contrib ops of a model onnxruntime's
optimizer saved equals the shape of that value when onnxruntime runs the
model, and a model without contrib ops is left exactly as onnx inferred it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from actorrt._model import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def _saved(name: str, tmp_path: Path):
    import bench_models
    model, feeds = bench_models.build(name.split()[-1])[:2]
    if name.startswith("quantized"):  # quantize_dynamic's output, then onnxruntime's fusions
        from onnxruntime.quantization import QuantType, quantize_dynamic
        onnx.save(model, str(tmp_path / "f.onnx"))
        quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"),
                         weight_type=QuantType.QInt8)
        model = onnx.load(str(tmp_path / "q.onnx"))
    name = name.replace(" ", "_")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return tmp_path / f"{name}.onnx", feeds


def _run_all_values(path: Path, feeds: dict, dtypes: bool = False) -> dict[str, tuple]:
    """Every node output's shape (and, with ``dtypes``, ``(shape, dtype)``)
    as onnxruntime computes it."""
    m = onnx.load(str(path))
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have:
                m.graph.output.add().name = o
                have.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    got = zip(names, s.run(names, feeds))
    if dtypes:
        return {n: (np.asarray(v).shape, np.asarray(v).dtype) for n, v in got}
    return {n: np.asarray(v).shape for n, v in got}


@pytest.mark.parametrize("name", ["encoder", "decode", "quantized encoder"])
def test_inferred_shapes_behind_contrib_ops_match_onnxruntimes_run(name, tmp_path):
    path, feeds = _saved(name, tmp_path)
    proto = onnx.load(str(path))
    first = next(i for i, n in enumerate(proto.graph.node) if n.domain == "com.microsoft")
    behind = {o for n in proto.graph.node[first + 1:] for o in n.output if o}
    actual = _run_all_values(path, feeds)
    graph = load_model(str(path)).model.graph
    typed = 0
    for node in graph:
        for v in node.outputs:
            if v is None or v.name not in behind or v.shape is None:
                continue
            want = actual[v.name]
            dims = list(v.shape)
            assert len(dims) == len(want), (v.name, dims, want)
            for d, w in zip(dims, want):
                if isinstance(d, int):
                    assert d == w, (v.name, dims, want)
            typed += 1
    # most values past the first contrib op now have a shape (onnx alone: ~none)
    assert typed >= 0.8 * len(behind), (typed, len(behind))


def test_model_without_contrib_ops_is_untouched():
    import bench_models
    model = bench_models.build("decode")[0]
    a = load_model(model).model.graph
    from onnx_ir.passes import common
    import onnx_ir as ir
    b = common.ShapeInferencePass(strict_mode=False)(
        common.TopologicalSortPass()(ir.serde.deserialize_model(model)).model).model.graph
    sa = {v.name: (v.type, v.shape) for n in a for v in n.outputs}
    sb = {v.name: (v.type, v.shape) for n in b for v in n.outputs}
    assert {k: str(v) for k, v in sa.items()} == {k: str(v) for k, v in sb.items()}


def _ms(op, ins, outs, **attrs):
    return onnx.helper.make_node(op, ins, outs, domain="com.microsoft", **attrs)


def test_handmade_chain_of_contrib_ops_matches_onnxruntimes_run(tmp_path):
    from onnx import TensorProto as TP, helper, numpy_helper
    rng = np.random.default_rng(5)
    b, s, d, h = 2, 6, 12, 3
    inits = [numpy_helper.from_array(rng.standard_normal((d, 3 * d)).astype(np.float32), "wqkv"),
             numpy_helper.from_array(rng.standard_normal((20, d)).astype(np.float32), "wt"),
             numpy_helper.from_array(rng.standard_normal((5, 8)).astype(np.float32), "wg"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "bg"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "gamma"),
             numpy_helper.from_array(np.int64([-1, 8]), "shape2"),
             numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "wc")]
    inits += [numpy_helper.from_array(rng.standard_normal((40, d)).astype(np.float32), "we"),
              numpy_helper.from_array(rng.standard_normal((16, d)).astype(np.float32), "pe"),
              numpy_helper.from_array(np.ones(d, np.float32), "eg"),
              numpy_helper.from_array(np.zeros(d, np.float32), "eb")]
    nodes = [_ms("EmbedLayerNormalization", ["ids", "", "we", "pe", "", "eg", "eb"],
                 ["emb", "mi"]),
             helper.make_node("Add", ["x0", "emb"], ["x"]),
             _ms("Attention", ["x", "wqkv"], ["att"], num_heads=h),
             _ms("Gelu", ["att"], ["g"]),
             _ms("FusedMatMul", ["g", "wt"], ["fm"], transB=1, alpha=0.5),
             helper.make_node("Relu", ["fm"], ["r"]),
             helper.make_node("Reshape", ["r", "shape2"], ["rs"]),
             _ms("FusedGemm", ["rs", "wg", "bg"], ["fg"], transB=1, activation="Relu"),
             _ms("SkipLayerNormalization", ["fg", "fg", "gamma"], ["sln"]),
             helper.make_node("Softmax", ["sln"], ["sm"], axis=-1),
             _ms("FusedConv", ["img", "wc"], ["fc"], pads=[1, 1, 1, 1], strides=[2, 2],
                 activation="Relu"),
             helper.make_node("GlobalAveragePool", ["fc"], ["gap"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x0", TP.FLOAT, [b, s, d]),
                                       helper.make_tensor_value_info("ids", TP.INT32, [b, s]),
                                       helper.make_tensor_value_info("img", TP.FLOAT,
                                                                     [1, 3, 9, 11])],
                          [helper.make_tensor_value_info("sm", TP.FLOAT, None),
                           helper.make_tensor_value_info("mi", TP.INT32, None),
                           helper.make_tensor_value_info("gap", TP.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "chain.onnx"
    onnx.save(m, str(path))
    feeds = {"x0": rng.standard_normal((b, s, d)).astype(np.float32),
             "ids": rng.integers(0, 40, (b, s)).astype(np.int32),
             "img": rng.standard_normal((1, 3, 9, 11)).astype(np.float32)}
    actual = _run_all_values(path, feeds)
    shapes = {v.name: v.shape for n in load_model(str(path)).model.graph for v in n.outputs}
    for name in ("emb", "mi", "x", "att", "g", "fm", "r", "rs", "fg", "sln", "sm", "fc", "gap"):
        assert shapes[name] is not None, name
        assert tuple(shapes[name]) == actual[name], (name, shapes[name], actual[name])
    # and the model itself runs as onnxruntime runs it
    import actorrt
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    with actorrt.InferenceSession(str(path)) as sess:
        got = sess.run(None, feeds)
    for gv, wv in zip(got, want):
        np.testing.assert_allclose(gv, wv, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------- one contrib op a case
def _f(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _u8(rng, shape, dtype=np.uint8):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _case(name, rng):
    """(nodes, graph inputs {name: array}, initializers {name: array},
    opset imports) for one contrib op followed by an onnx op per output."""
    f32 = lambda *s: _f(rng, s)  # noqa: E731
    sc = lambda: np.float32(0.05)  # noqa: E731
    zp = lambda dt=np.uint8: np.array(3, dt)  # noqa: E731
    if name.startswith("MatMulNBits"):
        bits = 8 if "8" in name else 4
        k, n, bs = 40, 6, 16  # K not a multiple of the block: a padded tail block
        blocks = -(-k // bs)
        inits = {"b": _u8(rng, (n, blocks, bs * bits // 8)),
                 "s": (rng.random(n * blocks) * 0.1 + 0.01).astype(np.float32)}
        ins = ["a", "b", "s"]
        if "zp" in name:
            inits["z"] = _u8(rng, n * -(-blocks * bits // 8))
            ins.append("z")
        node = _ms("MatMulNBits", ins, ["y"], K=k, N=n, bits=bits, block_size=bs)
        return [node, helper.make_node("Relu", ["y"], ["r"])], {"a": f32(2, 3, k)}, inits
    if name == "GatherBlockQuantized":
        inits = {"d": _u8(rng, (10, 16)), "s": (rng.random((10, 2)) + 0.1).astype(np.float32)}
        node = _ms("GatherBlockQuantized", ["d", "i", "s"], ["y"], bits=4, block_size=16,
                   gather_axis=0, quantize_axis=1)
        return ([node, helper.make_node("Relu", ["y"], ["r"])],
                {"i": rng.integers(0, 10, (2, 3)).astype(np.int64)}, inits)
    if name == "MultiHeadAttention":
        node = _ms("MultiHeadAttention", ["q", "k", "v"], ["y"], num_heads=2)
        return ([node, helper.make_node("Relu", ["y"], ["r"])],
                {"q": f32(2, 4, 12), "k": f32(2, 6, 12), "v": f32(2, 6, 8)}, {})
    if name == "MultiHeadAttention present":
        node = _ms("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"],
                   ["y", "yk", "yv"], num_heads=2)
        outs = [helper.make_node("Relu", [o], [o + "r"]) for o in ("y", "yk", "yv")]
        return ([node] + outs, {"q": f32(2, 1, 12), "k": f32(2, 1, 12), "v": f32(2, 1, 12),
                               "pk": f32(2, 2, 5, 6), "pv": f32(2, 2, 5, 6)}, {})
    if name.startswith("GroupQueryAttention"):
        packed = "packed" in name
        heads, kv, h, s, past = 4, 2, 8, 3, 5
        ins = {"q": f32(1, s, (heads + 2 * kv) * h if packed else heads * h)}
        if not packed:
            ins["k"], ins["v"] = f32(1, s, kv * h), f32(1, s, kv * h)
        ins["pk"], ins["pv"] = f32(1, kv, past, h), f32(1, kv, past, h)
        ins["sl"] = np.array([past + s - 1], np.int32)
        ins["tl"] = np.array(past + s, np.int32)
        names = ["q", "" if packed else "k", "" if packed else "v", "pk", "pv", "sl", "tl"]
        node = _ms("GroupQueryAttention", names, ["y", "yk", "yv"], num_heads=heads,
                   kv_num_heads=kv)
        outs = [helper.make_node("Relu", [o], [o + "r"]) for o in ("y", "yk", "yv")]
        return [node] + outs, ins, {}
    if name in ("QLinearAdd", "QLinearMul"):
        node = _ms(name, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"])
        inits = {"as": sc(), "az": zp(), "bs": sc(), "bz": zp(), "cs": sc(), "cz": zp()}
        return ([node, helper.make_node("Identity", ["y"], ["r"])],
                {"a": _u8(rng, (2, 1, 5)), "b": _u8(rng, (3, 1))}, inits)
    if name in ("QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax"):
        attrs = {"alpha": 0.1} if name == "QLinearLeakyRelu" else {}
        if name == "QLinearSoftmax":
            attrs = {"axis": -1, "opset": 13}
        node = _ms(name, ["x", "xs", "xz", "ys", "yz"], ["y"], **attrs)
        return ([node, helper.make_node("Identity", ["y"], ["r"])], {"x": _u8(rng, (2, 3, 5))},
                {"xs": sc(), "xz": zp(), "ys": np.float32(1 / 256) if name == "QLinearSoftmax"
                 else sc(), "yz": zp() if name != "QLinearSoftmax" else np.array(0, np.uint8)})
    if name == "QLinearAveragePool":
        node = _ms(name, ["x", "xs", "xz", "ys", "yz"], ["y"], kernel_shape=[3, 3],
                   strides=[2, 2], pads=[1, 1, 1, 1])
        return ([node, helper.make_node("Identity", ["y"], ["r"])], {"x": _u8(rng, (1, 3, 7, 9))},
                {"xs": sc(), "xz": zp(), "ys": sc(), "yz": zp()})
    if name == "QLinearGlobalAveragePool":
        node = _ms(name, ["x", "xs", "xz", "ys", "yz"], ["y"], channels_last=0)
        return ([node, helper.make_node("Identity", ["y"], ["r"])], {"x": _u8(rng, (1, 3, 7, 9))},
                {"xs": sc(), "xz": zp(), "ys": sc(), "yz": zp()})
    if name == "QLinearConcat":
        node = _ms(name, ["ys", "yz", "a", "as", "az", "b", "bs", "bz"], ["y"], axis=1)
        return ([node, helper.make_node("Identity", ["y"], ["r"])],
                {"a": _u8(rng, (1, 2, 3)), "b": _u8(rng, (1, 4, 3))},
                {"ys": sc(), "yz": zp(), "as": sc(), "az": zp(), "bs": sc(), "bz": zp()})
    if name.startswith("QGemm"):
        ins = ["a", "as", "az", "b", "bs", "bz", "c"]
        inits = {"as": sc(), "az": zp(), "b": _u8(rng, (5, 6), np.int8), "bs": sc(),
                 "bz": np.array(0, np.int8), "c": rng.integers(-50, 50, 5).astype(np.int32)}
        if "quantized" in name:
            ins += ["ys", "yz"]
            inits.update(ys=sc(), yz=zp())
        node = _ms("QGemm", ins, ["y"], transB=1, alpha=1.0)
        return ([node, helper.make_node("Identity", ["y"], ["r"])], {"a": _u8(rng, (4, 6))},
                inits)
    if name == "QuantizeLinear":
        return ([_ms(name, ["x", "s", "z"], ["y"]), helper.make_node("Identity", ["y"], ["r"])],
                {"x": f32(2, 5)}, {"s": sc(), "z": np.array(0, np.int8)})
    if name == "DequantizeLinear":
        return ([_ms(name, ["x", "s", "z"], ["y"]), helper.make_node("Relu", ["y"], ["r"])],
                {"x": _u8(rng, (2, 5))}, {"s": sc(), "z": zp()})
    if name == "SimplifiedLayerNormalization":
        node = helper.make_node(name, ["x", "g"], ["y", "inv"], axis=-1, epsilon=1e-5)
        return ([node, helper.make_node("Relu", ["y"], ["r"]),
                 helper.make_node("Relu", ["inv"], ["ri"])], {"x": f32(2, 3, 8)},
                {"g": f32(8)})
    raise AssertionError(name)


_CASES = ["MatMulNBits 4", "MatMulNBits 4 zp", "MatMulNBits 8", "MatMulNBits 8 zp",
          "GatherBlockQuantized", "MultiHeadAttention", "MultiHeadAttention present",
          "GroupQueryAttention", "GroupQueryAttention packed", "QLinearAdd", "QLinearMul",
          "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "QLinearAveragePool",
          "QLinearGlobalAveragePool", "QLinearConcat", "QGemm", "QGemm quantized",
          "QuantizeLinear", "DequantizeLinear", "SimplifiedLayerNormalization"]


@pytest.mark.parametrize("name", _CASES)
def test_types_through_one_contrib_op_match_onnxruntimes_run(name, tmp_path):
    """Every node output gets a dtype and a shape, and both equal what
    onnxruntime's run of that value gives (dims left unknown only where the
    rule cannot know them, e.g. a KV cache's total length)."""
    from onnx import numpy_helper
    rng = np.random.default_rng(7)
    nodes, ins, inits = _case(name, rng)
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype),
                                            list(v.shape)) for k, v in ins.items()]
    last = nodes[-1].output[0]
    g = helper.make_graph(nodes, "g", inputs, [onnx.ValueInfoProto(name=last)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19),
                                            helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    actual = _run_all_values(path, ins, dtypes=True)
    graph = load_model(str(path)).model.graph
    checked = 0
    for node in graph:
        for v in node.outputs:
            if v is None or not v.name:
                continue
            want_shape, want_dtype = actual[v.name]
            assert v.type is not None and v.shape is not None, (name, v.name)
            assert v.dtype.numpy() == want_dtype, (name, v.name, v.dtype, want_dtype)
            dims = list(v.shape)
            assert len(dims) == len(want_shape), (name, v.name, dims, want_shape)
            for d, w in zip(dims, want_shape):
                assert not isinstance(d, int) or d == w, (name, v.name, dims, want_shape)
            checked += 1
    assert checked == sum(len([o for o in n.output if o]) for n in nodes)
