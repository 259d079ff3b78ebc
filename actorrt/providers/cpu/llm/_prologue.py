"""Fusions of an LLM decode graph's input prologue: the small nodes between
the graph inputs (``input_ids``, ``attention_mask``) and the first decoder
block, which run once per generated token.

Each of them costs microseconds of Python on its own (12-15 µs warm for a
Gather or a ReduceSum, 30-130 µs in the decode loop right after the weights
streamed through the caches); SmolLM2's decode step ran 13 of them, ~0.5 ms
of a ~9 ms token. Two patterns, as ``actorrt.genai``'s builder and
onnxruntime-genai's models emit them:

* **attention-mask lengths** (:class:`MaskLengths`), the GroupQueryAttention
  inputs ``seqlens_k`` and ``total_sequence_length``::

      seqlens_k = Cast<int32>(Sub(ReduceSum(mask, axes=[1], keepdims=0), 1))
      total     = Cast<int32>(Gather(Shape(mask), [1]))

* **block-quantized embedding** (:class:`QuantizedGather`), a table of
  8-bit (or 4-bit-as-byte) blocks with one float scale per block::

      q = Gather(table (V, nb, bs) uint8/int8, ids)
      x = Reshape(Mul(Sub(Cast<float>(q), zero), Unsqueeze(Gather(scales (V, nb), ids), -1)),
                  shape)

  the same arithmetic as onnxruntime's ``GatherBlockQuantized`` contrib op
  (``(q - zero) * scale``, float32 at each step).

Each becomes one step with one compiled (or one numpy) call. Values the fast
path does not take (another dtype or rank, an index out of range, a shape
the Reshape rejects) run the original kernels one after another, so results
and error messages are theirs (naming the original node).
"""

from __future__ import annotations

from .. import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

from typing import Any, Callable, Sequence

import numpy as np

from .... import tracing
from ..._contract import Kernel, NodeSpec
from . import _contrib_numba as _nb
from ._fused import StepGraph, positions, replace_groups, run_original, slot_names

__all__ = ["MaskLengths", "QuantizedGather", "fuse_prologue", "MASK_OP", "GATHER_OP"]

#: op types of the fused steps (plan-internal, domain ``ai.actorrt``)
MASK_OP = "MaskLengths"
GATHER_OP = "QuantizedGather"
DOMAIN = "ai.actorrt"
#: fuse the prologue patterns (False: keep the nodes; for comparisons)
FUSE_PROLOGUE = True
_INT32, _FLOAT = 6, 1  # ONNX TensorProto data types

if _nb.HAVE_NUMBA:
    from numba import njit

    @njit(nogil=True, cache=True)
    def _mask_lengths(mask, n):  # pragma: no cover - compiled
        # (row sums - 1, n copies of the column count), int64 arithmetic
        # cast to int32 as ONNX Cast (numpy astype) wraps
        seqlens = np.empty(mask.shape[0], np.int32)
        for b in range(mask.shape[0]):
            s = np.int64(0)
            for t in range(mask.shape[1]):
                s += mask[b, t]
            seqlens[b] = np.int32(s - 1)
        total = np.empty(n, np.int32)
        total[:] = np.int32(np.int64(mask.shape[1]))
        return seqlens, total

    @njit(nogil=True, cache=True)
    def _gather_dequant(table, scales, zero, ids, out):  # pragma: no cover - compiled
        # out[i, b, j] = (float32(table[ids[i], b, j]) - zero) * scales[ids[i], b];
        # -1 when an index is out of range (nothing then matters: the
        # original Gather raises)
        v = table.shape[0]
        for i in range(ids.size):
            r = ids[i]
            if r < -v or r >= v:
                return -1
        for i in range(ids.size):
            r = ids[i]
            if r < 0:
                r += v
            for b in range(table.shape[1]):
                s = scales[r, b]
                for j in range(table.shape[2]):
                    out[i, b, j] = (np.float32(table[r, b, j]) - zero) * s
        return 0


class _Fused(Kernel):
    """A step standing for ``sub_steps`` (in topological order)."""

    def __init__(self, node: NodeSpec, sub_steps: Sequence[Any], consts: dict[int, Any],
                 in_slots: Sequence[int], out_slots: Sequence[int]):
        super().__init__(node)
        self.sub_steps = list(sub_steps)
        self.consts = consts
        self.in_slots = tuple(in_slots)
        self.out_slots = tuple(out_slots)

    def _original(self, *inputs: Any) -> tuple:
        return run_original(self.node, self.sub_steps, self.consts, self.in_slots,
                            self.out_slots, inputs)


