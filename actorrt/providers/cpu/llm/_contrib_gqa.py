"""com.microsoft GroupQueryAttention on the CPU provider (onnxruntime CPU
semantics: BNSH KV cache, right-padded batches described by ``seqlens_k``).

Per batch entry ``b`` the cache holds ``T_b = seqlens_k[b] + 1`` tokens after
the step. On the first prompt (``sequence_length == total_sequence_length``)
nothing is cached before it (``P_b = 0``) and rows ``s >= T_b`` are padding;
otherwise ``P_b = T_b - sequence_length`` tokens were cached and the new rows
go to positions ``[P_b, T_b)``. Query row ``s`` attends causally to cache
positions ``[0, P_b + s]`` (only the last ``local_window_size`` of them, itself
included, when a window is set). Rotary positions without ``position_ids``:
``s`` on the first prompt, ``P_b + s`` afterwards. ``present_*`` hold
``max(total_sequence_length, past length)`` rows: each entry's ``P_b`` past rows,
then its new rows, zeros after (onnxruntime without buffer sharing).
Attention scores: ``scale * q.k`` (+ attention_bias), softcap, causal/window
mask, softmax (with a zero logit for smooth_softmax, or ``head_sink[h]``).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .... import tracing

from ..._contract import Kernel, NodeSpec, deny, require
from actorrt._lazy import lazy_module
from ..registry import cpu_kernel
from .paged import is_paged

_nb = lazy_module(f"{__package__}._contrib_numba", globals(), "_nb")  # numba on first use

_LOW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _f32(x):
    return x.astype(np.float32) if x.dtype in _LOW else x


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotate x (B, N, S, D) in place by cos/sin (B, 1, S, rot/2)."""
    rot = cos.shape[-1] * 2
    if interleaved:
        x1 = x[..., 0:rot:2].copy()
        x2 = x[..., 1:rot:2].copy()
        x[..., 0:rot:2] = x1 * cos - x2 * sin
        x[..., 1:rot:2] = x2 * cos + x1 * sin
    else:
        h = rot // 2
        x1 = x[..., :h].copy()
        x2 = x[..., h:rot].copy()
        x[..., :h] = x1 * cos - x2 * sin
        x[..., h:rot] = x2 * cos + x1 * sin
    return x


def _lengths(seqlens_k, total_sequence_length, bsz: int, s: int) -> tuple[np.ndarray, int]:
    """``(seqlens (B,) int64, total)`` after onnxruntime's checks: one total
    length >= S, one seqlens_k entry per batch row, each in [0, total).

    Raises:
        ValueError: a length input breaks those rules.
    """
    if seqlens_k is None or total_sequence_length is None:
        raise ValueError("GroupQueryAttention: seqlens_k and total_sequence_length are required")
    tot = np.asarray(total_sequence_length).reshape(-1)
    if tot.size != 1:
        raise ValueError(f"GroupQueryAttention: total_sequence_length must hold one value, got "
                         f"{tot.size}")
    total = int(tot[0])
    if total < s:
        raise ValueError(f"GroupQueryAttention: total_sequence_length {total} is shorter than "
                         f"sequence_length {s}")
    seqlens = np.asarray(seqlens_k).reshape(-1).astype(np.int64, copy=False)
    if seqlens.shape[0] != bsz:
        raise ValueError(f"GroupQueryAttention: seqlens_k has {seqlens.shape[0]} entries "
                         f"for a batch of {bsz}")
    bad = np.flatnonzero((seqlens < 0) | (seqlens >= total))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"GroupQueryAttention: seqlens_k[{b}] = {int(seqlens[b])} is out of "
                         f"range [0, {total}) (total_sequence_length {total})")
    return seqlens, total


