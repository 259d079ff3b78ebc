"""The engine's KV stage (:class:`~actorrt.genai.engine.Engine` is built
from this mixin, :mod:`._prefill` and :mod:`._decode`): admission arithmetic,
the byte accounting, and both cache layouts: the block-paged cache
(:mod:`.kv_cache`: blocks grown per request, preemption of the newest
request when the pool runs dry) and the contiguous one (each request's own
prefill buffer, gathered into one right-padded batch buffer whenever the
batch changes).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .._errors import GenerationError, OutOfMemoryError
from ..providers._memory import huge_page_arrays
from ._requests import _Request
from .admission import kv_error, kv_need, kv_need_paged, kv_room, kv_room_alone
from .kv_cache import BLOCK_SIZE, KVCache

__all__ = ["KVStage"]


class KVStage:
    """Methods of :class:`~actorrt.genai.engine.Engine` (state set up by its
    ``__init__``)."""

    def _block_room(self, room: int | None) -> int:
        """Blocks the paged cache may hold now: its pool, or fewer where the
        budget or the memory limit (``room`` bytes) leaves less."""
        blocks = self._cache.num_blocks
        return blocks if room is None else min(blocks, room // self._cache.block_bytes)

    def _share_prefix(self, req: _Request) -> None:
        """A newly admitted request takes the cached blocks its tokens start
        with (:meth:`.kv_cache.KVCache.share_prefix`) and prefills the rest."""
        if self._cache is None or not self.prefix_caching or req.blocks or req.length:
            return
        n = self._cache.share_prefix(req.blocks, req.context_ids())
        if n:
            req.length = req.prefilled = n
            self._prefix_hits += 1
            self._prefix_tokens += n
            self._set_kv_bytes()

    def _register_prefix(self, req: _Request, tokens: list[int]) -> None:
        """Register the full blocks of ``req``'s prefilled tokens in the
        prefix cache."""
        if self._cache is not None and self.prefix_caching:
            self._cache.register(req.blocks, tokens, req.prefilled)

    def _register_finished(self, req: _Request) -> None:
        """When ``req`` finishes, register the full blocks of every token its
        cache holds, its prompt and generated tokens but the last (whose key
        and value were never computed), in the prefix cache: a follow-up
        turn whose prompt is this prompt + the answer takes them. Only
        positions below ``req.length`` are registered: a decode step still
        under way writes at or past it, never into a full block below it."""
        if self._cache is not None and self.prefix_caching and req.blocks and req.length:
            self._cache.register(req.blocks, req.prompt + req.generated, req.length)

    def _grow_decoding(self) -> list[_Request]:
        """Blocks for one more position of every decoding request; while the
        pool (or the memory limit) has none left, the newest request is
        preempted (:meth:`_preempt`). Returns the step's requests.

        Raises:
            OutOfMemoryError: a request alone cannot grow.
        """
        while True:
            reqs = list(self._decoding)
            try:
                for r in reqs:
                    self._cache.grow(r.blocks, r.length + 1)
                return reqs
            except OutOfMemoryError:
                if len(reqs) <= 1:
                    raise
                self._preempt(max(reqs, key=lambda r: r.id))

    def _preempt(self, req: _Request) -> None:
        """Take a decoding request out of the batch: its blocks go back to
        the free list and it waits at the head of the queue; once admitted
        again its prompt and generated tokens are prefilled anew (recompute)
        and it goes on from its pending token."""
        self._decoding.remove(req)
        self._free_blocks(req)
        req.length = req.prefilled = 0
        self._preemptions += 1
        self._waiting.appendleft(req)
        self._set_kv_bytes()

    def _kv_need(self, reqs: Sequence[_Request]) -> int:
        """Most KV-cache bytes serving ``reqs`` together holds at once
        (:func:`actorrt.genai.admission.kv_need`)."""
        if self._cache is not None:
            return kv_need_paged([self._capacity(r) for r in reqs], self._cache.block_size,
                                 self._cache.block_bytes)
        return kv_need([(self._capacity(r), len(r.prompt)) for r in reqs],
                       self.bytes_per_token)

    def _kv_room(self) -> int | None:
        """KV bytes the engine may hold now (:func:`~actorrt.genai.admission.kv_room`)."""
        return kv_room(self.kv_budget, self._host.memory)

    def _kv_error(self, req: _Request, room: int) -> OutOfMemoryError:
        return kv_error(len(req.prompt), req.params.max_new_tokens, self._kv_need([req]),
                        self.bytes_per_token, room, self._host.memory,
                        self.session.model_name)

    def _check_fits_alone(self, req: _Request) -> None:
        """Refuse, before queueing, a request that could not run even alone.

        Raises:
            GenerationError: its KV cache exceeds ``kv_budget_bytes``.
            OutOfMemoryError: its KV cache exceeds what the session's memory
                limit leaves beside the weights.
        """
        need = self._kv_need([req])
        if self.kv_budget is not None and need > self.kv_budget:
            raise GenerationError(
                f"request needs {need} bytes of KV cache ({len(req.prompt)} prompt tokens + "
                f"{req.params.max_new_tokens} new tokens, {self.bytes_per_token} bytes a "
                f"token); the engine's budget is {self.kv_budget} bytes")
        room = kv_room_alone(self._host.memory)
        if room is not None and need > room:
            raise self._kv_error(req, room)

    def _shrink_batch(self) -> bool:
        """Drop the rows of requests that left from the batch buffer before
        anything is admitted (their padding is held until then); ``False``
        when that ran out of memory (nothing is admitted this step)."""
        if self._cache is not None or not self._batch or not self._decoding:
            return True
        if [id(r) for r in self._decoding] == [id(r) for r in self._batch]:
            return True
        try:
            self._rebuild_batch()
            self._set_kv_bytes()
        except OutOfMemoryError as exc:
            self._decode_out_of_memory(exc)
            return False
        return True

    def _set_kv_bytes(self, extra: int = 0) -> None:
        """Account the KV bytes held now (prefill caches, caches waiting to join
        the batch, the batch buffer) plus ``extra`` about to be allocated.

        Raises:
            OutOfMemoryError: ``extra`` would pass the host provider's memory
                limit (nothing is accounted then).
        """
        if self._cache is not None:  # the cache accounts its blocks itself
            self._kv_bytes = self._cache.used_bytes
            return
        total = extra + sum(a.nbytes for r in (*self._prefilling, *self._decoding)
                            if r.kv is not None for a in r.kv)
        if self._batch_kv is not None:
            total += sum(a.nbytes for a in self._batch_kv)
        delta = total - self._kv_bytes
        if delta > 0:
            self._host.memory.reserve(delta, "kv-cache", what="KV cache")
        elif delta < 0:
            self._host.memory.release(-delta, "kv-cache")
        self._kv_bytes = total

    def _empty_kv(self, batch: int, length: int) -> list[np.ndarray]:
        """Zeroed KV buffers, accounted before they are allocated (the caller
        then holds them where :meth:`_set_kv_bytes` counts them).

        Raises:
            OutOfMemoryError: over the memory limit or the machine's memory.
        """
        # one huge-page mapping for every layer's key and value buffer
        shape = (batch, self.kv_heads, length, self.head_dim)
        self._set_kv_bytes(extra=2 * len(self._layers) * batch * self.kv_heads * length
                           * self.head_dim * 4)
        try:
            return huge_page_arrays(2 * len(self._layers), shape, np.float32)
        except MemoryError as exc:
            self._set_kv_bytes()
            mem = self._host.memory
            raise OutOfMemoryError("cannot map the KV cache", requested=batch * length
                                   * self.bytes_per_token, in_use=mem.statistics().live_bytes,
                                   limit=mem.limit, role="kv-cache", provider=mem.provider,
                                   model=self.session.model_name) from exc

    def _new_cache(self) -> KVCache:
        """The paged cache: a pool with room for what admission allows
        (``kv_budget_bytes``, else what the memory limit leaves beside the
        weights, else every row of ``max_batch`` at the context window)."""
        block_bytes = self.bytes_per_token * BLOCK_SIZE
        per_row = -(-self.context // BLOCK_SIZE) + 1
        blocks = self.max_batch * per_row
        room = self.kv_budget
        alone = kv_room_alone(self._host.memory)
        if alone is not None:
            room = alone if room is None else min(room, alone)
        if room is not None:
            blocks = min(blocks, max(1, room // block_bytes))
        return KVCache(self._kv_names, self.kv_heads, self.head_dim, blocks,
                       memory=self._host.memory, model=self.session.model_name,
                       dtype=self.kv_dtype)

    def _run_ended(self) -> None:
        self._in_run = False
        while self._deferred:
            self._cache.release(self._deferred.pop())
        self._set_kv_bytes()

    def _free_blocks(self, req: _Request) -> None:
        """Return ``req``'s blocks (after the run under way, if one is)."""
        if self._cache is None or not req.blocks:
            return
        if self._in_run:
            self._deferred.append(req.blocks)
            req.blocks = []
        else:
            self._cache.release(req.blocks)

    def _paged_feeds(self, ids: np.ndarray, mask: np.ndarray, reqs: Sequence[_Request],
                     positions: Sequence[int], last: list[int] | None = None) -> dict:
        """A run's feeds on the paged cache: each row's blocks grown to hold
        ``positions[b]`` positions, the block table set, the pools as past.

        Raises:
            OutOfMemoryError: the pool or the memory limit has no room (blocks
                taken for earlier rows stay theirs).
        """
        cache = self._cache
        for r, n in zip(reqs, positions):
            cache.grow(r.blocks, n)
        self._set_kv_bytes()
        feeds = self._feeds(ids, mask, [], last)
        feeds.update(cache.bind([r.blocks for r in reqs], ids.shape[1]))
        return feeds

    def _capacity(self, req: _Request) -> int:
        return min(len(req.prompt) + req.params.max_new_tokens, self.context)

    def _rebuild_batch(self) -> None:
        """Gather the decoding requests' caches into one right-padded buffer with
        room for every request's remaining tokens."""
        reqs = list(self._decoding)
        length = max(self._capacity(r) for r in reqs)
        own = reqs[0].kv
        if (len(reqs) == 1 and not self._batch and own is not None and own[0].shape[0] == 1
                and own[0].shape[2] >= length):
            # alone, its own prefill cache has room for all its tokens: no copy
            self._batch, self._batch_kv, reqs[0].kv = reqs, own, None
            return
        new = self._empty_kv(len(reqs), length)
        old_rows = {id(r): b for b, r in enumerate(self._batch)}
        for b, r in enumerate(reqs):
            for j in range(len(new)):
                if id(r) in old_rows and self._batch_kv is not None:
                    src = self._batch_kv[j][old_rows[id(r)], :, :r.length]
                else:
                    src = r.kv[j][0, :, :r.length]
                new[j][b, :, :r.length] = src
            r.kv = None
        self._batch = reqs
        self._batch_kv = new
