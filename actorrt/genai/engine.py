"""The generation engine: one actor owning the session, every request's KV
cache and the step loop; many tasks stream from it at once.

Each step of the loop (continuous batching):

1. requests whose caller left (iterator closed, task cancelled) are dropped and
   their KV cache freed;
2. waiting requests are admitted in FIFO order while the KV budget allows;
3. one prefill chunk (``prefill_chunk`` tokens) of the oldest newcomer runs, so
   running streams keep flowing while a long prompt is read;
4. one batched decode run advances every decoding request by one token: the
   requests' KV caches are kept right-padded in one ``(batch, kv_heads, len,
   head_dim)`` buffer per layer, each with its own past length
   (``attention_mask`` rows), rebuilt only when the batch changes. While the
   batch does not change (nothing to prefill, no newcomer), up to
   ``decode_run_steps`` steps run back to back in the provider's worker thread
   (:meth:`~actorrt.Session.run_many`), sampled there; the tokens are handed
   to the event loop every ``stream_interval_s``, and a newcomer, a cancel or
   a finished request ends the run at the next step. A round trip through the
   event loop per token cost ~7 % of SmolLM2's decode speed here (2 cores).

Model I/O follows onnxruntime-genai's decoder convention: ``input_ids`` int64
``(batch, seq)``, ``attention_mask`` int64 ``(batch, total_seq)``,
``past_key_values.{i}.key/value`` float32 ``(batch, kv_heads, past_seq,
head_dim)`` -> ``logits`` float32 ``(batch, seq, vocab)``,
``present.{i}.key/value``. The engine runs the folder's ``last_logits`` file
(:func:`actorrt.genai.models.model_file`): one more input,
``logits_positions`` int64 ``(batch, 1, 1)``, the position of each row whose
logits it samples, and ``(batch, 1, vocab)`` logits, so a prompt costs one
row of the LM head, not one per token (SmolLM2: 28M of its 135M weights).

The engine's code by stage (one class, :class:`Engine`, built from mixins):

* this module -- the API (stream, generate, statistics), the loop,
  admission, finishing requests, :func:`open_engine`;
* :mod:`._requests` -- results, stream pieces, statistics, the request record;
* :mod:`._kv_stage` -- KV accounting and the two cache layouts: the
  block-paged cache (:mod:`.kv_cache`, the default: a join or leave touches
  only that request's blocks, the newest request is preempted when blocks
  run out) and the contiguous one (``kv_layout="contiguous"``);
* :mod:`._prefill` -- prompt chunks and batched short prompts;
* :mod:`._decode` -- batched decode steps and runs.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections import deque
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncContextManager, AsyncIterator, Sequence

import attrs
import numpy as np
import trio

from .._errors import (ActorRTError, GenerationError, InvalidArgumentError, OutOfMemoryError,
                       SessionClosedError, UnwrapGroups)
from .._session import Session, SessionOptions, open_session
from ._decode import DecodeStage
from ._kv_stage import KVStage
from ._prefill import PrefillStage
from ._requests import (EngineStatistics, GenerationResult, GenerationStream, StreamPiece,
                        _Request)
from .admission import encode_prompt
from .kv_cache import KVCache
from .models import LOGITS_POSITIONS
from .sampling import SamplingParams

__all__ = ["Engine", "open_engine", "GenerationResult", "EngineStatistics", "GenerationStream",
           "StreamPiece"]

Prompt = str | Sequence[int] | Sequence[dict]

#: default :attr:`Engine.decode_run_steps`: how many steps a decode run goes
#: without the event loop looking at the batch (a newcomer, a cancel or the
#: engine closing ends it at the next step anyway)
DECODE_RUN_STEPS = 64
#: default :attr:`Engine.stream_interval_s`. Each hand-over wakes the event
#: loop, whose Python (detokenizing, the streams' consumers) then competes
#: with the decode thread for the GIL and for a core: handing every token over
#: cost ~6 % of SmolLM2's decode speed on 2 cores. 25 ms is ~3 tokens, below
#: what a reader notices.
STREAM_INTERVAL_S = 0.025


class Engine(KVStage, PrefillStage, DecodeStage):
    """Serves generation requests; obtain one from :func:`open_engine`."""

    def __init__(self, session: Session, tokenizer: Any, config: dict, *, max_batch: int,
                 kv_budget_bytes: int | None, prefill_chunk: int, kv_layout: str = "paged",
                 prefix_caching: bool = True, kv_dtype: str = "float32"):
        self.session = session
        #: the KV cache's element type (float16: paged layout only)
        self.kv_dtype = np.dtype(kv_dtype)
        self.tokenizer = tokenizer
        self.config = config
        self.max_batch = max(1, int(max_batch))
        self.kv_budget = kv_budget_bytes
        self.prefill_chunk = max(1, int(prefill_chunk))
        #: most decode steps run back to back in the worker thread while the
        #: batch does not change (:meth:`_decode_run`); 1 runs every step
        #: through the event loop
        self.decode_run_steps = DECODE_RUN_STEPS
        #: in a decode run, sampled tokens are handed to the event loop (and
        #: the streams) at most this often (s), and at the run's end
        self.stream_interval_s = STREAM_INTERVAL_S
        names = [i.name for i in session.get_inputs()]
        self._layers = sorted({int(n.split(".")[1]) for n in names
                               if n.startswith("past_key_values.")})
        shape = next(i.shape for i in session.get_inputs() if i.name.startswith("past_key_values."))
        self.kv_heads = int(shape[1])
        self.head_dim = int(shape[3])
        self.context = int(config.get("context_length") or config.get("max_length") or 8192)
        eos = config.get("eos_token_ids", config.get("eos_token_id", getattr(tokenizer, "eos_token_ids", [])))
        self.eos = set([eos] if isinstance(eos, int) else list(eos))
        from .models import search_to_sampling

        #: what a request without SamplingParams gets: greedy, or an
        #: onnxruntime-genai folder's ``search`` defaults
        self.default_params = SamplingParams(**search_to_sampling(
            {k: config[k] for k in ("do_sample", "temperature", "top_k", "top_p",
                                    "repetition_penalty") if k in config}))
        self.bytes_per_token = (len(self._layers) * 2 * self.kv_heads * self.head_dim
                                * self.kv_dtype.itemsize)
        self._output_index: tuple[int, list[int]] | None = None
        self._kv_names = [f"past_key_values.{layer}.{kv}" for layer in self._layers
                          for kv in ("key", "value")]
        self._present_names = [f"present.{layer}.{kv}" for layer in self._layers
                               for kv in ("key", "value")]
        # a last_logits file (models.model_file): the head reads one position a row
        self._positions = LOGITS_POSITIONS in names
        self._host = next(p for p in session._providers if p.name == "cpu")
        self._inbox_send, self._inbox = trio.open_memory_channel(math.inf)
        self._waiting: deque[_Request] = deque()
        self._prefilling: deque[_Request] = deque()
        self._decoding: list[_Request] = []
        self._batch: list[_Request] = []  # requests in the batched buffer, in row order
        self._batch_kv: list[np.ndarray] | None = None
        self._kv_bytes = 0
        self._completed = 0
        self._tokens = 0
        self._steps = 0
        self._decode_tokens = 0
        self._decode_time = 0.0
        self._prefill_runs = 0
        self._hist: dict[int, int] = {}
        self._t_start: float | None = None
        self._closed = False
        self._wake = trio.Event()
        #: set from the event loop to end a decode run (:meth:`_decode_run`)
        self._interrupt = False
        self._decode_mark = 0.0  # decode time is counted up to here
        #: the block-paged KV cache (kv_layout "paged"), or None: each request
        #: its own prefill buffer, then one right-padded batch buffer
        self._cache: KVCache | None = None
        #: a model run is under way: blocks of requests that leave meanwhile
        #: are returned after it (the run may still write them)
        self._in_run = False
        self._deferred: list[list[int]] = []
        self._preemptions = 0
        #: reuse cached prompt blocks (paged cache only)
        self.prefix_caching = bool(prefix_caching)
        self._prefix_hits = 0
        self._prefix_tokens = 0
        if kv_layout == "paged":
            self._cache = self._new_cache()
        elif self.kv_dtype != np.float32:
            raise InvalidArgumentError("kv_dtype float16 needs the paged KV cache",
                                       expected='kv_layout="paged"', got=repr(kv_layout),
                                       model=session.model_name)

    # ----------------------------------------------------------------- API
    def encode_prompt(self, prompt: Prompt, *, special_in_content: bool = False) -> list[int]:
        """Token ids of a prompt (:func:`actorrt.genai.admission.encode_prompt`):
        a string, token ids (a list or a 1-D integer array), or chat messages
        rendered with the model's chat template, whose contents are never read
        as control tokens unless ``special_in_content`` (pass the ids this
        returns to :meth:`generate` to use that opt-in).

        Raises:
            InvalidArgumentError: bytes (decode them first), text with a lone
                surrogate, malformed chat messages, out-of-vocab or non-integer
                ids, a prompt of another type, a non-bool flag.
        """
        return encode_prompt(self.tokenizer, prompt,
                             vocab_size=int(self.config.get("vocab_size", 1 << 31)),
                             special_in_content=special_in_content)

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, *,
               details: bool = False) -> GenerationStream:
        """Generate, yielding text pieces as they are decoded (UTF-8 safe: never
        half a character; spaces kept), or with ``details=True`` one
        :class:`StreamPiece` per generated token (ids, log-probabilities).
        The returned :class:`GenerationStream` holds the
        :class:`GenerationResult` in ``.result`` once it ends. Leaving the
        loop early, closing the iterator or cancelling the task frees the
        request's KV cache at the next step boundary.

        Raises (while iterating):
            GenerationError: the request can never fit (context or KV budget).
            InvalidArgumentError: a malformed prompt.
            SessionClosedError: the engine is closed, or closed before the
                request finished (the stream was cut short).
        """
        if not isinstance(details, bool):
            raise InvalidArgumentError("details must be a bool", expected="True or False",
                                       got=repr(details))
        return GenerationStream(self._run(prompt, params, details=details), details)

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None
                       ) -> GenerationResult:
        """Generate to completion; see :meth:`stream` for errors."""
        result = None
        async for item in self._run(prompt, params):
            if isinstance(item, GenerationResult):
                result = item
        assert result is not None
        return result

    async def _run(self, prompt: Prompt, params: SamplingParams | None, *,
                   details: bool = False):
        if self._closed:
            raise SessionClosedError("the engine is closed")
        if params is None:
            params = self.default_params
        elif not isinstance(params, SamplingParams):
            raise InvalidArgumentError("params must be a SamplingParams",
                                       expected="actorrt.genai.SamplingParams or None",
                                       got=type(params).__name__)
        ids = self.encode_prompt(prompt)
        if not ids:
            raise GenerationError("the prompt is empty")
        if len(ids) >= self.context:
            raise GenerationError(f"the prompt has {len(ids)} tokens; the context window is "
                                  f"{self.context}")
        send, recv = trio.open_memory_channel(math.inf)
        req = _Request(ids, params, send, self.tokenizer)
        self._check_fits_alone(req)
        req.details = details
        self._inbox_send.send_nowait(req)
        self._interrupt = True  # a decode run in the worker thread ends at its next step
        self._wake.set()
        try:
            async with recv:
                async for item in recv:
                    while True:  # what is already here, without a checkpoint each
                        if isinstance(item, BaseException):
                            raise item
                        yield item
                        try:
                            item = recv.receive_nowait()
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
        finally:
            if not req.done:
                req.cancelled = True
                self._wake.set()

    def statistics(self) -> EngineStatistics:
        active = len(self._prefilling) + len(self._decoding)
        el = (time.perf_counter() - self._t_start) if self._t_start else 0.0
        return EngineStatistics(active, len(self._waiting) + self._inbox.statistics().current_buffer_used,
                                self._completed, self._tokens,
                                self._tokens / el if el > 0 else 0.0, self._kv_bytes, self._steps,
                                dict(self._hist), self._decode_tokens, self._decode_time,
                                self._prefill_runs,
                                self._cache.used_blocks if self._cache else 0,
                                self._cache.num_blocks if self._cache else 0,
                                self._preemptions, self._prefix_hits, self._prefix_tokens,
                                self._cache.cached_blocks if self._cache else 0)

    # ---------------------------------------------------------------- loop
    async def _loop(self) -> None:
        while True:
            self._drain_inbox()
            self._reap()
            if self._shrink_batch():
                self._admit()
            if not self._decoding and self._batch_kv is not None:
                self._batch, self._batch_kv = [], None  # last stream left: free its cache
                self._set_kv_bytes()
            if not self._prefilling and not self._decoding:
                if self._closed:
                    return
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            if self._t_start is None:
                self._t_start = time.perf_counter()
            if self._prefilling:
                group = self._prefill_group()
                try:
                    if len(group) > 1:
                        await self._prefill_batch(group)
                    else:
                        group = [self._prefilling[0]]
                        await self._prefill_step(group[0])
                except OutOfMemoryError as exc:
                    self._prefill_out_of_memory(group, exc)
                except ActorRTError as exc:  # e.g. a kernel refusing this prompt: its own
                    for r in group:
                        self._fail(r, exc)
            self._reap()
            if self._decoding:
                try:
                    if (self.decode_run_steps > 1 and not self._prefilling
                            and not self._inbox.statistics().current_buffer_used):
                        await self._decode_run()
                    else:
                        await self._decode_step()
                except OutOfMemoryError as exc:
                    self._decode_out_of_memory(exc)
            await trio.lowlevel.checkpoint()

    def _drain_inbox(self) -> None:
        while True:
            try:
                req = self._inbox.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            self._waiting.append(req)

    def _admit(self) -> None:
        """Admit waiting requests in FIFO order while the batch has a free row
        and the KV bytes the admitted set can hold at once (:meth:`_kv_need`)
        fit :meth:`_kv_room`. A request that once ran out of memory beside
        others is admitted only into an idle engine, and nothing joins it."""
        while self._waiting:
            req = self._waiting[0]
            if req.cancelled:
                self._waiting.popleft()
                self._finish(req, "cancelled")
                continue
            admitted = [*self._prefilling, *self._decoding]
            if len(admitted) >= self.max_batch:
                return
            if admitted and (req.alone or any(r.alone for r in admitted)):
                return
            room = self._kv_room()
            if self._cache is not None:  # blocks: what it holds now, not its capacity
                room = self._block_room(room)
                need = (self._cache.used_blocks + len(admitted)
                        + self._cache.blocks_for(len(req.context_ids()) + 1))
                if need <= room:
                    self._waiting.popleft()
                    req.t_admit = req.t_admit or time.perf_counter()
                    self._share_prefix(req)
                    self._prefilling.append(req)
                    continue
                if admitted:
                    return  # fits once blocks are freed
                room = room * self._cache.block_bytes  # alone: it never fits
            elif room is not None and self._kv_need([*admitted, req]) <= room:
                room = None
            if room is not None:
                if admitted:
                    return  # fits once others finish
                self._waiting.popleft()  # alone and still too big: it never fits
                self._fail(req, self._kv_error(req, room))
                continue
            self._waiting.popleft()
            req.t_admit = time.perf_counter()
            self._prefilling.append(req)











    def _reap(self) -> None:
        for r in list(self._prefilling):
            if r.cancelled:
                self._prefilling.remove(r)
                self._finish(r, "cancelled")
        for r in list(self._decoding):
            if r.cancelled or r.done:
                self._decoding.remove(r)
                if not r.done:
                    self._finish(r, "cancelled")



    def _feeds(self, ids: np.ndarray, mask: np.ndarray, kv: list[np.ndarray],
               last: list[int] | None = None) -> dict:
        """A run's feeds; ``last``: each row's position in ``ids`` whose logits
        are sampled (default: the last column), fed where the model takes
        ``logits_positions``."""
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self._positions:
            feeds[LOGITS_POSITIONS] = (np.full((ids.shape[0], 1, 1), ids.shape[1] - 1, np.int64)
                                       if last is None
                                       else np.asarray(last, np.int64).reshape(-1, 1, 1))
        feeds.update(zip(self._kv_names, kv))
        return feeds

    def _row_logits(self, logits: np.ndarray, b: int, pos: int) -> np.ndarray:
        """Row ``b``'s logits at position ``pos`` of its run's input (the run
        was fed that position as ``logits_positions`` where the model takes it)."""
        return logits[b, 0 if self._positions else pos]

    async def _model(self, feeds: dict) -> tuple[np.ndarray, list[np.ndarray]]:
        # the KV buffers have spare capacity: GroupQueryAttention appends in place
        self._in_run = True
        try:
            outs = await self.session.run(None, feeds, donate=self._kv_names)
        finally:
            self._run_ended()
        return self._split_outputs(outs)














    def _split_index(self) -> tuple[int, list[int]]:
        """Positions of ``logits`` and of each layer's present key and value
        among the model's outputs."""
        if self._output_index is None:
            where = {o.name: i for i, o in enumerate(self.session.get_outputs())}
            self._output_index = (where["logits"], [where[n] for n in self._present_names])
        return self._output_index

    def _split_outputs(self, outs: list) -> tuple[np.ndarray, list[np.ndarray]]:
        """(logits, [present key, value of each layer]) of a run's outputs."""
        logits, kv = self._split_index()
        return outs[logits], [outs[i] for i in kv]

    def _sample(self, req: _Request, row: np.ndarray, history: list[int]) -> int | None:
        """The request's next token, or None after failing only that request
        (an error in one request's sampling never stops the engine)."""
        try:
            return req.sampler(row, history)
        except Exception as exc:  # noqa: BLE001 - reported to the request's caller
            self._fail(req, GenerationError(f"sampling the next token failed: "
                                            f"{type(exc).__name__}: {exc}"))
            return None

    def _send(self, req: _Request, item: Any) -> None:
        """Deliver to the request's reader; a reader that has gone away (stream
        closed, task cancelled) cancels the request instead of raising."""
        try:
            req.send.send_nowait(item)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            req.cancelled = True

    def _fail(self, req: _Request, exc: BaseException) -> None:
        """Finish ``req`` by raising ``exc`` in its caller."""
        self._retire(req, lambda: self._send(req, exc))

    def _retire(self, req: _Request, deliver) -> None:
        """Mark ``req`` done once: release its budget and cache, ``deliver()``
        its last items, close its stream."""
        if req.done:
            return
        req.done = True
        self._completed += 1
        req.kv = None
        self._free_blocks(req)
        deliver()
        req.send.close()
        if req in self._prefilling:
            self._prefilling.remove(req)
        if req in self._decoding:
            # leaves the batch now (its rows go at the next rebuild): the
            # statistics a caller reads once its result arrived count it out,
            # also while a decode run still holds the batch's buffers
            self._decoding.remove(req)
            if not self._decoding:
                self._batch, self._batch_kv = [], None
        # its own cache (a prefill) is gone now: the statistics say so at once
        self._set_kv_bytes()

    def _emit(self, req: _Request, tid: int | None) -> None:
        if tid is None:  # sampling failed: the request is finished with its error
            return
        now = time.perf_counter()
        req.t_last = now
        self._tokens += 1
        if tid in self.eos and not req.params.ignore_eos:
            req.generated.append(tid)
            self._finish(req, "stop")
            return
        req.generated.append(tid)
        req.pending = tid
        text, stopped = req.push_token(tid)
        if req.details:
            lps = req.sampler.logprobs
            i = len(req.generated) - 1
            self._send(req, StreamPiece(text, (tid,), (lps[i],) if i < len(lps) else None))
        elif text:
            self._send(req, text)
        if stopped:
            self._finish(req, "stop")
        elif (len(req.generated) >= req.params.max_new_tokens
              or req.length + 1 >= self.context):
            self._finish(req, "length")

    def _finish(self, req: _Request, reason: str) -> None:
        """Finish ``req`` normally: the held-back text, then its result."""
        def deliver() -> None:
            if reason != "cancelled":
                tail = req.flush()
                if tail:
                    self._send(req, tail)
            t_first = req.t_first or time.perf_counter()
            self._send(req, GenerationResult(
                req.text, list(req.generated), reason, len(req.prompt),
                max(t_first - req.t_admit, 0.0) if req.t_admit else 0.0,
                max(req.t_last - t_first, 0.0)))

        if not req.done and reason != "cancelled":
            self._register_finished(req)
        self._retire(req, deliver)

    async def _shutdown(self) -> None:
        self._closed = True
        self._interrupt = True
        self._drain_inbox()  # requests sent but never seen by the loop end too
        for r in list(self._waiting) + list(self._prefilling) + list(self._decoding):
            if not r.done:
                r.cancelled = True
                # a stream cut short must not end like a finished one
                self._fail(r, SessionClosedError(
                    f"the engine closed before the request finished ({len(r.generated)} of "
                    f"at most {r.params.max_new_tokens} tokens generated)",
                    model=str(self.session.model_name)))
        self._waiting.clear()
        self._prefilling.clear()
        self._decoding.clear()
        self._batch = []
        self._batch_kv = None
        self._set_kv_bytes()


