"""Transformer passes (extended level): the patterns PyTorch's exporters emit;
and two basic-level cleanups.

* :func:`eliminate_identities` (basic) -- ``Identity`` and inference
  ``Dropout`` (no training mode, mask unused) removed, their readers reading
  the input. Pre: the output is no graph output and no reader's subgraph
  captures it.

* :func:`fuse_gelu` -- ``x * 0.5 * (1 + Erf(x / sqrt(2)))`` in its exported
  orders (``Div`` by sqrt(2) or ``Mul`` by 1/sqrt(2); the 0.5 applied to ``x``,
  to ``1 + erf`` or last) -> ``com.microsoft:Gelu(x)``. Pre: float ``x``, the
  constants within 1e-6 of theirs, every intermediate read only inside.
* :func:`fuse_attention` -- ``MatMul(q, k) -> Div/Mul(scalar) -> [Add(mask)]
  -> Softmax(last axis) -> MatMul(., v)`` -> ``ai.actorrt:ScaledDotAttention
  (q, k, v[, mask], scale)``; the first product may also be onnxruntime's
  ``com.microsoft:FusedMatMul(q, k)`` (what its optimizer saves: ``alpha``
  joins the scale, ``transB=1`` becomes ``transpose_k=1``; not with
  ``transA`` or the batch transposes); a Transpose swapping the last two
  axes of ``k`` that only the product reads joins too (flips
  ``transpose_k``). Pre: float32, Softmax opset >= 13
  over the last axis, intermediates read only inside. Post: ``softmax(q @ k
  * scale + mask) @ v`` in one kernel.
* :func:`fuse_matmul_epilogue` -- ``MatMul(A, B) -> Add(bias) [-> Gelu | Relu]``
  with a constant ``bias`` over the last axis, or ``MatMul(A, B) ->
  com.microsoft:BiasGelu(., bias)`` (onnxruntime's saved form of the same)
  -> ``ai.actorrt:MatMulEpilogue``;
  ``Gemm -> activation`` -> ``com.microsoft:FusedGemm``. Pre: float, the
  product read only by the Add, bias of N elements and rank <= the product's.
* :func:`fuse_skip_layer_norm` -- ``Add(a, b) -> LayerNormalization(last
  axis)`` with ``a``, ``b`` of the same known shape and constant scale / bias
  -> ``com.microsoft:SkipLayerNormalization`` (its 4th output carries ``a + b``
  when something else reads the sum). Pre: only LayerNormalization's first
  output used; every other reader of the sum runs after the LayerNormalization.
* :func:`fuse_view_pairs` -- ``Transpose(Reshape(x, shape), perm)`` and
  ``Reshape(Transpose(x, perm), shape)`` (a transformer's head split and head
  merge) -> ``ai.actorrt:ReshapeTranspose(x)`` with the shape and perm as
  attributes. Pre: the middle value read only by the second node; a constant
  integer shape (Reshape opset >= 5) without two ``-1`` or entries under
  ``-1``; a known perm. Runs after :func:`fuse_attention` (which takes the
  keys' Transpose first). Post: the same tensor, one node instead of two.

Layout passes (basic level; they run first):

* :func:`cancel_transposes` -- ``Transpose(Transpose(x, p1), p2)`` -> one
  ``Transpose(x, p1[p2])``, or ``Identity(x)`` when the two are inverse.
  Pre: the inner output read only by the outer, both perms known (explicit,
  or the default reversal of a known rank). Post: the same tensor.
* :func:`collapse_reshapes` -- ``Reshape(Reshape(x, s1), s2)`` ->
  ``Reshape(x, s2)``. Pre: the inner output read only by the outer, both
  shapes constant, ``s2`` without ``0`` entries (a ``0`` would copy a dim of
  the intermediate) unless ``allowzero``; the inner reshape is checked valid
  for ``x``'s known static shape when there is one. Post: the same tensor.
* :func:`fold_transpose_into_gemm` -- ``Gemm(Transpose(A), B)`` /
  ``Gemm(A, Transpose(B))`` with 2-D perm ``(1, 0)`` -> ``Gemm`` with
  ``transA`` / ``transB`` flipped; a 2-D ``MatMul(A, Transpose(B))`` ->
  ``Gemm(A, B, transB=1)``. Pre: the Transpose output read only by that
  input; float operands of rank 2. Post: the same product.
"""

from __future__ import annotations

import math

