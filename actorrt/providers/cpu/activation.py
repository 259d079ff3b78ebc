"""Activation functions, elementwise; the output has the input's shape and dtype.

Spec: ONNX Relu (opsets 1, 6, 13, 14), Sigmoid (1, 6, 13), Elu/Selu/HardSigmoid
(1, 6, 22), Celu (12, 28), LeakyRelu (1, 6, 16), PRelu (1, 6, 7, 9, 16),
HardSwish (14, 22), Softplus/Softsign (1, 22), Gelu (20), Mish (18, 22),
Swish (24), Shrink (9), ThresholdedRelu (10, 22), SwiGLU (28).

Float attributes are converted to the input's scalar type first (a Python float
would promote bfloat16 to float32). Formulas avoid overflow (no exp of large
positive numbers), so no floating-point warnings are raised for large inputs.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from .._contract import Kernel
from .elementwise import input_dtype, may_be_scalar
from .math import erf
from .registry import cpu_kernel

__all__ = ["sigmoid"]

_FAST_SIGMOID = (np.dtype(np.float32), np.dtype(np.float64))


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)). For float32/float64 arrays four in-place passes: where
    exp(-x) overflows (x below about -88.7 / -709.8) the result is 0, and the
    overflow is not reported (the exact value there is below the smallest
    normal float, ~1e-38 / 1e-308). Otherwise exp(-|x|), which never overflows."""
    if isinstance(x, np.ndarray) and x.dtype in _FAST_SIGMOID and x.ndim:
        y = np.negative(x)
        with np.errstate(over="ignore"):
            np.exp(y, out=y)
        y += x.dtype.type(1)
        return np.reciprocal(y, out=y)
    e = np.abs(x)
    e = np.negative(e, out=e) if isinstance(e, np.ndarray) else -e
    e = np.exp(e)
    d = e + 1
    num = np.where(x >= 0, x.dtype.type(1), e)
    return np.divide(num, d, out=num)


def _relu(x):
    return np.asarray(np.maximum(x, x.dtype.type(0)))


@cpu_kernel("Relu", since=(1, 6, 13, 14))
class Relu(Kernel):
    """ONNX Relu (opsets 1-14): max(X, 0). With the dtype and a nonzero rank
    known at plan time it compiles to ``partial(np.maximum, zero)`` (no Python
    frame on the hot path)."""

    def compile(self):
        dt = input_dtype(self.node)
        if dt is None or may_be_scalar(self.node):
            return _relu
        return partial(np.maximum, dt.type(0))

    def run(self, x):
        return _relu(x)


@cpu_kernel("Sigmoid", since=(1, 6, 13))
def Sigmoid(x):
    """ONNX Sigmoid (opsets 1, 6, 13): 1 / (1 + exp(-X))."""
    return sigmoid(x)


def _expm1_neg(x: np.ndarray) -> np.ndarray:
    """exp(min(x, 0)) - 1: the negative branch of the ELU family, overflow-free."""
    return np.expm1(np.minimum(x, x.dtype.type(0)))


@cpu_kernel("Elu", since=(1, 6, 22))
def Elu(x, *, alpha=1.0):
    """ONNX Elu (opsets 1, 6, 22): X if X > 0 else alpha * (exp(X) - 1)."""
    return np.where(x > 0, x, _expm1_neg(x) * x.dtype.type(alpha))


@cpu_kernel("Selu", since=(1, 6, 22))
def Selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    """ONNX Selu (opsets 1, 6, 22): gamma * (X if X > 0 else alpha * (exp(X) - 1))."""
    t = x.dtype.type
    return np.asarray(np.where(x > 0, x, _expm1_neg(x) * t(alpha)) * t(gamma))


@cpu_kernel("Celu", since=(12, 28))
def Celu(x, *, alpha=1.0):
    """ONNX Celu (opsets 12, 28): max(0, X) + min(0, alpha * (exp(X / alpha) - 1))."""
    t = x.dtype.type
    neg = np.expm1(np.minimum(x, t(0)) / t(alpha)) * t(alpha)
    return np.asarray(np.maximum(x, t(0)) + neg)


@cpu_kernel("LeakyRelu", since=(1, 6, 16))
def LeakyRelu(x, *, alpha=0.01):
    """ONNX LeakyRelu (opsets 1, 6, 16): X if X >= 0 else alpha * X."""
    a = x.dtype.type(alpha)
    if 0.0 <= alpha <= 1.0:
        return np.asarray(np.maximum(x, x * a))
    return np.where(x >= 0, x, x * a)


