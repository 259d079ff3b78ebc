"""The engine's block-paged KV cache (see ``docs/kv_cache.md``).

Every layer has one key pool and one value pool, ``(num_blocks, kv_heads,
block_size, head_dim)`` float32 (or float16: ``dtype``), carved from one anonymous mapping (pages
are committed by the kernel when first written, so resident memory grows
with the blocks ever used, not with the pool's size). A block holds
``block_size`` positions of every layer's keys and values; a request owns
a list of blocks (its row of the block table), grown as its tokens are
appended and returned to the free list when it leaves: a join or a leave
touches only that request's blocks, nothing is copied.

Bytes are accounted to the host provider's memory accountant (role
``kv-cache``) per block taken, so the provider's statistics and
``engine.statistics().kv_bytes`` count the blocks held, not the pool.

Prefix caching: a full block of a prompt is registered under its content
key, the BLAKE2b digest (128 bits) of the key of the block before and its
token ids (so a key names the whole prefix up to the block's end; a
collision is as likely as one of the hash).
A request whose tokens start with registered blocks takes them (their
reference count goes up) and prefills only the rest. Shared blocks are
full and never written again: a request's new positions always go to a
block of its own, so a prompt that diverges inside a block recomputes that
block privately (there is nothing to copy on write). A registered block
whose last reference goes stays cached, off the free list, until a block
is needed and none is free: then the least recently released one is
evicted (its key forgotten). Cached blocks without references are not
accounted as held (they are free to take).

The pools are fed to the decoder graph as its ``past_key_values.*`` inputs
(:class:`~actorrt.providers.cpu.llm.paged.PagedKVPool`), with the run's
block table in their shared :class:`~actorrt.providers.cpu.llm.paged.PageTable`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from .._errors import InvalidArgumentError, OutOfMemoryError
from ..providers._memory import huge_page_arrays
from ..providers.cpu.llm.paged import KV_DTYPES, PagedKVPool, PageTable

__all__ = ["KVCache", "BLOCK_SIZE"]

#: positions a block holds (every layer's key and value)
BLOCK_SIZE = 16


class KVCache:
    """A pool of KV blocks, its free list and the block table of each run.

    Args:
        names: the graph's past inputs, ``past_key_values.{i}.key`` then
            ``.value`` for each layer (one pool each).
        kv_heads, head_dim: the cache's geometry.
        num_blocks: blocks in the pool (its most positions: ``num_blocks *
            block_size``).
        memory: the host provider's memory accountant (blocks taken are
            reserved there under ``kv-cache``).
        model: the model's name (named in errors).
        block_size: positions a block holds.
        dtype: the pools' element type, float32 or float16.

    Raises:
        OutOfMemoryError: the pool's mapping could not be made.
        InvalidArgumentError: another ``dtype``.
    """

    def __init__(self, names: Sequence[str], kv_heads: int, head_dim: int, num_blocks: int, *,
                 memory: Any, model: str | None = None, block_size: int = BLOCK_SIZE,
                 dtype: Any = np.float32):
        self.names = list(names)
        #: the pools' element type: float32, or float16 (half the bytes; the
        #: kernels convert each value to float32 as they read it)
        self.dtype = np.dtype(dtype)
        if self.dtype not in KV_DTYPES:
            raise InvalidArgumentError("unknown KV cache dtype", expected="float32 or float16",
                                       got=str(self.dtype), model=model)
        self.kv_heads, self.head_dim = int(kv_heads), int(head_dim)
        self.block_size = int(block_size)
        self.num_blocks = max(1, int(num_blocks))
        self.memory = memory
        self.model = model
        #: bytes of one block: every layer's key and value rows
        self.block_bytes = (len(self.names) * self.kv_heads * self.block_size * self.head_dim
                            * self.dtype.itemsize)
        self.pages = PageTable()
        shape = (self.num_blocks, self.kv_heads, self.block_size, self.head_dim)
        try:
            arrays = huge_page_arrays(len(self.names), shape, self.dtype)
        except MemoryError as exc:
            raise OutOfMemoryError(
                f"cannot map the KV pool ({self.num_blocks} blocks of {self.block_bytes} bytes)",
                requested=self.num_blocks * self.block_bytes, in_use=0, limit=memory.limit,
                role="kv-cache", provider=memory.provider, model=model) from exc
        self.pools = [PagedKVPool.wrap(a, self.pages) for a in arrays]
        # LIFO: a freed block (its pages already committed) is taken first
        self._free = list(range(self.num_blocks - 1, -1, -1))
        self._refs = [0] * self.num_blocks
        #: prefix cache: content key <-> block, and the registered blocks
        #: nobody holds, least recently released first
        self._block_of: dict[Any, int] = {}
        self._key_of: dict[int, Any] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()
        #: registered blocks evicted to make room
        self.evictions = 0

    # ------------------------------------------------------------ blocks
    @property
    def free_blocks(self) -> int:
        """Blocks that can be taken: free ones and cached ones nobody holds."""
        return len(self._free) + len(self._idle)

    @property
    def used_blocks(self) -> int:
        """Blocks some request holds."""
        return self.num_blocks - self.free_blocks

    @property
    def cached_blocks(self) -> int:
        """Registered prefix blocks (held or idle)."""
        return len(self._key_of)

    @property
    def used_bytes(self) -> int:
        """Bytes of the blocks held (what the memory accountant counts)."""
        return self.used_blocks * self.block_bytes

    def blocks_for(self, positions: int) -> int:
        """Blocks that hold ``positions`` positions."""
        return -(-max(int(positions), 0) // self.block_size)

    def grow(self, blocks: list[int], positions: int) -> None:
        """Append free blocks to ``blocks`` (a request's) until they hold
        ``positions`` positions.

        Raises:
            OutOfMemoryError: the free list is empty (``role`` kv-cache) or the
                memory limit would be passed; ``blocks`` is unchanged then.
        """
        need = self.blocks_for(positions) - len(blocks)
        if need <= 0:
            return
        if need > self.free_blocks:
            raise OutOfMemoryError(
                f"the KV pool has {self.free_blocks} free blocks of {self.block_size} "
                f"positions; {need} more are needed", requested=need * self.block_bytes,
                in_use=self.used_bytes, limit=self.num_blocks * self.block_bytes,
                role="kv-cache", provider=self.memory.provider, model=self.model)
        self.memory.reserve(need * self.block_bytes, "kv-cache", what="KV cache blocks")
        for _ in range(need):
            b = self._take()
            self._refs[b] = 1
            blocks.append(b)

    def _take(self) -> int:
        """A block nobody holds: a free one, else the least recently released
        cached one (evicted from the prefix cache)."""
        if self._free:
            return self._free.pop()
        b, _ = self._idle.popitem(last=False)
        del self._block_of[self._key_of.pop(b)]
        self.evictions += 1
        return b

    def release(self, blocks: list[int]) -> None:
        """Drop a request's references to ``blocks`` (empties the list): a
        block nobody holds goes back to the free list, or, registered in the
        prefix cache, stays cached until evicted; its bytes are released."""
        if not blocks:
            return
        gone = 0
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                gone += 1
                if b in self._key_of:
                    self._idle[b] = None
                else:
                    self._free.append(b)
        if gone:
            self.memory.release(gone * self.block_bytes, "kv-cache")
        blocks.clear()

    # ----------------------------------------------------- prefix cache
    def share_prefix(self, blocks: list[int], tokens: Sequence[int]) -> int:
        """Give a request (``blocks`` empty) the cached blocks its ``tokens``
        start with, keeping at least one token to compute; returns the
        positions they hold (0: no hit). Stops early where the memory limit
        leaves no room for a block taken off the idle list."""
        assert not blocks
        bs = self.block_size
        key = b""
        for j in range((len(tokens) - 1) // bs):
            key = _chain(key, tokens[j * bs:(j + 1) * bs])
            b = self._block_of.get(key)
            if b is None:
                break
            if self._refs[b] == 0:
                try:
                    self.memory.reserve(self.block_bytes, "kv-cache", what="KV cache blocks")
                except OutOfMemoryError:
                    break
                del self._idle[b]
            self._refs[b] += 1
            blocks.append(b)
        return len(blocks) * bs

    def register(self, blocks: Sequence[int], tokens: Sequence[int], positions: int) -> None:
        """Register the full blocks among a request's first ``positions``
        positions (``tokens`` its token ids) in the prefix cache (a content
        already cached keeps its block)."""
        bs = self.block_size
        key = b""
        for j in range(min(positions, len(tokens)) // bs):
            key = _chain(key, tokens[j * bs:(j + 1) * bs])
            b = blocks[j]
            if key not in self._block_of and b not in self._key_of:
                self._block_of[key] = b
                self._key_of[b] = key

    # ------------------------------------------------------------- runs
    def bind(self, rows: Sequence[Sequence[int]], positions: int = 0) -> dict[str, Any]:
        """Set the block table of a run whose batch row ``b`` is ``rows[b]``
        (a request's blocks) and return the pools as the run's past feeds.
        The table is at least wide enough for ``positions`` positions (a
        right-padded prompt batch's length); unused entries are -1."""
        width = max(max((len(r) for r in rows), default=1), self.blocks_for(positions), 1)
        table = np.full((len(rows), width), -1, np.int32)
        for b, r in enumerate(rows):
            table[b, :len(r)] = r
        self.pages.table = table
        return dict(zip(self.names, self.pools))

    def rows(self, blocks: list[int], positions: int) -> np.ndarray:
        """(KVH, positions, D) float32 keys of layer 0 of a request's first
        ``positions`` positions (a copy, for tests and debugging)."""
        pool = self.pools[0]
        out = np.empty((self.kv_heads, positions, self.head_dim), np.float32)
        for t in range(positions):
            out[:, t] = pool[blocks[t // self.block_size], :, t % self.block_size]
        return out


def _chain(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The content key of a block: the digest of its prefix's key and its
    token ids."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(np.asarray(tokens, np.int64).tobytes())
    return h.digest()
