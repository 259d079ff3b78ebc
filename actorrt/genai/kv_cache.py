"""The engine's block-paged KV cache (see ``docs/kv_cache.md``).

Every layer has one key pool and one value pool, ``(num_blocks, kv_heads,
block_size, head_dim)`` float32, carved from one anonymous mapping (pages
are committed by the kernel when first written, so resident memory grows
with the blocks ever used, not with the pool's size). A block holds
``block_size`` positions of every layer's keys and values; a request owns
a list of blocks (its row of the block table), grown as its tokens are
appended and returned to the free list when it leaves: a join or a leave
touches only that request's blocks, nothing is copied.

Bytes are accounted to the host provider's memory accountant (role
``kv-cache``) per block taken, so the provider's statistics and
``engine.statistics().kv_bytes`` count the blocks held, not the pool.

The pools are fed to the decoder graph as its ``past_key_values.*`` inputs
(:class:`~actorrt.providers.cpu.llm.paged.PagedKVPool`), with the run's
block table in their shared :class:`~actorrt.providers.cpu.llm.paged.PageTable`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._errors import OutOfMemoryError
from ..providers._memory import huge_page_arrays
from ..providers.cpu.llm.paged import PagedKVPool, PageTable

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

    Raises:
        OutOfMemoryError: the pool's mapping could not be made.
    """

    def __init__(self, names: Sequence[str], kv_heads: int, head_dim: int, num_blocks: int, *,
                 memory: Any, model: str | None = None, block_size: int = BLOCK_SIZE):
        self.names = list(names)
        self.kv_heads, self.head_dim = int(kv_heads), int(head_dim)
        self.block_size = int(block_size)
        self.num_blocks = max(1, int(num_blocks))
        self.memory = memory
        self.model = model
        #: bytes of one block: every layer's key and value rows
        self.block_bytes = len(self.names) * self.kv_heads * self.block_size * self.head_dim * 4
        self.pages = PageTable()
        shape = (self.num_blocks, self.kv_heads, self.block_size, self.head_dim)
        try:
            arrays = huge_page_arrays(len(self.names), shape, np.float32)
        except MemoryError as exc:
            raise OutOfMemoryError(
                f"cannot map the KV pool ({self.num_blocks} blocks of {self.block_bytes} bytes)",
                requested=self.num_blocks * self.block_bytes, in_use=0, limit=memory.limit,
                role="kv-cache", provider=memory.provider, model=model) from exc
        self.pools = [PagedKVPool.wrap(a, self.pages) for a in arrays]
        # LIFO: a freed block (its pages already committed) is taken first
        self._free = list(range(self.num_blocks - 1, -1, -1))

    # ------------------------------------------------------------ blocks
    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

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
        if need > len(self._free):
            raise OutOfMemoryError(
                f"the KV pool has {len(self._free)} free blocks of {self.block_size} positions; "
                f"{need} more are needed", requested=need * self.block_bytes,
                in_use=self.used_bytes, limit=self.num_blocks * self.block_bytes,
                role="kv-cache", provider=self.memory.provider, model=self.model)
        self.memory.reserve(need * self.block_bytes, "kv-cache", what="KV cache blocks")
        blocks.extend(self._free.pop() for _ in range(need))

    def release(self, blocks: list[int]) -> None:
        """Return ``blocks`` to the free list (and their bytes); empties the list."""
        if not blocks:
            return
        self._free.extend(reversed(blocks))
        self.memory.release(len(blocks) * self.block_bytes, "kv-cache")
        blocks.clear()

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
        """(KVH, positions, D) keys of layer 0 of a request's first
        ``positions`` positions (a copy, for tests and debugging)."""
        pool = self.pools[0]
        out = np.empty((self.kv_heads, positions, self.head_dim), np.float32)
        for t in range(positions):
            out[:, t] = pool[blocks[t // self.block_size], :, t % self.block_size]
        return out
