"""What the engine (:mod:`actorrt.genai.engine`) hands its callers and keeps
per request: results, stream pieces, the stream iterator, the statistics,
and the request record itself."""

from __future__ import annotations

import codecs
import itertools
from typing import Any, AsyncIterator

import attrs
import numpy as np

from .sampling import Sampler, SamplingParams, TokenLogprob

__all__ = ["GenerationResult", "StreamPiece", "GenerationStream", "EngineStatistics"]


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
        preemptions: decoding requests preempted because the paged cache ran
            out of blocks (their blocks freed, their tokens recomputed when
            they are admitted again).
        prefix_hits: requests that took cached prompt blocks;
            prefix_tokens_skipped: the positions those blocks held (prompt
            tokens not computed); kv_blocks_cached: blocks registered in the
            prefix cache (held or idle).
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
    preemptions: int = 0
    prefix_hits: int = 0
    prefix_tokens_skipped: int = 0
    kv_blocks_cached: int = 0

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

    def context_ids(self) -> list[int]:
        """The tokens its KV cache holds once prefilled: the prompt, and
        after a preemption the generated tokens but the pending one."""
        return self.prompt + self.generated[:-1] if self.generated else self.prompt

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
