"""The engine's decode stage (a mixin of
:class:`~actorrt.genai.engine.Engine`): one batched step through the event
loop, or a decode run of up to ``decode_run_steps`` steps in the provider's
worker thread (:meth:`~actorrt.Session.run_many`), sampled there and handed
to the event loop every ``stream_interval_s``.
"""

from __future__ import annotations

import time

import numpy as np
import trio

from .._errors import GenerationError, OutOfMemoryError
from ._requests import _Request
from .models import LOGITS_POSITIONS

__all__ = ["DecodeStage"]


class DecodeStage:
    """Methods of :class:`~actorrt.genai.engine.Engine` (state set up by its
    ``__init__``)."""

    def _decode_out_of_memory(self, exc: OutOfMemoryError) -> None:
        """A decode step (or the batch rebuild before it) ran out of memory:
        the requests that were joining the batch fail with ``exc``, else the
        newest one in it; the others go on at the next step."""
        joining = [r for r in self._decoding if r.kv is not None]
        victims = joining or ([max(self._decoding, key=lambda r: r.id)] if self._decoding else [])
        for r in victims:
            self._fail(r, exc)
        self._set_kv_bytes()

    async def _decode_step(self) -> None:
        t0 = time.perf_counter()
        if self._cache is not None:
            reqs = self._grow_decoding()
        else:
            if [id(r) for r in self._batch] != [id(r) for r in self._decoding]:
                self._rebuild_batch()
                self._set_kv_bytes()
            reqs = self._batch
        length = max(r.length for r in reqs)
        ids = np.asarray([[r.pending] for r in reqs], np.int64)
        mask = np.zeros((len(reqs), length + 1), np.int64)
        for b, r in enumerate(reqs):
            mask[b, :r.length + 1] = 1
        if self._cache is not None:
            feeds = self._paged_feeds(ids, mask, reqs, [r.length + 1 for r in reqs])
        else:
            feeds = self._feeds(ids, mask, self._batch_kv)
        logits, kv = await self._model(feeds)
        if self._cache is None:
            self._batch_kv = kv
        self._steps += 1
        self._hist[len(reqs)] = self._hist.get(len(reqs), 0) + 1
        for b, r in enumerate(reqs):
            r.length += 1
            if r.cancelled:
                continue
            self._emit(r, self._sample(r, logits[b, -1], r.prompt + r.generated))
            self._decode_tokens += 1
        self._set_kv_bytes()
        self._decode_time += time.perf_counter() - t0

    async def _decode_run(self) -> None:
        """Up to :attr:`decode_run_steps` decode steps of an unchanged batch
        back to back in the provider's worker thread (:meth:`Session.run_many`),
        sampling there: no event-loop round trip per token. Each step's tokens
        reach the event loop at once (``run_sync_soon``), which emits them as
        :meth:`_decode_step` does. The run ends after a step in which a
        request finished (EOS, length, a sampling error), and before the next
        step once a request was finished, cancelled or a new one arrived
        (flags read in the worker thread), so streams see every token as soon
        as it is sampled and a cancel takes effect within a step."""
        t0 = time.perf_counter()
        limit = self.decode_run_steps
        paged = None
        if self._cache is not None:
            reqs = list(self._decoding)
            # blocks for every step the run can take (it ends once a request
            # finishes): the block table stays as it is for the whole run
            limit = min([limit] + [min(r.params.max_new_tokens - len(r.generated),
                                       self.context - 1 - r.length) for r in reqs])
            try:
                for r in reqs:
                    self._cache.grow(r.blocks, r.length + max(limit, 1))
            except OutOfMemoryError:
                limit = 1  # what a single step needs (its failure is the step's)
            self._set_kv_bytes()
            limit = max(limit, 1)
            paged = self._cache.bind([r.blocks for r in reqs])
        else:
            if [id(r) for r in self._batch] != [id(r) for r in self._decoding]:
                self._rebuild_batch()
                self._set_kv_bytes()
            reqs = self._batch
        # worker-side state: the event loop owns the requests' own fields
        history = [r.prompt + r.generated for r in reqs]
        lengths = [r.length for r in reqs]
        counts = [len(r.generated) for r in reqs]
        pending = [r.pending for r in reqs]
        state = {"kv": self._batch_kv, "steps": 0, "outs": None}
        token = trio.lowlevel.current_trio_token()
        # greedy without a repetition penalty: the sampler's argmax, called directly
        argmax = [r.params.plain_argmax for r in reqs]
        # the attention mask of every step of the run, row b ones up to its
        # length + 1 (each step sets one more column per row)
        masks = np.zeros((len(reqs), max(lengths) + limit + 1), np.int64)
        for b, n in enumerate(lengths):
            masks[b, :n + 1] = 1
        # a step's one position a row, where the model takes logits_positions
        positions = {LOGITS_POSITIONS: np.zeros((len(reqs), 1, 1), np.int64)
                     } if self._positions else {}
        eos, context = self.eos, self.context
        interval = self.stream_interval_s
        unsent: list = []  # steps sampled, not yet handed to the event loop
        last_sent = [time.perf_counter()]
        self._interrupt = False

        def hand_over(final: bool = False) -> None:
            # final: the run's last step is written (nothing more will be)
            token.run_sync_soon(self._emit_steps, list(unsent), final)
            unsent.clear()
            last_sent[0] = time.perf_counter()

        # the next step's token ids: one buffer written each step (a run
        # reads it only while it runs)
        ids_buf = np.empty((len(reqs), 1), np.int64)
        at_logits = self._split_index()[0]
        carry = dict(zip(self._kv_names, self._present_names))

        def next_feeds(outs: list | None) -> dict | None:
            if outs is not None:
                logits = outs[at_logits]
                state["outs"] = outs  # the KV cache after the last step
                state["steps"] += 1
                tokens: list = []
                finished = False
                one_row = logits.shape[0] == 1 and logits.shape[1] == 1
                for b, r in enumerate(reqs):
                    lengths[b] += 1
                    masks[b, lengths[b]] = 1
                    if r.cancelled or r.done:
                        tokens.append(None)
                        continue
                    try:
                        tid = ((int(logits.argmax()) if one_row else int(logits[b, -1].argmax()))
                               if argmax[b] else r.sampler(logits[b, -1], history[b]))
                    except Exception as exc:  # noqa: BLE001 - fails only this request
                        tokens.append(exc)
                        finished = True
                        continue
                    tokens.append(tid)
                    history[b].append(tid)
                    counts[b] += 1
                    pending[b] = tid
                    if ((tid in eos and not r.params.ignore_eos)
                            or counts[b] >= r.params.max_new_tokens
                            or lengths[b] + 1 >= context):
                        finished = True
                unsent.append((reqs, tokens, list(lengths)))
                if finished:
                    hand_over(True)
                    return None
                if time.perf_counter() - last_sent[0] >= interval:
                    hand_over()
            if (self._interrupt or state["steps"] >= limit
                    or any(r.cancelled or r.done for r in reqs)):
                if unsent:
                    hand_over(True)
                return None
            ids = ids_buf
            for b, p in enumerate(pending):
                ids[b, 0] = p
            mask = masks[:, :max(lengths) + 1]
            if len(reqs) > 1:
                mask = np.ascontiguousarray(mask)
            if outs is None and paged is not None:
                return {**self._feeds(ids, mask, []), **paged}
            if outs is None:
                return self._feeds(ids, mask, state["kv"])
            # the KV cache: the last step's present outputs (carried)
            return {"input_ids": ids, "attention_mask": mask, **positions}

        self._decode_mark = t0
        if paged is not None and limit == 1:  # a single step: its blocks are taken per step
            await self._decode_step()
            return
        self._in_run = True
        try:
            await self.session.run_many(next_feeds, donate=self._kv_names, carry=carry)
        finally:
            self._run_ended()
        if paged is not None:
            self._decode_time += time.perf_counter() - self._decode_mark
            return
        if state["outs"] is not None:
            state["kv"] = self._split_outputs(state["outs"])[1]
        # every step's tokens were handed over (and counted) before this:
        # run_sync_soon is FIFO
        if self._batch is reqs:
            self._batch_kv = state["kv"]
        self._set_kv_bytes()
        self._decode_time += time.perf_counter() - self._decode_mark

    def _emit_steps(self, steps: list[tuple], final: bool = False) -> None:
        """Steps of a decode run, on the event loop: per step ``(requests,
        tokens, lengths)``, each request's token (None: skipped; an exception:
        its sampling failed) and KV length after the step. ``final``: the
        run wrote its last step, so the blocks of requests that finish now
        are returned at once (the statistics a caller reads once its result
        arrived count them out)."""
        if final and self._cache is not None:
            self._run_ended()
        for reqs, tokens, lengths in steps:
            self._emit_step(reqs, tokens, lengths)
            self._steps += 1
            self._hist[len(reqs)] = self._hist.get(len(reqs), 0) + 1
        # decode time counted up to the tokens counted: statistics read by a
        # caller whose last token just arrived (the run still going) agree
        now = time.perf_counter()
        self._decode_time += now - self._decode_mark
        self._decode_mark = now

    def _emit_step(self, reqs: list[_Request], tokens: list, lengths: list[int]) -> None:
        for r, tid, n in zip(reqs, tokens, lengths):
            r.length = n
            if tid is None or r.done:
                continue
            if isinstance(tid, BaseException):
                self._fail(r, GenerationError(f"sampling the next token failed: "
                                              f"{type(tid).__name__}: {tid}"))
                continue
            self._emit(r, tid)
            self._decode_tokens += 1