@cpu_kernel("GroupQueryAttention", domain="com.microsoft")
class GroupQueryAttention(Kernel):
    """com.microsoft GroupQueryAttention: query (B, S, H*D) or packed QKV
    (B, S, (H + 2*KVH)*D); past/present KV (B, KVH, L, D); seqlens_k (B,) int32;
    total_sequence_length int32 scalar. Outputs (output (B, S, H*D),
    present_key, present_value)."""

    multi_output = True
    #: present_key/present_value may reuse past_key/past_value when the past
    #: buffer has room (onnxruntime's shared past/present buffer) and is writable
    inplace = {1: 3, 2: 4}

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        h = node.attr("num_heads", 0)
        kvh = node.attr("kv_num_heads", 0)
        require(h > 0 and kvh > 0 and h % kvh == 0,
                "GroupQueryAttention: num_heads (%s) must be a positive multiple of "
                "kv_num_heads (%s)", h, kvh)
        require(node.attr("causal", 1) == 1, "GroupQueryAttention: causal=0 is not supported")
        for a in ("k_quant_type", "v_quant_type"):
            q = node.attr(a, "NONE")
            q = q.decode() if isinstance(q, bytes) else q
            require(q == "NONE", "GroupQueryAttention: quantized KV cache (%s=%s) is not "
                    "supported", a, q)
        require(not node.attr("kv_cache_bit_width", 0),
                "GroupQueryAttention: quantized KV cache is not supported")
        require(not node.attr("sliding_window_cache", 0),
                "GroupQueryAttention: sliding_window_cache=1 is not supported")
        require(not node.attr("qk_output", 0),
                "GroupQueryAttention: qk_output is not supported")
        for i, what in ((12, "k_scale"), (13, "v_scale"), (14, "q_norm_weight"),
                        (15, "k_norm_weight"), (16, "query_seqlens")):
            if node.has_input(i):
                deny("GroupQueryAttention: input %s is not supported", what)
        if node.attr("do_rotary", 0):
            require(node.has_input(7) and node.has_input(8),
                    "GroupQueryAttention: do_rotary=1 needs cos_cache and sin_cache")

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        a = node.attr
        self.h = int(a("num_heads"))
        self.kvh = int(a("kv_num_heads"))
        self.scale = float(a("scale", 0.0) or 0.0)
        self.softcap = float(a("softcap", 0.0) or 0.0)
        self.window = int(a("local_window_size", -1))
        self.do_rotary = bool(a("do_rotary", 0))
        self.interleaved = bool(a("rotary_interleaved", 0))
        self.smooth = int(a("smooth_softmax", -1)) == 1
        #: the numba kernel (rotary + append + attention in one pass) serves
        #: float32 without bias/softcap/sink; the numpy path serves the rest
        self.fused = _nb.HAVE_NUMBA
        if self.fused:
            _nb.warm_up()

    def _check(self, query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
               cos_cache, sin_cache, position_ids):
        """Shape checks shared by both paths (the compiled kernel does not
        bounds-check). Returns ``(B, S, head_size, past length, seqlens, total)``.

        Raises:
            ValueError: an input's shape or a length breaks the contrib op's rules.
        """
        h, kvh = self.h, self.kvh
        if query is None or query.ndim != 3:
            raise ValueError(f"GroupQueryAttention: query must be (B, S, hidden), got "
                             f"{None if query is None else query.shape}")
        bsz, s, width = query.shape
        if (key is None) != (value is None):
            raise ValueError("GroupQueryAttention: key and value must both be given, or both "
                             "be absent (packed QKV)")
        groups = h + 2 * kvh if key is None else h
        if width % groups:
            raise ValueError(f"GroupQueryAttention: query width {width} is not a multiple of "
                             f"{groups} heads")
        d = width // groups
        if key is not None:
            for name, x in (("key", key), ("value", value)):
                if x.shape != (bsz, s, kvh * d):
                    raise ValueError(f"GroupQueryAttention: {name} must be {(bsz, s, kvh * d)}, "
                                     f"got {x.shape}")
        seqlens, total = _lengths(seqlens_k, total_sequence_length, bsz, s)
        past_len = 0
        if past_key is not None or past_value is not None:
            ref = past_key if past_key is not None else past_value
            past_len = ref.shape[2] if ref.ndim == 4 else -1
            for name, x in (("past_key", past_key), ("past_value", past_value)):
                if x is None or x.shape != (bsz, kvh, past_len, d):
                    raise ValueError(f"GroupQueryAttention: {name} must be (B={bsz}, "
                                     f"KVH={kvh}, L, D={d}), got "
                                     f"{None if x is None else x.shape}")
        if self.do_rotary:
            cs, sn = np.shape(cos_cache), np.shape(sin_cache)
            if len(cs) != 2 or sn != cs or not 0 < 2 * cs[1] <= d:
                raise ValueError(f"GroupQueryAttention: cos_cache/sin_cache must be (positions, "
                                 f"rotary_dim/2 <= {d // 2}), got {cs} and {sn}")
            if position_ids is not None and np.size(position_ids) != bsz * s:
                raise ValueError(f"GroupQueryAttention: position_ids must hold {bsz}x{s} "
                                 f"positions, got {np.shape(position_ids)}")
        return bsz, s, d, past_len, seqlens, total

    def _run_fused(self, query, key, value, past_key, past_value, seqlens_k,
                   total_sequence_length, cos_cache, sin_cache, position_ids):
        """float32 without bias/softcap/sink: one numba pass (see
        :func:`._contrib_numba.gqa_attention`) after :meth:`_check`."""
        h, kvh = self.h, self.kvh
        bsz, s, d, past_len, seqlens, total = self._check(
            query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
            sin_cache, position_ids)
        present_len = max(total, past_len)
        if (past_key is not None and past_len == present_len and past_key.flags.writeable
                and past_value.flags.writeable and not np.shares_memory(past_key, past_value)):
            present_k, present_v, copy = past_key, past_value, False
            tracing.kernel_variant("kv", "in-place", "past buffer donated with capacity %d",
                                   past_len)
        else:
            present_k = np.zeros((bsz, kvh, present_len, d), np.float32)
            present_v = np.zeros((bsz, kvh, present_len, d), np.float32)
            copy = past_len > 0
        cos = sin = pos = None
        if self.do_rotary:
            cos = np.ascontiguousarray(_f32(cos_cache), np.float32)
            sin = np.ascontiguousarray(_f32(sin_cache), np.float32)
            if position_ids is not None:
                pos = np.ascontiguousarray(np.asarray(position_ids, np.int64).reshape(bsz, s))
        y, status = _nb.gqa_attention(
            query, key, value, past_key if copy else present_k,
            past_value if copy else present_v, present_k, present_v, seqlens, total, cos, sin,
            pos, num_heads=h, kv_num_heads=kvh, copy_past=copy,
            alpha=self.scale if self.scale != 0.0 else 1.0 / math.sqrt(d), window=self.window,
            interleaved=self.interleaved)
        if status == 1:
            raise ValueError(f"GroupQueryAttention: seqlens_k {seqlens.tolist()} do not fit "
                             f"sequence_length {s} and a present length of {present_len}")
        if status == 2:
            raise ValueError("GroupQueryAttention: past_key is shorter than seqlens_k says")
        if status == 3:
            raise ValueError(f"GroupQueryAttention: rotary positions exceed cos_cache "
                             f"({cos.shape[0]} rows)")
        tracing.kernel_variant("attention", "numba-fused", "float32, no bias/softcap/sink")
        return y, present_k, present_v

    def fast_path(self):
        """The checks of the compiled hot path, shared by :meth:`compile` and
        the decoder-block fusion (:mod:`._fusion`): ``None`` when the numba
        kernel cannot serve this node at all (no numba, softcap, smooth
        softmax), else ``prep(bsz, s, width, packed, past_key, past_value,
        seqlens_k, total_sequence_length, cos_cache, sin_cache)``.

        ``prep`` returns ``None`` when these values leave the hot path (a
        float32 past of shape (B, KVH, L, D), int seqlens (B,), one total
        length >= S, validated float32 rotary caches), else ``(present_k,
        present_v, copy_past, seqlens (B,) int64, total, alpha)``: the present
        buffers are the past ones when they have room and may be written,
        else new zeroed arrays. It remembers validated rotary caches by
        identity and raises nothing: :meth:`run` finds and names problems."""
        if not self.fused or self.smooth or self.softcap > 0.0:
            return None
        h, kvh, rotary = self.h, self.kvh, self.do_rotary
        f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
        variant, shares, zeros = tracing.kernel_variant, np.shares_memory, np.zeros
        scale = self.scale
        checked: list = [None, None]  # rotary caches (cos, sin) already validated

        def prep(bsz, s, width, packed, past_key, past_value, seqlens_k, total_sequence_length,
                 cos_cache, sin_cache):
            if (past_key is None or past_value is None or seqlens_k is None
                    or total_sequence_length is None or past_key.dtype != f32
                    or past_value.dtype != f32):
                return None
            heads = h + 2 * kvh if packed else h
            d = width // heads
            past_len = past_key.shape[2] if past_key.ndim == 4 else -1
            pshape = (bsz, kvh, past_len, d)
            tsl = total_sequence_length.reshape(-1)
            seqlens = seqlens_k.reshape(-1)
            if (width != heads * d or past_key.shape != pshape or past_value.shape != pshape
                    or tsl.shape != (1,) or seqlens.shape != (bsz,) or seqlens.dtype.kind != "i"):
                return None
            total = int(tsl[0])
            if total < s:
                return None
            if rotary and (cos_cache is not checked[0] or sin_cache is not checked[1]):
                cs = np.shape(cos_cache)
                if (cos_cache.dtype != f32 or sin_cache.dtype != f32 or len(cs) != 2
                        or np.shape(sin_cache) != cs or not 0 < 2 * cs[1] <= d
                        or not cos_cache.flags.c_contiguous or not sin_cache.flags.c_contiguous):
                    return None
                checked[0], checked[1] = cos_cache, sin_cache
            if seqlens.dtype != i64:
                seqlens = seqlens.astype(i64)
            present_len = max(total, past_len)
            if (past_len == present_len and past_key.flags.writeable
                    and past_value.flags.writeable and not shares(past_key, past_value)):
                present_k, present_v, copy = past_key, past_value, False
                variant("kv", "in-place", "past buffer donated with capacity %d", past_len)
            else:
                present_k = zeros((bsz, kvh, present_len, d), f32)
                present_v = zeros((bsz, kvh, present_len, d), f32)
                copy = past_len > 0
            return (present_k, present_v, copy, seqlens, total,
                    scale if scale != 0.0 else 1.0 / math.sqrt(d))

        return prep

    def _run_paged(self, query, key, value, past_key, past_value, seqlens_k,
                   total_sequence_length, cos_cache, sin_cache, position_ids, attention_bias,
                   head_sink):
        """past_key/past_value are a paged cache's pools (:mod:`.paged`): the
        new keys and values are written into their blocks and attention reads
        through the block table (:func:`._paged_kernels.gqa_paged`); the
        present outputs are the pools.

        Raises:
            ValueError: what the paged path does not serve (no numba, softcap,
                smooth softmax, an attention bias or sink, a dtype other than
                float32, pools of another cache or shape, a block table that
                does not hold the lengths).
        """
        from . import _paged_kernels as _pk
        from .paged import table_of

        h, kvh = self.h, self.kvh
        if (not self.fused or not _pk.HAVE_PAGED or self.softcap > 0.0 or self.smooth
                or attention_bias is not None or head_sink is not None):
            raise ValueError("GroupQueryAttention: a paged KV cache needs the numba kernel "
                             "without softcap, smooth softmax, attention bias or head sink")
        if query is None or query.ndim != 3 or query.dtype != np.float32 or any(
                x is not None and x.dtype != np.float32 for x in (key, value)):
            raise ValueError("GroupQueryAttention: a paged KV cache takes float32 "
                             "query/key/value (B, S, width)")
        bsz, s, width = query.shape
        table = table_of((past_key, past_value), bsz)
        packed = key is None
        d = width // (h + 2 * kvh) if packed else width // h
        if (table is None or past_key.shape[1] != kvh or past_key.shape[3] != d
                or (not packed and (key.shape != (bsz, s, kvh * d) or value.shape != key.shape))):
            raise ValueError(f"GroupQueryAttention: past_key/past_value must be one paged "
                             f"cache's writeable float32 or float16 pools (blocks, KVH={kvh}, "
                             f"block size, "
                             f"D={d}) with a block table of {bsz} rows; got "
                             f"{past_key.shape} and {np.shape(past_value)}")
        seqlens, total = _lengths(seqlens_k, total_sequence_length, bsz, s)
        cos = sin = pos = None
        if self.do_rotary:
            cs, sn = np.shape(cos_cache), np.shape(sin_cache)
            if len(cs) != 2 or sn != cs or not 0 < 2 * cs[1] <= d:
                raise ValueError(f"GroupQueryAttention: cos_cache/sin_cache must be "
                                 f"(positions, rotary_dim/2 <= {d // 2}), got {cs} and {sn}")
            cos = np.ascontiguousarray(_f32(cos_cache), np.float32)
            sin = np.ascontiguousarray(_f32(sin_cache), np.float32)
            if position_ids is not None:
                pos = np.ascontiguousarray(np.asarray(position_ids, np.int64).reshape(bsz, s))
        y, status = _pk.gqa_paged(
            query, key, value, past_key, past_value, table, seqlens, total, cos, sin, pos,
            num_heads=h, kv_num_heads=kvh,
            alpha=self.scale if self.scale != 0.0 else 1.0 / math.sqrt(d), window=self.window,
            interleaved=self.interleaved)
        if status == 1:
            raise ValueError(f"GroupQueryAttention: seqlens_k {seqlens.tolist()} do not fit "
                             f"the block table's {table.shape[1]} blocks of "
                             f"{past_key.shape[2]} positions")
        if status == 3:
            raise ValueError(f"GroupQueryAttention: rotary positions exceed cos_cache "
                             f"({cos.shape[0]} rows)")
        if status:
            raise ValueError(f"GroupQueryAttention: the block table names blocks outside the "
                             f"pool of {past_key.shape[0]} blocks for seqlens_k "
                             f"{seqlens.tolist()}")
        tracing.kernel_variant("attention", "numba-paged", f"{past_key.dtype} KV, block table")
        return y, past_key, past_value

    def compile(self):
        """With numba, no softcap and no smooth softmax: a closure for the decode
        and prefill hot path (float32 query/key/value, separate or packed, a
        float32 past, no position ids, bias or sink) that does only the checks the compiled
        kernel relies on (:meth:`fast_path`) and leaves every other case, and
        every error message, to :meth:`run` (measured here: the checks of
        :meth:`run` cost ~2x the kernel itself at decode). Same results as
        :meth:`run`."""
        prep = self.fast_path()
        if prep is None:
            return self.run
        h, kvh, run, rotary = self.h, self.kvh, self.run, self.do_rotary
        f32 = np.dtype(np.float32)
        gqa, variant = _nb.gqa_attention, tracing.kernel_variant
        window, interleaved = self.window, self.interleaved

        def group_query_attention(query, key=None, value=None, past_key=None, past_value=None,
                                  seqlens_k=None, total_sequence_length=None, cos_cache=None,
                                  sin_cache=None, *more):
            args = (query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
                    cos_cache, sin_cache, *more)
            if type(past_key) is not np.ndarray and is_paged(past_key):
                return run(*args)  # a paged cache (.paged): _run_paged
            packed = key is None and value is None
            if ((not packed and (key is None or value is None or key.dtype != f32
                                 or value.dtype != f32))
                    or any(x is not None for x in more) or query.dtype != f32
                    or query.ndim != 3):
                return run(*args)
            bsz, s, width = query.shape
            if not packed:
                kshape = (bsz, s, kvh * (width // h))
                if key.shape != kshape or value.shape != kshape:
                    return run(*args)
            ready = prep(bsz, s, width, packed, past_key, past_value, seqlens_k,
                         total_sequence_length, cos_cache, sin_cache)
            if ready is None:
                return run(*args)
            present_k, present_v, copy, seqlens, total, alpha = ready
            y, status = gqa(query, key, value, past_key if copy else present_k,
                            past_value if copy else present_v, present_k, present_v, seqlens,
                            total, cos_cache if rotary else None, sin_cache if rotary else None,
                            None, num_heads=h, kv_num_heads=kvh, copy_past=copy,
                            alpha=alpha, window=window, interleaved=interleaved)
            if status:  # nothing was written: run() finds the problem and names it
                return run(*args)
            variant("attention", "numba-fused", "float32, no bias/softcap/sink")
            return y, present_k, present_v

        return group_query_attention

    def run(self, query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
            total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
            attention_bias=None, head_sink=None, *unused):
        f32 = np.float32
        if is_paged(past_key) or is_paged(past_value):
            return self._run_paged(query, key, value, past_key, past_value, seqlens_k,
                                   total_sequence_length, cos_cache, sin_cache, position_ids,
                                   attention_bias, head_sink)
        if (self.fused and attention_bias is None and head_sink is None and not self.smooth
                and self.softcap <= 0.0 and query.dtype == f32
                and all(x is None or x.dtype == f32 for x in (key, value, past_key, past_value))):
            return self._run_fused(query, key, value, past_key, past_value, seqlens_k,
                                   total_sequence_length, cos_cache, sin_cache, position_ids)
        h, kvh = self.h, self.kvh
        dt = query.dtype
        bsz, s, d, past_len, seqlens, total = self._check(
            query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
            sin_cache, position_ids)
        qf = _f32(query)
        if key is None:  # packed QKV
            q = qf[..., :h * d]
            k = qf[..., h * d:(h + kvh) * d]
            v = qf[..., (h + kvh) * d:]
        else:
            q, k, v = qf, _f32(key), _f32(value)
        q = q.reshape(bsz, s, h, d).transpose(0, 2, 1, 3)
        k = k.reshape(bsz, s, kvh, d).transpose(0, 2, 1, 3)
        v = v.reshape(bsz, s, kvh, d).transpose(0, 2, 1, 3)

        tot = seqlens + 1  # T_b
        present_len = max(total, past_len)
        first_prompt = s == total
        past = np.zeros_like(tot) if first_prompt else tot - s  # P_b
        if (past < 0).any() or (past + s > present_len).any():
            raise ValueError(f"GroupQueryAttention: seqlens_k {seqlens.tolist()} do not fit "
                             f"sequence_length {s} and a present length of {present_len}")
        if not first_prompt and past_len and (past > past_len).any():
            raise ValueError("GroupQueryAttention: past_key is shorter than seqlens_k says")

        cos_c = sin_c = pos = None
        if self.do_rotary:
            if position_ids is not None:
                pos = np.asarray(position_ids, np.int64).reshape(bsz, s)
            elif first_prompt:
                ar = np.arange(s, dtype=np.int64)[None, :]
                pos = np.broadcast_to(ar, (bsz, s))
            else:
                pos = past[:, None] + np.arange(s, dtype=np.int64)[None, :]
            cos_c, sin_c = _f32(cos_cache), _f32(sin_cache)
            if pos.size and (pos.min() < 0 or pos.max() >= cos_c.shape[0]):
                raise ValueError(f"GroupQueryAttention: rotary positions exceed cos_cache "
                                 f"({cos_c.shape[0]} rows)")

        shared = (past_key is not None and past_value is not None and past_len == present_len
                  and past_key.flags.writeable and past_value.flags.writeable
                  and past_key.dtype == dt and past_value.dtype == dt
                  and not np.shares_memory(past_key, past_value))
        if shared:
            # donated buffer with room: append the new rows in place, no copy
            present_k, present_v = past_key, past_value
            tracing.kernel_variant("kv", "in-place", "past buffer donated with capacity %d",
                                   past_len)
        else:
            present_k = np.zeros((bsz, kvh, present_len, d), dt)
            present_v = np.zeros((bsz, kvh, present_len, d), dt)
            for b in range(bsz):
                p = int(past[b])
                if p:
                    present_k[b, :, :p] = past_key[b, :, :p]
                    present_v[b, :, :p] = past_value[b, :, :p]

        alpha = self.scale if self.scale != 0.0 else 1.0 / math.sqrt(d)
        if cos_c is not None:
            cos = cos_c[pos][:, None]  # (B, 1, S, rot/2)
            sin = sin_c[pos][:, None]
            q = _rope(np.array(q, np.float32), cos, sin, self.interleaved)
            k = _rope(np.array(k, np.float32), cos, sin, self.interleaved)
        for b in range(bsz):
            p = int(past[b])
            present_k[b, :, p:p + s] = k[b]
            present_v[b, :, p:p + s] = v[b]

        g = h // kvh
        sink = None
        if head_sink is not None:
            sink = _f32(head_sink).astype(np.float32).reshape(kvh, g, 1, 1)
        elif self.smooth:
            sink = np.zeros((kvh, g, 1, 1), np.float32)
        # all batch entries at once, keys padded to the longest entry and masked
        t_max = int(tot.max())
        kb = present_k[:, :, :t_max].astype(np.float32, copy=False)  # (B, KVH, T, D)
        vb = present_v[:, :, :t_max].astype(np.float32, copy=False)
        qb = q.reshape(bsz, kvh, g * s, d)
        sc = np.matmul(qb, kb.transpose(0, 1, 3, 2)).reshape(bsz, kvh, g, s, t_max)
        sc *= np.float32(alpha)
        if attention_bias is not None:
            ab = _f32(attention_bias)[..., :t_max]  # (B or 1, H or 1, S, T)
            ab = np.broadcast_to(ab, (ab.shape[0], ab.shape[1], s, t_max))
            if ab.shape[1] == 1:
                sc += ab.reshape(ab.shape[0], 1, 1, s, t_max)
            else:
                sc += ab.reshape(ab.shape[0], kvh, g, s, t_max)
        if self.softcap > 0.0:
            c = np.float32(self.softcap)
            sc = c * np.tanh(sc / c)
        cols = np.arange(t_max)[None, None, :]
        causal = past[:, None, None] + np.arange(s)[None, :, None] + 1  # (B, S, 1)
        mask = cols < np.minimum(causal, tot[:, None, None])  # (B, S, T)
        if self.window > 0:
            mask &= cols >= causal - self.window
        if not mask.all():
            sc = np.where(mask[:, None, None], sc, np.float32(-np.inf))
        m = sc.max(axis=-1, keepdims=True)
        if sink is not None:
            m = np.maximum(m, sink[None])
        m = np.where(np.isfinite(m), m, np.float32(0))  # a row that sees no key
        e = np.exp(sc - m)
        den = e.sum(axis=-1, keepdims=True)
        if sink is not None:
            den = den + np.exp(sink[None] - m)
        probs = e / np.where(den > 0, den, np.float32(1.0))
        out = np.matmul(probs.reshape(bsz, kvh, g * s, t_max), vb).reshape(bsz, h, s, d)
        y = out.transpose(0, 2, 1, 3).reshape(bsz, s, h * d).astype(dt, copy=False)
        return y, present_k, present_v