def open_engine(model: str | Path = "smollm2", *, max_batch: int = 16,
                kv_budget_bytes: int | None = None, prefill_chunk: int = 64,
                providers: Sequence[Any] | None = None,
                options: SessionOptions | None = None,
                home: str | Path | None = None,
                accuracy_level: int | None = None,
                kv_layout: str = "paged",
                prefix_caching: bool = True,
                kv_dtype: str | None = None) -> AsyncContextManager[Engine]:
    """Prepare ``model`` (``"smollm2"``, a GGUF path, or a prepared model folder),
    open its session and run the engine actor until the block exits::

        async with open_engine("smollm2") as engine:
            ...

    What leaves the block is the exception itself, never an ExceptionGroup
    around it (unless several distinct failures happened at once): the body's
    own exception passes through unchanged, and ``except
    actorrt.ActorRTError`` catches the engine's errors outside the block.

    Args:
        model: model name, llama-family ``.gguf`` path, or folder from
            :func:`actorrt.genai.prepare_model`.
        max_batch: most requests prefilling/decoding at once.
        kv_budget_bytes: most KV-cache bytes for admitted requests (``None``:
            unlimited); new requests wait FIFO while the budget is full.
        prefill_chunk: prompt tokens per prefill run.
        providers: execution providers for the session (default: CPU).
        options: session options. The default runs the graph's branches one
            after another (``parallel_execution=False``): the LLM kernels
            already spread over every core, and running the q/k/v or gate/up
            branches side by side on top of that oversubscribed the cores
            (measured here: slower at batch 1 and at batch 8).
        home: model cache root (see :func:`actorrt.genai.prepare_model`).
        accuracy_level: ``MatMulNBits`` ``accuracy_level`` of the graph to run
            (:func:`actorrt.genai.models.model_file`). ``None`` (the default):
            4 for a model actorrt built (a built-in name, a GGUF file, its
            folder), and an onnxruntime-genai folder's ``model.onnx`` as
            written (its nodes' own levels, what onnxruntime-genai runs). 4 (as
            onnxruntime-genai's CPU int4 models and llama.cpp's Q8 activations)
            quantizes activations to int8 per 32-value block where the CPU has
            AVX2 (SmolLM2-135M Q4_1: teacher-forced perplexity on 3,768 tokens
            of CPython's LICENSE.txt 5.830 vs 5.811 at level 0, +0.34 %;
            ``benchmarks/perplexity.py``); 0 keeps them float32 (the logits
            match onnxruntime on the same file to 1e-3).
        kv_layout: ``"paged"`` (the default): one block-paged KV cache
            (:mod:`actorrt.genai.kv_cache`; a join or leave touches only that
            request's blocks, memory grows with the tokens held);
            ``"contiguous"``: each request's own buffer, gathered into one
            right-padded batch buffer whenever the batch changes (the previous
            engine, kept for comparison). Sessions on other providers than
            the CPU use the contiguous layout.
        prefix_caching: with the paged layout, requests whose tokens start
            with full blocks another prompt computed take those blocks and
            prefill only the rest (``statistics().prefix_hits`` and
            ``prefix_tokens_skipped``); unused cached blocks are evicted,
            least recently used first, when blocks run out.
        kv_dtype: the KV cache's element type: ``"float32"`` or
            ``"float16"`` (paged layout on the CPU provider only: IEEE
            half values, half the bytes a token; the attention kernels
            convert each key and value to float32 as they read it and round
            new ones to half, to nearest even, as they write them).
            ``None`` (the default): float16 where the run's accuracy level
            is 4 (int8 activations; as llama.cpp's default f16 KV cache)
            on the paged layout of the CPU provider, else float32, so that
            level 0 keeps onnxruntime-identical logits (SmolLM2-135M Q4_1,
            level 4: teacher-forced perplexity on CPython's LICENSE.txt
            with a float16 cache within 2 % of level 0's;
            ``benchmarks/perplexity.py --kv-dtype float16``).

    Raises:
        ModelLoadError: the model cannot be fetched, built or loaded, or an
            unknown ``accuracy_level``.
        InvalidArgumentError: bad ``options`` or ``providers`` (as
            :func:`actorrt.open_session`); an unknown ``kv_layout`` or
            ``kv_dtype``; ``kv_dtype="float16"`` with the contiguous layout
            or a session on another provider than the CPU.
    """
    if options is not None:
        options = SessionOptions.check(options)
    if kv_layout not in ("paged", "contiguous"):
        raise InvalidArgumentError("unknown kv_layout", expected='"paged" or "contiguous"',
                                   got=repr(kv_layout))
    if kv_dtype not in (None, "float32", "float16"):
        raise InvalidArgumentError("unknown kv_dtype", expected='"float32" or "float16"',
                                   got=repr(kv_dtype))
    if kv_dtype == "float16" and kv_layout != "paged":
        raise InvalidArgumentError(
            "kv_dtype float16 needs the paged KV cache: the contiguous layout's kernels "
            "read float32 buffers", expected='kv_layout="paged"', got=repr(kv_layout))
    return UnwrapGroups(_open_engine(model, max_batch=max_batch,
                                     kv_budget_bytes=kv_budget_bytes,
                                     prefill_chunk=prefill_chunk, providers=providers,
                                     options=options, home=home,
                                     accuracy_level=accuracy_level, kv_layout=kv_layout,
                                     prefix_caching=prefix_caching, kv_dtype=kv_dtype))