class MaskLengths(_Fused):
    """``attention_mask`` (B, T) int64 -> ``seqlens_k`` (B,) int32 (the row
    sums minus one) and ``total_sequence_length`` int32 (T, shaped as the
    original Gather's index: (1,) or a scalar); ONNX ReduceSum-13, Sub-14,
    Cast-21, Shape-21, Gather-13 as the fused nodes define them. Another
    dtype or rank runs the original nodes."""

    multi_output = True

    def __init__(self, node, sub_steps, consts, in_slots, out_slots, index_shape):
        super().__init__(node, sub_steps, consts, in_slots, out_slots)
        self.index_shape = tuple(index_shape)

    def run(self, mask: Any) -> tuple:
        return self.compile()(mask)

    def compile(self) -> Callable:
        original, shape = self._original, self.index_shape
        i64 = np.dtype(np.int64)
        variant = tracing.kernel_variant

        compiled = _nb.HAVE_NUMBA
        size = int(np.prod(shape, dtype=np.int64))
        flat = len(shape) == 1

        def mask_lengths(mask):
            if type(mask) is not np.ndarray or mask.dtype != i64 or mask.ndim != 2:
                return original(mask)
            variant("fusion", "mask-lengths", "6 nodes in one step")
            if compiled:  # one call: numpy's reductions cost ~100 us cold in decode
                seqlens, total = _mask_lengths(mask, size)
                return seqlens, (total if flat else total.reshape(shape))
            seqlens = mask.sum(axis=1)
            seqlens -= 1
            return (seqlens.astype(np.int32),
                    np.full(shape, mask.shape[1], np.int64).astype(np.int32))

        return mask_lengths


