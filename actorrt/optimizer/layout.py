"""Layout pass: chains of convolutions and pools on 16-channel blocks (NCHWc).

:func:`nchwc_layout` (level 99, ``ORT_ENABLE_ALL``; onnxruntime's NCHWc
transformer does the same at its "all" level). The CPU provider's blocked
kernels form 16-channel blocks from NCHW input on every call and transpose
their output back; inside a chain those transposes are wasted work (in a
MobileNet-style model, as much as the depthwise convolutions themselves).

Pre: a float32 2-D ``Conv`` / ``com.microsoft:FusedConv`` with a constant
weight, static shapes, an epilogue of none / Relu / LeakyRelu / Clip, and
shapes the blocked kernels take (:func:`actorrt.providers.cpu.nchwc.conv_kind`);
or a 2-D ``MaxPool`` / ``AveragePool`` with static shapes, ``ceil_mode`` 0
(MaxPool: its ``Indices`` output unused; AveragePool: dilations 1); or a
``Concat`` along the channels of values of multiples of 16 channels; or an
``ai.actorrt:ChannelAffine`` (a folded BatchNormalization, densenet's
pre-activation) with an epilogue of none / Relu / LeakyRelu / Clip; or a
GlobalAveragePool / ReduceMean over H and W (a chain's end: it reads the
blocks and writes its NCHW result). Such
nodes are rewritten by connected groups (linked by the values they would
read as blocks) holding at least :data:`MIN_CONVS` convolutions: a lone
convolution keeps its own per-call blocking, pools, Concats and affines
alone stay NCHW.

Post: each rewritten node is an ``ai.actorrt:NchwcConv`` / ``NchwcPool`` /
``NchwcAffine`` (:mod:`actorrt.providers.cpu.nchwc`) or a ``Concat`` along the blocks' axis 1,
whose output is the blocked value
``<name>/nchwc`` of shape ``(N, ceil(C/16), H, W, 16)``; a blocked input
whose producer was not rewritten comes from one ``ai.actorrt:ReorderInput``
per value, and every original value that something else reads (or a graph
output) is rebuilt under its own name by one ``ai.actorrt:ReorderOutput``
right after its producer. Results equal the NCHW kernels' (the same tiles
and sums).
"""

from __future__ import annotations

import numpy as np

from .. import _dtypes
from ..providers._contract import NodeSpec, ValueType
from ._graph import OptContext

__all__ = ["nchwc_layout"]

ENGINE = "ai.actorrt"
_F32 = int(_dtypes.from_numpy_dtype(np.dtype(np.float32)))
_POOLS = ("MaxPool", "AveragePool")
#: convolutions a connected group of blocked nodes needs to be rewritten
MIN_CONVS = 2


def _static(ctx: OptContext, name: str) -> tuple | None:
    """``name``'s shape when it is a float32 tensor whose dims past the first
    are known ints (the batch may be symbolic: the kernels plan per run)."""
    t = ctx.types.get(name)
    if t is None or t.kind != "tensor" or t.dtype != _F32 or t.shape is None or not t.shape:
        return None
    rest = t.shape[1:]
    if any(not isinstance(d, (int, np.integer)) or d < 1 for d in rest):
        return None
    n = t.shape[0]
    if isinstance(n, (int, np.integer)):
        if n < 1:
            return None
        n = int(n)
    elif not isinstance(n, str):
        return None
    return (n,) + tuple(int(d) for d in rest)


def _conv_kind(ctx: OptContext, s: NodeSpec, nc) -> str | None:
    if not ((s.op_type == "Conv" and s.domain == "") or
            (s.op_type == "FusedConv" and s.domain == "com.microsoft")):
        return None
    if len(s.inputs) < 2 or not s.outputs or len([o for o in s.outputs if o]) != 1:
        return None
    w = ctx.const(s.inputs[1])
    xs, ys = _static(ctx, s.inputs[0]), _static(ctx, s.outputs[0])
    if w is None or w.dtype != np.float32 or w.ndim != 4 or xs is None or ys is None:
        return None
    if len(s.inputs) > 2 and s.inputs[2] and ctx.const(s.inputs[2]) is None:
        return None
    has_z = s.op_type == "FusedConv" and len(s.inputs) > 3 and bool(s.inputs[3])
    if has_z and _static(ctx, s.inputs[3]) != ys:
        return None
    act = s.attr("activation", b"") if s.op_type == "FusedConv" else ""
    act = act.decode() if isinstance(act, bytes) else str(act)
    try:
        kernel, strides, _, out, _, _ = nc.node_geometry(s, xs, w.shape)
    except ValueError:
        return None
    if tuple(kernel) != tuple(w.shape[2:]) or (ys[0], w.shape[0]) + tuple(out) != ys:
        return None
    return nc.conv_kind(xs, w.shape, int(s.attr("group", 1)), out, strides, act,
                        s.attr("activation_params"), has_z)


