"""Random generators.

Spec: ONNX RandomNormal, RandomUniform, RandomNormalLike, RandomUniformLike
(opsets 1, 22), Bernoulli (15, 22), Multinomial (7, 22).

Draws come from ``np.random.default_rng``: seeded with the bits of the
``seed`` attribute when it is set (then every run of the node draws the same
values), from fresh OS entropy otherwise. The values differ from those of
onnxruntime or the ONNX reference evaluator even for the same seed; only the
shape, dtype and distribution are specified.
"""

from __future__ import annotations

import numpy as np

from ..._dtypes import to_numpy_dtype
from .registry import cpu_kernel


def _rng(seed: float | None) -> np.random.Generator:
    """A generator seeded from the float64 bits of ``seed`` (``None``: unseeded)."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(int(np.array(seed, np.float64).view(np.uint64)))


def _out_dtype(dtype: int | None, like: np.ndarray | None) -> np.dtype:
    """The output dtype: attribute ``dtype`` if set, else ``like``'s dtype.

    Raises:
        TypeError: the result is not a floating-point type.
    """
    dt = to_numpy_dtype(dtype) if dtype else np.asarray(like).dtype
    if np.dtype(dt).kind != "f" and "bfloat16" not in str(dt):
        raise TypeError(f"random output must be a floating-point type, got {dt}")
    return np.dtype(dt)


def _shape(shape) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"shape {list(dims)} has a negative dim")
    return dims


@cpu_kernel("RandomNormal", since=(1, 22))
def RandomNormal(*, shape, dtype=1, mean=0.0, scale=1.0, seed=None):
    """ONNX RandomNormal (1, 22): normal(mean, scale) samples of ``shape``."""
    out = _out_dtype(dtype, None)
    return _rng(seed).normal(mean, scale, _shape(shape)).astype(out)


@cpu_kernel("RandomUniform", since=(1, 22))
def RandomUniform(*, shape, dtype=1, high=1.0, low=0.0, seed=None):
    """ONNX RandomUniform (1, 22): uniform [low, high) samples of ``shape``."""
    out = _out_dtype(dtype, None)
    return _rng(seed).uniform(low, high, _shape(shape)).astype(out)


@cpu_kernel("RandomNormalLike", since=(1, 22))
def RandomNormalLike(input, *, dtype=None, mean=0.0, scale=1.0, seed=None):
    """ONNX RandomNormalLike (1, 22): normal samples shaped like ``input``,
    dtype ``dtype`` or the input's."""
    out = _out_dtype(dtype, input)
    return _rng(seed).normal(mean, scale, np.shape(input)).astype(out)


@cpu_kernel("RandomUniformLike", since=(1, 22))
def RandomUniformLike(input, *, dtype=None, high=1.0, low=0.0, seed=None):
    """ONNX RandomUniformLike (1, 22): uniform samples shaped like ``input``,
    dtype ``dtype`` or the input's."""
    out = _out_dtype(dtype, input)
    return _rng(seed).uniform(low, high, np.shape(input)).astype(out)


@cpu_kernel("Bernoulli", since=(15, 22))
def Bernoulli(input, *, dtype=None, seed=None):
    """ONNX Bernoulli (15, 22): 1 with probability ``input`` else 0, shaped
    like the input, dtype ``dtype`` (any numeric or bool) or the input's."""
    p = np.asarray(input, dtype=np.float64)
    out = to_numpy_dtype(dtype) if dtype else np.asarray(input).dtype
    return (_rng(seed).random(p.shape) < p).astype(out)


@cpu_kernel("Multinomial", since=(7, 22))
def Multinomial(input, *, dtype=6, sample_size=1, seed=None):
    """ONNX Multinomial (7, 22): ``sample_size`` class indices per row drawn from
    the unnormalised log-probabilities ``input`` ``(batch, classes)``; output
    ``(batch, sample_size)`` int32 or int64 (``dtype``)."""
    out = to_numpy_dtype(dtype)
    if out not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"Multinomial dtype must be int32 or int64, got {out}")
    logits = np.asarray(input, dtype=np.float64)
    if logits.ndim != 2:
        raise ValueError(f"Multinomial input must be (batch, classes), got {list(logits.shape)}")
    batch, classes = logits.shape
    if classes == 0:
        raise ValueError("Multinomial needs at least one class")
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    cdf = np.cumsum(p, axis=1)
    cdf /= cdf[:, -1:]
    u = _rng(seed).random((batch, int(sample_size)))
    idx = np.empty((batch, int(sample_size)), np.int64)
    for b in range(batch):  # one searchsorted per row
        idx[b] = np.searchsorted(cdf[b], u[b], side="right")
    return np.minimum(idx, classes - 1).astype(out)
