"""Sampling parameters and the token sampler (greedy, temperature, top-k,
top-p, min-p, repetition / presence / frequency penalties, log-probabilities),
one seeded generator per request."""

from __future__ import annotations

import math
from typing import Sequence

import attrs
import numpy as np

from .._errors import GenerationError

__all__ = ["SamplingParams", "Sampler", "TokenLogprob", "MAX_TOP_LOGPROBS"]

#: most alternatives :attr:`SamplingParams.logprobs` may ask for (OpenAI: 20)
MAX_TOP_LOGPROBS = 20


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(
        v, (bool, np.bool_))


def _stop_tuple(s) -> tuple:
    """``stop`` as a tuple: ``None`` -> no stop strings, one string -> one;
    anything else that is not an iterable is kept for the check to refuse."""
    if s is None:
        return ()
    if isinstance(s, str):
        return (s,)
    try:
        return tuple(s)
    except TypeError:
        return (s,)


@attrs.frozen
class SamplingParams:
    """How to pick tokens for one request.

    Attributes:
        max_new_tokens: most tokens to generate (>= 1).
        temperature: 0 means greedy (argmax); otherwise logits are divided by it.
        top_k: keep the k most likely tokens (0: all).
        top_p: keep the smallest set whose probability reaches p (1.0: all).
        min_p: drop tokens whose probability is below ``min_p`` x the top one (0: off).
        repetition_penalty: > 1 discourages tokens already in the prompt or output
            (llama.cpp / HF rule: positive logits divided, negative multiplied).
        seed: seed of this request's generator (``None``: fresh entropy).
        stop: strings that end generation (not included in the text); one
            string, a list, or ``None`` (none).
        ignore_eos: keep generating past end-of-sequence tokens (benchmarks,
            as llama.cpp's ``--ignore-eos``).
        presence_penalty: subtracted once from the logit of every token already
            generated (OpenAI semantics, in [-2, 2]; the prompt is not counted).
        frequency_penalty: subtracted from a token's logit once per time it was
            already generated (OpenAI semantics, in [-2, 2]).
        logprobs: ``None`` (off), or how many most likely alternatives to
            report with each generated token's log-probability (0 to
            :data:`MAX_TOP_LOGPROBS`); see :class:`TokenLogprob`.

    Raises:
        GenerationError: a value out of range (checked on construction).
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = attrs.field(default=(), converter=lambda s: _stop_tuple(s))
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None

    def __attrs_post_init__(self) -> None:
        for name in ("max_new_tokens", "top_k"):
            v = getattr(self, name)
            if not _is_int(v):
                raise GenerationError(f"{name} must be an integer, got {v!r}")
        for name in ("temperature", "top_p", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_real(v) or not math.isfinite(v):
                raise GenerationError(f"{name} must be a finite number, got {v!r}")
        if self.max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise GenerationError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise GenerationError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise GenerationError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise GenerationError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise GenerationError(f"seed must be None or an integer >= 0, got {self.seed!r}")
        if not all(isinstance(x, str) and x for x in self.stop):
            raise GenerationError(f"stop must be non-empty strings, got {self.stop!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise GenerationError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.logprobs is not None and (not _is_int(self.logprobs)
                                          or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise GenerationError(f"logprobs must be None or an integer in "
                                  f"[0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")
        for x in self.stop:
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                raise GenerationError(f"stop string {x!r} holds a lone surrogate") from None
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise GenerationError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def plain_argmax(self) -> bool:
        """Greedy with nothing that looks at the logits beyond their argmax (no
        penalty, no log-probabilities): the engine may take the argmax itself."""
        return (self.temperature == 0 and self.repetition_penalty == 1.0
                and self.presence_penalty == 0 and self.frequency_penalty == 0
                and self.logprobs is None)

    def for_choice(self, index: int) -> "SamplingParams":
        """The parameters of choice ``index`` of ``n`` requests sharing these
        (OpenAI's ``n``): choice 0 keeps :attr:`seed`; choice ``i > 0`` gets a
        seed derived from ``(seed, i)`` (``numpy.random.SeedSequence``), so
        the choices differ and a seeded request reproduces all of them.
        Without a seed every choice draws fresh entropy."""
        if index == 0 or self.seed is None:
            return self
        seed = int(np.random.SeedSequence([self.seed, index]).generate_state(1, np.uint32)[0])
        return attrs.evolve(self, seed=seed)


@attrs.frozen
class TokenLogprob:
    """One generated token's log-probability and the most likely alternatives.

    Log-probabilities are the log-softmax over the whole vocabulary of the
    logits the token was sampled from after the repetition / presence /
    frequency penalties and before temperature, top-k, top-p and min-p (the
    model's distribution, as OpenAI and vLLM report it; natural log).

    Attributes:
        token_id: the generated token.
        logprob: its log-probability (<= 0).
        top: ``(token id, log-probability)`` of the ``logprobs`` most likely
            tokens, most likely first (ties: lower id first).
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class Sampler:
    """Picks the next token from a logits row for one request."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self._penalized = params.presence_penalty != 0 or params.frequency_penalty != 0
        #: times each token was sampled so far (presence / frequency penalties)
        self.counts: dict[int, int] = {}
        #: with ``params.logprobs`` set: one :class:`TokenLogprob` per call, in order
        self.logprobs: list[TokenLogprob] = []

    def __call__(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """Next token id from ``logits`` (shape ``(vocab,)``, float32);
        ``history``: the prompt and the tokens generated so far (ids)."""
        tid = self._pick(logits, history)
        if self._penalized:
            self.counts[tid] = self.counts.get(tid, 0) + 1
        return tid

    def _pick(self, logits: np.ndarray, history: Sequence[int]) -> int:
        p = self.params
        if p.repetition_penalty != 1.0 and len(history):
            logits = logits.astype(np.float32, copy=True)
            ids = np.unique(np.asarray(history, dtype=np.int64))
            vals = logits[ids]
            logits[ids] = np.where(vals > 0, vals / p.repetition_penalty,
                                   vals * p.repetition_penalty)
        if self._penalized and self.counts:
            logits = logits.astype(np.float32, copy=True)
            ids = np.fromiter(self.counts.keys(), np.int64, len(self.counts))
            n = np.fromiter(self.counts.values(), np.float32, len(self.counts))
            logits[ids] -= n * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)
        if p.logprobs is not None:
            tid = int(np.argmax(logits)) if p.greedy else self._draw(logits)
            self.logprobs.append(_logprobs(logits, tid, p.logprobs))
            return tid
        if p.greedy:
            return int(np.argmax(logits))
        return self._draw(logits)

    def _draw(self, logits: np.ndarray) -> int:
        p = self.params
        z = logits.astype(np.float64)
        # shift before dividing: every value is <= 0, so a tiny temperature
        # gives -inf (probability 0), never inf - inf
        with np.errstate(over="ignore"):
            z = (z - z.max()) / p.temperature
        if p.top_k and p.top_k < z.size:
            kth = np.partition(z, -p.top_k)[-p.top_k]
            z = np.where(z < kth, -np.inf, z)
        probs = np.exp(z)
        probs /= probs.sum()
        if p.min_p > 0:
            probs = np.where(probs < p.min_p * probs.max(), 0.0, probs)
            probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            csum = np.cumsum(probs[order])
            keep = csum - probs[order] < p.top_p  # always keeps the first
            mask = np.zeros_like(probs, dtype=bool)
            mask[order[keep]] = True
            probs = np.where(mask, probs, 0.0)
            probs /= probs.sum()
        return int(self.rng.choice(probs.size, p=probs))


def _logprobs(logits: np.ndarray, tid: int, k: int) -> TokenLogprob:
    """Log-softmax of ``logits`` (float64): token ``tid``'s and the top ``k``."""
    z = logits.astype(np.float64)
    top = z.max()
    lse = top + math.log(float(np.exp(z - top).sum()))
    alts: tuple[tuple[int, float], ...] = ()
    if k:
        idx = np.argpartition(-z, k - 1)[:k] if k < z.size else np.arange(z.size)
        idx = sorted(idx.tolist(), key=lambda i: (-z[i], i))
        alts = tuple((int(i), float(z[i] - lse)) for i in idx)
    return TokenLogprob(int(tid), float(z[tid] - lse), alts)
