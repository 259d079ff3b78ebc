"""Sampling parameters and the token sampler (greedy, temperature, top-k,
top-p, min-p, repetition penalty), one seeded generator per request."""

from __future__ import annotations

import math
from typing import Sequence

import attrs
import numpy as np

from .._errors import GenerationError

__all__ = ["SamplingParams", "Sampler"]


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

    def __attrs_post_init__(self) -> None:
        for name in ("max_new_tokens", "top_k"):
            v = getattr(self, name)
            if not _is_int(v):
                raise GenerationError(f"{name} must be an integer, got {v!r}")
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
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


class Sampler:
    """Picks the next token from a logits row for one request."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """Next token id from ``logits`` (shape ``(vocab,)``, float32)."""
        p = self.params
        if p.repetition_penalty != 1.0 and len(history):
            logits = logits.astype(np.float32, copy=True)
            ids = np.unique(np.asarray(history, dtype=np.int64))
            vals = logits[ids]
            logits[ids] = np.where(vals > 0, vals / p.repetition_penalty,
                                   vals * p.repetition_penalty)
        if p.greedy:
            return int(np.argmax(logits))
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
