"""In-place epilogues the fused kernels share (FusedConv, FusedGemm,
MatMulEpilogue, ChannelAffine): an activation applied to a freshly
allocated float result, with no further allocation of its size.

Activations (onnxruntime FusedConv's names and ``activation_params``):
``Relu``, ``LeakyRelu`` (alpha), ``Sigmoid``, ``Tanh``, ``Clip`` (min, max),
``HardSigmoid`` (alpha, beta), ``Gelu`` (erf form), ``""`` (none).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .math import erf

__all__ = ["activation", "ACTIVATIONS", "gelu_inplace", "bias_gelu_inplace"]

ACTIVATIONS = ("", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "Gelu")


#: use the one-pass compiled GELU (:mod:`._gelu_numba`) for float32 when numba is there
COMPILED_GELU = True


def gelu_inplace(y: np.ndarray) -> np.ndarray:
    """``y = 0.5 * y * (1 + erf(y / sqrt(2)))`` in ``y``'s float dtype, in place
    (float32: one compiled pass when numba is installed, else numpy)."""
    if COMPILED_GELU and y.dtype == np.float32 and y.size:
        from . import _gelu_numba
        if _gelu_numba.gelu_inplace_f32(y):
            return y
    e = erf(y * y.dtype.type(0.7071067811865476))
    e += y.dtype.type(1)
    e *= y.dtype.type(0.5)
    y *= e
    return y


def bias_gelu_inplace(y: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``y = gelu(y + bias)`` (erf form) in place for float ``y`` ``(..., N)``
    and a bias broadcasting against it without enlarging it: float32 ``y``
    with a float32 ``(N,)`` bias is one compiled pass when numba is
    installed, anything else ``y += bias`` then :func:`gelu_inplace`."""
    if COMPILED_GELU and y.dtype == np.float32 and y.size:
        from . import _gelu_numba
        if _gelu_numba.bias_gelu_inplace_f32(y, bias):
            return y
    y += bias
    return gelu_inplace(y)


def activation(name: str, params: Sequence[float] = ()) -> Callable[[np.ndarray], np.ndarray]:
    """``fn(y) -> y`` applying activation ``name`` to float array ``y`` in place.

    Raises:
        ValueError: an unknown activation or missing parameters.
    """
    p = [float(v) for v in params]
    if name == "":
        return lambda y: y
    if name == "Relu":
        return lambda y: np.maximum(y, y.dtype.type(0), out=y)
    if name == "LeakyRelu":
        alpha = p[0] if p else 0.01

        def leaky(y):
            np.multiply(y, y.dtype.type(alpha), out=y, where=y < 0)
            return y
        return leaky
    if name == "Sigmoid":
        def sigmoid(y):
            np.negative(y, out=y)
            np.exp(y, out=y)
            y += y.dtype.type(1)
            np.reciprocal(y, out=y)
            return y
        return sigmoid
    if name == "Tanh":
        return lambda y: np.tanh(y, out=y)
    if name == "Clip":
        lo = p[0] if len(p) > 0 else -np.inf
        hi = p[1] if len(p) > 1 else np.inf
        return lambda y: np.clip(y, y.dtype.type(lo), y.dtype.type(hi), out=y)
    if name == "HardSigmoid":
        alpha = p[0] if p else 0.2
        beta = p[1] if len(p) > 1 else 0.5

        def hard(y):
            y *= y.dtype.type(alpha)
            y += y.dtype.type(beta)
            return np.clip(y, y.dtype.type(0), y.dtype.type(1), out=y)
        return hard
    if name == "Gelu":
        return gelu_inplace
    raise ValueError(f"unknown activation {name!r}; known: {', '.join(a for a in ACTIVATIONS if a)}")
