"""The CPU provider's public hook for a block-paged KV cache (used by
:mod:`actorrt.genai.kv_cache`).

A paged cache keeps, per layer, one key pool and one value pool shaped
``(num_blocks, kv_heads, block_size, head_dim)`` float32 (or float16:
``kv_dtype="float16"``, half the bytes); a request's
positions live in the blocks its row of the block table names: position
``t`` of batch row ``b`` is row ``t % block_size`` of block
``table[b, t // block_size]``. The pools are fed to a decoder graph in place
of its ``past_key_values.{i}.key/value`` inputs (their shape, ``(batch,
kv_heads, past_seq, head_dim)`` with symbolic batch and length, admits them)
as :class:`PagedKVPool` arrays, all sharing one :class:`PageTable`: the
attention kernels that know the type (the fused decoder stack, the decoder
block through its GroupQueryAttention, GroupQueryAttention's numba path)
append the new keys and values into the blocks and attend through the
table; ``present.*`` are the pools themselves. The lengths come from the
graph as usual (``seqlens_k``, ``total_sequence_length`` from the attention
mask). Any other kernel reading such an array refuses it (it is no
contiguous ``(B, KVH, L, D)`` cache), so a paged cache never gives a
silently wrong answer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PageTable", "PagedKVPool", "is_paged", "table_of", "paged_lengths"]

_NO_TABLE = np.zeros((0, 1), np.int32)

#: the element types a pool may hold: float32, or IEEE half (float16), which
#: the kernels read and write converted to and from float32 (``_half``)
KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


class PageTable:
    """The block table every pool of one cache reads: ``table`` int32
    ``(batch, max_blocks)`` C-contiguous, row ``b`` the blocks of the run's
    batch row ``b`` in position order (entries past a row's length unused,
    -1 by convention). Set by the cache's owner before each run."""

    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table: np.ndarray = _NO_TABLE


class PagedKVPool(np.ndarray):
    """One layer's key or value pool ``(num_blocks, kv_heads, block_size,
    head_dim)`` float32 or float16, C-contiguous, carrying the cache's
    :class:`PageTable` as ``pages`` (a view keeps it).

    A pool stands for the graph's float32 ``past_key_values`` input
    whatever it holds (a float16 pool: those values rounded to half), so a
    session's feed check takes it as float32 (:attr:`feed_dtype`)."""

    pages: PageTable | None
    #: the element type of the graph input a pool is fed as
    feed_dtype = np.dtype(np.float32)

    def __array_finalize__(self, obj: Any) -> None:
        self.pages = getattr(obj, "pages", None)

    @classmethod
    def wrap(cls, array: np.ndarray, pages: PageTable) -> "PagedKVPool":
        """``array`` (4-D float32 or float16, C-contiguous) as a pool reading
        ``pages``."""
        out = array.view(cls)
        out.pages = pages
        return out


def is_paged(x: Any) -> bool:
    """Whether ``x`` is a paged cache's pool (:class:`PagedKVPool`)."""
    return isinstance(x, PagedKVPool)


def table_of(kv: Any, bsz: int) -> np.ndarray | None:
    """The block table of pools ``kv`` (every key and value pool of a run,
    key 0 first) when they are one cache's writeable pools of one dtype
    (float32 or float16) shaped alike, read by a batch of ``bsz`` rows; else None."""
    k0 = kv[0]
    pages = getattr(k0, "pages", None)
    if pages is None or k0.ndim != 4:
        return None
    table = pages.table
    if (table.dtype != np.int32 or table.ndim != 2 or table.shape[0] != bsz
            or not table.flags.c_contiguous):
        return None
    shape, dt = k0.shape, k0.dtype
    if dt not in KV_DTYPES:
        return None
    for a in kv:
        if (getattr(a, "pages", None) is not pages or a.dtype != dt or a.shape != shape
                or not a.flags.c_contiguous or not a.flags.writeable):
            return None
    return table


def paged_lengths(seqlens_k: Any, total_sequence_length: Any, bsz: int, s: int, cos: Any,
                  sin: Any, rotary: bool, kv_heads: int, head_dim: int, scale: float
                  ) -> tuple | None:
    """What the fused decoder stack's paged path needs of a run's lengths,
    as GroupQueryAttention's ``fast_path`` prep gives it for a contiguous
    cache: ``(None, None, False, seqlens (B,) int64, total, alpha)``; None
    when the values leave the compiled path (the blocks' GroupQueryAttention
    then checks them and names the problem)."""
    if seqlens_k is None or total_sequence_length is None:
        return None
    tsl = np.asarray(total_sequence_length).reshape(-1)
    seqlens = np.asarray(seqlens_k).reshape(-1)
    if tsl.shape != (1,) or seqlens.shape != (bsz,) or seqlens.dtype.kind != "i":
        return None
    total = int(tsl[0])
    if total < s:
        return None
    if rotary:
        f32 = np.dtype(np.float32)
        cs = np.shape(cos)
        if (getattr(cos, "dtype", None) != f32 or getattr(sin, "dtype", None) != f32
                or len(cs) != 2 or np.shape(sin) != cs or not 0 < 2 * cs[1] <= head_dim
                or not cos.flags.c_contiguous or not sin.flags.c_contiguous):
            return None
    alpha = scale if scale != 0.0 else 1.0 / float(np.sqrt(head_dim))
    return None, None, False, seqlens.astype(np.int64), total, alpha