class QuantizedGather(_Fused):
    """``ids`` (any shape, int64/int32) -> the rows of a block-quantized
    table, dequantized: ``(table[ids] - zero) * scales[ids][..., None]``
    reshaped (float32), as the fused ONNX Gather-13, Cast-21, Sub-14,
    Unsqueeze-21, Mul-14 and Reshape-21 nodes compute it (the arithmetic of
    onnxruntime's GatherBlockQuantized contrib op). ``table``: (V, nb, bs)
    uint8 or int8; ``scales``: (V, nb) float32; ``zero``: one float32. An
    index out of ``[-V, V)`` or a target shape the Reshape rejects runs the
    original nodes (whose errors name them)."""

    def __init__(self, node, sub_steps, consts, in_slots, out_slots, table, scales, zero,
                 target):
        super().__init__(node, sub_steps, consts, in_slots, out_slots)
        self.table = np.ascontiguousarray(table)
        self.scales = np.ascontiguousarray(scales, np.float32)
        self.zero = np.float32(zero)
        self.target = tuple(int(t) for t in target)

    def run(self, ids: Any) -> Any:
        return self.compile()(ids)

    def _shape(self, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The Reshape's output shape for an input of ``shape`` (allowzero 0:
        a 0 copies the input's dimension; one -1 is inferred); None when the
        Reshape would reject it."""
        size = int(np.prod(shape, dtype=np.int64))
        out, infer = [], -1
        for i, t in enumerate(self.target):
            if t == 0:
                if i >= len(shape):
                    return None
                out.append(shape[i])
            elif t == -1:
                if infer >= 0:
                    return None
                infer = i
                out.append(1)
            elif t > 0:
                out.append(t)
            else:
                return None
        known = int(np.prod(out, dtype=np.int64))
        if infer >= 0:
            if known == 0 or size % known:
                return None
            out[infer] = size // known
        return tuple(out) if int(np.prod(out, dtype=np.int64)) == size else None

    def compile(self) -> Callable:
        original = self._original
        table, scales, zero = self.table, self.scales, self.zero
        nb, bs = table.shape[1], table.shape[2]
        shapes: dict[tuple, tuple | None] = {}
        reshape = self._shape
        variant = tracing.kernel_variant
        ints = (np.dtype(np.int64), np.dtype(np.int32))
        compiled = _nb.HAVE_NUMBA

        def quantized_gather(ids):
            if type(ids) is not np.ndarray or ids.dtype not in ints:
                return original(ids)
            key = ids.shape
            if key not in shapes:
                shapes[key] = reshape(key + (nb, bs))
            target = shapes[key]
            if target is None:
                return original(ids)
            flat = ids.reshape(-1)
            out = np.empty((flat.size, nb, bs), np.float32)
            if compiled:
                if _gather_dequant(table, scales, zero, flat, out):
                    return original(ids)
            else:
                v = table.shape[0]
                if flat.size and (flat.min() < -v or flat.max() >= v):
                    return original(ids)
                np.subtract(table[flat], zero, out=out, dtype=np.float32)
                out *= scales[flat][:, :, None]
            variant("fusion", "quantized-gather", "%d-byte blocks", bs)
            return out.reshape(target)

        return quantized_gather


# ------------------------------------------------------------------- matching

def _is(step: Any, op: str) -> bool:
    return step.node.op_type == op and (step.node.domain or "") == ""


def _const(step: Any, i: int) -> np.ndarray | None:
    v = step.node.constant_inputs.get(i)
    return v if isinstance(v, np.ndarray) else None


def _scalar(step: Any, i: int, dtype: Any) -> Any:
    """The value of constant input ``i`` when it holds one ``dtype`` value."""
    v = _const(step, i)
    if v is None or v.dtype != dtype or v.size != 1 or v.ndim > 1:
        return None
    return v.reshape(-1)[0]


class _Readers(StepGraph):
    def next(self, step: Any, op: str, *, index: int = 0) -> Any:
        """The only reader of ``step``'s single output, when it is an ``op``
        (ai.onnx) reading it as input ``index``."""
        if len(step.outputs) != 1:
            return None
        r = self.only_reader(step.outputs[0])
        if r is None or not _is(r, op) or r.outer:
            return None
        if index >= 0 and (len(r.inputs) <= index or r.inputs[index] != step.outputs[0]):
            return None
        return r


def _match_mask(g: _Readers, reduce: Any) -> dict | None:
    """seqlens_k / total_sequence_length from the ReduceSum of a mask."""
    if reduce.node.attr("keepdims", 1) != 0 or len(reduce.inputs) < 2:
        return None
    axes = _const(reduce, 1)
    if axes is None or axes.size != 1 or int(axes.reshape(-1)[0]) not in (1, -1):
        return None
    mask = reduce.inputs[0]
    sub = g.next(reduce, "Sub")
    if sub is None or len(sub.inputs) != 2 or _scalar(sub, 1, np.int64) != 1:
        return None
    cast = g.next(sub, "Cast")
    if cast is None or cast.node.attr("to") != _INT32:
        return None
    for shape in g.consumers.get(mask, []):
        if not _is(shape, "Shape") or shape.node.attrs.get("start", 0) != 0 or (
                shape.node.attrs.get("end") is not None):
            continue
        gather = g.next(shape, "Gather")
        if gather is None or gather.node.attr("axis", 0) != 0 or len(gather.inputs) != 2:
            continue
        idx = _const(gather, 1)
        if idx is None or idx.dtype.kind != "i" or idx.size != 1 or int(idx.reshape(-1)[0]) \
                not in (1, -1):
            continue
        total = g.next(gather, "Cast")
        if total is None or total.node.attr("to") != _INT32:
            continue
        steps = [reduce, sub, cast, shape, gather, total]
        if len({st.provider for st in steps}) != 1 or any(st.outer for st in steps):
            return None
        return dict(steps=steps, inputs=(mask,), outputs=(cast.outputs[0], total.outputs[0]),
                    index_shape=idx.shape, kind=MASK_OP)
    return None


def _match_gather(g: _Readers, gq: Any) -> dict | None:
    """The block-quantized embedding whose byte blocks ``gq`` gathers."""
    table = _const(gq, 0)
    if (table is None or table.ndim != 3 or table.dtype not in (np.uint8, np.int8)
            or gq.node.attr("axis", 0) != 0 or len(gq.inputs) != 2 or gq.inputs[1] < 0):
        return None
    ids = gq.inputs[1]
    cast = g.next(gq, "Cast")
    if cast is None or cast.node.attr("to") != _FLOAT:
        return None
    sub = g.next(cast, "Sub")
    zero = _scalar(sub, 1, np.float32) if sub is not None and len(sub.inputs) == 2 else None
    if zero is None:
        return None
    mul = g.next(sub, "Mul", index=-1)
    if mul is None or len(mul.inputs) != 2:
        return None
    other = mul.inputs[1] if mul.inputs[0] == sub.outputs[0] else mul.inputs[0]
    unsq = g.producer.get(other)
    if unsq is None or not _is(unsq, "Unsqueeze") or g.only_reader(other) is not mul:
        return None
    axes = _const(unsq, 1) if len(unsq.inputs) > 1 else None
    if axes is None:
        axes = unsq.node.attrs.get("axes")
        axes = None if axes is None else np.asarray(axes)
    if axes is None or axes.size != 1 or int(axes.reshape(-1)[0]) != -1:
        return None
    gs = g.producer.get(unsq.inputs[0])
    scales = _const(gs, 0) if gs is not None and _is(gs, "Gather") else None
    if (scales is None or g.only_reader(unsq.inputs[0]) is not unsq or gs.inputs[1] != ids
            or gs.node.attr("axis", 0) != 0 or scales.dtype != np.float32
            or scales.shape != table.shape[:2]):
        return None
    reshape = g.next(mul, "Reshape")
    target = _const(reshape, 1) if reshape is not None and len(reshape.inputs) == 2 else None
    if target is None or target.ndim != 1 or reshape.node.attr("allowzero", 0) != 0:
        return None
    steps = [gq, cast, sub, gs, unsq, mul, reshape]
    if len({st.provider for st in steps}) != 1 or any(st.outer for st in steps):
        return None
    return dict(steps=steps, inputs=(ids,), outputs=(reshape.outputs[0],), table=table,
                scales=scales, zero=zero, target=target, kind=GATHER_OP)


def fuse_prologue(steps: list, protected: set[int], consts: dict[int, Any],
                  make_step: Callable[..., Any], provider: Any
                  ) -> tuple[list, list[tuple[str, tuple]]]:
    """Replace the attention-mask lengths and block-quantized embedding
    subgraphs of ``steps`` (see the module docstring) by one step each.

    Args and returns as :func:`._fusion.fuse_decoder_blocks`: ``(steps,
    fusions)``, the new topological step list and, per fused step, ``(fused
    node name, original node names)``."""
    g = _Readers(steps, protected)
    pos = positions(steps)
    taken: set[int] = set()
    groups = []
    for st in steps:
        if st.provider is not provider:
            continue
        mt = None
        if _is(st, "ReduceSum"):
            mt = _match_mask(g, st)
        elif _is(st, "Gather"):
            mt = _match_gather(g, st)
        if (mt is None or any(id(s) in taken for s in mt["steps"])
                or g.read_early(mt["steps"], mt["outputs"], pos)):
            continue
        mt["steps"].sort(key=lambda s: pos[id(s)])  # topological order
        taken.update(id(s) for s in mt["steps"])
        groups.append((mt["steps"], mt))
    return replace_groups(steps, groups, lambda mt: _step(mt, consts, make_step))


def _step(mt: dict, consts: dict[int, Any], make_step: Callable[..., Any]) -> Any:
    subs = mt["steps"]  # in topological order
    names, types = slot_names(subs)
    in_slots, out_slots = tuple(mt["inputs"]), tuple(mt["outputs"])
    base = subs[0].node.name.rsplit("/", 1)[0] if "/" in subs[0].node.name else \
        subs[0].node.name
    kind = mt["kind"]
    node = NodeSpec(name=f"{base}/{kind}", op_type=kind, domain=DOMAIN, opset=1,
                    attrs={"fused_nodes": [s.node.name for s in subs]},
                    inputs=tuple(names.get(s, "") for s in in_slots),
                    outputs=tuple(names.get(s, "") for s in out_slots),
                    input_types=tuple(types.get(s) for s in in_slots),
                    output_types=tuple(types.get(s) for s in out_slots),
                    model=subs[0].node.model)
    sub_consts = {i: consts[i] for sub in subs for i in sub.inputs if i in consts}
    for sub in subs:  # inputs the kernels hold as constants (folded values)
        for k, v in sub.node.constant_inputs.items():
            if k < len(sub.inputs) and sub.inputs[k] >= 0:
                sub_consts.setdefault(sub.inputs[k], v)
    if kind == MASK_OP:
        kernel: Kernel = MaskLengths(node, subs, sub_consts, in_slots, out_slots,
                                     mt["index_shape"])
    else:
        kernel = QuantizedGather(node, subs, sub_consts, in_slots, out_slots, mt["table"],
                                 mt["scales"], mt["zero"], mt["target"])
    cost = subs[0].cost
    for s in subs[1:]:
        cost = cost + s.cost
    return make_step(node, subs[0].provider, kernel, in_slots, out_slots, cost)