import numpy as np

from ..providers._contract import NodeSpec
from ._graph import OptContext
from .conv import ENGINE_DOMAIN, MS, activation_of

__all__ = ["eliminate_identities", "fuse_gelu", "fuse_attention", "fuse_matmul_epilogue",
           "fuse_skip_layer_norm",
           "fuse_view_pairs", "cancel_transposes", "collapse_reshapes",
           "fold_transpose_into_gemm"]


def _scalar(ctx: OptContext, name: str) -> float | None:
    c = ctx.const(name)
    if c is None or c.size != 1 or c.dtype.kind != "f":
        return None
    return float(c.reshape(-1)[0])


def _binary(s: NodeSpec | None, op: str) -> bool:
    return s is not None and s.domain == "" and s.op_type == op and len(s.inputs) == 2 \
        and len(s.outputs) == 1


def _other(s: NodeSpec, x: str) -> str:
    return s.inputs[1] if s.inputs[0] == x else s.inputs[0]


def _near(v: float | None, want: float) -> bool:
    return v is not None and abs(v - want) <= 1e-6 * max(1.0, abs(want))


def fuse_gelu(ctx: OptContext) -> None:
    """Erf GELU subgraphs -> ``com.microsoft:Gelu``."""
    for erf in list(ctx.specs):
        if erf.op_type != "Erf" or erf.domain != "" or erf not in ctx.specs:
            continue
        pre = ctx.producer.get(erf.inputs[0])
        if pre is None or ctx.sole_reader(pre.outputs[0]) is not erf:
            continue
        if _binary(pre, "Div") and _near(_scalar(ctx, pre.inputs[1]), math.sqrt(2)):
            x = pre.inputs[0]
        elif _binary(pre, "Mul"):
            x = pre.inputs[0] if _near(_scalar(ctx, pre.inputs[1]), 1 / math.sqrt(2)) else (
                pre.inputs[1] if _near(_scalar(ctx, pre.inputs[0]), 1 / math.sqrt(2)) else None)
        else:
            x = None
        if x is None or not ctx.is_float(x):
            continue
        add = ctx.sole_reader(erf.outputs[0])
        if not _binary(add, "Add") or not _near(_scalar(ctx, _other(add, erf.outputs[0])), 1.0):
            continue
        m1 = ctx.sole_reader(add.outputs[0])
        if not _binary(m1, "Mul"):
            continue
        o = _other(m1, add.outputs[0])
        members = [pre, erf, add, m1]
        if o == x:  # (x * (1 + erf)) * 0.5
            m2 = ctx.sole_reader(m1.outputs[0])
            if not _binary(m2, "Mul") or not _near(_scalar(ctx, _other(m2, m1.outputs[0])), 0.5):
                continue
            members.append(m2)
        elif _near(_scalar(ctx, o), 0.5):  # ((1 + erf) * 0.5) * x
            m2 = ctx.sole_reader(m1.outputs[0])
            if not _binary(m2, "Mul") or _other(m2, m1.outputs[0]) != x:
                continue
            members.append(m2)
        else:  # (x * 0.5) * (1 + erf)
            h = ctx.producer.get(o)
            if not _binary(h, "Mul") or ctx.sole_reader(o) is not m1 or \
                    _other(h, x) == x or not _near(_scalar(ctx, _other(h, x)), 0.5) or x not in h.inputs:
                continue
            members.insert(0, h)
        out = members[-1].outputs[0]
        new = ctx.make(erf, "Gelu", MS, [x], [out], {}, name=erf.name + "/gelu", opset=1)
        ctx.replace(members, new)


