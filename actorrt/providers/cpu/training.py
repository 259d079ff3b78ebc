"""Optimizer update rules of the ai.onnx.preview.training domain.

Spec: ai.onnx.preview.training Adagrad, Adam, Momentum (opset 1). Inputs are
``R`` (learning rate, scalar), ``T`` (update count, int64 scalar), then the
variadic groups ``X...``, ``G...`` and the optimizer state tensors; outputs are
the updated ``X...`` then the updated state groups. Arithmetic is done in
float64 and cast back to each tensor's dtype.
"""

from __future__ import annotations

import numpy as np

from .registry import cpu_kernel

TRAINING = "ai.onnx.preview.training"


def _groups(tensors: tuple, k: int, op: str) -> list[tuple]:
    """Split the variadic inputs into ``k`` equal groups, zipped per tensor.

    Raises:
        ValueError: the count is not a multiple of ``k``.
    """
    if len(tensors) % k or not tensors:
        raise ValueError(f"{op} takes {k} groups of equally many tensors after R and T, "
                         f"got {len(tensors)} tensors")
    n = len(tensors) // k
    return list(zip(*(tensors[i * n:(i + 1) * n] for i in range(k))))


def _scalar(v) -> float:
    return float(np.asarray(v).reshape(-1)[0])


@cpu_kernel("Adagrad", since=1, domain=TRAINING, multi_output=True)
def Adagrad(R, T, *tensors, decay_factor=0.0, epsilon=0.0, norm_coefficient=0.0):
    """ai.onnx.preview.training Adagrad (1): inputs ``R, T, X..., G..., H...``;
    outputs ``X_new..., H_new...``."""
    r = _scalar(R) / (1.0 + _scalar(T) * decay_factor)
    xs, hs = [], []
    for x, g, h in _groups(tensors, 3, "Adagrad"):
        g_reg = norm_coefficient * x.astype(np.float64) + g
        h_new = h + g_reg * g_reg
        xs.append((x - r * g_reg / (np.sqrt(h_new) + epsilon)).astype(x.dtype))
        hs.append(h_new.astype(h.dtype))
    return tuple(xs + hs)


@cpu_kernel("Adam", since=1, domain=TRAINING, multi_output=True)
def Adam(R, T, *tensors, alpha=0.9, beta=0.999, epsilon=0.0, norm_coefficient=0.0,
         norm_coefficient_post=0.0):
    """ai.onnx.preview.training Adam (1): inputs ``R, T, X..., G..., V..., H...``;
    outputs ``X_new..., V_new..., H_new...`` (bias correction when ``T > 0``)."""
    r, t = _scalar(R), _scalar(T)
    if t > 0:
        r = r * np.sqrt(1 - beta ** t) / (1 - alpha ** t)
    xs, vs, hs = [], [], []
    for x, g, v, h in _groups(tensors, 4, "Adam"):
        g_reg = norm_coefficient * x.astype(np.float64) + g
        v_new = alpha * v.astype(np.float64) + (1 - alpha) * g_reg
        h_new = beta * h.astype(np.float64) + (1 - beta) * g_reg * g_reg
        x_new = x - r * (v_new / (np.sqrt(h_new) + epsilon))
        xs.append(((1 - norm_coefficient_post) * x_new).astype(x.dtype))
        vs.append(v_new.astype(v.dtype))
        hs.append(h_new.astype(h.dtype))
    return tuple(xs + vs + hs)


@cpu_kernel("Momentum", since=1, domain=TRAINING, multi_output=True)
def Momentum(R, T, *tensors, alpha, beta, mode, norm_coefficient):
    """ai.onnx.preview.training Momentum (1): inputs ``R, T, X..., G..., V...``;
    outputs ``X_new..., V_new...``; ``mode`` is ``"standard"`` or
    ``"nesterov"`` (the gradient's coefficient is 1 on the first update)."""
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum mode must be 'standard' or 'nesterov', got {mode!r}")
    r, t = _scalar(R), _scalar(T)
    b = beta if t > 0 else 1.0
    xs, vs = [], []
    for x, g, v in _groups(tensors, 3, "Momentum"):
        g_reg = norm_coefficient * x.astype(np.float64) + g
        v_new = alpha * v.astype(np.float64) + b * g_reg
        step = v_new if mode == "standard" else g_reg + alpha * v_new
        xs.append((x - r * step).astype(x.dtype))
        vs.append(v_new.astype(v.dtype))
    return tuple(xs + vs)
