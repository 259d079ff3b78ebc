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
"""

from __future__ import annotations

import codecs
import functools
import itertools
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
from ..providers._memory import huge_page_arrays
from .admission import encode_prompt, kv_error, kv_need, kv_need_paged, kv_room, kv_room_alone
from .kv_cache import BLOCK_SIZE, KVCache
from .models import LOGITS_POSITIONS
from .sampling import Sampler, SamplingParams, TokenLogprob

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


@attrs.frozen
class GenerationResult:
    """The outcome of one request.

    Attributes:
        text: generated text (prompt excluded, stop string excluded).
        token_ids: generated token ids.
        finish_reason: ``"stop"`` (EOS or a stop string), ``"length"``
            (max_new_tokens or the context window), ``"cancelled"``.
        prompt_tokens: prompt length in tokens.
        prompt_seconds: time from admission to the first token (s).
        decode_seconds: time from the first to the last token (s).
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    prompt_seconds: float
    decode_seconds: float

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.token_ids) - 1
        return n / self.decode_seconds if n > 0 and self.decode_seconds > 0 else 0.0


@attrs.frozen
class StreamPiece:
    """What one generated token adds to a stream (``engine.stream(...,
    details=True)``).

    Attributes:
        text: text released by the token (may be ``""``: half a character, or
            a possible stop-string prefix held back; the held text arrives with
            a later piece). The last piece of a stream may carry only text
            (``token_ids`` empty): the held-back tail.
        token_ids: the token (one id), or ``()`` for the tail piece.
        logprobs: with :attr:`SamplingParams.logprobs` set, the token's
            :class:`~actorrt.genai.sampling.TokenLogprob` (one per id);
            otherwise ``None``.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None


class GenerationStream:
    """The async iterator :meth:`Engine.stream` returns: text pieces (``str``)
    or, with ``details=True``, :class:`StreamPiece` objects.

    After the iteration ends, :attr:`result` holds the request's
    :class:`GenerationResult` (finish reason, token ids, counts, timings).
    A stream the engine aborted (the engine closed under it) raises
    :class:`~actorrt.SessionClosedError` instead of ending.
    ``await stream.aclose()`` (or leaving an ``async with
    contextlib.aclosing(stream)`` block) cancels the request.
    """

    def __init__(self, items: AsyncIterator[Any], details: bool):
        self._items = items
        self._details = details
        #: the request's :class:`GenerationResult` once the stream ended
        #: normally; ``None`` before
        self.result: GenerationResult | None = None

    def __aiter__(self) -> "GenerationStream":
        return self

    async def __anext__(self) -> "str | StreamPiece":
        while True:
            item = await self._items.__anext__()
            if isinstance(item, GenerationResult):
                self.result = item
                continue
            if self._details:
                return item if isinstance(item, StreamPiece) else StreamPiece(item, ())
            text = item.text if isinstance(item, StreamPiece) else item
            if text:
                return text

    async def aclose(self) -> None:
        """Stop reading: the request is cancelled and its KV cache freed at the
        next step boundary."""
        await self._items.aclose()


@attrs.frozen
class EngineStatistics:
    """Engine counters.

    Attributes:
        active: requests prefilling or decoding. waiting: queued for admission.
        completed: requests finished (any reason). tokens_generated: total.
        tokens_per_s: aggregate generated tokens/s since the engine started
            serving its first request.
        kv_bytes: bytes held by KV caches now.
        steps: decode steps run; batch_histogram: batch size -> steps.
        decode_tokens: tokens produced by decode steps (first tokens come from
            prefill and are not counted); decode_time_s: wall seconds spent in
            decode steps (batched model run + sampling, prefill excluded).
        prefill_runs: model runs spent on prompts (several short prompts that
            arrive together share one run).
        kv_blocks_used, kv_blocks_total: blocks of the paged KV cache held
            now and in its pool (0 with ``kv_layout="contiguous"``).
    """

    active: int
    waiting: int
    completed: int
    tokens_generated: int
    tokens_per_s: float
    kv_bytes: int
    steps: int
    batch_histogram: dict[int, int]
    decode_tokens: int = 0
    decode_time_s: float = 0.0
    prefill_runs: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0

    @property
    def decode_tokens_per_s(self) -> float:
        """Aggregate decode throughput: decode tokens / decode seconds (the
        analogue of llama.cpp batched-bench's text-generation speed)."""
        return self.decode_tokens / self.decode_time_s if self.decode_time_s > 0 else 0.0


class _Request:
    _ids = itertools.count(1)

    def __init__(self, prompt_ids: list[int], params: SamplingParams, send, tokenizer):
        self.id = next(self._ids)
        self.prompt = prompt_ids
        self.params = params
        self.sampler = Sampler(params)
        self.send = send
        self.tok = tokenizer
        self.kv: list[np.ndarray] | None = None  # own cache while prefilling
        self.blocks: list[int] = []  # its blocks of a paged cache, in position order
        self.length = 0  # tokens in the KV cache
        self.prefilled = 0
        self.generated: list[int] = []
        self.pending: int | None = None  # sampled, not yet fed to the model
        self.cancelled = False
        self.done = False
        self.details = False  # send StreamPiece objects rather than text
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.held = ""  # text held back (possible stop-string prefix)
        self.t_admit = 0.0
        self.t_first = 0.0
        self.t_last = 0.0
        #: admitted only while nothing else runs (it ran out of memory beside others)
        self.alone = False

    # text ---------------------------------------------------------------
    def push_token(self, tid: int) -> tuple[str, bool]:
        """Add a generated token; returns (text safe to emit, hit a stop string)."""
        piece = self.decoder.decode(self.tok.token_bytes(tid))
        buf = self.held + piece
        for s in self.params.stop:
            i = buf.find(s)
            if i >= 0:
                self.held = ""
                self.text += buf[:i]
                return buf[:i], True
        keep = 0
        for s in self.params.stop:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    keep = max(keep, k)
                    break
        out, self.held = (buf[:len(buf) - keep], buf[len(buf) - keep:]) if keep else (buf, "")
        self.text += out
        return out, False

    def flush(self) -> str:
        """The text held back, at the request's end. Bytes of a character the
        generation stopped inside (e.g. cut by ``max_new_tokens``) are
        dropped: they never decode to text, and U+FFFD would be a character
        the model did not produce."""
        tail = self.held
        self.decoder.reset()
        self.held = ""
        self.text += tail
        return tail


class Engine:
    """Serves generation requests; obtain one from :func:`open_engine`."""

    def __init__(self, session: Session, tokenizer: Any, config: dict, *, max_batch: int,
                 kv_budget_bytes: int | None, prefill_chunk: int, kv_layout: str = "paged"):
        self.session = session
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
        self.bytes_per_token = len(self._layers) * 2 * self.kv_heads * self.head_dim * 4
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
        if kv_layout == "paged":
            self._cache = self._new_cache()

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
                                self._cache.num_blocks if self._cache else 0)

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
            if room is not None and self._kv_need([*admitted, req]) > room:
                if admitted:
                    return  # fits once others finish
                self._waiting.popleft()  # alone and still too big: it never fits
                self._fail(req, self._kv_error(req, room))
                continue
            self._waiting.popleft()
            req.t_admit = time.perf_counter()
            self._prefilling.append(req)

    # ------------------------------------------------------- KV accounting
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

    def _decode_out_of_memory(self, exc: OutOfMemoryError) -> None:
        """A decode step (or the batch rebuild before it) ran out of memory:
        the requests that were joining the batch fail with ``exc``, else the
        newest one in it; the others go on at the next step."""
        joining = [r for r in self._decoding if r.kv is not None]
        victims = joining or ([max(self._decoding, key=lambda r: r.id)] if self._decoding else [])
        for r in victims:
            self._fail(r, exc)
        self._set_kv_bytes()

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

    # ------------------------------------------------------- paged cache
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
                       memory=self._host.memory, model=self.session.model_name)

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

    async def _prefill_step(self, req: _Request) -> None:
        start = req.prefilled
        chunk = req.prompt[start:start + self.prefill_chunk]
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
        self._set_kv_bytes()
        if req.prefilled < len(req.prompt):
            return
        self._prefilling.popleft()
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
            if r.prefilled or r.kv is not None or n > self.prefill_chunk:
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
            self._prefilling.remove(r)
            r.t_first = now
            self._emit(r, self._sample(r, self._row_logits(logits, b, n - 1), r.prompt))
            if not r.done:
                self._decoding.append(r)
        self._set_kv_bytes()

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

    async def _decode_step(self) -> None:
        t0 = time.perf_counter()
        if self._cache is not None:
            reqs = list(self._decoding)
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

        def hand_over() -> None:
            token.run_sync_soon(self._emit_steps, list(unsent))
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
                    hand_over()
                    return None
                if time.perf_counter() - last_sent[0] >= interval:
                    hand_over()
            if (self._interrupt or state["steps"] >= limit
                    or any(r.cancelled or r.done for r in reqs)):
                if unsent:
                    hand_over()
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

    def _emit_steps(self, steps: list[tuple]) -> None:
        """Steps of a decode run, on the event loop: per step ``(requests,
        tokens, lengths)``, each request's token (None: skipped; an exception:
        its sampling failed) and KV length after the step."""
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
                accuracy_level: int = 4,
                kv_layout: str = "paged") -> AsyncContextManager[Engine]:
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
            (:func:`actorrt.genai.models.model_file`): 4 (the default, as
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

    Raises:
        ModelLoadError: the model cannot be fetched, built or loaded, or an
            unknown ``accuracy_level``.
        InvalidArgumentError: bad ``options`` or ``providers`` (as
            :func:`actorrt.open_session`).
    """
    if options is not None:
        options = SessionOptions.check(options)
    if kv_layout not in ("paged", "contiguous"):
        raise InvalidArgumentError("unknown kv_layout", expected='"paged" or "contiguous"',
                                   got=repr(kv_layout))
    return UnwrapGroups(_open_engine(model, max_batch=max_batch,
                                     kv_budget_bytes=kv_budget_bytes,
                                     prefill_chunk=prefill_chunk, providers=providers,
                                     options=options, home=home,
                                     accuracy_level=accuracy_level, kv_layout=kv_layout))


@asynccontextmanager
async def _open_engine(model: str | Path, *, max_batch: int, kv_budget_bytes: int | None,
                       prefill_chunk: int, providers: Sequence[Any] | None,
                       options: SessionOptions | None, home: str | Path | None,
                       accuracy_level: int, kv_layout: str) -> AsyncIterator[Engine]:
    from .models import model_file, prepare_model
    from .tokenizer import load_tokenizer

    p = Path(model)
    if p.is_dir() and (p / "model.onnx").exists():
        folder = p
    else:
        folder = await trio.to_thread.run_sync(lambda: prepare_model(str(model), home=home))
    config = json.loads((folder / "genai_config.json").read_text())
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
        if any(p.name != "cpu" for p in session._providers):
            kv_layout = "contiguous"  # the paged kernels are the CPU provider's
        engine = Engine(session, tokenizer, _flat_config(config), max_batch=max_batch,
                        kv_budget_bytes=kv_budget_bytes, prefill_chunk=prefill_chunk,
                        kv_layout=kv_layout)
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
