"""The engine's prefill stage (a mixin of
:class:`~actorrt.genai.engine.Engine`): one chunk of the oldest newcomer's
prompt a step, or several short prompts in one right-padded run; a
request preempted from a paged cache is recomputed here (prompt and
generated tokens) and goes back to decoding without sampling.
"""

from __future__ import annotations

import time

import numpy as np

from .._errors import OutOfMemoryError
from ._requests import _Request

__all__ = ["PrefillStage"]


class PrefillStage:
    """Methods of :class:`~actorrt.genai.engine.Engine` (state set up by its
    ``__init__``)."""

    def _prefill_out_of_memory(self, group: list[_Request], exc: OutOfMemoryError) -> None:
        """A prefill ran out of memory: its requests wait again at the head
        of the queue, to run alone, when other requests held memory beside
        them; a request that was alone fails with ``exc``."""
        group = [r for r in group if not r.done]
        others = [r for r in (*self._prefilling, *self._decoding) if r not in group]
        retry = others or len(group) > 1
        for r in reversed(group):
            if retry and not r.alone and not r.generated:
                if r in self._prefilling:
                    self._prefilling.remove(r)
                r.kv, r.length, r.prefilled, r.t_admit, r.alone = None, 0, 0, 0.0, True
                self._free_blocks(r)
                self._waiting.appendleft(r)
            else:
                self._fail(r, exc)
        self._set_kv_bytes()

    async def _prefill_step(self, req: _Request) -> None:
        start = req.prefilled
        tokens = req.context_ids()  # a preempted request: its generated tokens too
        chunk = tokens[start:start + self.prefill_chunk]
        ids = np.asarray([chunk], np.int64)
        mask = np.ones((1, req.length + len(chunk)), np.int64)
        if self._cache is not None:
            feeds = self._paged_feeds(ids, mask, [req], [req.length + len(chunk)])
        else:
            if req.kv is None:  # capacity for the whole request: appended in place
                req.kv = self._empty_kv(1, self._capacity(req))
            feeds = self._feeds(ids, mask, req.kv)
        logits, kv = await self._model(feeds)
        self._prefill_runs += 1
        if req.cancelled:
            return
        if self._cache is None:
            req.kv = kv
        req.length += len(chunk)
        req.prefilled += len(chunk)
        self._register_prefix(req, tokens)
        self._set_kv_bytes()
        if req.prefilled < len(tokens):
            return
        self._prefilling.popleft()
        if req.generated:  # resumed after a preemption: its next token is pending
            self._decoding.append(req)
            return
        req.t_first = time.perf_counter()
        self._emit(req, self._sample(req, logits[0, -1], req.prompt))
        if not req.done:
            self._decoding.append(req)

    def _prefill_group(self) -> list[_Request]:
        """Newcomers whose whole prompt fits one chunk are prefilled together:
        one right-padded run of at most ``prefill_chunk`` token rows (padding
        included), so a burst of short prompts costs one weight pass and its
        requests join the decode batch at the same step."""
        group: list[_Request] = []
        longest = 0
        for r in self._prefilling:
            n = len(r.prompt)
            if r.prefilled or r.kv is not None or r.generated or n > self.prefill_chunk:
                break
            if (len(group) + 1) * max(longest, n) > self.prefill_chunk:
                break
            group.append(r)
            longest = max(longest, n)
        return group

    async def _prefill_batch(self, group: list[_Request]) -> None:
        s = max(len(r.prompt) for r in group)
        ids = np.zeros((len(group), s), np.int64)
        mask = np.zeros((len(group), s), np.int64)
        for b, r in enumerate(group):
            ids[b, :len(r.prompt)] = r.prompt
            mask[b, :len(r.prompt)] = 1
        last = [len(r.prompt) - 1 for r in group]
        if self._cache is not None:  # each row's prompt goes into its own blocks
            feeds = self._paged_feeds(ids, mask, group, [len(r.prompt) for r in group], last)
        else:  # no past: each row's present holds its prompt, then padding rows
            feeds = self._feeds(ids, mask, self._empty_kv(len(group), 0), last)
        logits, kv = await self._model(feeds)
        self._prefill_runs += 1
        now = time.perf_counter()
        for b, r in enumerate(group):
            if r.cancelled:
                continue  # reaped at the next step boundary
            n = len(r.prompt)
            if self._cache is None:
                # its own rows (read once by _rebuild_batch): the run's buffers go now
                self._set_kv_bytes(extra=n * self.bytes_per_token)
                r.kv = [a[b:b + 1, :, :n].copy() for a in kv]
            r.length = r.prefilled = n
            self._register_prefix(r, r.prompt)
            self._prefilling.remove(r)
            r.t_first = now
            self._emit(r, self._sample(r, self._row_logits(logits, b, n - 1), r.prompt))
            if not r.done:
                self._decoding.append(r)
        self._set_kv_bytes()