@asynccontextmanager
async def _open_engine(model: str | Path, *, max_batch: int, kv_budget_bytes: int | None,
                       prefill_chunk: int, providers: Sequence[Any] | None,
                       options: SessionOptions | None, home: str | Path | None,
                       accuracy_level: int | None, kv_layout: str,
                       prefix_caching: bool = True,
                       kv_dtype: str | None = None) -> AsyncIterator[Engine]:
    from .models import is_ort_genai_folder, model_file, prepare_model
    from .tokenizer import load_tokenizer

    p = Path(model)
    if p.is_dir() and (p / "model.onnx").exists():
        folder = p
    else:
        folder = await trio.to_thread.run_sync(lambda: prepare_model(str(model), home=home))
    config = json.loads((folder / "genai_config.json").read_text())
    if accuracy_level is None:  # ours: int8 activations; onnxruntime-genai's: as written
        accuracy_level = 0 if is_ort_genai_folder(folder) else 4
    tokenizer = await trio.to_thread.run_sync(load_tokenizer, folder)
    if options is None:
        options = SessionOptions(parallel_execution=False)
    # the engine keeps its outputs to itself (logits sampled, KV written in
    # place into donated buffers): no copies to make them owned
    options = attrs.evolve(options, output_views=True)
    # the head reads only the positions the engine samples from
    path = await trio.to_thread.run_sync(
        functools.partial(model_file, folder, accuracy_level, last_logits=True))
    async with open_session(path, providers, options) as session:
        on_cpu = not any(p.name != "cpu" for p in session._providers)
        if kv_dtype is None:  # float16 with int8 activations on the paged CPU cache
            kv_dtype = "float16" if (accuracy_level == 4 and on_cpu
                                     and kv_layout == "paged") else "float32"
        if not on_cpu:
            if kv_dtype != "float32":
                raise InvalidArgumentError(
                    "kv_dtype float16 needs the CPU provider's paged kernels",
                    expected="providers=['cpu']",
                    got=repr([p.name for p in session._providers]),
                    model=session.model_name)
            kv_layout = "contiguous"  # the paged kernels are the CPU provider's
        engine = Engine(session, tokenizer, _flat_config(config), max_batch=max_batch,
                        kv_budget_bytes=kv_budget_bytes, prefill_chunk=prefill_chunk,
                        kv_layout=kv_layout, prefix_caching=prefix_caching,
                        kv_dtype=kv_dtype)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine._loop)
            try:
                yield engine
            finally:
                await engine._shutdown()
                engine._wake.set()


def _flat_config(cfg: dict) -> dict:
    """Flatten nested config dicts so keys like ``context_length`` are found."""
    out: dict = {}

    def walk(d):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v)
            out.setdefault(k, v)
    walk(cfg)
    return out
