"""Decoder-block fusion of the architecture variants (gemma3, qwen2) and of
blocks with 16-value-block projections, for int8 activations
(``accuracy_level=4``): the pattern of :mod:`._fusion` with, optionally,

    q/k/v (or packed qkv) = Add(MatMulNBits(h), bias)            qwen2
    q, k = Reshape(SimplifiedLayerNormalization(Reshape(
               MatMulNBits(h), [0, 0, H, D]), gamma_d), [0, 0, H * D])   gemma3
    o' = SimplifiedLayerNormalization(o, gamma)      post-attention norm (gemma3)
    act = Mul(Gelu[approximate=tanh](gate), up)      GELU-tanh MLP (gemma3)
    down' = SimplifiedLayerNormalization(down, gamma)  post-FFN norm (gemma3)

(the biases, gammas constant float32; the norms over the last axis, their
extra outputs unused), any int8 projection layout (block 32 of
:func:`._contrib_int8.pack_i8` or block 16 of
:func:`._contrib_int8_b16.pack_b16`, mixed freely). The fused step is a
:class:`VariantBlock` running :func:`._block_variants.region_block_v`;
values its hot path does not take run the original kernels, as
:class:`._fusion.DecoderBlock` does. :func:`match_variant` is called by
:func:`._fusion.fuse_decoder_blocks` for every block the plain matcher
declines. Variant blocks are not stacked (:class:`._fusion.DecoderStack`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .... import tracing
from . import _contrib_int8 as _i8
from . import _contrib_numba as _nb
from . import _fusion as _fu
from ._fused import StepGraph
from .paged import is_paged

__all__ = ["VariantBlock", "match_variant", "VARIANT"]

#: the match's ``variant`` (and the fused node's attribute)
VARIANT = "i8-variant"
#: fuse the variant blocks at all (False: leave them to the unfused kernels).
#: Measured on Gemma 3 270M, level 4, same run, on a machine shared by five
#: (load ~10 on 2 cores): 1 thread 206 vs 344 ms a decode step (fused
#: faster), 2 threads 414-664 vs 110-194 ms (slower: a team thread spinning
#: at a stage's end while its partner is descheduled; the plain block's
#: region works the same way). On the idle machine (2 threads, 56-token
#: prompt, 32 greedy tokens, 2 interleaved rounds, same run): fused / unfused
#: prompt 0.89x, decode 0.92x (35.9 vs 39.2 tok/s): off by default until the
#: variant blocks stack and beat the unfused kernels.
VARIANT_BLOCKS = False
_SLN = "SimplifiedLayerNormalization"


def _const(step: Any, i: int) -> np.ndarray | None:
    v = step.node.constant_inputs.get(i)
    return v if isinstance(v, np.ndarray) else None


def _is_any(step: Any, op: str) -> bool:
    return step is not None and step.node.op_type == op and (step.node.domain or "") in (
        "", "com.microsoft")


def _plain_norm(g: StepGraph, step: Any, x: int, width: int) -> tuple[int, np.ndarray, float] | None:
    """(output slot, gamma, epsilon) of SimplifiedLayerNormalization(x, gamma)
    over the last axis, gamma constant float32 (width,), other outputs unused."""
    if not _is_any(step, _SLN) or len(step.inputs) != 2 or step.inputs[0] != x:
        return None
    gamma = _const(step, 1)
    if gamma is None or gamma.dtype != np.float32 or gamma.shape != (width,):
        return None
    if int(step.node.attr("axis", -1)) != -1 or int(step.node.attr("stash_type", 1)) != 1:
        return None
    outs = step.outputs
    if outs[0] < 0 or not all(g.unused(o) for o in outs[1:]):
        return None
    return outs[0], np.ascontiguousarray(gamma), float(step.node.attr("epsilon", 1e-5))


def _shape_is(step: Any, want: list[int]) -> bool:
    shape = _const(step, 1)
    return (_is_any(step, "Reshape") and shape is not None and shape.dtype == np.int64
            and shape.tolist() == want and not step.node.attr("allowzero", 0))


def _projection(g: StepGraph, slot: int, reader: Any, heads: int
                ) -> tuple[Any, np.ndarray | None, tuple | None, list] | None:
    """The chain producing ``slot`` (read only by ``reader``): ``(MatMulNBits
    step, bias or None, (gamma, eps) of a per-head norm or None, the steps in
    between)``."""
    between: list = []
    st = g.producer.get(slot)
    if st is None or g.only_reader(slot) is not reader:
        return None
    norm = None
    if _is_any(st, "Reshape"):  # Reshape(SLN(Reshape(y, [0, 0, H, D])), [0, 0, H * D])
        sln = g.producer.get(st.inputs[0])
        if not _is_any(sln, _SLN) or g.only_reader(st.inputs[0]) is not st:
            return None
        r1 = g.producer.get(sln.inputs[0])
        if not _is_any(r1, "Reshape") or g.only_reader(sln.inputs[0]) is not sln:
            return None
        gamma = _const(sln, 1)
        if gamma is None or gamma.ndim != 1:
            return None
        d = gamma.shape[0]
        if not (_shape_is(r1, [0, 0, heads, d]) and _shape_is(st, [0, 0, heads * d])):
            return None
        found = _plain_norm(g, sln, sln.inputs[0], d)
        if found is None:
            return None
        norm = found[1:]
        between = [r1, sln, st]
        slot, reader, st = r1.inputs[0], r1, g.producer.get(r1.inputs[0])
        if st is None or g.only_reader(slot) is not reader:
            return None
    bias = None
    if _is_any(st, "Add") and len(st.inputs) == 2:
        consts = [_const(st, i) for i in (0, 1)]
        which = 1 if consts[1] is not None else 0 if consts[0] is not None else -1
        if which < 0:
            return None
        bias = consts[which]
        if bias.dtype != np.float32 or bias.ndim != 1:
            return None
        between = [st] + between
        slot, reader = st.inputs[1 - which], st
        st = g.producer.get(slot)
        if st is None or g.only_reader(slot) is not reader:
            return None
    if not _fu._is(st, "MatMulNBits") or st.inputs[0] < 0:
        return None
    if bias is not None and bias.shape != (st.kernel.n,):
        return None
    return st, bias, norm, between


def _gelu_mlp(g: StepGraph, readers: list) -> tuple | None:
    """(gate step, up step, [Gelu, Mul] steps, product slot) of
    ``Mul(Gelu[tanh](gate), up)`` (either operand order), or None."""
    for gate, up in (readers, readers[::-1]):
        gs, us = gate.outputs[0], up.outputs[0]
        gelu = g.only_reader(gs)
        if not _is_any(gelu, "Gelu") or gelu.inputs[0] != gs:
            continue
        approx = gelu.node.attr("approximate", "none")
        if (approx.decode() if isinstance(approx, bytes) else str(approx)) != "tanh":
            continue
        mul = g.only_reader(gelu.outputs[0])
        if (not _is_any(mul, "Mul") or g.only_reader(us) is not mul
                or sorted(mul.inputs) != sorted([gelu.outputs[0], us])):
            continue
        return gate, up, [gelu, mul], mul.outputs[0]
    return None


def _layout(kernel: Any) -> tuple | None:
    """(w, d, dz) of an int8 MatMulNBits the variant block runs (block 32,
    or block 16 with ``d`` / ``dz`` viewed 3-D), else None."""
    p = getattr(kernel, "packed", None)
    if p is None or p.empty or kernel.node.has_input(5) or kernel.node.has_input(4):
        return None
    if p.qi is not None and p.n_blocks * p.block_size == p.k:
        return p.qi, p.scales, p.dz
    if p.i16 is not None and p.k % 32 == 0 and p.n % 4 == 0:
        w, d, dz = p.i16
        return w, d.reshape(d.shape[0], -1, 2), dz.reshape(dz.shape[0], -1, 2)
    return None


def match_variant(g: StepGraph, gqa: Any, why: list | None = None) -> dict | None:
    """The variant decoder block around one GroupQueryAttention step (module
    docstring), or None (then ``why``, when given, gets the reason first)."""
    def no(reason: str) -> None:
        if why is not None:
            why.insert(0, reason)
        return None

    if not _i8.HAVE_INT8_DOT or not VARIANT_BLOCKS:
        return no("no int8 kernels on this machine for the variant block" if VARIANT_BLOCKS
                  else "variant block fusion turned off (_fusion_variants.VARIANT_BLOCKS)")
    prep = gqa.kernel.fast_path() if hasattr(gqa.kernel, "fast_path") else None
    ins = gqa.inputs
    if prep is None or len(ins) < 7 or any(i >= 0 for i in ins[9:]) or gqa.outer:
        return None  # the plain matcher's reason stands
    if any(i < 0 for i in ins[3:7]) or (gqa.kernel.do_rotary and (len(ins) < 9 or ins[7] < 0
                                                                  or ins[8] < 0)):
        return None
    heads, kv_heads = gqa.kernel.h, gqa.kernel.kvh
    packed = ins[1] < 0 and ins[2] < 0
    slots = [ins[0]] if packed else list(ins[:3])
    if any(i < 0 for i in slots):
        return None
    chains = [_projection(g, s, gqa, h) for s, h in zip(slots, (heads, kv_heads, kv_heads))]
    if any(c is None for c in chains):
        return no("q/k/v are not MatMulNBits outputs (with biases / per-head norms) read only "
                  "by attention")
    qkv = [c[0] for c in chains]
    h = qkv[0].inputs[0]
    if any(p.inputs[0] != h for p in qkv):
        return None
    biases = [c[1] for c in chains]
    norms = [c[2] for c in chains]
    if packed and norms[0] is not None:
        return no("a per-head norm on packed QKV")
    if not packed and (norms[2] is not None or (norms[0] is None) != (norms[1] is None)):
        return no("per-head norms on v, or on only one of q and k")
    if any(b is not None for b in biases) and not packed and any(b is None for b in biases):
        return no("biases on some of q, k, v only")
    if norms[0] is not None and (norms[0][0].shape != norms[1][0].shape
                                 or norms[0][1] != norms[1][1]):
        return no("q and k norms of different widths or epsilons")
    attn, present_k, present_v = (list(gqa.outputs) + [-1, -1])[:3]
    o_proj = g.only_reader(attn)
    if not _fu._is(o_proj, "MatMulNBits") or o_proj.inputs[0] != attn:
        return None
    hidden = qkv[0].kernel.k
    o_slot, pn2 = o_proj.outputs[0], None
    post = g.only_reader(o_slot)
    found = _plain_norm(g, post, o_slot, hidden)
    if found is not None:
        o_slot, pn2 = found[0], found[1:]
        extra_attn = [post]
    else:
        extra_attn = []
    norm2 = g.only_reader(o_slot)
    n2 = _fu._skip_norm(g, norm2, o_slot)
    if n2 is None:
        return no("o_proj (after an optional post-attention norm) is not followed by "
                  "SkipSimplifiedLayerNormalization")
    residual, gamma2, eps2 = n2
    h2, r2 = norm2.outputs[0], norm2.outputs[3]
    readers = g.consumers.get(h2, [])
    if h2 in g.protected or len(readers) != 2 or not all(_fu._is(r, "MatMulNBits")
                                                         for r in readers):
        return None
    mlp, gelu = _fu._silu_mlp(g, readers), False
    if mlp is None:
        mlp, gelu = _gelu_mlp(g, readers), True
    if mlp is None:
        return no("the MLP is neither SiLU- nor GELU-tanh-gated")
    gate, up, steps_mlp, act = mlp
    down = g.only_reader(act)
    if not _fu._is(down, "MatMulNBits") or down.inputs[0] != act:
        return None
    d_slot, pn3 = down.outputs[0], None
    post3 = g.only_reader(d_slot)
    found = _plain_norm(g, post3, d_slot, hidden)
    if found is not None:
        d_slot, pn3 = found[0], found[1:]
        extra_ffn = [post3]
    else:
        extra_ffn = []
    norm3 = g.only_reader(d_slot)
    n3 = _fu._skip_norm(g, norm3, d_slot)
    if n3 is None or n3[0] != r2 or g.only_reader(r2) is not norm3:
        return no("down_proj (after an optional post-FFN norm) is not followed by the next "
                  "SkipSimplifiedLayerNormalization")
    _, gamma3, eps3 = n3
    mats = [*qkv, o_proj, gate, up, down]
    layouts = [_layout(m.kernel) for m in mats]
    if any(lay is None for lay in layouts):
        return no("a projection is not on the int8 kernels (accuracy_level 4, block 32 or 16)")
    steps = [*qkv, *[s for c in chains for s in c[3]], gqa, o_proj, *extra_attn, norm2, gate,
             up, *steps_mlp, down, *extra_ffn, norm3]
    if len({st.provider for st in steps}) != 1 or any(st.outer for st in steps):
        return no("the block spans several providers or reads outer-scope values")
    return dict(steps=steps, packed=packed, hidden=hidden, variant=VARIANT,
                weights=layouts, blocks=sum(m.kernel.n * m.kernel.k for m in mats) // 32,
                prep=prep, gqa=gqa.kernel, gamma2=gamma2, eps2=eps2, gamma3=gamma3, eps3=eps3,
                biases=biases, qk_norm=norms[0] and (norms[0][0], norms[1][0], norms[0][1]),
                pn2=pn2, pn3=pn3, gelu=gelu, kernel_class=VariantBlock,
                inputs=(h, residual, *ins[3:9]),
                outputs=(norm3.outputs[0], norm3.outputs[3], present_k, present_v))


class VariantBlock(_fu.DecoderBlock):
    """A fused variant decoder block (module docstring): the inputs and
    outputs of :class:`._fusion.DecoderBlock`; the original kernels run
    (and name any problem) when a value leaves the compiled path."""

    def statics(self) -> dict[str, Any] | None:
        st = super().statics()
        if st is None:
            return None
        mt = self.match
        f32 = np.float32
        empty = np.zeros(0, f32)
        mats = st["mats"]
        bq, bk, bv = (b if b is not None else empty for b in (list(mt["biases"]) + [None] * 2)[:3])
        if st["packed"]:
            bk = bv = empty
        has_bias = any(b is not None for b in mt["biases"])
        width = mats[0].shape[0]
        if has_bias and (bq.shape != (width,) or (not st["packed"] and (
                bk.shape != (mats[3].shape[0],) or bv.shape != (mats[6].shape[0],)))):
            return None
        qn = mt["qk_norm"]
        pn2, pn3 = mt["pn2"], mt["pn3"]
        st.update(bq=bq, bk=bk, bv=bv, has_bias=has_bias,
                  qn=qn[0] if qn else empty, kn=qn[1] if qn else empty,
                  eps_qk=f32(qn[2] if qn else 0.0), has_qk_norm=bool(qn),
                  pn2=pn2[0] if pn2 else empty, eps_p2=f32(pn2[1] if pn2 else 0.0),
                  has_pn2=pn2 is not None, pn3=pn3[0] if pn3 else empty,
                  eps_p3=f32(pn3[1] if pn3 else 0.0), has_pn3=pn3 is not None,
                  gelu=bool(mt["gelu"]))
        return st

    def compile(self) -> Callable:
        st = self.statics()
        from . import _block_variants as _bv
        if st is None or not hasattr(_bv, "region_block_v"):
            return self.run
        block = _bv.region_block_v
        (qw, qd, qz, kw, kd, kz, vw, vd, vz, ow, od, oz, gw, gd, gz, uw, ud, uz, dw, dd,
         dz) = st["mats"]
        prep, packed, hidden, width = st["prep"], st["packed"], st["hidden"], st["width"]
        heads, kv_heads, rotary = st["heads"], st["kv_heads"], st["rotary"]
        window, interleaved = st["window"], st["interleaved"]
        g2, g3, eps2, eps3 = st["g2"], st["g3"], st["eps2"], st["eps3"]
        tail = (st["bq"], st["bk"], st["bv"], st["has_bias"], st["qn"], st["kn"],
                st["eps_qk"], st["has_qk_norm"], st["pn2"], st["eps_p2"], st["has_pn2"],
                st["pn3"], st["eps_p3"], st["has_pn3"], st["gelu"])
        f32 = np.dtype(np.float32)
        fallback, parallel, num_threads = self._fallback, _nb._parallel, _nb.num_threads
        variant = tracing.kernel_variant
        one, no_pos = _nb._ONE, _nb._NO_POS
        blocks, n_sub = st["blocks"], len(self.sub_steps)

        def variant_block(h, residual, past_key, past_value, seqlens_k, total_sequence_length,
                          cos_cache=None, sin_cache=None):
            if (h.dtype != f32 or residual.dtype != f32 or h.ndim != 3 or h.shape[2] != hidden
                    or residual.shape != h.shape or not h.flags.c_contiguous
                    or not residual.flags.c_contiguous):
                return fallback(h, residual, past_key, past_value, seqlens_k,
                                total_sequence_length, cos_cache, sin_cache)
            if type(past_key) is not np.ndarray and is_paged(past_key):
                # a paged cache: the original kernels read its block table
                return fallback(h, residual, past_key, past_value, seqlens_k,
                                total_sequence_length, cos_cache, sin_cache)
            bsz, s = h.shape[0], h.shape[1]
            ready = prep(bsz, s, width, packed, past_key, past_value, seqlens_k,
                         total_sequence_length, cos_cache, sin_cache)
            if ready is None:
                return fallback(h, residual, past_key, past_value, seqlens_k,
                                total_sequence_length, cos_cache, sin_cache)
            present_k, present_v, copy, seqlens, total, alpha = ready
            threads = num_threads()
            team = threads if bsz * s * blocks >= _fu.REGION_MIN_WORK else 1
            status, y, r, spans = parallel(
                block, h, residual, qw, qd, qz, kw, kd, kz, vw, vd, vz, packed,
                past_key if copy else present_k, past_value if copy else present_v,
                present_k, present_v, seqlens, total, cos_cache if rotary else one,
                sin_cache if rotary else one, no_pos, heads, kv_heads, copy, rotary,
                interleaved, np.float32(alpha), window, ow, od, oz, g2, eps2, gw, gd, gz, uw,
                ud, uz, dw, dd, dz, g3, eps3, team, _fu.CHUNK_COLUMNS,
                _fu.CHUNKS_PER_THREAD * team, _fu.PREFETCH, _fu.SPAN_UNITS, _fu.SPAN_ROWS,
                *tail)
            if status:  # nothing was written: the original kernels name the problem
                return fallback(h, residual, past_key, past_value, seqlens_k,
                                total_sequence_length, cos_cache, sin_cache)
            variant("fusion", "decoder-block", "%s, %d nodes in one call, attention in %d "
                    "span(s)", VARIANT, n_sub, spans)
            return y, r, present_k, present_v

        return variant_block