@cpu_kernel("PRelu", since=(1, 6, 7, 9, 16))
def PRelu(x, slope, *, node=None):
    """ONNX PRelu (opsets 1-16): X if X >= 0 else slope * X, slope broadcast
    unidirectionally to X. Before opset 7 a 1-D slope of C values is per channel
    (axis 1), as PRelu-1/6 specify."""
    if (node is not None and node.opset < 7 and slope.ndim == 1 and x.ndim >= 2
            and slope.size == x.shape[1] and slope.size != 1):
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    return np.where(x < 0, x * slope, x)


def _clip01(y: np.ndarray) -> np.ndarray:
    """min(max(y, 0), 1) in y's dtype (np.clip would widen bfloat16)."""
    t = y.dtype.type
    return np.minimum(np.maximum(y, t(0)), t(1))


@cpu_kernel("HardSigmoid", since=(1, 6, 22))
def HardSigmoid(x, *, alpha=0.2, beta=0.5):
    """ONNX HardSigmoid (opsets 1, 6, 22): max(0, min(1, alpha * X + beta))."""
    t = x.dtype.type
    return np.asarray(_clip01(x * t(alpha) + t(beta)))


@cpu_kernel("HardSwish", since=(14, 22))
def HardSwish(x):
    """ONNX HardSwish (opsets 14, 22): X * max(0, min(1, X / 6 + 1 / 2))."""
    t = x.dtype.type
    return np.asarray(x * _clip01(x * t(1 / 6) + t(0.5)))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(x.dtype.type(0), x)


@cpu_kernel("Softplus", since=(1, 22))
def Softplus(x):
    """ONNX Softplus (opsets 1, 22): log(exp(X) + 1)."""
    return np.asarray(_softplus(x))


@cpu_kernel("Softsign", since=(1, 22))
def Softsign(x):
    """ONNX Softsign (opsets 1, 22): X / (1 + |X|)."""
    return np.asarray(x / (np.abs(x) + 1))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@cpu_kernel("Gelu", since=20)
def Gelu(x, *, approximate="none"):
    """ONNX Gelu (opset 20): 0.5 X (1 + erf(X / sqrt 2)), or with approximate='tanh'
    0.5 X (1 + tanh(sqrt(2 / pi) (X + 0.044715 X^3))). float16 and bfloat16 are
    computed in float32."""
    approximate = _str(approximate)
    xf = x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)
    if approximate == "tanh":
        inner = xf * xf
        inner *= 0.044715
        inner += 1
        inner *= xf
        inner *= _SQRT_2_OVER_PI
        t = np.tanh(inner)
    elif approximate == "none":
        t = erf(xf * math.sqrt(0.5))
    else:
        raise ValueError(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    t += 1
    t *= xf
    t *= 0.5
    return np.asarray(t if t.dtype == x.dtype else t.astype(x.dtype))


@cpu_kernel("Mish", since=(18, 22))
def Mish(x):
    """ONNX Mish (opsets 18, 22): X * tanh(softplus(X))."""
    return np.asarray(x * np.tanh(_softplus(x)))


@cpu_kernel("Swish", since=24)
def Swish(x, *, alpha=1.0):
    """ONNX Swish (opset 24): X * sigmoid(alpha * X)."""
    return np.asarray(x * sigmoid(x * x.dtype.type(alpha) if alpha != 1.0 else x))


@cpu_kernel("SwiGLU", since=28)
def SwiGLU(a, b, *, alpha=1.0):
    """ONNX SwiGLU (opset 28): Swish_alpha(A) * B; A and B have the same shape."""
    if a.shape != b.shape:
        raise ValueError(f"SwiGLU needs A and B of one shape, got {a.shape} and {b.shape}")
    r = sigmoid(a * a.dtype.type(alpha) if alpha != 1.0 else a)
    r *= a
    r *= b
    return r


@cpu_kernel("Shrink", since=9)
def Shrink(x, *, bias=0.0, lambd=0.5):
    """ONNX Shrink (opset 9): X + bias if X < -lambd, X - bias if X > lambd, else 0."""
    b = x.dtype.type(bias)
    zero = x.dtype.type(0)
    return np.where(x < -lambd, x + b, np.where(x > lambd, x - b, zero))


@cpu_kernel("ThresholdedRelu", since=(10, 22))
def ThresholdedRelu(x, *, alpha=1.0):
    """ONNX ThresholdedRelu (opsets 10, 22): X if X > alpha else 0."""
    return np.where(x > x.dtype.type(alpha), x, x.dtype.type(0))
