"""Test helpers: run a model or a single node through actorrt and compare with
the ONNX reference evaluator (and onnxruntime where it supports the op).

The expected values always come from a peer, never from actorrt itself.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper

import actorrt


def make_node_model(op_type: str, inputs: dict[str, np.ndarray], outputs: Sequence[str],
                    *, opset: int = 21, domain: str = "", **attrs: Any) -> onnx.ModelProto:
    """A one-node model whose graph inputs are ``inputs`` (names -> sample arrays;
    ``None`` values become omitted optional inputs)."""
    in_names = [n if v is not None else "" for n, v in inputs.items()]
    node = helper.make_node(op_type, in_names, list(outputs), domain=domain, **attrs)
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in inputs.items() if v is not None]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs if o]
    graph = helper.make_graph([node], f"{op_type}_test", vis, outs)
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=imports)


def run_actorrt(model, feeds: dict[str, np.ndarray], **kw) -> list:
    """actorrt on ``model`` (a ``ModelProto``, its bytes or a path)."""
    with actorrt.InferenceSession(model, **kw) as sess:
        return sess.run(None, feeds)


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list:
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model).run(None, feeds)


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_onnxruntime_unoptimized(model, feeds: dict[str, np.ndarray]) -> list:
    """onnxruntime's CPU provider on ``model`` (a ``ModelProto``, its bytes or
    a path) with its graph optimizations off (``ORT_DISABLE_ALL``), so its
    own kernel for each node is the reference."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_close(got: Sequence[Any], want: Sequence[Any], *, rtol: float = 1e-4,
                 atol: float = 1e-5, check_dtype: bool = True) -> None:
    assert len(got) == len(want), f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, list):
            assert isinstance(g, list) and len(g) == len(w), f"output {i}: sequence differs"
            assert_close(g, w, rtol=rtol, atol=atol, check_dtype=check_dtype)
            continue
        if w is None:
            assert g is None, f"output {i}: expected None"
            continue
        g = np.asarray(g)
        w = np.asarray(w)
        if check_dtype:
            assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype}, expected {w.dtype}"
        assert g.shape == w.shape, f"output {i}: shape {g.shape}, expected {w.shape}"
        if w.dtype == object:
            assert (g == w).all(), f"output {i}: {g} != {w}"
        elif w.dtype.kind in "fc" or w.dtype.names is None and w.dtype.kind == "V":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                       atol=atol, err_msg=f"output {i}")
        else:
            try:
                np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
            except TypeError:
                np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64))


def check_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, peer: str = "reference",
                rtol: float = 1e-4, atol: float = 1e-5) -> list:
    """Run ``model`` on actorrt and on ``peer`` (``"reference"`` or ``"ort"``) and
    assert the outputs match. Returns actorrt's outputs."""
    got = run_actorrt(model, feeds)
    want = run_reference(model, feeds) if peer == "reference" else run_onnxruntime(model, feeds)
    assert_close(got, want, rtol=rtol, atol=atol)
    return got


def check_node(op_type: str, inputs: dict[str, np.ndarray], outputs: Sequence[str] = ("y",), *,
               opset: int = 21, domain: str = "", peer: str = "reference", rtol: float = 1e-4,
               atol: float = 1e-5, **attrs: Any) -> list:
    """Build a one-node model, run it on actorrt and ``peer``, assert they match."""
    model = make_node_model(op_type, inputs, outputs, opset=opset, domain=domain, **attrs)
    feeds = {n: v for n, v in inputs.items() if v is not None}
    return check_model(model, feeds, peer=peer, rtol=rtol, atol=atol)