def fuse_attention(ctx: OptContext) -> None:
    """MatMul-scale-[mask]-Softmax-MatMul -> ``ai.actorrt:ScaledDotAttention``."""
    for mm in list(ctx.specs):
        if mm not in ctx.specs:
            continue
        fused = _fused_matmul_scale(mm)
        if not _binary(mm, "MatMul") and fused is None:
            continue
        q, k = mm.inputs
        if ctx.const(q) is not None or ctx.const(k) is not None:
            continue
        if not all(ctx.types.get(n) is not None and ctx.types[n].dtype == 1 for n in (q, k)):
            continue
        if (ctx.rank(q) or 0) < 2 or (ctx.rank(k) or 0) < 2:
            continue
        members, cur = [mm], mm.outputs[0]
        scale, transpose_k = fused if fused is not None else (1.0, 0)
        r = ctx.sole_reader(cur)
        scaled = True
        if _binary(r, "Div") and r.inputs[0] == cur and _scalar(ctx, r.inputs[1]):
            scale /= _scalar(ctx, r.inputs[1])
        elif _binary(r, "Mul") and _scalar(ctx, _other(r, cur)) is not None:
            scale *= _scalar(ctx, _other(r, cur))
        else:
            scaled = False
        if scaled:
            members.append(r)
            cur = r.outputs[0]
            r = ctx.sole_reader(cur)
        mask = ""
        if _binary(r, "Add"):
            mask = _other(r, cur)
            if mask == cur or ctx.types.get(mask) is None or ctx.types[mask].dtype != 1:
                continue
            members.append(r)
            cur = r.outputs[0]
            r = ctx.sole_reader(cur)
        if r is None or r.op_type != "Softmax" or r.domain != "" or r.opset < 13:
            continue
        rank, axis = ctx.rank(cur), int(r.attr("axis", -1))
        if axis != -1 and (rank is None or axis != rank - 1):  # (unknown after a contrib op)
            continue
        members.append(r)
        cur = r.outputs[0]
        mm2 = ctx.sole_reader(cur)
        if not _binary(mm2, "MatMul") or mm2.inputs[0] != cur or mm2.inputs[1] == cur:
            continue
        v = mm2.inputs[1]
        if ctx.types.get(v) is None or ctx.types[v].dtype != 1:
            continue
        members.append(mm2)
        t = ctx.producer.get(k)
        if _unary(t, "Transpose") and ctx.sole_reader(k) is mm:
            p = _perm(ctx, t)
            r = len(p) if p is not None else 0
            if r >= 2 and p == list(range(r - 2)) + [r - 1, r - 2]:
                # keys transposed only for this product (GPT-2's exports): read them as they are
                k, transpose_k = t.inputs[0], 1 - transpose_k
                members.insert(0, t)
        ins = [q, k, v] + ([mask] if mask else [])
        at = {"scale": float(scale)}
        if transpose_k:
            at["transpose_k"] = 1
        new = ctx.make(mm, "ScaledDotAttention", ENGINE_DOMAIN, ins, [mm2.outputs[0]],
                       at, name=mm.name + "/attention", opset=1)
        ctx.replace(members, new)


def _fused_matmul_scale(s: NodeSpec) -> tuple[float, int] | None:
    """``(alpha, transB)`` of a com.microsoft FusedMatMul that is a plain
    ``alpha * (a @ b)`` or ``alpha * (a @ b^T)`` over the last two axes; None
    for any other node (or a FusedMatMul with ``transA`` / batch transposes)."""
    if s.op_type != "FusedMatMul" or s.domain != MS or len(s.inputs) != 2 or \
            len(s.outputs) != 1:
        return None
    if any(int(s.attr(a, 0)) for a in ("transA", "transBatchA", "transBatchB")):
        return None
    return float(s.attr("alpha", 1.0)), int(bool(s.attr("transB", 0)))


