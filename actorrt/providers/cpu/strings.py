"""String ops on object arrays of ``str``.

Spec: ONNX StringConcat (20), StringNormalizer (10), StringSplit (20),
RegexFullMatch (20), TfIdfVectorizer (9).

Python has no vectorised string kernels, so per-string work (split, regex,
case change) goes through one list comprehension over the flattened strings;
everything else (broadcasting, filtering, padding, n-gram matching) is numpy.
"""

from __future__ import annotations

import re

import numpy as np

from .._contract import Kernel, NodeSpec, require
from .registry import cpu_kernel


def _strings(flat) -> np.ndarray:
    """A 1-D object array holding ``flat`` (a list of str)."""
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out


@cpu_kernel("StringConcat", since=20)
def StringConcat(X, Y):
    """ONNX StringConcat (20): elementwise ``X + Y`` with numpy broadcasting."""
    x = np.asarray(X, dtype=object)
    y = np.asarray(Y, dtype=object)
    out = np.empty(np.broadcast_shapes(x.shape, y.shape), dtype=object)
    np.add(x, y, out=out)
    return out


@cpu_kernel("StringNormalizer", since=10)
def StringNormalizer(X, *, case_change_action="NONE", is_case_sensitive=0, locale="",
                     stopwords=None):
    """ONNX StringNormalizer (10): drop elements equal to a stopword (case-
    insensitively unless ``is_case_sensitive``), then change case. Input
    ``[C]`` or ``[1, C]``; output ``[C']`` or ``[1, C']``, ``[""]`` / ``[[""]]``
    when every element was dropped."""
    x = np.asarray(X, dtype=object)
    if x.ndim == 2 and x.shape[0] != 1 or x.ndim not in (1, 2):
        raise ValueError(f"StringNormalizer input must be [C] or [1, C], got {list(x.shape)}")
    if case_change_action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(f"unknown case_change_action {case_change_action!r}")
    flat = x.reshape(-1).tolist()
    if stopwords:
        if is_case_sensitive:
            stops = set(stopwords)
            flat = [s for s in flat if s not in stops]
        else:
            stops = {w.casefold() for w in stopwords}
            flat = [s for s in flat if s.casefold() not in stops]
    if case_change_action == "LOWER":
        flat = [s.lower() for s in flat]
    elif case_change_action == "UPPER":
        flat = [s.upper() for s in flat]
    if not flat:
        flat = [""]
    out = _strings(flat)
    return out.reshape(1, -1) if x.ndim == 2 else out


@cpu_kernel("StringSplit", since=20, multi_output=True)
def StringSplit(X, *, delimiter="", maxsplit=None):
    """ONNX StringSplit (20): split each string on ``delimiter`` (runs of
    whitespace when empty, leading/trailing ones dropped) at most ``maxsplit``
    times. Outputs Y ``X.shape + [max pieces]`` (padded with ``""``) and Z the
    piece counts (int64, ``X.shape``)."""
    x = np.asarray(X, dtype=object)
    sep = delimiter or None
    ms = -1 if maxsplit is None else int(maxsplit)
    parts = [s.split(sep, ms) for s in x.reshape(-1).tolist()]
    counts = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    width = int(counts.max(initial=0))
    y = np.full((len(parts), width), "", dtype=object)
    if parts:
        rows = np.repeat(np.arange(len(parts)), counts)
        cols = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        y[rows, cols] = _strings([s for p in parts for s in p])
    return y.reshape(*x.shape, width), counts.reshape(x.shape)


@cpu_kernel("RegexFullMatch", since=20)
class RegexFullMatch(Kernel):
    """ONNX RegexFullMatch (20): bool tensor, true where the whole string
    matches ``pattern``. Python ``re`` stands in for RE2 (same syntax for the
    common subset; RE2-only syntax is rejected at plan time)."""

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        pattern = node.attr("pattern")
        require(isinstance(pattern, str), "RegexFullMatch needs a string pattern")
        try:
            re.compile(pattern)
        except re.error as e:
            require(False, "RegexFullMatch pattern %r does not compile: %s", pattern, e)

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self.regex = re.compile(node.attrs["pattern"])

    def run(self, X):
        x = np.asarray(X, dtype=object)
        match = self.regex.fullmatch
        flat = [match(s) is not None for s in x.reshape(-1).tolist()]
        return np.array(flat, dtype=bool).reshape(x.shape)


# ------------------------------------------------------------------ TfIdf

