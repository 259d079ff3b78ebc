"""Convolution and per-channel affine passes.

* :func:`fold_conv_affine` (basic) -- ``Conv -> BatchNormalization`` (inference,
  constant statistics) and ``Conv -> Mul/Add`` by a per-channel constant fold
  into the Conv's weight and bias. Pre: constant float W (and B), the Conv's
  output read only by the folded node; BatchNormalization in inference mode
  with only its first output used. Post: one ``Conv`` with ``W' = W * a``,
  ``B' = B * a + t`` per output channel, writing the folded node's output.
* :func:`fuse_conv_activation` (extended) -- ``Conv [-> Add(Z)] -> act`` into
  ``com.microsoft:FusedConv`` (onnxruntime's contrib op: ``act(conv(X, W) +
  B + Z)``). Pre: float Conv, each intermediate read only by the next node;
  ``Z`` of the same known shape as the Conv's output; ``act`` one of
  :data:`ACTIVATIONS` with constant parameters.
* :func:`fuse_affine_activation` (extended) -- ``BatchNormalization``
  (inference, constants) followed by per-channel ``Mul``/``Add`` constants
  and/or an activation into ``ai.actorrt:ChannelAffine`` (``act(x * a[c] +
  t[c])``). Pre: as above; at least one node absorbed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..providers._contract import NodeSpec
from ._graph import OptContext

__all__ = ["fold_conv_affine", "fuse_conv_activation", "fuse_affine_activation",
           "activation_of", "ACTIVATIONS", "ENGINE_DOMAIN"]

ENGINE_DOMAIN = "ai.actorrt"
MS = "com.microsoft"
#: activations an epilogue applies (onnxruntime FusedConv's names)
ACTIVATIONS = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid")


def activation_of(ctx: OptContext, s: NodeSpec | None, x: str) -> tuple[str, list[float]] | None:
    """``(activation, params)`` when ``s`` is an activation of ``x`` whose
    parameters are known at plan time (FusedConv's ``activation_params``)."""
    if s is None or s.domain != "" or s.op_type not in ACTIVATIONS or not s.inputs or s.inputs[0] != x:
        return None
    if len([o for o in s.outputs if o]) != 1:
        return None
    op = s.op_type
    if op == "LeakyRelu":
        return op, [float(s.attr("alpha", 0.01))]
    if op == "HardSigmoid":
        return op, [float(s.attr("alpha", 0.2)), float(s.attr("beta", 0.5))]
    if op == "Clip":
        if s.opset < 11:
            return op, [float(s.attr("min", -3.4028234663852886e38)),
                        float(s.attr("max", 3.4028234663852886e38))]
        bounds = []
        for i, default in ((1, -3.4028234663852886e38), (2, 3.4028234663852886e38)):
            if not s.has_input(i):
                bounds.append(default)
                continue
            c = ctx.const(s.inputs[i])
            if c is None or c.size != 1:
                return None
            bounds.append(float(c.reshape(-1)[0]))
        return op, bounds
    if len([i for i in s.inputs if i]) != 1:
        return None
    return op, []


def _channel_vector(c: np.ndarray | None, rank: int | None, m: int) -> np.ndarray | None:
    """``c`` as a length-``m`` vector when it broadcasts against an
    ``(N, M, *spatial)`` tensor of ``rank`` along the channel axis only."""
    if c is None or rank is None or c.ndim > rank or c.dtype.kind != "f":
        return None
    shape = (1,) * (rank - c.ndim) + c.shape
    if shape[0] != 1 or shape[1] not in (1, m) or any(d != 1 for d in shape[2:]):
        return None
    return np.broadcast_to(c.reshape(-1), (m,)) if c.size == 1 else c.reshape(m)


def _bn_affine(ctx: OptContext, bn: NodeSpec) -> tuple[np.ndarray, np.ndarray] | None:
    """``(a, t)`` with ``BN(x) = x * a + t`` per channel, for an inference-mode
    BatchNormalization with constant parameters and one used output."""
    if bn.op_type != "BatchNormalization" or bn.domain != "" or len(bn.inputs) < 5:
        return None
    if bn.opset >= 14 and bn.attr("training_mode", 0):
        return None
    if bn.opset < 7 and int(bn.attr("spatial", 1)) != 1:
        return None
    if not ctx.only_first_output_used(bn):
        return None
    p = [ctx.const(n) for n in bn.inputs[1:5]]
    if any(v is None or v.ndim != 1 for v in p) or len({v.shape for v in p}) != 1:
        return None
    scale, b, mean, var = (v.astype(np.float64) for v in p)
    a = scale / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
    return a, b - mean * a


def _affine_step(ctx: OptContext, r: NodeSpec | None, x: str, m: int, rank: int | None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """``(mul, add)`` vectors when ``r`` is a per-channel constant Mul / Add /
    BatchNormalization of ``x``."""
    if r is None or r.domain != "":
        return None
    if r.op_type == "BatchNormalization" and r.inputs[0] == x:
        if ctx.rank(x) is not None and ctx.rank(x) < 2:
            return None
        ab = _bn_affine(ctx, r)
        return ab if ab is not None and ab[0].shape == (m,) else None
    if r.op_type in ("Mul", "Add") and len(r.inputs) == 2:
        other = r.inputs[1] if r.inputs[0] == x else r.inputs[0]
        vec = _channel_vector(ctx.const(other), rank, m)
        if vec is None:
            return None
        vec = vec.astype(np.float64)
        if r.op_type == "Mul":
            return vec, np.zeros(m)
        return np.ones(m), vec
    return None


def _affine_chain(ctx: OptContext, head: NodeSpec, a_tot: np.ndarray, t_tot: np.ndarray,
                  m: int, rank: int | None):
    """Walk the per-channel affine nodes (``_affine_step``) that follow
    ``head``, each the sole reader of the one before, composing them onto
    ``y = a_tot * x + t_tot``. Returns ``(members, out, a_tot, t_tot)``:
    ``head`` and the nodes taken, the last one's output, the composed affine."""
    members, out = [head], head.outputs[0]
    while True:
        r = ctx.sole_reader(out)
        step = _affine_step(ctx, r, out, m, rank)
        if step is None:
            return members, out, a_tot, t_tot
        a, t = step
        a_tot, t_tot = a_tot * a, t_tot * a + t
        members.append(r)
        out = r.outputs[0]


def fold_conv_affine(ctx: OptContext) -> None:
    """Fold per-channel affine nodes after a Conv into its weight and bias."""
    for conv in list(ctx.specs):
        if conv.op_type != "Conv" or conv.domain != "" or conv not in ctx.specs:
            continue
        w = ctx.const(conv.inputs[1]) if len(conv.inputs) > 1 else None
        if w is None or w.dtype not in (np.float32, np.float64) or w.ndim < 3:
            continue
        has_b = conv.has_input(2)
        b = ctx.const(conv.inputs[2]) if has_b else None
        if has_b and b is None:
            continue
        m = w.shape[0]
        rank = ctx.rank(conv.outputs[0]) or ctx.rank(conv.inputs[0]) or w.ndim
        a_tot, t_tot = np.ones(m), (b.astype(np.float64) if b is not None else np.zeros(m))
        members, out, a_tot, t_tot = _affine_chain(ctx, conv, a_tot, t_tot, m, rank)
        if len(members) == 1:
            continue
        shape = (m,) + (1,) * (w.ndim - 1)
        w2 = ctx.add_const(conv.inputs[1] + "/folded", (w.astype(np.float64) * a_tot.reshape(shape)).astype(w.dtype))
        b2 = ctx.add_const(conv.name + "/bias_folded", t_tot.astype(w.dtype))
        new = ctx.make(conv, "Conv", "", [conv.inputs[0], w2, b2], [out], conv.attrs)
        ctx.replace(members, new)


def fuse_conv_activation(ctx: OptContext) -> None:
    """``Conv [+ Add(Z)] + activation`` -> ``com.microsoft:FusedConv``."""
    for conv in list(ctx.specs):
        if conv.op_type != "Conv" or conv.domain != "" or conv not in ctx.specs:
            continue
        y = conv.outputs[0]
        if not ctx.is_float(conv.inputs[0]):
            continue
        r = ctx.sole_reader(y)
        members, z = [conv], ""
        if r is not None and r.domain == "" and r.op_type in ("Add", "Sum") and \
                len(r.inputs) == 2 and len(r.outputs) == 1:
            other = r.inputs[1] if r.inputs[0] == y else r.inputs[0]
            ty, tz = ctx.types.get(y), ctx.types.get(other)
            if other != y and ty is not None and tz is not None and ty.shape is not None and \
                    ty.shape == tz.shape and None not in ty.shape and ty.dtype == tz.dtype:
                act = activation_of(ctx, ctx.sole_reader(r.outputs[0]), r.outputs[0])
                if act is not None:
                    members.append(r)
                    z = other
                    r = ctx.sole_reader(r.outputs[0])
        act = activation_of(ctx, r, members[-1].outputs[0])
        if act is None:
            continue
        members.append(r)
        ins = list(conv.inputs[:3]) + [""] * (3 - len(conv.inputs[:3]))
        if z:
            ins.append(z)
        while ins and not ins[-1]:
            ins.pop()
        at = dict(conv.attrs)
        at["activation"] = act[0]
        if act[1]:
            at["activation_params"] = act[1]
        new = ctx.make(conv, "FusedConv", MS, ins, [r.outputs[0]], at, opset=1)
        ctx.replace(members, new)


def fuse_affine_activation(ctx: OptContext) -> None:
    """BatchNormalization + per-channel Mul/Add + activation -> ChannelAffine."""
    for bn in list(ctx.specs):
        if bn.op_type != "BatchNormalization" or bn not in ctx.specs:
            continue
        ab = _bn_affine(ctx, bn)
        if ab is None or not ctx.is_float(bn.inputs[0]):
            continue
        rank = ctx.rank(bn.inputs[0])
        if rank is None or rank < 2:
            continue
        a_tot, t_tot = ab
        m = a_tot.shape[0]
        members, out, a_tot, t_tot = _affine_chain(ctx, bn, a_tot, t_tot, m, rank)
        at: dict[str, Any] = {}
        act = activation_of(ctx, ctx.sole_reader(out), out)
        if act is not None:
            r = ctx.sole_reader(out)
            members.append(r)
            out = r.outputs[0]
            at = {"activation": act[0], "activation_params": act[1]}
        if len(members) == 1:
            continue
        dt = ctx.types[bn.inputs[0]]
        npdt = np.float64 if ctx.const(bn.inputs[1]).dtype == np.float64 and dt.dtype == 11 else np.float32
        an = ctx.add_const(bn.name + "/scale", a_tot.astype(npdt))
        tn = ctx.add_const(bn.name + "/shift", t_tot.astype(npdt))
        new = ctx.make(bn, "ChannelAffine", ENGINE_DOMAIN, [bn.inputs[0], an, tn], [out], at, opset=1)
        ctx.replace(members, new)
