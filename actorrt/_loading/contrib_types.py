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
* the LLM and quantized contrib ops of onnxruntime-genai and
  ``quantize_static`` / ``quantize_dynamic`` models: ``MatMulNBits``
  ``(..., N)`` of input 0's dtype; ``GatherBlockQuantized`` (``gather_axis``
  0) ``indices.shape + (K,)`` of the scales' dtype; ``MultiHeadAttention``
  and ``GroupQueryAttention`` output 0 ``(B, S, heads * head_size)`` and the
  present key/value ``(B, kv_heads, ?, head_size)``; ``QLinearAdd`` /
  ``QLinearMul`` by onnx ``Add``'s broadcast, ``QLinearSigmoid`` /
  ``QLinearLeakyRelu`` / ``QLinearSoftmax`` input 0's type,
  ``QLinearAveragePool`` / ``QLinearGlobalAveragePool`` / ``QLinearConcat``
  by onnx ``AveragePool`` / ``GlobalAveragePool`` / ``Concat`` in input 0's
  dtype, ``QGemm`` by onnx ``Gemm`` (float32 out without ``y_scale``, else
  ``y_zero_point``'s dtype), com.microsoft ``QuantizeLinear`` /
  ``DequantizeLinear`` as onnx's;
* onnxruntime's ``SimplifiedLayerNormalization`` (which it registers in the
  onnx domain, where onnx has no schema): ``Y`` input 0's type,
  ``inv_std_var`` float32 with the normalized axes kept as 1;
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


def _tp(elem: int, dims) -> onnx.TypeProto:
    """A tensor TypeProto: ``dims`` items are ints, dim names, None
    (unknown) or ``TensorShapeProto.Dimension`` messages."""
    out = onnx.TypeProto()
    out.tensor_type.elem_type = elem
    shape = out.tensor_type.shape
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, onnx.TensorShapeProto.Dimension):
            dim.CopyFrom(d)
        elif isinstance(d, int):
            dim.dim_value = d
        elif isinstance(d, str):
            dim.dim_param = d
    return out


def _dims(tp: onnx.TypeProto | None):
    """The dimension messages of a ranked tensor type, else None."""
    if tp is None or not tp.tensor_type.HasField("shape"):
        return None
    return list(tp.tensor_type.shape.dim)


def _val(d) -> int | None:
    return d.dim_value if d is not None and d.HasField("dim_value") else None


def _as_elem(tp: onnx.TypeProto, elem: int) -> onnx.TypeProto:
    out = onnx.TypeProto()
    out.CopyFrom(tp)
    out.tensor_type.elem_type = elem
    return out


def _matmul_nbits(node, types):
    a = _dims(types[0])
    n = node.attributes.get_int("N", None)
    if a is None or n is None:
        return {}
    return {0: _tp(types[0].tensor_type.elem_type, a[:-1] + [int(n)])}


def _gather_block_quantized(node, types):
    data, idx = _dims(types[0]), _dims(types[1])
    if data is None or idx is None or len(types) < 3 or types[2] is None or len(data) != 2:
        return {}
    at = node.attributes
    if at.get_int("gather_axis", 0) != 0 or at.get_int("quantize_axis", 1) not in (1, -1):
        return {}
    bits = int(at.get_int("bits", 4))
    k = _val(data[1])
    if k is None:
        return {}
    # uint8 data packs 8 // bits values a byte; int4/uint4 data holds one each
    per = 8 // bits if types[0].tensor_type.elem_type == onnx.TensorProto.UINT8 else 1
    return {0: _tp(types[2].tensor_type.elem_type, idx + [k * per])}


def _present(b, heads, head_size):
    return [b, heads, None, head_size]


