"""Classification losses.

Spec: ONNX NegativeLogLikelihoodLoss (12, 13, 22) and SoftmaxCrossEntropyLoss
(12, 13). ``input``/``scores`` are ``(N, C, d1, ..., dk)``, ``target`` is the int
class index ``(N, d1, ..., dk)``, the optional ``weight`` is ``(C,)``. Elements
whose target equals ``ignore_index`` contribute 0 and are left out of the mean's
weight sum. ``reduction`` is ``"none"`` (shape of ``target``), ``"sum"`` or
``"mean"`` (scalars). float16 / bfloat16 compute in float32.
"""

from __future__ import annotations

import numpy as np

from ._reduce_util import upcast
from .registry import cpu_kernel


def _nll(log_prob: np.ndarray, target: np.ndarray, weight, reduction, ignore_index) -> np.ndarray:
    """Weighted negative log-likelihood of ``log_prob`` (accumulation dtype)."""
    if log_prob.ndim < 2:
        raise ValueError(f"input must be (N, C, ...), got shape {log_prob.shape}")
    c = log_prob.shape[1]
    t = np.asarray(target).astype(np.int64, copy=False)
    if t.shape != log_prob.shape[:1] + log_prob.shape[2:]:
        raise ValueError(f"target shape {t.shape} does not match input shape {log_prob.shape}")
    valid = None if ignore_index is None else t != int(ignore_index)
    ts = t if valid is None else np.where(valid, t, 0)
    if ts.size and (ts.min() < 0 or ts.max() >= c):
        raise ValueError(f"target values must lie in [0, {c}) or equal ignore_index")
    picked = np.take_along_axis(log_prob, np.expand_dims(ts, 1), axis=1)[:, 0]
    loss = -picked
    w = None
    if weight is not None:
        w = upcast(weight)[ts]
    if valid is not None:
        w = valid.astype(loss.dtype) if w is None else np.where(valid, w, 0).astype(loss.dtype)
    if w is not None:
        loss = loss * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.asarray(loss.sum())
    if reduction == "mean":
        if w is None:
            return np.asarray(loss.mean())
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(loss.sum() / w.sum())
    raise ValueError(f"unknown reduction {reduction!r} (expected none, sum or mean)")


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@cpu_kernel("NegativeLogLikelihoodLoss", since=(12, 13, 22))
def NegativeLogLikelihoodLoss(input, target, weight=None, *, ignore_index=None,
                              reduction="mean"):
    """ONNX NegativeLogLikelihoodLoss (opsets 12, 13, 22): ``-input[n, target[n, ...], ...]``
    weighted, then reduced."""
    loss = _nll(upcast(input), target, weight, _str(reduction), ignore_index)
    return loss.astype(input.dtype, copy=False)


@cpu_kernel("SoftmaxCrossEntropyLoss", since=(12, 13), multi_output=True)
def SoftmaxCrossEntropyLoss(scores, labels, weights=None, *, ignore_index=None,
                            reduction="mean"):
    """ONNX SoftmaxCrossEntropyLoss (opsets 12, 13): NLL of ``log_softmax(scores, axis=1)``;
    the optional second output is that log-probability, shaped like ``scores``."""
    x = upcast(scores)
    s = x - np.max(x, axis=1, keepdims=True)
    s -= np.log(np.sum(np.exp(s), axis=1, keepdims=True))
    loss = _nll(s, labels, weights, _str(reduction), ignore_index)
    return loss.astype(scores.dtype, copy=False), s.astype(scores.dtype, copy=False)
