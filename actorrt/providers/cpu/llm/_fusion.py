"""Decoder-block fusion: one compiled kernel per transformer layer of an LLM
decode graph, as onnxruntime's transformer optimizer fuses subgraphs.

The pattern (what ``actorrt.genai``'s builder and onnxruntime-genai's CPU
models emit, the com.microsoft contrib ops, float32):

    q[, k, v] = MatMulNBits(h)                      packed QKV or three projections
    attn, present_k, present_v = GroupQueryAttention(q, k, v, past_k, past_v,
                                     seqlens_k, total_sequence_length, cos, sin)
    o = MatMulNBits(attn)
    h2, _, _, r2 = SkipSimplifiedLayerNormalization(o, residual, gamma2)
    gate, up = MatMulNBits(h2), MatMulNBits(h2)
    act = gate * Sigmoid(gate) * up                 SiLU-gated MLP
    down = MatMulNBits(act)
    h3, _, _, r3 = SkipSimplifiedLayerNormalization(down, r2, gamma3)

becomes one step ``(h, residual, past_k, past_v, seqlens_k,
total_sequence_length, cos, sin) -> (h3, r3, present_k, present_v)`` whose
hot path is a single numba call: the projections, attention with its rotary
embedding and KV append, both norms and the SiLU gate run back to back with
no Python between them. With int8 activations (``accuracy_level=4``) the
whole block is one parallel region: every kernel thread runs the same stage
program and claims chunks of each stage (column ranges of a projection,
(batch row, KV head) pairs of attention, ``ROW_CHUNK``-row slices of the row-wise
steps) from atomic counters, then waits until the stage's chunks are done.
Only chunks that a running thread claimed are waited for, so a thread that
never starts cannot hang the others: one thread alone finishes the block.
With float32 activations each projection is a parallel launch of its own.

Measured here on SmolLM2-135M at accuracy_level 4, batch 1 (2 threads): the
node-by-node graph ran its 576-wide projections on one thread (waking the
team for each cost more than it saved) and paid ~11 Python dispatches per
layer; fused, decode went from ~50 to 70-89 tok/s (the machine's memory
bandwidth drifts between 8 and 20 GB/s), with the 30 blocks' 66 MB of
weights streamed at ~10 GB/s when the machine's read bandwidth measured 11.

A group is fused only when nothing outside it reads an intermediate (or it
is a graph output), every node runs on the CPU provider, and the kernels'
prepacked layouts allow the compiled path: every MatMulNBits prepacked for
the same numba variant (int8 activations, 4- or 8-bit, or float32
activations) with K a multiple of its block size and no bias;
GroupQueryAttention without softcap/smooth softmax and no inputs past
``sin_cache``; SkipSimplifiedLayerNormalization without bias and a constant
float32 gamma. Values the hot path does not take (another dtype, a
non-contiguous input, an out-of-range length) run the original kernels one
after another, so results and error messages are theirs.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from .... import tracing
from ..._contract import Kernel, NodeSpec
from . import _contrib_int8 as _i8
from . import _contrib_numba as _nb
from . import _flash as _fl
from . import _block_kernels as _bk
from ._fused import StepGraph, positions, replace_groups, run_original, slot_names
from ._paged_block import f32_block_runner
from ._half import kernel_view
from .paged import is_paged, paged_lengths, table_of

__all__ = ["DecoderBlock", "DecoderStack", "fuse_decoder_blocks", "fuse_decoder_stacks",
           "FUSED_OP", "STACK_OP", "FUSED_DOMAIN"]

#: op type and domain of a fused step (plan-internal: never read from a model)
FUSED_OP = "DecoderBlock"
STACK_OP = "DecoderStack"
FUSED_DOMAIN = "ai.actorrt"
#: an int8 block runs its parallel region on every kernel thread from this
#: many 32-weight block products (rows x weight blocks); below, on one
REGION_MIN_WORK = 1 << 12
#: a projection in the parallel region is split into this many chunks per
#: thread (claimed dynamically), each at least CHUNK_COLUMNS output columns
#: (a multiple of 4, the int8 layout's column group)
CHUNKS_PER_THREAD = 2
CHUNK_COLUMNS = 64
#: run consecutive int8 blocks as one stack (:class:`DecoderStack`)
STACK_BLOCKS = True
#: take the LM head that follows a stack into it (one region, one step)
STACK_HEAD = True
#: software prefetch in the int8 blocks, bit flags: 1 the projections
#: prefetch their weights ahead (_contrib_int8._group_pf), 2 a thread waiting
#: at the end of a small stage (quantize, attention, norm, SiLU) prefetches
#: the next projection's weights; 0 turns both off
PREFETCH = 3
#: a decode step's attention splits each (batch row, KV head) pair's cached
#: rows into spans (flash-decoding) when there are fewer than SPAN_UNITS
#: pairs, so that a few pairs balance over the threads; a span has at least
#: SPAN_ROWS rows. SmolLM2 (3 KV heads, batch 1): 2 spans from 32 cached
#: rows; the decoder stack alone on 2 threads at 128-256 cached rows,
#: interleaved: 3-6 % faster (streamed decode: within the machine's noise)
SPAN_UNITS = 4
SPAN_ROWS = 16
#: a profiling hook (benchmarks/profile_decode.py): None, or an int64 array
#: (layers + 1, _block_kernels.PROFILE_SLOTS) of zeros that every decoder
#: stack region adds its stage timings into (cycle counts, see
#: _block_kernels.PROFILE_SLOTS); read at each call
STAGE_PROFILE: "np.ndarray | None" = None

MS = "com.microsoft"


# ------------------------------------------------------------------- matching

def _layout(kernel: Any) -> tuple[str, tuple] | None:
    """(variant, (w, d, z)) of a MatMulNBits kernel the compiled block can
    run, else None."""
    p = getattr(kernel, "packed", None)
    if (p is None or p.empty or p.n_blocks * p.block_size != p.k
            or kernel.node.has_input(5) or kernel.node.has_input(4)):
        return None
    if p.qi is not None:
        return "i8", (p.qi, p.scales, p.dz)
    if p.q is not None:
        return "f32", (p.q, p.scales, p.zps)
    return None


def _is(step: Any, op: str, domain: str = MS) -> bool:
    return step.node.op_type == op and (step.node.domain or "") == domain


def _skip_norm(g: StepGraph, step: Any, x: int) -> tuple[int, np.ndarray, float] | None:
    """(skip slot, gamma, epsilon) of a SkipSimplifiedLayerNormalization that
    adds ``x`` (input 0 or 1) to a skip, gamma constant float32, no bias and
    unused mean/inv_std_var; else None."""
    if step is None or not _is(step, "SkipSimplifiedLayerNormalization"):
        return None
    ins = step.inputs
    if len(ins) < 3 or (len(ins) > 3 and ins[3] >= 0) or ins[0] == ins[1]:
        return None
    if x not in ins[:2]:
        return None
    gamma = step.node.constant_inputs.get(2)
    if gamma is None or not isinstance(gamma, np.ndarray) or gamma.dtype != np.float32:
        return None
    outs = step.outputs
    if len(outs) != 4 or not all(g.unused(o) for o in outs[1:3]) or outs[0] < 0 or outs[3] < 0:
        return None
    skip = ins[1] if ins[0] == x else ins[0]
    return skip, np.ascontiguousarray(gamma), float(step.node.attr("epsilon", 1e-12))


def _declined(why: list | None, reason: str) -> None:
    if why is not None:
        why.append(reason)
    return None


def _match(g: StepGraph, gqa: Any, why: list | None = None) -> dict | None:
    """The decoder block around one GroupQueryAttention step, or None (then
    ``why``, when given, gets the reason appended)."""
    prep = gqa.kernel.fast_path() if hasattr(gqa.kernel, "fast_path") else None
    ins = gqa.inputs
    if prep is None or len(ins) < 7 or any(i >= 0 for i in ins[9:]) or gqa.outer:
        return _declined(why, 'attention kernel has no compiled path (softcap, smooth softmax or no numba) or extra inputs')
    if any(i < 0 for i in ins[3:7]) or (gqa.kernel.do_rotary and (len(ins) < 9 or ins[7] < 0
                                                                  or ins[8] < 0)):
        return _declined(why, 'attention inputs (past, lengths or rotary caches) missing')
    packed = ins[1] < 0 and ins[2] < 0
    projections = [ins[0]] if packed else list(ins[:3])
    if any(i < 0 for i in projections):
        return _declined(why, 'attention query/key/value missing')
    qkv = [g.producer.get(i) for i in projections]
    if any(p is None or not _is(p, "MatMulNBits") or g.only_reader(p.outputs[0]) is not gqa
           for p in qkv):
        return _declined(why, 'q/k/v are not MatMulNBits outputs read only by attention (biases or q/k norms between)')
    h = qkv[0].inputs[0]
    if any(p.inputs[0] != h for p in qkv):
        return _declined(why, 'q, k and v are projections of different inputs')
    attn, present_k, present_v = (list(gqa.outputs) + [-1, -1])[:3]
    o_proj = g.only_reader(attn)
    if o_proj is None or not _is(o_proj, "MatMulNBits") or o_proj.inputs[0] != attn:
        return _declined(why, 'attention output is not read only by a MatMulNBits o_proj')
    norm2 = g.only_reader(o_proj.outputs[0])
    n2 = _skip_norm(g, norm2, o_proj.outputs[0])
    if n2 is None:
        return _declined(why, 'o_proj is not followed by SkipSimplifiedLayerNormalization (e.g. a post-attention norm)')
    residual, gamma2, eps2 = n2
    h2, r2 = norm2.outputs[0], norm2.outputs[3]
    readers = g.consumers.get(h2, [])
    if h2 in g.protected or len(readers) != 2 or not all(_is(r, "MatMulNBits") for r in readers):
        return _declined(why, 'the post-attention norm is not read by exactly two MatMulNBits (gate, up)')
    mlp = _silu_mlp(g, readers)
    if mlp is None:
        return _declined(why, 'the MLP is not SiLU-gated (x * Sigmoid(x) * up)')
    gate, up, steps_mlp, act = mlp
    down = g.only_reader(act)
    if down is None or not _is(down, "MatMulNBits") or down.inputs[0] != act:
        return _declined(why, 'the MLP product is not read only by a MatMulNBits down projection')
    norm3 = g.only_reader(down.outputs[0])
    n3 = _skip_norm(g, norm3, down.outputs[0])
    if n3 is None or n3[0] != r2 or g.only_reader(r2) is not norm3:
        return _declined(why, 'down_proj is not followed by the next SkipSimplifiedLayerNormalization (e.g. a post-FFN norm)')
    _, gamma3, eps3 = n3
    mats = [*qkv, o_proj, gate, up, down]
    layouts = [_layout(m.kernel) for m in mats]
    if any(lay is None for lay in layouts) or len({lay[0] for lay in layouts}) != 1:
        return _declined(why, "the projections' weights differ in prepacked layout (bit width / block size / int8 path)")
    variant = layouts[0][0]
    if variant not in _BLOCKS:
        return _declined(why, "no compiled block for the projections' layout")
    steps = [*qkv, gqa, o_proj, norm2, gate, up, *steps_mlp, down, norm3]
    if len({st.provider for st in steps}) != 1 or any(st.outer for st in steps):
        return _declined(why, 'the block spans several providers or reads outer-scope values')
    return dict(steps=steps, packed=packed, hidden=qkv[0].kernel.k, variant=variant,
                weights=[lay[1] for lay in layouts],
                blocks=sum(m.kernel.n * m.kernel.k for m in mats) // 32, prep=prep,
                gqa=gqa.kernel, gamma2=gamma2, eps2=eps2, gamma3=gamma3, eps3=eps3,
                inputs=(h, residual, *ins[3:9]),
                outputs=(norm3.outputs[0], norm3.outputs[3], present_k, present_v))


def _silu_mlp(g: StepGraph, readers: list) -> tuple | None:
    """(gate step, up step, [Sigmoid, Mul, Mul] steps, product slot) of
    ``Mul(Mul(gate, Sigmoid(gate)), up)`` (either operand order), or None."""
    for gate, up in (readers, readers[::-1]):
        gs, us = gate.outputs[0], up.outputs[0]
        rs = g.consumers.get(gs, [])
        if gs in g.protected or len(rs) != 2:
            continue
        sig = next((r for r in rs if _is(r, "Sigmoid", "")), None)
        mul1 = next((r for r in rs if _is(r, "Mul", "")), None)
        if sig is None or mul1 is None or sig.inputs[0] != gs:
            continue
        if g.only_reader(sig.outputs[0]) is not mul1 or sorted(mul1.inputs) != sorted(
                [gs, sig.outputs[0]]):
            continue
        mul2 = g.only_reader(mul1.outputs[0])
        if (mul2 is None or not _is(mul2, "Mul", "") or g.only_reader(us) is not mul2
                or sorted(mul2.inputs) != sorted([mul1.outputs[0], us])):
            continue
        return gate, up, [sig, mul1, mul2], mul2.outputs[0]
    return None


_BLOCKS: dict[str, Callable] = {}
if _nb.HAVE_NUMBA:
    _BLOCKS["f32"] = _bk.block_f32
    if _i8.HAVE_INT8_DOT:
        _BLOCKS["i8"] = _bk.region_block


# --------------------------------------------------------------------- kernel

class DecoderBlock(Kernel):
    """A fused decoder block (see the module docstring): inputs ``(h (B, S,
    hidden), residual (B, S, hidden), past_key, past_value (B, KVH, L, D),
    seqlens_k (B,) int32, total_sequence_length (1,) int32, cos_cache,
    sin_cache)``, float32; outputs ``(h3, r3, present_key, present_value)``
    exactly as the original nodes define them (com.microsoft MatMulNBits,
    GroupQueryAttention, SkipSimplifiedLayerNormalization; ONNX Sigmoid and
    Mul). ``present_*`` reuse the ``past_*`` buffers when they have room and
    were donated (as GroupQueryAttention does).

    Errors are those of the original kernels, naming the original node."""

    multi_output = True
    inplace = {2: 2, 3: 3}

    def __init__(self, node: NodeSpec, match: dict, sub_steps: Sequence[Any]):
        super().__init__(node)
        self.match = match
        self.sub_steps = list(sub_steps)
        self.in_slots = tuple(match["in_slots"])
        self.out_slots = tuple(match["out_slots"])

    def _fallback(self, *inputs: Any) -> tuple:
        """Run the original kernels one after another (their closures)."""
        return run_original(self.node, self.sub_steps, self.match["consts"], self.in_slots,
                            self.out_slots, inputs)

    def run(self, *inputs: Any) -> tuple:
        return self._fallback(*inputs)

    def statics(self) -> dict[str, Any] | None:
        """What the compiled path needs besides the inputs: the 21 weight
        arrays (w, scales, zero-point term of q, k, v, o, gate, up, down; k
        and v empty when q is packed QKV), gammas, epsilons and the attention
        attributes; None when the shapes do not fit it."""
        mt = self.match
        gqa, packed, weights = mt["gqa"], mt["packed"], mt["weights"]
        qkv = list(weights[:3])
        if packed:
            w, d, z = weights[0]
            empty = (w[:0], d[:0], d[:0])
            qkv = [weights[0], empty, empty]
        mats = tuple(a for triple in (*qkv, *weights[-4:]) for a in triple)
        hidden, width = mt["hidden"], mats[0].shape[0]
        heads, kv_heads = gqa.h, gqa.kvh
        g2, g3 = mt["gamma2"], mt["gamma3"]
        if (g2.shape != (hidden,) or g3.shape != (hidden,) or mats[18].shape[0] != hidden
                or mats[9].shape[0] != hidden):
            return None
        return dict(mats=mats, packed=packed, hidden=hidden, width=width, heads=heads,
                    kv_heads=kv_heads, rotary=gqa.do_rotary, window=gqa.window,
                    interleaved=gqa.interleaved, g2=g2, g3=g3, eps2=np.float32(mt["eps2"]),
                    eps3=np.float32(mt["eps3"]), prep=mt["prep"], blocks=mt["blocks"],
                    variant=mt["variant"], scale=gqa.scale)

    def compile(self) -> Callable:
        st = self.statics()
        if st is None:
            return self.run
        block = _BLOCKS[st["variant"]]
        (qw, qd, qz, kw, kd, kz, vw, vd, vz, ow, od, oz, gw, gd, gz, uw, ud, uz, dw, dd,
         dz) = st["mats"]
        prep, packed, hidden, width = st["prep"], st["packed"], st["hidden"], st["width"]
        heads, kv_heads, rotary = st["heads"], st["kv_heads"], st["rotary"]
        window, interleaved = st["window"], st["interleaved"]
        g2, g3, eps2, eps3 = st["g2"], st["g3"], st["eps2"], st["eps3"]
        f32 = np.dtype(np.float32)
        fallback, parallel, num_threads = self._fallback, _nb._parallel, _nb.num_threads
        variant = tracing.kernel_variant
        one, no_pos = _nb._ONE, _nb._NO_POS
        name = st["variant"]
        region = name != "f32"
        blocks = st["blocks"]
        d = width // (heads + 2 * kv_heads) if packed else width // heads
        # a paged cache (.paged): the float32 block attends through its block
        # table; an int8 block alone runs its original kernels on one
        paged = f32_block_runner(st, fallback) if not region else fallback

        def decoder_block(h, residual, past_key, past_value, seqlens_k, total_sequence_length,
                          cos_cache=None, sin_cache=None):
            if (h.dtype != f32 or residual.dtype != f32 or h.ndim != 3 or h.shape[2] != hidden
                    or residual.shape != h.shape or not h.flags.c_contiguous
                    or not residual.flags.c_contiguous):
                return fallback(h, residual, past_key, past_value, seqlens_k,
                                total_sequence_length, cos_cache, sin_cache)
            if type(past_key) is not np.ndarray and is_paged(past_key):
                return (paged or fallback)(h, residual, past_key, past_value, seqlens_k,
                                           total_sequence_length, cos_cache, sin_cache)
            bsz, s = h.shape[0], h.shape[1]
            ready = prep(bsz, s, width, packed, past_key, past_value, seqlens_k,
                         total_sequence_length, cos_cache, sin_cache)
            if ready is None:
                return fallback(h, residual, past_key, past_value, seqlens_k,
                                total_sequence_length, cos_cache, sin_cache)
            present_k, present_v, copy, seqlens, total, alpha = ready
            threads = num_threads()
            if region:
                # one parallel region for the whole block: below ~4M
                # multiply-adds, one thread (waking the team costs more)
                team = threads if bsz * s * blocks >= REGION_MIN_WORK else 1
                last = (team, CHUNK_COLUMNS, CHUNKS_PER_THREAD * team, PREFETCH, SPAN_UNITS,
                        SPAN_ROWS)
            else:
                work = bsz * heads * s * (int(seqlens.max(initial=0)) + 1) * d
                units = bsz * kv_heads * (_fl.n_tiles(s) if s > 1 else 1)  # + query tiles
                gqa_chunks = (min(units, 4 * threads)
                              if work >= _nb.GQA_PARALLEL_MIN_WORK and units > 1 else 1)
                last = (2 * threads,)
            status, y, r, spans = parallel(
                block, h, residual, qw, qd, qz, kw, kd, kz, vw, vd, vz, packed,
                past_key if copy else present_k, past_value if copy else present_v,
                present_k, present_v, seqlens, total, cos_cache if rotary else one,
                sin_cache if rotary else one, no_pos, heads, kv_heads, copy, rotary,
                interleaved, np.float32(alpha), window, *(() if region else (gqa_chunks,)),
                ow, od, oz, g2, eps2, gw, gd, gz, uw, ud, uz, dw, dd, dz, g3, eps3, *last)
            if status:  # nothing was written: the original kernels name the problem
                return fallback(h, residual, past_key, past_value, seqlens_k,
                                total_sequence_length, cos_cache, sin_cache)
            variant("fusion", "decoder-block", "%s, %d nodes in one call, attention in %d "
                    "span(s)", name, len(self.sub_steps), spans)
            return y, r, present_k, present_v

        return decoder_block


class DecoderStack(Kernel):
    """Consecutive int8 decoder blocks (:class:`DecoderBlock`, each reading
    the previous one's ``h3, r3``) as one step: inputs ``(h (B, S, hidden),
    residual, seqlens_k (B,) int32, total_sequence_length (1,) int32,
    cos_cache, sin_cache, past_key_0, past_value_0, past_key_1, ...)``, float32
    (B, KVH, L, D) KV buffers; outputs ``(h, residual, present_key_0,
    present_value_0, ...)``, each layer's exactly as its block defines them.
    With ``head`` (the LM head: a com.microsoft MatMulNBits step reading the
    last layer's ``h``, whose ``residual`` nothing reads), the first output is
    the head's ``(B, S, N)`` logits instead of ``h``. With ``select`` too (an
    ONNX GatherND step, batch_dims 1, between the two), the stack's last
    input is its int64 ``(B, 1, 1)`` indices and the head reads only the row
    each picks: ``(B, 1, N)`` logits.

    The compiled path runs every layer (and an int8 head) in one parallel
    region (see ``_stack_region``) and needs every KV buffer donated with
    room for the new positions (appended in place, as the engine runs
    decode); otherwise the blocks (then the head) run one after another, so
    results and errors are theirs."""

    multi_output = True

    def __init__(self, node: NodeSpec, blocks: Sequence[Any], head: Any = None,
                 head_consts: Sequence[Any] = (), select: Any = None):
        super().__init__(node)
        self.blocks = list(blocks)
        self.head = head
        self.head_consts = tuple(head_consts)  # the head's inputs after A (constants)
        self.select = select if head is not None else None
        n = len(self.blocks)
        self.inplace = {2 + 2 * i: 6 + 2 * i for i in range(n)}
        self.inplace.update({3 + 2 * i: 7 + 2 * i for i in range(n)})

    def _head_packed(self) -> Any:
        """The head's int8 prepacked weight when the region can run it."""
        head = self.head
        if head is None:
            return None
        p = getattr(head.kernel, "packed", None)
        hidden = self.blocks[0].kernel.statics()
        if (p is None or p.qi is None or p.empty or hidden is None or p.k != hidden["hidden"]
                or p.n_blocks * p.block_size != p.k or head.node.has_input(5)):
            return None
        return p

    @staticmethod
    def _chain(fns: Sequence[Callable], h: Any, residual: Any, seqlens_k: Any, total: Any,
               cos_cache: Any, sin_cache: Any, kv: Sequence[Any]) -> tuple:
        presents: list = []
        for i, fn in enumerate(fns):
            h, residual, pk, pv = fn(h, residual, kv[2 * i], kv[2 * i + 1], seqlens_k, total,
                                     cos_cache, sin_cache)
            presents += (pk, pv)
        return (h, residual, *presents)

    def run(self, h, residual, seqlens_k, total, cos_cache=None, sin_cache=None, *kv):
        rows = None
        if self.select is not None:
            kv, rows = kv[:-1], kv[-1]
        out = self._chain([b.kernel.run for b in self.blocks], h, residual, seqlens_k, total,
                          cos_cache, sin_cache, kv)
        if self.head is None:
            return out
        x = out[0] if rows is None else self.select.kernel.run(out[0], rows)
        return (self.head.kernel.run(x, *self.head_consts), *out[1:])

    def compile(self) -> Callable:
        fns = [b.fn for b in self.blocks]
        blocks_chain = self._chain
        head_fn = self.head.fn if self.head is not None else None
        head_consts = self.head_consts
        select_fn = self.select.fn if self.select is not None else None
        n_kv = 2 * len(fns)

        def chain(fns, h, residual, seqlens_k, total, cos_cache, sin_cache, kv):
            rows = None
            if select_fn is not None:
                kv, rows = kv[:-1], kv[-1]
            out = blocks_chain(fns, h, residual, seqlens_k, total, cos_cache, sin_cache, kv)
            if head_fn is None:
                return out
            x = out[0] if rows is None else select_fn(out[0], rows)
            return (head_fn(x, *head_consts), *out[1:])

        statics = [b.kernel.statics() for b in self.blocks]
        if any(st is None for st in statics) or not _same_layers(statics):
            return lambda *a: chain(fns, *a[:6], a[6:])
        s0 = statics[0]
        # the layers' weights by address (kept alive by the blocks' kernels
        # and by ``keep``), typed and shaped like layer 0's
        keep = [st["mats"] for st in statics]
        table = np.array([[a.ctypes.data for a in mats] for mats in keep], np.int64)
        templates = s0["mats"]
        g2s = np.ascontiguousarray(np.stack([st["g2"] for st in statics]), np.float32)
        g3s = np.ascontiguousarray(np.stack([st["g3"] for st in statics]), np.float32)
        eps2s = np.array([st["eps2"] for st in statics], np.float32)
        eps3s = np.array([st["eps3"] for st in statics], np.float32)
        prep, packed, hidden, width = s0["prep"], s0["packed"], s0["hidden"], s0["width"]
        heads, kv_heads, rotary = s0["heads"], s0["kv_heads"], s0["rotary"]
        window, interleaved, blocks = s0["window"], s0["interleaved"], s0["blocks"]
        f32 = np.dtype(np.float32)
        parallel, num_threads = _nb._parallel, _nb.num_threads
        variant = tracing.kernel_variant
        one, no_pos = _nb._ONE, _nb._NO_POS
        n_layers = len(fns)
        region = _bk.region_stack
        hp = self._head_packed()
        # the head in the region (its weight), or after it (head_fn), or none
        in_region = hp is not None
        head_args = ((hp.qi, hp.scales, hp.dz, True) if in_region
                     else (templates[0][:0], templates[1][:0], templates[1][:0], False))
        n_vocab = hp.n if in_region else 0
        no_rows = _NO_ROWS
        no_table = _NO_TABLE
        scale = s0["scale"]
        head_dim = width // (heads + 2 * kv_heads) if packed else width // heads
        # (weak references to the KV buffers last checked, their address
        # table): a finished request's cache is not kept alive
        checked: list = [None]

        def decoder_stack(h, residual, seqlens_k, total_sequence_length, cos_cache=None,
                          sin_cache=None, *kv):
            full = kv  # what the unfused chain reads (the row indices last)
            rows = no_rows
            if select_fn is not None:
                rows = _head_rows(kv[-1], h) if len(kv) == n_kv + 1 and in_region else None
                if rows is None:  # the GatherND step itself checks (and names) them
                    return chain(fns, h, residual, seqlens_k, total_sequence_length,
                                 cos_cache, sin_cache, full)
                kv = kv[:-1]
            if (len(kv) != 2 * n_layers or h.dtype != f32 or residual.dtype != f32
                    or h.ndim != 3 or h.shape[2] != hidden or residual.shape != h.shape
                    or not h.flags.c_contiguous or not residual.flags.c_contiguous):
                return chain(fns, h, residual, seqlens_k, total_sequence_length, cos_cache,
                             sin_cache, full)
            bsz, s = h.shape[0], h.shape[1]
            bt = no_table
            if type(kv[0]) is not np.ndarray and is_paged(kv[0]):  # a paged cache (.paged)
                bt = table_of(kv, bsz)
                ready = None if bt is None else paged_lengths(
                    seqlens_k, total_sequence_length, bsz, s, cos_cache, sin_cache, rotary,
                    kv_heads, head_dim, scale)
                if ready is None:  # the blocks' attention names the problem
                    return chain(fns, h, residual, seqlens_k, total_sequence_length, cos_cache,
                                 sin_cache, full)
            else:
                ready = prep(bsz, s, width, packed, kv[0], kv[1], seqlens_k,
                             total_sequence_length, cos_cache, sin_cache)
                if ready is None or ready[2] or ready[0] is not kv[0]:
                    return chain(fns, h, residual, seqlens_k, total_sequence_length,
                                 cos_cache, sin_cache, full)
            known = checked[0]  # one read: another thread may replace it
            if known is None or any(w() is not a for w, a in zip(known[0], kv)):
                kvt = _kv_table(kv)  # every layer's buffers like layer 0's, or None
                if kvt is None:
                    return chain(fns, h, residual, seqlens_k, total_sequence_length,
                                 cos_cache, sin_cache, full)
                known = checked[0] = (tuple(weakref.ref(a) for a in kv), kvt)
            seqlens, total, alpha = ready[3], ready[4], ready[5]
            team = num_threads() if bsz * s * blocks >= REGION_MIN_WORK else 1
            status, y, r, spans, logits = parallel(
                region, h, residual, table, *templates, g2s, eps2s, g3s, eps3s, known[1],
                kernel_view(kv[0]), seqlens, total, cos_cache if rotary else one,
                sin_cache if rotary else one, no_pos, packed, heads, kv_heads, rotary,
                interleaved, np.float32(alpha), window, team, CHUNK_COLUMNS,
                CHUNKS_PER_THREAD * team, PREFETCH, SPAN_UNITS, SPAN_ROWS, *head_args, rows,
                _NO_PROFILE if STAGE_PROFILE is None else STAGE_PROFILE, bt)
            if status:  # nothing was written: the blocks (and their nodes) name it
                return chain(fns, h, residual, seqlens_k, total_sequence_length, cos_cache,
                             sin_cache, full)
            variant("fusion", "decoder-stack", "%d int8 blocks%s in one parallel region, "
                    "attention in %d span(s)", n_layers, " and the LM head" if in_region else "",
                    spans)
            if in_region:
                return (logits.reshape(bsz, s if select_fn is None else 1, n_vocab), r, *kv)
            if head_fn is not None:
                return (head_fn(y, *head_consts), r, *kv)
            return (y, r, *kv)

        decoder_stack.keep = keep  # the weights the table points at
        return decoder_stack