@cpu_kernel("TfIdfVectorizer", since=9)
class TfIdfVectorizer(Kernel):
    """ONNX TfIdfVectorizer (9): count the pool's n-grams (lengths
    ``min_gram_length..max_gram_length``, items up to ``max_skip_count``
    apart; unigrams once) in each row of ``X`` (``[C]`` or ``[B, C]``, int32,
    int64 or string) and weight them per ``mode``. Output float32 ``[O]`` or
    ``[B, O]``, ``O = max(ngram_indexes) + 1``."""

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        a = node.attrs
        require(a.get("mode") in ("TF", "IDF", "TFIDF"), "TfIdfVectorizer mode must be TF, IDF "
                "or TFIDF, got %r", a.get("mode"))
        require(a.get("pool_int64s") is not None or a.get("pool_strings") is not None,
                "TfIdfVectorizer needs pool_int64s or pool_strings")
        require(a.get("ngram_counts") is not None and a.get("ngram_indexes") is not None,
                "TfIdfVectorizer needs ngram_counts and ngram_indexes")

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        a = node.attrs
        self.mode = a["mode"]
        self.min_n = int(a["min_gram_length"])
        self.max_n = int(a["max_gram_length"])
        self.max_skip = int(a["max_skip_count"])
        strings = a.get("pool_strings") is not None
        pool = a["pool_strings"] if strings else a["pool_int64s"]
        pool = _strings(list(pool)) if strings else np.asarray(pool, dtype=np.int64)
        indexes = np.asarray(a["ngram_indexes"], dtype=np.int64)
        self.out_size = int(indexes.max()) + 1 if indexes.size else 0
        w = a.get("weights")
        self.weights = None if w is None or len(w) == 0 else np.asarray(w, np.float32)
        self.vocab = np.unique(pool)
        codes = np.searchsorted(self.vocab, pool).astype(np.int64)
        # n-grams of length n: (k_n, n) vocab codes and their output columns
        counts = list(a["ngram_counts"]) + [len(pool)]
        self.grams: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        gram_id = 0
        for i in range(len(counts) - 1):
            n = i + 1
            items = codes[counts[i]:counts[i + 1]]
            k = len(items) // n
            if self.min_n <= n <= self.max_n and k:
                self.grams[n] = (items[:k * n].reshape(k, n), indexes[gram_id:gram_id + k])
            gram_id += k

    def _codes(self, x: np.ndarray) -> np.ndarray:
        """Vocabulary code of each item, -1 for items not in the pool."""
        if self.vocab.dtype == object:
            x = np.asarray(x, dtype=object)
        else:
            x = np.asarray(x).astype(np.int64)
        if self.vocab.size == 0:
            return np.full(x.shape, -1, np.int64)
        pos = np.searchsorted(self.vocab, x)
        pos = np.minimum(pos, self.vocab.size - 1)
        return np.where(self.vocab[pos] == x, pos, -1).astype(np.int64)

    def _count(self, codes: np.ndarray, n: int, gap: int, freq: np.ndarray) -> None:
        """Add the n-grams of ``codes`` (B, C) with items ``gap`` apart to ``freq``."""
        pool, cols = self.grams[n]
        B, C = codes.shape
        span = (n - 1) * gap
        if C <= span:
            return
        starts = np.arange(C - span)
        win = codes[:, starts[:, None] + gap * np.arange(n)]  # (B, W, n)
        # match windows against the pool one item at a time, ranking prefixes
        base = len(self.vocab) + 1
        key_pool = np.zeros(len(pool), np.int64)
        key_win = np.zeros(win.shape[:2], np.int64)
        ok = np.ones(win.shape[:2], bool)
        for j in range(n):
            kp = key_pool * base + pool[:, j]
            kw = key_win * base + np.maximum(win[..., j], 0)
            ok &= win[..., j] >= 0
            uniq = np.unique(kp)
            key_pool = np.searchsorted(uniq, kp)
            pos = np.minimum(np.searchsorted(uniq, kw), uniq.size - 1)
            ok &= uniq[pos] == kw
            key_win = pos
        order = np.argsort(key_pool, kind="stable")  # key_pool are ranks of whole n-grams
        b_idx, w_idx = np.nonzero(ok)
        ranks = key_win[b_idx, w_idx]
        # a rank may match several pool entries: the last one wins, as in the
        # reference n-gram trie
        last = order[np.searchsorted(key_pool[order], ranks, side="right") - 1]
        np.add.at(freq, (b_idx, cols[last]), 1)

    def run(self, X):
        x = np.asarray(X)
        if x.ndim > 2:
            raise ValueError(f"TfIdfVectorizer input must be [C] or [B, C], got {list(x.shape)}")
        rows = x.reshape(1, -1) if x.ndim < 2 else x
        freq = np.zeros((rows.shape[0], self.out_size), np.int64)
        if rows.size and self.grams:
            codes = self._codes(rows)
            for gap in range(1, self.max_skip + 2):
                for n in self.grams:
                    if n == 1 and gap > 1:
                        continue  # unigrams do not depend on the skip distance
                    self._count(codes, n, gap, freq)
        if self.mode == "TF":
            y = freq.astype(np.float32)
        elif self.mode == "IDF":
            w = self.weights if self.weights is not None else np.float32(1)
            y = np.where(freq > 0, w, np.float32(0)).astype(np.float32)
        else:
            w = self.weights if self.weights is not None else np.float32(1)
            y = (freq * w).astype(np.float32)
        return y.reshape(-1) if x.ndim < 2 else y