def _pool_ok(ctx: OptContext, s: NodeSpec, nc) -> bool:
    if s.op_type not in _POOLS or s.domain != "" or not s.outputs:
        return False
    if any(ctx.used(o) for o in s.outputs[1:]):
        return False
    xs, ys = _static(ctx, s.inputs[0]), _static(ctx, s.outputs[0])
    ks = s.attr("kernel_shape")
    if xs is None or ys is None or len(xs) != 4 or not ks or len(ks) != 2:
        return False
    if int(s.attr("ceil_mode", 0)) or int(s.attr("storage_order", 0)):
        return False
    dil = tuple(s.attr("dilations") or (1, 1))
    if s.op_type == "AveragePool" and dil != (1, 1):
        return False
    try:
        _, _, _, out, _, _ = nc.node_geometry(s, xs, (0, 0) + tuple(ks))
    except ValueError:
        return False
    return (xs[0], xs[1]) + tuple(out) == ys and nc.pool_applies(xs, out)


def _affine_ok(ctx: OptContext, s: NodeSpec, nc) -> bool:
    """``ai.actorrt:ChannelAffine`` with constant ``a``, ``t`` on a static 4-D
    float32 value, an activation the blocked epilogue has."""
    if s.op_type != "ChannelAffine" or s.domain != ENGINE or len(s.inputs) != 3:
        return False
    xs = _static(ctx, s.inputs[0])
    a, t = ctx.const(s.inputs[1]), ctx.const(s.inputs[2])
    if xs is None or len(xs) != 4 or a is None or t is None or a.size != xs[1] or \
            t.size != xs[1] or _static(ctx, s.outputs[0]) != xs:
        return False
    act = s.attr("activation", b"")
    act = act.decode() if isinstance(act, bytes) else str(act)
    return nc.affine_applies(xs, act, s.attr("activation_params"))


def _global_mean(ctx: OptContext, s: NodeSpec) -> int | None:
    """``keepdims`` (1 / 0) of a GlobalAveragePool, or of a ReduceMean over
    exactly axes 2 and 3, of a static 4-D float32 value; else None."""
    if s.domain != "" or len(s.outputs) != 1 or not s.inputs:
        return None
    xs = _static(ctx, s.inputs[0])
    if xs is None or len(xs) != 4 or xs[2] * xs[3] < 1:
        return None
    if s.op_type == "GlobalAveragePool":
        return 1
    if s.op_type != "ReduceMean":
        return None
    if len(s.inputs) > 1 and s.inputs[1]:
        axes = ctx.const(s.inputs[1])
        axes = None if axes is None else [int(a) for a in axes.reshape(-1)]
    else:
        axes = s.attr("axes")
        axes = None if axes is None else [int(a) for a in axes]
    if axes is None or sorted(a % 4 for a in axes) != [2, 3]:
        return None
    return int(s.attr("keepdims", 1))


def _concat_ok(ctx: OptContext, s: NodeSpec) -> bool:
    """A channel Concat of 4-D static float32 values, each a multiple of 16
    channels (blocks concatenated along axis 1 are the blocked result)."""
    if s.op_type != "Concat" or s.domain != "" or len(s.outputs) != 1 or len(s.inputs) < 2:
        return False
    ys = _static(ctx, s.outputs[0])
    if ys is None or len(ys) != 4 or int(s.attr("axis", 0)) not in (1, -3):
        return False
    for v in s.inputs:
        xs = _static(ctx, v) if v else None
        if xs is None or len(xs) != 4 or xs[1] % 16 or xs[2] * xs[3] < 16:
            return False
    return True