def fuse_matmul_epilogue(ctx: OptContext) -> None:
    """MatMul + bias [+ activation] -> MatMulEpilogue; Gemm + activation -> FusedGemm."""
    for mm in list(ctx.specs):
        if mm not in ctx.specs or mm.domain != "":
            continue
        if mm.op_type == "Gemm" and ctx.is_float(mm.inputs[0]):
            r = ctx.sole_reader(mm.outputs[0])
            act = activation_of(ctx, r, mm.outputs[0])
            if act is None:
                continue
            at = dict(mm.attrs)
            at["activation"] = act[0]
            if act[1]:
                at["activation_params"] = act[1]
            new = ctx.make(mm, "FusedGemm", MS, mm.inputs, [r.outputs[0]], at, opset=1)
            ctx.replace([mm, r], new)
            continue
        if not _binary(mm, "MatMul") or not ctx.is_float(mm.inputs[0]):
            continue
        b = ctx.const(mm.inputs[1])
        if b is None or b.ndim != 2:
            continue
        add = ctx.sole_reader(mm.outputs[0])
        bias_gelu = add is not None and add.op_type == "BiasGelu" and add.domain == MS and \
            len(add.inputs) == 2 and add.inputs[0] == mm.outputs[0] and len(add.outputs) == 1
        if not _binary(add, "Add") and not bias_gelu:
            continue
        bias = ctx.const(_other(add, mm.outputs[0]))
        rank = ctx.rank(mm.outputs[0])
        if bias is None or bias.dtype != b.dtype or bias.size != b.shape[1] or \
                bias.shape[-1:] != (b.shape[1],) or \
                (bias.ndim > 1 and (rank is None or bias.ndim > rank)):
            continue  # (a 1-D bias fits any product; its rank is unknown after a contrib op)
        if bias_gelu and bias.ndim != 1:
            continue
        members, out, at = [mm, add], add.outputs[0], {"activation": ""}
        r = None if bias_gelu else ctx.sole_reader(out)
        if bias_gelu:  # Gelu(a @ b + bias) as one onnxruntime node
            at = {"activation": "Gelu"}
        elif r is not None and r.op_type == "Gelu" and r.domain == MS and r.inputs == (out,):
            members.append(r)
            out = r.outputs[0]
            at = {"activation": "Gelu"}
        elif r is not None and r.op_type == "Relu" and r.domain == "":
            members.append(r)
            out = r.outputs[0]
            at = {"activation": "Relu"}
        bn = ctx.add_const(mm.name + "/bias", np.ascontiguousarray(bias.reshape(-1)))
        new = ctx.make(mm, "MatMulEpilogue", ENGINE_DOMAIN, [mm.inputs[0], mm.inputs[1], bn],
                       [out], at, opset=1)
        ctx.replace(members, new)


def fuse_skip_layer_norm(ctx: OptContext) -> None:
    """Add + LayerNormalization -> ``com.microsoft:SkipLayerNormalization``."""
    for ln in list(ctx.specs):
        if ln.op_type != "LayerNormalization" or ln.domain != "" or ln not in ctx.specs:
            continue
        x = ln.inputs[0]
        rank = ctx.rank(x)
        if rank is None or int(ln.attr("axis", -1)) not in (-1, rank - 1):
            continue
        if not ctx.only_first_output_used(ln) or int(ln.attr("stash_type", 1)) != 1:
            continue
        gamma = ctx.const(ln.inputs[1])
        beta = ctx.const(ln.inputs[2]) if ln.has_input(2) else None
        if gamma is None or gamma.ndim != 1 or (ln.has_input(2) and (beta is None or beta.ndim != 1)):
            continue
        add = ctx.producer.get(x)
        if not _binary(add, "Add"):
            continue
        a, b = add.inputs
        ta, tb = ctx.types.get(a), ctx.types.get(b)
        if ta is None or tb is None or ta.shape is None or ta.shape != tb.shape or ta.dtype != 1 or \
                tb.dtype != 1 or None in ta.shape or ctx.const(a) is not None or ctx.const(b) is not None:
            continue
        others = [r for r in ctx.consumers.get(x, []) if r is not ln]
        pos = {id(s): i for i, s in enumerate(ctx.specs)}
        if any(pos[id(r)] < pos[id(ln)] for r in others) or ln.inputs.count(x) != 1:
            continue
        keep = x if (others or x in ctx.protected) else ""
        ins = [a, b, ln.inputs[1]] + ([ln.inputs[2]] if ln.has_input(2) else [])
        outs = [ln.outputs[0]] + (["", "", keep] if keep else [])
        new = ctx.make(ln, "SkipLayerNormalization", MS, ins, outs,
                       {"epsilon": float(ln.attr("epsilon", 1e-5))}, opset=1)
        ctx.replace([add, ln], new)


# ------------------------------------------------------------------ layout

def _perm(ctx: OptContext, t: NodeSpec) -> list[int] | None:
    """A Transpose's permutation (the default reversal needs a known rank)."""
    p = t.attr("perm")
    if p is not None:
        return [int(v) for v in p]
    r = ctx.rank(t.inputs[0])
    return None if r is None else list(range(r))[::-1]


def _unary(s: NodeSpec | None, op: str) -> bool:
    return s is not None and s.domain == "" and s.op_type == op and len(s.outputs) == 1 \
        and bool(s.inputs) and bool(s.inputs[0])


