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


def _run_all_values(path: Path, feeds: dict) -> dict[str, tuple]:
    """Every node output's shape as onnxruntime computes it."""
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
    return {n: np.asarray(v).shape for n, v in zip(names, s.run(names, feeds))}


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
