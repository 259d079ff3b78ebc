"""Value types through com.microsoft contrib ops, after onnx shape inference.

onnx has no schemas for onnxruntime's contrib ops, so its shape inference
stops at the first one: in a model onnxruntime's optimizer saved (every layer
has a ``SkipLayerNormalization``, ``FusedMatMul``, ``BiasGelu``...) nothing
after the first layer gets a type, and the graph optimizer's passes, which
check dtypes and ranks, skip every later layer.

:func:`infer_through_contrib_ops` walks the main graph once in order and,
for each node whose outputs have no type but whose inputs all do, fills
them in:

* contrib ops by their onnxruntime schema: the elementwise ones
  (``Gelu``, ``FastGelu``, ``QuickGelu``, ``BiasGelu``, ``BiasAdd``,
  ``RotaryEmbedding``) and ``Skip[Simplified]LayerNormalization`` (outputs 0
  and 3) take input 0's type; ``Attention`` gives ``(B, S, Dv)``,
  ``EmbedLayerNormalization`` ``(B, S, D)``, ``(B,)``, ``(B, S, D)``;
  ``FusedMatMul`` (and, float32 out, ``DynamicQuantizeMatMul`` /
  ``MatMulIntegerToFloat``) is onnx ``MatMul`` on its
  permuted operands, ``FusedGemm`` onnx ``Gemm``, ``FusedConv`` onnx ``Conv``
  (their activation attributes dropped);
* onnx ops by onnx's own per-node inference
  (``onnx.shape_inference.infer_node_outputs``), with small integer
  constants given as input data (``Reshape`` shapes and the like).

Types are advisory here as everywhere in loading (kernels see run-time
shapes): a node whose inference fails keeps no type.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper, shape_inference

__all__ = ["infer_through_contrib_ops"]

_MS = "com.microsoft"
#: contrib ops whose listed outputs have input 0's type
_LIKE_INPUT0 = {"Gelu": (0,), "FastGelu": (0,), "QuickGelu": (0,), "BiasGelu": (0,),
                "BiasAdd": (0,), "RotaryEmbedding": (0,),
                "SkipLayerNormalization": (0, 3), "SkipSimplifiedLayerNormalization": (0, 3)}
#: contrib ops inferred as an onnx op: (onnx op, attributes kept, inputs kept)
_AS_ONNX = {"FusedGemm": ("Gemm", ("transA", "transB", "alpha", "beta"), 3),
            "FusedConv": ("Conv", ("auto_pad", "dilations", "group", "kernel_shape", "pads",
                                   "strides"), 3)}
#: integer constants up to this many values are passed to onnx as input data
_DATA_MAX = 64


def _type_proto(v: ir.Value) -> onnx.TypeProto | None:
    if v.type is None:
        return None
    return ir.serde.serialize_value(v).type


def _set(v: ir.Value, tp: onnx.TypeProto) -> None:
    if v.type is None:
        v.type = ir.serde.deserialize_type_proto_for_type(tp)
    if v.shape is None:
        shape = ir.serde.deserialize_type_proto_for_shape(tp)
        if shape is not None:
            v.shape = shape


def _permuted(tp: onnx.TypeProto, trans_batch: bool, trans: bool) -> onnx.TypeProto | None:
    """FusedMatMul's view of an operand type (the kernel's own axis order,
    ``matmul.fused_matmul_perm``)."""
    from ..providers.cpu.matmul import fused_matmul_perm
    t = tp.tensor_type
    if not t.HasField("shape"):
        return None
    dims = list(t.shape.dim)
    perm = fused_matmul_perm(len(dims), trans_batch, trans)
    out = onnx.TypeProto()
    out.tensor_type.elem_type = t.elem_type
    for i in perm:
        out.tensor_type.shape.dim.add().CopyFrom(dims[i])
    return out


def _attention_output(node: ir.Node, x: onnx.TypeProto, w: onnx.TypeProto
                      ) -> dict[int, onnx.TypeProto]:
    """com.microsoft Attention's output 0: ``(B, S, Dv)`` of input 0's dtype."""
    xs, ws = x.tensor_type.shape.dim, w.tensor_type.shape.dim
    if len(xs) != 3 or len(ws) != 2:
        return {}
    sizes = node.attributes.get_ints("qkv_hidden_sizes", None)
    if sizes:
        dv = int(sizes[2])
    elif ws[1].HasField("dim_value"):
        dv = ws[1].dim_value // 3
    else:
        return {}
    out = onnx.TypeProto()
    out.tensor_type.elem_type = x.tensor_type.elem_type
    for d in xs[:2]:
        out.tensor_type.shape.dim.add().CopyFrom(d)
    out.tensor_type.shape.dim.add().dim_value = dv
    return {0: out}


def _embed_outputs(ids: onnx.TypeProto, table: onnx.TypeProto, n_out: int
                   ) -> dict[int, onnx.TypeProto]:
    """EmbedLayerNormalization: ``(B, S, D)`` of the table's dtype, int32
    ``(B,)``, ``(B, S, D)``."""
    i, t = ids.tensor_type.shape.dim, table.tensor_type.shape.dim
    if len(i) != 2 or len(t) != 2:
        return {}
    y = onnx.TypeProto()
    y.tensor_type.elem_type = table.tensor_type.elem_type
    for d in (i[0], i[1], t[1]):
        y.tensor_type.shape.dim.add().CopyFrom(d)
    mi = onnx.TypeProto()
    mi.tensor_type.elem_type = onnx.TensorProto.INT32
    mi.tensor_type.shape.dim.add().CopyFrom(i[0])
    return {k: tp for k, tp in ((0, y), (1, mi), (2, y)) if k < n_out}


def _onnx_infer(op: str, domain: str, opset: int, inputs: list[str], outputs: list[str],
                attrs: dict, types: dict, data: dict) -> dict:
    schema = onnx.defs.get_schema(op, opset, domain)
    node = helper.make_node(op, inputs, outputs, domain=domain or None, **attrs)
    return shape_inference.infer_node_outputs(schema, node, types, input_data=data)


def _attr_values(node: ir.Node, keep=None) -> dict:
    out = {}
    for name, a in node.attributes.items():
        if keep is not None and name not in keep:
            continue
        if a.is_ref() or a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
            return {}
        val = a.value
        if a.type in (ir.AttributeType.TENSOR,):
            val = ir.serde.serialize_tensor(val)
        elif a.type in (ir.AttributeType.TENSORS,):
            val = [ir.serde.serialize_tensor(x) for x in val]
        elif a.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS,
                        ir.AttributeType.STRINGS):
            val = list(val)
        out[name] = val
    return out


def _infer(node: ir.Node, opsets: dict) -> dict[int, onnx.TypeProto]:
    """Output index -> inferred type for one node (empty when unknown)."""
    ins = [v for v in node.inputs]
    types = [None if v is None else _type_proto(v) for v in ins]
    if any(v is not None and t is None for v, t in zip(ins, types)):
        return {}
    if node.domain == _MS:
        op = node.op_type
        if op in _LIKE_INPUT0 and types and types[0] is not None:
            return {i: types[0] for i in _LIKE_INPUT0[op] if i < len(node.outputs)}
        if op == "FusedMatMul" and len(types) == 2 and None not in types:
            a = node.attributes
            ta = _permuted(types[0], bool(a.get_int("transBatchA", 0)), bool(a.get_int("transA", 0)))
            tb = _permuted(types[1], bool(a.get_int("transBatchB", 0)), bool(a.get_int("transB", 0)))
            if ta is None or tb is None:
                return {}
            got = _onnx_infer("MatMul", "", 13, ["a", "b"], ["y"], {}, {"a": ta, "b": tb}, {})
            return {0: got["y"]} if "y" in got else {}
        if op == "EmbedLayerNormalization" and len(types) >= 3 and types[0] is not None \
                and types[2] is not None:
            return _embed_outputs(types[0], types[2], len(node.outputs))
        if op == "Attention" and len(types) >= 2 and None not in types[:2]:
            return _attention_output(node, types[0], types[1])
        if op in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat") and len(types) >= 2 and \
                None not in types[:2]:  # float32 out, MatMul's shape rule
            ta, tb = onnx.TypeProto(), onnx.TypeProto()
            ta.CopyFrom(types[0])
            tb.CopyFrom(types[1])
            ta.tensor_type.elem_type = tb.tensor_type.elem_type = onnx.TensorProto.FLOAT
            got = _onnx_infer("MatMul", "", 13, ["a", "b"], ["y"], {}, {"a": ta, "b": tb}, {})
            return {0: got["y"]} if "y" in got else {}
        if op in _AS_ONNX:
            base, keep, n_in = _AS_ONNX[op]
            names = [f"i{k}" if types[k] is not None else "" for k in range(min(n_in, len(types)))]
            feed = {n: t for n, t in zip(names, types) if n}
            got = _onnx_infer(base, "", 13 if base == "Gemm" else 11, names, ["y"],
                              _attr_values(node, keep), feed, {})
            return {0: got["y"]} if "y" in got else {}
        return {}
    if node.domain not in ("", "ai.onnx") or not node.outputs:
        return {}
    names = [f"i{k}" if v is not None else "" for k, v in enumerate(ins)]
    feed = {n: t for n, t in zip(names, types) if n}
    data = {}
    for n, v in zip(names, ins):
        c = None if v is None else v.const_value
        if c is not None and c.dtype in (ir.DataType.INT64, ir.DataType.INT32) and \
                c.size <= _DATA_MAX:
            data[n] = numpy_helper.from_array(np.asarray(c.numpy()), n)
    attrs = _attr_values(node)
    if node.attributes and not attrs:
        return {}  # subgraph or reference attributes: left to onnx's whole-model pass
    outs = [f"o{k}" if v is not None else "" for k, v in enumerate(node.outputs)]
    got = _onnx_infer(node.op_type, "", opsets.get("", 1), names, outs, attrs, feed, data)
    return {k: got[o] for k, o in enumerate(outs) if o and o in got}


def infer_through_contrib_ops(model: ir.Model) -> None:
    """Fill in the value types onnx's shape inference left out behind
    com.microsoft nodes of ``model``'s main graph (in place; see the module
    docstring). Does nothing in a graph without such nodes."""
    graph = model.graph
    if not any(n.domain == _MS for n in graph):
        return
    opsets = dict(model.opset_imports)
    opsets[""] = opsets.get("", opsets.get("ai.onnx", 1))
    for node in graph:
        missing = [v for v in node.outputs if v is not None and v.name and
                   (v.type is None or v.shape is None)]
        if not missing:
            continue
        try:
            got = _infer(node, opsets)
        except Exception:  # inference is advisory (onnx InferenceError, schema gaps)
            continue
        for k, tp in got.items():
            v = node.outputs[k]
            if v is not None and tp.HasField("tensor_type") and tp.tensor_type.elem_type:
                _set(v, tp)