def _identity_input(ctx: OptContext, s: NodeSpec) -> str | None:
    """The input an ``Identity`` or an inference ``Dropout`` (no training mode,
    its mask unused) passes through, else None."""
    if s.domain != "" or not s.inputs or not s.inputs[0] or not s.outputs or not s.outputs[0]:
        return None
    if s.op_type == "Identity":
        return s.inputs[0]
    if s.op_type != "Dropout" or not ctx.only_first_output_used(s):
        return None
    if len(s.inputs) > 2 and s.inputs[2]:
        mode = ctx.const(s.inputs[2])
        if mode is None or mode.size != 1 or bool(mode.reshape(-1)[0]):
            return None
    return s.inputs[0]


def eliminate_identities(ctx: OptContext) -> None:
    """``Identity`` and inference ``Dropout`` nodes whose output is not a graph
    output: their readers read the input instead (onnxruntime's
    EliminateIdentity / EliminateDropout). Pre: no reader captures the
    output in a subgraph."""
    i = 0
    while i < len(ctx.specs):  # a rewired reader replaces its node: walk the live list
        s = ctx.specs[i]
        i += 1
        x = _identity_input(ctx, s)
        y = s.outputs[0] if x is not None else None
        if x is None or y in ctx.protected or x == y:
            continue
        readers = ctx.consumers.get(y, [])
        if any(y in r.outer_scope or r.outer_scope for r in readers):
            continue
        ids = {id(r) for r in readers}
        out = []
        for r in ctx.specs:
            if r is s:
                continue
            if id(r) in ids:
                r = ctx.make(r, r.op_type, r.domain, [x if v == y else v for v in r.inputs],
                             r.outputs, r.attrs, name=r.name, opset=r.opset)
            out.append(r)
        ctx.specs = out
        ctx.fusions.append((s.name + "/eliminated", (s.name,)))
        ctx.reindex()
        i -= 1  # the node at i was removed


def cancel_transposes(ctx: OptContext) -> None:
    """Transpose pairs -> one Transpose, or Identity when they cancel."""
    for t2 in list(ctx.specs):
        if not _unary(t2, "Transpose") or t2 not in ctx.specs:
            continue
        t1 = ctx.producer.get(t2.inputs[0])
        if not _unary(t1, "Transpose") or ctx.sole_reader(t1.outputs[0]) is not t2:
            continue
        p1, p2 = _perm(ctx, t1), _perm(ctx, t2)
        if p1 is None or p2 is None or len(p1) != len(p2) or sorted(p1) != list(range(len(p1))) \
                or sorted(p2) != list(range(len(p2))):
            continue
        p = [p1[i] for i in p2]
        x = t1.inputs[0]
        if p == list(range(len(p))):
            new = ctx.make(t2, "Identity", "", [x], [t2.outputs[0]], {},
                           name=t2.name + "/cancelled")
        else:
            new = ctx.make(t2, "Transpose", "", [x], [t2.outputs[0]], {"perm": p},
                           name=t2.name + "/merged")
        ctx.replace([t1, t2], new)


def _reshape_ok(shape_in: tuple, target: np.ndarray, allowzero: bool) -> bool:
    """Whether reshaping a static ``shape_in`` to ``target`` is valid."""
    dims = [int(d) for d in target.reshape(-1)]
    out, infer = [], -1
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(shape_in):
                return False
            d = shape_in[i]
        elif d == -1:
            if infer >= 0:
                return False
            infer = i
        elif d < 0:
            return False
        out.append(d)
    total = math.prod(shape_in)
    if infer >= 0:
        known = math.prod(d for i, d in enumerate(out) if i != infer)
        return known != 0 and total % known == 0
    return math.prod(out) == total


def collapse_reshapes(ctx: OptContext) -> None:
    """Reshape chains -> one Reshape."""
    for r2 in list(ctx.specs):
        if r2 not in ctx.specs or r2.domain != "" or r2.op_type != "Reshape" or \
                len(r2.inputs) != 2 or r2.opset < 5:
            continue
        r1 = ctx.producer.get(r2.inputs[0])
        if r1 is None or r1.domain != "" or r1.op_type != "Reshape" or len(r1.inputs) != 2 or \
                r1.opset < 5 or ctx.sole_reader(r1.outputs[0]) is not r2:
            continue
        s1, s2 = ctx.const(r1.inputs[1]), ctx.const(r2.inputs[1])
        if s1 is None or s2 is None or s1.dtype.kind != "i" or s2.dtype.kind != "i":
            continue
        z2 = bool(r2.attr("allowzero", 0))
        if not z2 and np.any(s2 == 0):
            continue
        t = ctx.types.get(r1.inputs[0])
        if t is not None and t.shape is not None and all(isinstance(d, int) for d in t.shape):
            if not _reshape_ok(tuple(t.shape), s1, bool(r1.attr("allowzero", 0))):
                continue  # keep the inner node: it fails at run time, as it should
        elif np.any(s1 < -1) or np.count_nonzero(s1 == -1) > 1:
            continue
        new = ctx.make(r2, "Reshape", "", [r1.inputs[0], r2.inputs[1]], [r2.outputs[0]],
                       dict(r2.attrs), name=r2.name + "/collapsed")
        ctx.replace([r1, r2], new)


