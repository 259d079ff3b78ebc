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
    model, feeds = bench_models.build(name)[:2]
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


@pytest.mark.parametrize("name", ["encoder", "decode"])
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