def nchwc_layout(ctx: OptContext) -> None:
    """Chains of blocked-kernel convolutions and pools -> NCHWc ops (module
    docstring)."""
    if not any(s.op_type in ("Conv", "FusedConv") for s in ctx.specs):
        return  # (and numba stays unloaded for models without convolutions)
    from ..providers.cpu import nchwc as nc
    if not nc.available():
        return
    kind: dict[int, str] = {}
    for s in ctx.specs:
        k = _conv_kind(ctx, s, nc)
        if k is None and _pool_ok(ctx, s, nc):
            k = "pool"
        if k is None and _concat_ok(ctx, s):
            k = "concat"
        if k is None and _affine_ok(ctx, s, nc):
            k = "affine"
        if k is None and _global_mean(ctx, s) is not None:
            k = "mean"
        if k is not None:
            kind[id(s)] = k
    if not kind:
        return

    def blocked_inputs(s: NodeSpec) -> list[str]:
        """The values ``s`` reads as blocks (X unless a stem; Z)."""
        k = kind[id(s)]
        if k == "concat":
            return list(s.inputs)
        ins = [] if k == "stem" else [s.inputs[0]]
        if k in ("conv", "depthwise", "stem") and len(s.inputs) > 3 and s.inputs[3]:
            ins.append(s.inputs[3])
        return ins

    # keep the connected groups (edges: blocked values) with at least two
    # convolutions: a lone one, or pools and Concats alone, gain nothing
    by_id = {id(s): s for s in ctx.specs if id(s) in kind}
    parent = {i: i for i in by_id}

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, s in by_id.items():
        for v in blocked_inputs(s):
            p = ctx.producer.get(v)
            if p is not None and id(p) in by_id:
                parent[root(i)] = root(id(p))
    convs: dict[int, int] = {}
    for i in by_id:
        if kind[i] not in ("pool", "concat", "affine", "mean"):
            convs[root(i)] = convs.get(root(i), 0) + 1
    for i in list(by_id):
        if convs.get(root(i), 0) < MIN_CONVS:
            del kind[i]
    if not kind:
        return

    blocked: dict[str, str] = {}  # NCHW value -> its blocked value
    out: list[NodeSpec] = []
    for s in ctx.specs:
        if id(s) not in kind:
            out.append(s)
            continue
        k = kind[id(s)]
        for v in blocked_inputs(s):
            if v in blocked:
                continue
            shape = _static(ctx, v)
            b = _name(ctx, v)
            ctx.types[b] = ValueType("tensor", _F32, _blocked_shape(shape))
            out.append(ctx.make(s, "ReorderInput", ENGINE, [v], [b], {},
                                name=f"{v}/reorder_input", opset=1))
            blocked[v] = b
        y = s.outputs[0]
        if k == "mean":  # reads blocks, writes its NCHW result under its own name
            xs = _static(ctx, s.inputs[0])
            new = ctx.make(s, "NchwcGlobalAveragePool", ENGINE, [blocked[s.inputs[0]]], [y],
                           {"channels": xs[1], "keepdims": _global_mean(ctx, s)}, opset=1)
            out.append(new)
            ctx.fusions.append((new.name, (s.name,)))
            continue
        ys = _static(ctx, y)
        yb = _name(ctx, y)
        ctx.types[yb] = ValueType("tensor", _F32, _blocked_shape(ys))
        if k == "concat":  # ONNX Concat along the blocks' axis 1
            new = ctx.make(s, "Concat", "", [blocked[v] for v in s.inputs], [yb], {"axis": 1})
            out.append(new)
            blocked[y] = yb
            _reorder_output(ctx, s, y, yb, ys, kind, blocked_inputs, out)
            continue
        xs = _static(ctx, s.inputs[0])
        attrs = {key: val for key, val in s.attrs.items() if key not in ("storage_order",)}
        attrs["channels"] = xs[1]
        if k == "affine":
            new = ctx.make(s, "NchwcAffine", ENGINE, [blocked[s.inputs[0]]] + list(s.inputs[1:]),
                           [yb], attrs, opset=1)
        elif k == "pool":
            attrs["mode"] = "max" if s.op_type == "MaxPool" else "avg"
            new = ctx.make(s, "NchwcPool", ENGINE, [blocked[s.inputs[0]]], [yb], attrs, opset=1)
        else:
            ins = list(s.inputs[:4])
            if k == "stem":
                attrs["input_layout"] = "NCHW"
            else:
                ins[0] = blocked[ins[0]]
            if len(ins) > 3 and ins[3]:
                ins[3] = blocked[ins[3]]
            new = ctx.make(s, "NchwcConv", ENGINE, ins, [yb], attrs, opset=1)
        out.append(new)
        ctx.fusions.append((new.name, (s.name,)))
        blocked[y] = yb
        _reorder_output(ctx, s, y, yb, ys, kind, blocked_inputs, out)
    ctx.specs = out
    ctx.reindex()


def _reorder_output(ctx: OptContext, s: NodeSpec, y: str, yb: str, ys, kind, blocked_inputs,
                    out: list) -> None:
    """``ReorderOutput(yb) -> y`` after ``s`` where anything reads ``y`` as NCHW
    (or ``y`` is a graph output)."""
    readers = ctx.consumers.get(y, [])
    if y in ctx.protected or any(id(r) not in kind or y not in blocked_inputs(r)
                                 for r in readers):
        out.append(ctx.make(s, "ReorderOutput", ENGINE, [yb], [y], {"channels": ys[1]},
                            name=f"{y}/reorder_output", opset=1))


def _blocked_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    n, c, h, w = shape
    return (n, -(-c // 16), h, w, 16)


def _name(ctx: OptContext, v: str) -> str:
    """A fresh value name for ``v``'s blocks."""
    name = f"{v}/nchwc"
    while name in ctx.producer or name in ctx.consumers or name in ctx.types:
        name += "_"
    return name