_NO_ROWS = np.zeros(0, np.int64)  # the head reads every row
_NO_TABLE = np.zeros((0, 1), np.int32)  # a contiguous KV cache
_NO_PROFILE = np.zeros((0, 1), np.int64)  # the stage timings not recorded


def _head_rows(idx: Any, h: np.ndarray) -> np.ndarray | None:
    """The rows of ``h`` (B, S, hidden) flattened to (B * S, hidden) that
    GatherND (batch_dims 1) with int64 indices ``idx`` (B, 1, 1) picks (a
    negative index counts from the end), ``_NO_ROWS`` when that is every row
    (S = 1); None when ``idx`` is not such an array or out of range."""
    if (not isinstance(idx, np.ndarray) or idx.dtype != np.int64 or h.ndim != 3
            or idx.shape != (h.shape[0], 1, 1)):
        return None
    s = h.shape[1]
    p = idx.reshape(-1)
    if s == 1 and not p.any():
        return _NO_ROWS
    if p.size and (p.min() < -s or p.max() >= s):
        return None
    return np.arange(0, p.size * s, s, dtype=np.int64) + np.where(p < 0, p + s, p)


def _kv_table(kv: Sequence[Any]) -> np.ndarray | None:
    """(layers, 2) int64 addresses of the key and value buffers ``kv`` (key 0,
    value 0, key 1, ...) when every one is a writeable C-contiguous float32
    array (float16 for a paged cache's pools, :mod:`._half`) shaped like the
    first and no layer's key and value overlap (the
    stack writes them in place); else None.

    The stack checks a set of buffers once and then recognises it by
    identity: the engine passes the same donated buffers every decode step.
    A buffer's flags or shape changed in place (not a new array) between
    two calls would go unnoticed."""
    k0 = kv[0]
    if not isinstance(k0, np.ndarray):
        return None
    shape, f32 = k0.shape, np.dtype(np.float32)
    if is_paged(k0) and k0.dtype == np.float16:  # a float16 paged cache (._half)
        f32 = k0.dtype
    table = np.empty((len(kv) // 2, 2), np.int64)
    for i, a in enumerate(kv):
        if not isinstance(a, np.ndarray):
            return None
        fl = a.flags
        if a.dtype != f32 or a.shape != shape or not fl.c_contiguous or not fl.writeable:
            return None
        table[i // 2, i % 2] = a.ctypes.data
    nbytes = k0.nbytes
    k, v = table[:, 0], table[:, 1]
    if np.any((k < v + nbytes) & (v < k + nbytes)):
        return None
    return table


def _same_layers(statics: Sequence[dict]) -> bool:
    """Whether every layer is int8 and typed and shaped like the first (the
    stack reads layer i's weights through layer 0's types and shapes)."""
    s0 = statics[0]
    if s0["variant"] != "i8" or "i8" not in _BLOCKS:
        return False
    for st in statics:
        if any(st[k] != s0[k] for k in ("packed", "hidden", "width", "heads", "kv_heads",
                                        "rotary", "window", "interleaved", "blocks",
                                        "variant")):
            return False
        for a, b in zip(st["mats"], s0["mats"]):
            if a.dtype != b.dtype or a.shape != b.shape or not a.flags.c_contiguous:
                return False
    return True


def _lm_head(g: StepGraph, last: Any, consts: dict[int, Any]) -> tuple[Any, Any] | None:
    """``(head, select)``: the step reading ``last`` block's ``h3`` alone when
    it is an LM head the stack can take in (a com.microsoft MatMulNBits of
    int8 layout with constant weights, K = hidden) and nothing reads the
    block's ``r3``; ``select`` None, or the ONNX ``GatherND`` (batch_dims 1,
    its indices not a constant) between them that picks the rows the head
    reads (a ``last_logits`` model file: :func:`actorrt.genai.models.model_file`)."""
    if not g.unused(last.outputs[1]):
        return None
    head = g.only_reader(last.outputs[0])
    select = None
    if (head is not None and _is(head, "GatherND", "") and len(head.inputs) == 2
            and head.inputs[0] == last.outputs[0] and head.inputs[1] >= 0
            and head.inputs[1] not in consts and len(head.outputs) == 1
            and head.node.attrs.get("batch_dims", 0) == 1):
        select, head = head, g.only_reader(head.outputs[0])
    src = select.outputs[0] if select is not None else last.outputs[0]
    if (head is None or not _is(head, "MatMulNBits") or head.inputs[0] != src
            or len(head.outputs) != 1
            or any(i >= 0 and i not in consts for i in head.inputs[1:])):
        return None
    p = getattr(head.kernel, "packed", None)
    if p is None or p.qi is None or p.empty or p.n_blocks * p.block_size != p.k:
        return None
    return head, select


def fuse_decoder_stacks(steps: list, protected: set[int], make_step: Callable[..., Any],
                        consts: dict[int, Any] | None = None
                        ) -> tuple[list, list[tuple[str, tuple]]]:
    """Replace every run of consecutive int8 :class:`DecoderBlock` steps
    (each reading the previous one's ``h3, r3`` and nothing else reading
    those, the same lengths and rotary caches) by one :class:`DecoderStack`,
    taking in the LM head that follows (:func:`_lm_head`, when ``consts``
    holds the plan's constant slots and :data:`STACK_HEAD`).

    Returns ``(steps, fusions)`` as :func:`fuse_decoder_blocks` does, one
    ``(stack name, block (and head) names)`` per stack."""
    g = StepGraph(steps, protected)
    runs: list[list] = []
    for st in steps:
        if not isinstance(st.kernel, DecoderBlock) or st.kernel.match["variant"] != "i8":
            continue
        prev = runs[-1][-1] if runs else None
        if (prev is not None and tuple(st.inputs[:2]) == tuple(prev.outputs[:2])
                and tuple(st.inputs[4:8]) == tuple(prev.inputs[4:8])
                and all(g.only_reader(o) is st for o in prev.outputs[:2])):
            runs[-1].append(st)
        else:
            runs.append([st])
    pos = positions(steps)
    groups = []
    for run in runs:
        if len(run) < 2:
            continue
        outs = [o for b in run for o in b.outputs[2:4]] + list(run[-1].outputs[:2])
        if g.read_early(run, outs, pos):
            continue
        found = _lm_head(g, run[-1], consts) if consts is not None and STACK_HEAD else None
        head, select = found if found is not None else (None, None)
        extra = [x for x in (select, head) if x is not None]
        if extra and g.read_early(run + extra, outs + [o for x in extra for o in x.outputs],
                                  pos):
            head = select = None
            extra = []
        hc = tuple(consts[i] if i >= 0 else None for i in head.inputs[1:]) if head else ()
        groups.append((run + extra, (run, head, hc, select)))
    return replace_groups(steps, groups, lambda pl: _stack_step(*pl, make_step=make_step))


def _stack_step(run: list, head: Any, head_consts: tuple, select: Any,
                make_step: Callable[..., Any]) -> Any:
    first, last = run[0], run[-1]
    kv_in = [i for b in run for i in b.inputs[2:4]]
    kv_out = [o for b in run for o in b.outputs[2:4]]
    # a head's row selection: its indices are the stack's last input
    in_slots = (*first.inputs[:2], *first.inputs[4:8], *kv_in,
                *((select.inputs[1],) if select is not None else ()))
    out_slots = (head.outputs[0] if head is not None else last.outputs[0], last.outputs[1],
                 *kv_out)
    extra = [x for x in (select, head) if x is not None]
    names, types = slot_names(run + extra)
    base = [b.node.name.rsplit("/", 1)[0] for b in (first, last)]
    common = len(os.path.commonprefix(base))
    while common and base[1][common - 1].isdigit():  # "layers.0".."layers.29": "layers."
        common -= 1
    node = NodeSpec(name=f"{base[0]}..{base[1][common:]}/{STACK_OP}", op_type=STACK_OP,
                    domain=FUSED_DOMAIN, opset=1,
                    attrs={"fused_nodes": [b.node.name for b in run + extra],
                           "variant": "i8"},
                    inputs=tuple(names.get(s, "") if s >= 0 else "" for s in in_slots),
                    outputs=tuple(names.get(s, "") if s >= 0 else "" for s in out_slots),
                    input_types=tuple(types.get(s) for s in in_slots),
                    output_types=tuple(types.get(s) for s in out_slots),
                    model=first.node.model)
    cost = run[0].cost
    for b in run[1:] + extra:
        cost = cost + b.cost
    return make_step(node, first.provider, DecoderStack(node, run, head, head_consts, select),
                     in_slots, out_slots, cost)


def fuse_decoder_blocks(steps: list, protected: set[int], consts: dict[int, Any],
                        make_step: Callable[..., Any], provider: Any,
                        declined: list | None = None) -> tuple[list, list[tuple[str, tuple]]]:
    """Replace every matching decoder block of ``steps`` (see the module
    docstring) by one :class:`DecoderBlock` step.

    Args:
        steps: the plan's steps in topological order (kernels instantiated).
        protected: slots read outside the steps (graph outputs).
        consts: slot -> constant value (inputs the steps read from constants).
        make_step: ``make_step(node, provider, kernel, inputs, outputs, cost)``
            builds a plan step.
        provider: only blocks whose every node runs on this provider fuse.
        declined: when given, gets ``(GroupQueryAttention node name, reason)``
            for each attention of this provider whose block is not fused
            (another architecture's block: q/k norms, sandwich norms, a GELU
            MLP, biases...), left to the unfused kernels.

    Returns:
        ``(steps, fusions)``: the new step list in topological order and, per
        fused block, ``(fused node name, original node names)``.
    """
    if not _BLOCKS:
        return steps, []
    g = StepGraph(steps, protected)
    pos = positions(steps)
    taken: set[int] = set()
    groups = []
    for st in steps:
        if not _is(st, "GroupQueryAttention") or st.provider is not provider:
            continue
        why: list[str] = []
        mt = _match(g, st, why)
        if mt is None:  # gemma3 / qwen2 blocks, block-16 projections (int8)
            from . import _fusion_variants
            mt = _fusion_variants.match_variant(g, st, why)
        if mt is None:
            if declined is not None:
                declined.append((st.node.name, why[0] if why else "the pattern differs"))
            continue
        if (any(id(s) in taken for s in mt["steps"])
                or g.read_early(mt["steps"], mt["outputs"], pos)):
            continue
        taken.update(id(s) for s in mt["steps"])
        groups.append((mt["steps"], mt))  # the block runs where its last node ran
    return replace_groups(steps, groups, lambda mt: _fused_step(mt, consts, make_step))


def _fused_step(mt: dict, consts: dict[int, Any], make_step: Callable[..., Any]) -> Any:
    subs = sorted(mt["steps"], key=lambda s: s.index)
    gqa = next(s for s in subs if _is(s, "GroupQueryAttention"))
    base = gqa.node.name.rsplit("/", 2)[0] if gqa.node.name.count("/") >= 2 else gqa.node.name
    name = base + "/DecoderBlock"
    in_slots, out_slots = tuple(mt["inputs"]), tuple(mt["outputs"])
    names, types = slot_names(subs)
    mt["node_names"] = [s.node.name for s in subs]
    node = NodeSpec(name=name, op_type=FUSED_OP, domain=FUSED_DOMAIN, opset=1,
                    attrs={"fused_nodes": list(mt["node_names"]), "variant": mt["variant"]},
                    inputs=tuple(names.get(s, "") if s >= 0 else "" for s in in_slots),
                    outputs=tuple(names.get(s, "") if s >= 0 else "" for s in out_slots),
                    input_types=tuple(types.get(s) for s in in_slots),
                    output_types=tuple(types.get(s) for s in out_slots),
                    model=gqa.node.model)
    mt["in_slots"], mt["out_slots"] = in_slots, out_slots
    mt["consts"] = {i: consts[i] for sub in subs for i in sub.inputs if i in consts}
    cost = subs[0].cost
    for s in subs[1:]:
        cost = cost + s.cost
    kernel = mt.get("kernel_class", DecoderBlock)(node, mt, subs)
    return make_step(node, gqa.provider, kernel, in_slots, out_slots, cost)
