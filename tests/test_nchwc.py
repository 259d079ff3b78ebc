"""Files onnxruntime saved at ORT_ENABLE_ALL (com.microsoft.nchwc ops and
filters reordered for MLAS's blocked layout) load as standard ops
(actorrt._loading.nchwc) and compute what onnxruntime computes from the
original model."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt import ModelLoadError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

NCHWC = "com.microsoft.nchwc"


def _save_all(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(path)
    so.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(path))


def _reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _handmade(opset: int) -> tuple[onnx.ModelProto, dict]:
    """A CNN that exercises the NCHWc ops onnxruntime writes: a channel count
    that is no multiple of the block (24), the fused activations, a
    fused residual Sum, depthwise, pools, Upsample, Concat, both reorders."""
    rng = np.random.default_rng(3)
    inits, nodes = [], []

    def w(name, *shape):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.3).astype(np.float32), name))
        return name

    def conv(x, y, cin, cout, k, act=None, group=1, **attrs):
        nodes.append(helper.make_node("Conv", [x, w(y + "_w", cout, cin // group, k, k),
                                               w(y + "_b", cout)], [y + "_c" if act else y],
                                      pads=[k // 2] * 4, group=group, **attrs))
        if act:
            kw = {"alpha": 0.2} if act == "LeakyRelu" else {}
            nodes.append(helper.make_node(act, [y + "_c"], [y], **kw))
        return y

    conv("x", "c1", 3, 32, 3, "Relu")
    nodes.append(helper.make_node("MaxPool", ["c1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]))
    conv("p1", "c2", 32, 32, 3, "Sigmoid")
    nodes.append(helper.make_node("AveragePool", ["c2"], ["p2"], kernel_shape=[3, 3],
                                  pads=[1, 1, 1, 1], count_include_pad=1))
    conv("p2", "c3", 32, 48, 1, "LeakyRelu")
    inits.append(numpy_helper.from_array(np.float32([1, 1, 2, 2]), "scales"))
    if opset >= 11:
        nodes.append(helper.make_node("Resize", ["c3", "", "scales"], ["up"], mode="nearest",
                                      coordinate_transformation_mode="asymmetric",
                                      nearest_mode="floor"))
    elif opset == 10:
        nodes.append(helper.make_node("Resize", ["c3", "scales"], ["up"], mode="nearest"))
    else:
        nodes.append(helper.make_node("Upsample", ["c3", "scales"], ["up"], mode="nearest"))
    conv("up", "dw", 48, 48, 3, "Tanh", group=48)
    conv("dw", "c4", 48, 48, 3)
    nodes.append(helper.make_node("Add", ["c4", "up"], ["res"]))
    nodes.append(helper.make_node("Relu", ["res"], ["r4"]))
    conv("r4", "c5", 48, 24, 3, "Relu")   # 24: padded to the block
    conv("c5", "c7", 24, 16, 1, "Relu")   # reads the padded channels
    nodes.append(helper.make_node("Concat", ["r4", "c7"], ["cat"], axis=1))
    nodes.append(helper.make_node("GlobalMaxPool", ["cat"], ["gmp"]))
    nodes.append(helper.make_node("GlobalAveragePool", ["c5"], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gmp"], ["y1"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["y2"]))
    g = helper.make_graph(nodes, "handmade", [helper.make_tensor_value_info("x", TP.FLOAT,
                                                                            [2, 3, 20, 22])],
                          [helper.make_tensor_value_info("y1", TP.FLOAT, None),
                           helper.make_tensor_value_info("y2", TP.FLOAT, None),
                           helper.make_tensor_value_info("cat", TP.FLOAT, None),
                           helper.make_tensor_value_info("c5", TP.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    return m, {"x": rng.standard_normal((2, 3, 20, 22)).astype(np.float32)}


def _build(name: str):
    if name.startswith("handmade"):
        return _handmade(int(name.split("-")[1]))
    import bench_models
    return bench_models.build(name)[:2]


@pytest.mark.parametrize("name", ["handmade-17", "handmade-10", "handmade-9", "resnetish",
                                  "mobilenetish", "densenet121", "shufflenet"])
def test_saved_at_enable_all_runs_as_onnxruntime_runs_the_original(name, tmp_path):
    model, feeds = _build(name)
    saved = _save_all(model, tmp_path / "all.onnx")
    ops = collections.Counter(n.op_type for n in saved.graph.node if n.domain == NCHWC)
    assert ops["Conv"] and ops["ReorderOutput"], ops  # onnxruntime did write NCHWc
    if name.startswith("handmade"):
        assert {"MaxPool", "AveragePool", "Upsample", "GlobalMaxPool"} <= set(ops), ops
    else:  # the zoo files and the built CNNs: blocked inputs made at run time too
        assert name in ("resnetish", "mobilenetish") or ops["ReorderInput"], ops
    want = _reference(model, feeds)
    # old zoo files list initializers as graph inputs too; the saved file
    # keeps such an input while moving its initializer: fed from the original
    inits = {t.name: t for t in model.graph.initializer}
    kept = {t.name for t in saved.graph.initializer}
    feeds = dict(feeds, **{i.name: numpy_helper.to_array(inits[i.name])
                           for i in saved.graph.input if i.name in inits and i.name not in kept})
    with actorrt.InferenceSession(str(tmp_path / "all.onnx")) as sess:
        got = sess.run(None, feeds)
    for g, w_ in zip(got, want):
        assert g.shape == w_.shape
        np.testing.assert_allclose(g, w_, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(w_).max()))


def _saved_handmade(tmp_path) -> onnx.ModelProto:
    return _save_all(_handmade(17)[0], tmp_path / "all.onnx")


def test_blocked_tensor_into_another_op_is_refused_naming_the_node(tmp_path):
    m = _saved_handmade(tmp_path)
    conv = next(n for n in m.graph.node if n.domain == NCHWC and n.op_type == "Conv"
                and any(o.domain == NCHWC for o in m.graph.node if n.output[0] in o.input))
    m.graph.node.append(helper.make_node("Transpose", [conv.output[0]], ["t"], name="bad_t",
                                         perm=[0, 1, 3, 2]))
    m.graph.output.append(helper.make_tensor_value_info("t", TP.FLOAT, None))
    with pytest.raises(ModelLoadError, match="bad_t") as e:
        actorrt.InferenceSession(m.SerializeToString())
    assert "NCHWc" in str(e.value)


def test_channels_no_block_divides_are_refused(tmp_path):
    m = _saved_handmade(tmp_path)
    conv = next(n for n in m.graph.node if n.domain == NCHWC and n.op_type == "Conv")
    init = next(t for t in m.graph.initializer if t.name == conv.input[1])
    arr = numpy_helper.to_array(init)
    init.CopyFrom(numpy_helper.from_array(arr[:-4].copy(), init.name))  # 12 of a 16 block
    with pytest.raises(ModelLoadError, match="block size"):
        actorrt.InferenceSession(m.SerializeToString())


def test_unknown_fused_activation_is_refused(tmp_path):
    m = _saved_handmade(tmp_path)
    conv = next(n for n in m.graph.node if n.domain == NCHWC and n.op_type == "Conv")
    for a in conv.attribute:
        if a.name == "activation":
            a.s = b"Swish"
            break
    else:
        conv.attribute.append(helper.make_attribute("activation", "Swish"))
    with pytest.raises(ModelLoadError, match="Swish"):
        actorrt.InferenceSession(m.SerializeToString())
