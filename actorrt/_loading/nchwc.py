"""Files onnxruntime saved at ``ORT_ENABLE_ALL``: com.microsoft.nchwc ops as
standard onnx ops.

onnxruntime's NCHWc transformer (only at ``ORT_ENABLE_ALL``) rewrites a CNN's
convolutions and pools into the ``com.microsoft.nchwc`` domain: activations
move to a blocked layout ``(N, C_pad / B, H, W, B)`` (``B``, MLAS's NCHWc
block, is 8 on AVX2 and 16 on AVX-512 machines; ``C_pad`` is the channel
count rounded up to ``B``), and every filter is stored reordered for it. A
file saved from such a session carries those ops and those reordered weights.

:func:`expand_nchwc` turns them back into standard ops on *unblocked padded*
tensors, ``(N, C_pad, H, W)`` (the blocked tensor with its block axis moved
next to the channel blocks; same values, same padding channels):

* ``ReorderInput``: ``Transpose`` from NHWC when ``channels_last``, then a
  zero ``Pad`` of the channels up to ``C_pad`` (MLAS zero-fills them);
* ``Conv``: onnx ``Conv`` with the filter unblocked (``OIHWBiBo`` when the
  input is blocked, ``OIHWBo`` when it is plain NCHW or the conv is
  depthwise), ``+ Sum`` (the fused residual input), then the fused
  activation as its own op;
* ``MaxPool`` / ``AveragePool`` / ``GlobalMaxPool`` / ``GlobalAveragePool``:
  the onnx op of that name; ``Upsample``: ``Resize`` (``Upsample`` below
  opset 10);
* ``ReorderOutput``: ``Slice`` of the first ``channels`` channels (nothing
  when no padding), then ``Transpose`` to NHWC when ``channels_last``.

onnx ops the transformer left on blocked tensors (elementwise ones, and
``Concat`` on the channel axis) mean the same on the unblocked form. Every
emitted op uses the model's onnx opset (``Clip``'s bounds, ``Slice``'s and
``Pad``'s arguments as attributes or inputs). ``B`` is read off the file:
the one of 16 and 8 that divides every padded channel count, this machine's
MLAS block (16 with AVX-512F) when both do.

Refused with :class:`~actorrt.ModelLoadError` naming the node: a blocked
value reaching any other op, a grouped conv of a plain NCHW input, channel
counts no block size divides, an unknown activation, and (below opset 8,
without ``Expand``) a ``ReorderInput`` whose channel count is unknown at
load time (it is padded with zeros shaped at run time; a known count gets a
static ``Pad``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .._errors import ModelLoadError

__all__ = ["NCHWC_DOMAIN", "expand_nchwc"]

NCHWC_DOMAIN = "com.microsoft.nchwc"
#: onnx ops that mean the same on the unblocked padded form (elementwise)
_ELEMENTWISE = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip", "HardSigmoid", "Elu",
                "Selu", "Softplus", "Softsign", "HardSwish", "Neg", "Abs", "Exp", "Identity",
                "Add", "Sum", "Mul", "Sub", "Div", "Max", "Min", "Mean"}
_BINARY = {"Add", "Sum", "Mul", "Sub", "Div", "Max", "Min", "Mean"}


def _host_block() -> int:
    try:
        import llvmlite.binding as ll
        return 16 if ll.get_host_cpu_features().get("avx512f", False) else 8
    except Exception:  # no llvmlite: the AVX2 block
        return 8


class _Expander:
    def __init__(self, model: ir.Model, name: str):
        self.model, self.graph, self.name = model, model.graph, name
        imports = model.opset_imports
        self.opset = int(imports.get("", imports.get("ai.onnx", 1)))
        self.blocked: set[ir.Value] = set()
        self.unblocked_weights: dict[tuple[int, bool], ir.Value] = {}
        self.count = 0

    # ------------------------------------------------------------ helpers
    def fail(self, node: ir.Node, why: str) -> ModelLoadError:
        return ModelLoadError(f"NCHWc ({NCHWC_DOMAIN}) file saved at ORT_ENABLE_ALL: {why}",
                              model=self.name, node=node.name or node.op_type)

    def fresh(self, base: str) -> str:
        self.count += 1
        return f"{base}__nchwc{self.count}"

    def const(self, arr: np.ndarray, base: str) -> ir.Value:
        v = ir.Value(name=self.fresh(base), const_value=ir.tensor(arr),
                     type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                     shape=ir.Shape(arr.shape))
        self.graph.register_initializer(v)
        return v

    def node(self, out: list, op: str, ins: list, base: str, **attrs) -> ir.Value:
        n = ir.Node("", op, ins, attributes=[ir.convenience.convert_attribute(k, v)
                                              for k, v in attrs.items()],
                    num_outputs=1, name=self.fresh(base))
        n.outputs[0].name = self.fresh(base)
        out.append(n)
        return n.outputs[0]

    # ------------------------------------------------------------ ops
    def block_size(self, nodes: list[ir.Node]) -> int:
        counts = []
        for n in nodes:
            if n.op_type == "Conv" and len(n.inputs) > 1 and n.inputs[1] is not None:
                w = n.inputs[1].const_value
                if w is None or len(w.shape) < 3:
                    raise self.fail(n, "the filter is not a constant of rank >= 3")
                counts.append(int(w.shape[0]))
        fits = [b for b in (16, 8) if all(c % b == 0 for c in counts)]
        if not fits:
            raise self.fail(nodes[0], f"no NCHWc block size (16 or 8) divides the filters' "
                                      f"output channels {sorted(set(counts))}")
        host = _host_block()
        return host if host in fits else fits[0]

    def activation(self, out: list, y: ir.Value, node: ir.Node) -> ir.Value:
        a = node.attributes
        act = a.get_string("activation", None)
        if act is None:
            return y
        params = list(a.get_floats("activation_params", []) or [])
        base = node.name or "conv"
        if act in ("Relu", "Sigmoid", "Tanh"):
            return self.node(out, act, [y], base)
        if act == "LeakyRelu":
            return self.node(out, act, [y], base, alpha=float(params[0] if params else 0.01))
        if act == "HardSigmoid":
            alpha, beta = (params + [0.2, 0.5][len(params):])[:2]
            return self.node(out, act, [y], base, alpha=float(alpha), beta=float(beta))
        if act == "Clip":
            lo, hi = (params + [float("-inf"), float("inf")][len(params):])[:2]
            if self.opset < 11:
                return self.node(out, "Clip", [y], base, min=float(lo), max=float(hi))
            return self.node(out, "Clip", [y, self.const(np.float32(lo), base + "_min"),
                                           self.const(np.float32(hi), base + "_max")], base)
        raise self.fail(node, f"fused activation {act!r} is not one onnxruntime's NCHWc Conv "
                              "fuses (Relu, Sigmoid, Tanh, LeakyRelu, HardSigmoid, Clip)")

    def filter(self, node: ir.Node, w: ir.Value, blocked_in: bool, depthwise: bool) -> ir.Value:
        key = (id(w), blocked_in and not depthwise)
        if key in self.unblocked_weights:
            return self.unblocked_weights[key]
        arr = np.asarray(w.const_value.numpy())
        o, i = int(arr.shape[0]), int(arr.shape[1])
        k = tuple(int(d) for d in arr.shape[2:])
        b = self.block
        flat = arr.reshape(-1)
        if blocked_in and not depthwise:  # OIHWBiBo
            if i % b:
                raise self.fail(node, f"blocked filter with {i} input channels, not a multiple "
                                      f"of the block {b}")
            blk = flat.reshape((o // b, i // b) + k + (b, b))
            nk = len(k)
            perm = (0, 3 + nk, 1, 2 + nk) + tuple(range(2, 2 + nk))
            out = blk.transpose(perm).reshape(arr.shape)
        else:  # OIHWBo
            blk = flat.reshape((o // b, i) + k + (b,))
            nk = len(k)
            perm = (0, 2 + nk, 1) + tuple(range(2, 2 + nk))
            out = blk.transpose(perm).reshape(arr.shape)
        v = self.const(np.ascontiguousarray(out), (w.name or "w") + "_oihw")
        self.unblocked_weights[key] = v
        return v

    def conv(self, node: ir.Node, out: list) -> ir.Value:
        a = node.attributes
        x, w = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        total = node.inputs[3] if len(node.inputs) > 3 else None
        group = int(a.get_int("group", 1))
        wshape = w.const_value.shape
        depthwise = group > 1 and int(wshape[1]) == 1
        blocked_in = x in self.blocked
        if group > 1 and not depthwise and not blocked_in:
            raise self.fail(node, f"grouped convolution (group={group}) of a plain input")
        attrs = {}
        for key in ("auto_pad", "kernel_shape", "dilations", "strides", "pads"):
            if key in a:
                attrs[key] = a[key].value
        if depthwise:
            attrs["group"] = int(wshape[0])  # every padded channel its own group
        elif group > 1:  # the groups' channels are whole blocks: OIHWBiBo per group
            attrs["group"] = group
        ins = [x, self.filter(node, w, blocked_in, depthwise)]
        if bias is not None:
            ins.append(bias)
        y = self.node(out, "Conv", ins, node.name or "conv", **attrs)
        if total is not None:
            y = self.node(out, "Add", [y, total], node.name or "conv")
        return self.activation(out, y, node)

    def pool(self, node: ir.Node, out: list) -> ir.Value:
        op = node.op_type
        if op.startswith("Global"):
            return self.node(out, op, [node.inputs[0]], node.name or op)
        a = node.attributes
        keep = ["auto_pad", "kernel_shape", "pads", "strides"]
        keep += ["storage_order"] if op == "MaxPool" else ["count_include_pad"]
        attrs = {k: a[k].value for k in keep if k in a}
        # attributes onnx added later: kept where set, refused below their opset
        since = {"ceil_mode": 10, "dilations": 10 if op == "MaxPool" else 19}
        for k, first in since.items():
            if k not in a:
                continue
            val = a[k].value
            default = val == 0 if k == "ceil_mode" else all(int(d) == 1 for d in val)
            if default:
                continue
            if self.opset < first:
                raise self.fail(node, f"{op} {k}={val} needs onnx opset >= {first}")
            attrs[k] = val
        return self.node(out, op, [node.inputs[0]], node.name or op, **attrs)

    def upsample(self, node: ir.Node, out: list) -> ir.Value:
        a = node.attributes
        scales = [float(s) for s in a.get_ints("scales", [])]
        mode = a.get_string("mode", "nearest")
        if len(scales) != 4:
            raise self.fail(node, f"Upsample scales {scales} (four expected)")
        sc = np.array(scales, np.float32)
        x, base = node.inputs[0], node.name or "upsample"
        if self.opset >= 11:
            ctm = a.get_string("coordinate_transformation_mode", "asymmetric")
            attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
            if mode == "nearest":
                attrs["nearest_mode"] = "floor"
            return self.node(out, "Resize", [x, None, self.const(sc, base + "_scales")], base,
                             **attrs)
        if a.get_string("coordinate_transformation_mode", "asymmetric") != "asymmetric":
            raise self.fail(node, "a non-asymmetric Upsample needs onnx opset >= 11")
        if self.opset == 10:
            return self.node(out, "Resize", [x, self.const(sc, base + "_scales")], base, mode=mode)
        if self.opset == 9:
            return self.node(out, "Upsample", [x, self.const(sc, base + "_scales")], base,
                             mode=mode)
        return self.node(out, "Upsample", [x], base, mode=mode, scales=scales)

    def reorder_input(self, node: ir.Node, out: list) -> ir.Value:
        x, base = node.inputs[0], node.name or "reorder_input"
        last = bool(node.attributes.get_int("channels_last", 0))
        c = None
        if x.shape is not None and len(x.shape) == 4:
            d = x.shape[3 if last else 1]
            c = d if isinstance(d, int) else None
        if last:
            x = self.node(out, "Transpose", [x], base, perm=[0, 3, 1, 2])
        b = self.block
        if c is not None:
            extra = (-c) % b
            if not extra:
                return self.node(out, "Identity", [x], base)
            pads = [0, 0, 0, 0, 0, extra, 0, 0]
            if self.opset < 11:
                return self.node(out, "Pad", [x], base, pads=pads, mode="constant")
            return self.node(out, "Pad", [x, self.const(np.int64(pads), base + "_pads")], base)
        if self.opset < 8:
            raise self.fail(node, "the input's channel count is unknown at load time and "
                                  "onnx opset < 8 has no Expand to shape the padding")
        # [x, zeros (N, C_pad - C, H, W)] along the channels, shaped at run
        # time: C_pad = (C + B - 1) / B * B (int64 Div/Mul/Add/Sub, Expand: opset 8)
        shape = self.node(out, "Shape", [x], base)
        pick = lambda idx, tag: self.node(  # noqa: E731
            out, "Gather", [shape, self.const(np.int64(idx), base + tag)], base, axis=0)
        c = pick([1], "_c")
        bv = self.const(np.int64([b]), base + "_block")
        up = self.node(out, "Mul", [self.node(out, "Div", [self.node(out, "Add", [
            c, self.const(np.int64([b - 1]), base + "_b1")], base), bv], base), bv], base)
        extra = self.node(out, "Sub", [up, c], base)
        zshape = self.node(out, "Concat", [pick([0], "_n"), extra, pick([2, 3], "_hw")], base,
                           axis=0)
        zeros = self.node(out, "Expand", [self.const(np.zeros((1, 1, 1, 1), np.float32),
                                                     base + "_zero"), zshape], base)
        return self.node(out, "Concat", [x, zeros], base, axis=1)

    def reorder_output(self, node: ir.Node, out: list) -> ir.Value:
        x, base = node.inputs[0], node.name or "reorder_output"
        a = node.attributes
        channels = a.get_int("channels", None)
        if channels is None:
            raise self.fail(node, "ReorderOutput without its channels attribute")
        y = x
        if int(channels) % self.block:
            if self.opset < 10:
                y = self.node(out, "Slice", [x], base, starts=[0], ends=[int(channels)], axes=[1])
            else:
                y = self.node(out, "Slice", [x, self.const(np.int64([0]), base + "_s"),
                                             self.const(np.int64([channels]), base + "_e"),
                                             self.const(np.int64([1]), base + "_a")], base)
        if a.get_int("channels_last", 0):
            y = self.node(out, "Transpose", [y], base, perm=[0, 2, 3, 1])
        elif y is x:
            y = self.node(out, "Identity", [x], base)
        return y

    # ------------------------------------------------------------ driver
    def run(self) -> None:
        graph = self.graph
        nchwc = [n for n in graph if n.domain == NCHWC_DOMAIN]
        self.block = self.block_size(nchwc)
        for node in list(graph):
            if node.domain != NCHWC_DOMAIN:
                if any(v in self.blocked for v in node.inputs if v is not None):
                    self.check_blocked_onnx(node)
                    for v in node.outputs:  # the saved type is the blocked one's
                        if v is not None:
                            v.type = v.shape = None
                            self.blocked.add(v)
                continue
            out: list[ir.Node] = []
            op = node.op_type
            if op == "Conv":
                y = self.conv(node, out)
            elif op in ("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"):
                y = self.pool(node, out)
            elif op == "Upsample":
                y = self.upsample(node, out)
            elif op == "ReorderInput":
                y = self.reorder_input(node, out)
            elif op == "ReorderOutput":
                y = self.reorder_output(node, out)
            else:
                raise self.fail(node, f"unknown NCHWc op {op!r}")
            old = node.outputs[0]
            ir.convenience.replace_all_uses_with([old], [y], replace_graph_outputs=True)
            graph.insert_after(node, out)
            graph.remove(node, safe=True)
            y.name = old.name
            if op == "ReorderOutput":  # plain again: the saved type is right
                y.type, y.shape = old.type, old.shape
            else:
                self.blocked.add(y)
        for name in [k for k, v in graph.initializers.items() if not v.uses()
                     and v not in graph.outputs]:
            graph.initializers.pop(name)
        imports = self.model.opset_imports
        imports.pop(NCHWC_DOMAIN, None)

    def check_blocked_onnx(self, node: ir.Node) -> None:
        op = node.op_type
        ins = [v for v in node.inputs if v is not None]
        if node.domain in ("", "ai.onnx") and op in _ELEMENTWISE:
            if op in _BINARY and not all(v in self.blocked for v in ins):
                raise self.fail(node, f"{op} of a blocked tensor and a plain one")
            return
        if node.domain in ("", "ai.onnx") and op == "Concat" and \
                node.attributes.get_int("axis", 0) == 1 and all(v in self.blocked for v in ins):
            return
        raise self.fail(node, f"{op} reads a tensor in the NCHWc layout")


def expand_nchwc(model: ir.Model, name: str) -> None:
    """Rewrite ``model``'s com.microsoft.nchwc nodes into standard onnx ops,
    in place (see the module docstring). Does nothing without such nodes.

    Raises:
        ModelLoadError: a construct the rewrite cannot express (named node).
    """
    if not any(n.domain == NCHWC_DOMAIN for n in model.graph):
        return
    _Expander(model, name).run()