def _multi_head_attention(node, types):
    q = _dims(types[0])
    heads = node.attributes.get_int("num_heads", None)
    if q is None or len(q) != 3 or heads is None:
        return {}
    elem = types[0].tensor_type.elem_type
    k = _dims(types[1]) if len(types) > 1 else None
    v = _dims(types[2]) if len(types) > 2 else None
    dv = None
    if v is not None and len(v) == 3:
        dv = _val(v[2])
    elif v is not None and len(v) == 4:
        dv = None if _val(v[3]) is None else heads * _val(v[3])
    elif v is None and k is not None and len(k) == 5:  # packed KV (B, L, N, 2, H)
        dv = None if _val(k[4]) is None else heads * _val(k[4])
    elif v is None and k is None:
        dv = _val(q[2])
    if dv is None:
        return {}
    out = {0: _tp(elem, [q[0], q[1], dv])}
    dk = _val(q[2])
    if dk is not None and dk % heads == 0 and dv % heads == 0:
        for i, h in ((1, dk // heads), (2, dv // heads)):
            out[i] = _tp(elem, _present(q[0], heads, h))
    return out


def _group_query_attention(node, types):
    q = _dims(types[0])
    at = node.attributes
    heads, kv = at.get_int("num_heads", None), at.get_int("kv_num_heads", None)
    if q is None or len(q) != 3 or not heads or not kv or _val(q[2]) is None:
        return {}
    k = _dims(types[1]) if len(types) > 1 and types[1] is not None else None
    if k is not None:
        if len(k) != 3 or _val(k[2]) is None:
            return {}
        h = _val(k[2]) // kv
    else:  # packed QKV: (B, S, (heads + 2 kv) * H)
        h = _val(q[2]) // (heads + 2 * kv)
    elem = types[0].tensor_type.elem_type
    return {0: _tp(elem, [q[0], q[1], heads * h]), 1: _tp(elem, _present(q[0], kv, h)),
            2: _tp(elem, _present(q[0], kv, h))}


def _qlinear_binary(node, types):
    if len(types) < 4 or types[0] is None or types[3] is None:
        return {}
    got = _onnx_infer("Add", "", 14, ["a", "b"], ["y"], {}, {"a": types[0], "b": types[3]}, {})
    return {0: got["y"]} if "y" in got else {}


def _float_op_in(base: str, opset: int, keep, tp_in: list, node, elem: int):
    """Infer ``base`` on float32 views of the inputs and give its output
    ``elem``."""
    names = [f"i{k}" for k in range(len(tp_in))]
    feed = {n: _as_elem(t, onnx.TensorProto.FLOAT) for n, t in zip(names, tp_in)}
    got = _onnx_infer(base, "", opset, names, ["y"], _attr_values(node, keep), feed, {})
    return {0: _as_elem(got["y"], elem)} if "y" in got else {}


def _qlinear_average_pool(node, types):
    if node.attributes.get_int("channels_last", 0):
        return {}
    keep = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
    return _float_op_in("AveragePool", 19, keep, [types[0]], node,
                        types[0].tensor_type.elem_type)


def _qlinear_global_average_pool(node, types):
    if node.attributes.get_int("channels_last", 0):
        return {}
    return _float_op_in("GlobalAveragePool", 1, (), [types[0]], node,
                        types[0].tensor_type.elem_type)


def _qlinear_concat(node, types):
    xs = types[2::3]
    if not xs or any(t is None for t in xs):
        return {}
    return _float_op_in("Concat", 13, ("axis",), xs, node, xs[0].tensor_type.elem_type)


def _qgemm(node, types):
    if len(types) < 6 or types[0] is None or types[3] is None:
        return {}
    ins = [types[0], types[3]] + ([types[6]] if len(types) > 6 and types[6] is not None else [])
    if len(types) > 7 and types[7] is not None:
        elem = types[8].tensor_type.elem_type if len(types) > 8 and types[8] is not None \
            else onnx.TensorProto.UINT8
    else:
        elem = onnx.TensorProto.FLOAT
    return _float_op_in("Gemm", 13, ("transA", "transB"), ins, node, elem)


def _quantize_linear(node, types):
    if types[0] is None or _dims(types[0]) is None:
        return {}
    elem = types[2].tensor_type.elem_type if len(types) > 2 and types[2] is not None \
        else onnx.TensorProto.UINT8
    return {0: _tp(elem, _dims(types[0]))}


def _dequantize_linear(node, types):
    if types[0] is None or _dims(types[0]) is None or len(types) < 2 or types[1] is None:
        return {}
    return {0: _tp(types[1].tensor_type.elem_type, _dims(types[0]))}


def _like_input0(node, types):
    return {0: types[0]} if types and types[0] is not None else {}


#: com.microsoft op -> rule(node, input types) -> {output index: type}
_RULES = {"MatMulNBits": _matmul_nbits, "GatherBlockQuantized": _gather_block_quantized,
          "MultiHeadAttention": _multi_head_attention,
          "GroupQueryAttention": _group_query_attention,
          "QLinearAdd": _qlinear_binary, "QLinearMul": _qlinear_binary,
          "QLinearSigmoid": _like_input0, "QLinearLeakyRelu": _like_input0,
          "QLinearSoftmax": _like_input0, "QLinearAveragePool": _qlinear_average_pool,
          "QLinearGlobalAveragePool": _qlinear_global_average_pool,
          "QLinearConcat": _qlinear_concat, "QGemm": _qgemm,
          "QuantizeLinear": _quantize_linear, "DequantizeLinear": _dequantize_linear}


def _simplified_layer_norm(node, types):
    """onnxruntime's SimplifiedLayerNormalization (onnx domain, no onnx schema)."""
    x = _dims(types[0]) if types and types[0] is not None else None
    if x is None:
        return {}
    out = {0: types[0]}
    axis = node.attributes.get_int("axis", -1)
    axis = axis + len(x) if axis < 0 else axis
    if 0 <= axis < len(x) and len(node.outputs) > 1:
        out[1] = _tp(onnx.TensorProto.FLOAT, x[:axis] + [1] * (len(x) - axis))
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
        if op in _RULES:
            return _RULES[op](node, types)
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
    if node.op_type == "SimplifiedLayerNormalization":
        return _simplified_layer_norm(node, types)
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
    if not any(n.domain == _MS or n.op_type == "SimplifiedLayerNormalization" for n in graph):
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
            v = node.outputs[k] if k < len(node.outputs) else None
            if v is not None and tp.HasField("tensor_type") and tp.tensor_type.elem_type:
                _set(v, tp)