def _const_shape(ctx: OptContext, r: NodeSpec) -> np.ndarray | None:
    """A Reshape's constant shape input (opset >= 5) when the fused kernel can
    take it as an attribute: 1-D integers, at most one ``-1``, none below."""
    if r.domain != "" or r.op_type != "Reshape" or len(r.inputs) != 2 or r.opset < 5 or \
            len(r.outputs) != 1 or not r.inputs[0]:
        return None
    sh = ctx.const(r.inputs[1])
    if sh is None or sh.dtype.kind != "i" or sh.ndim != 1 or np.any(sh < -1) or \
            np.count_nonzero(sh == -1) > 1:
        return None
    return sh


def fuse_view_pairs(ctx: OptContext) -> None:
    """Reshape -> Transpose and Transpose -> Reshape pairs -> one
    ``ai.actorrt:ReshapeTranspose`` (module docstring)."""
    for second in list(ctx.specs):
        if second not in ctx.specs:
            continue
        if _unary(second, "Transpose"):
            first = ctx.producer.get(second.inputs[0])
            shape_node, t, transpose_first = first, second, 0
        elif second.domain == "" and second.op_type == "Reshape" and second.inputs:
            first = ctx.producer.get(second.inputs[0])
            shape_node, t, transpose_first = second, first, 1
        else:
            continue
        if first is None or not _unary(t, "Transpose") or \
                ctx.sole_reader(first.outputs[0]) is not second:
            continue
        sh = _const_shape(ctx, shape_node)
        perm = _perm(ctx, t)
        if sh is None or perm is None:
            continue
        at = {"shape": [int(v) for v in sh], "perm": perm,
              "allowzero": int(shape_node.attr("allowzero", 0)),
              "transpose_first": transpose_first}
        new = ctx.make(second, "ReshapeTranspose", ENGINE_DOMAIN, [first.inputs[0]],
                       [second.outputs[0]], at, name=second.name + "/view", opset=1)
        ctx.replace([first, second], new)


def _swap_transpose(ctx: OptContext, name: str) -> NodeSpec | None:
    """The 2-D ``(1, 0)`` Transpose producing ``name`` that only it reads."""
    t = ctx.producer.get(name)
    if not _unary(t, "Transpose") or ctx.sole_reader(name) is None or ctx.rank(name) != 2:
        return None
    return t if _perm(ctx, t) == [1, 0] and ctx.is_float(t.inputs[0]) else None


def fold_transpose_into_gemm(ctx: OptContext) -> None:
    """2-D Transposes feeding Gemm / MatMul -> Gemm's transA / transB."""
    for g in list(ctx.specs):
        if g not in ctx.specs or g.domain != "":
            continue
        if g.op_type == "Gemm" and len(g.outputs) == 1 and g.opset >= 11:
            at = dict(g.attrs)
            ins = list(g.inputs)
            members = []
            for i, key in ((0, "transA"), (1, "transB")):
                t = _swap_transpose(ctx, ins[i]) if ins[i] and ins.count(ins[i]) == 1 else None
                if t is not None:
                    members.append(t)
                    ins[i] = t.inputs[0]
                    at[key] = 0 if int(at.get(key, 0)) else 1
            if members:
                new = ctx.make(g, "Gemm", "", ins, g.outputs, at, name=g.name + "/trans")
                ctx.replace(members + [g], new)
        elif _binary(g, "MatMul") and g.inputs[0] != g.inputs[1] and \
                ctx.rank(g.inputs[0]) == 2 and ctx.is_float(g.inputs[0]):
            t = _swap_transpose(ctx, g.inputs[1])
            if t is None:
                continue
            new = ctx.make(g, "Gemm", "", [g.inputs[0], t.inputs[0]], g.outputs, {"transB": 1},
                           name=g.name + "/gemm", opset=13)
            ctx.replace([t, g], new)
