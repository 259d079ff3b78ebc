"""Unary elementwise math: rounding, exponentials, trigonometry, Erf, Clip and
the IsInf / IsNaN tests.

Spec: ONNX Abs/Neg/Ceil/Floor/Exp/Log/Sqrt/Reciprocal/Tanh (opsets 1, 6, 13),
Sin/Cos/Tan/Asin/Acos/Atan (7, 22), Sinh/Cosh/Asinh/Acosh/Atanh (9, 22),
Round (11, 22), Sign (9, 13), Erf (9, 13), IsNaN (9, 13, 20), IsInf (10, 20),
Clip (1, 6, 11, 12, 13). The output dtype is the input's (bool for IsInf/IsNaN).
Plain ufunc ops compile to the bare numpy ufunc (see ``elementwise``).
"""

from __future__ import annotations

import math

import numpy as np

from .._contract import Kernel
from .elementwise import input_dtype, may_be_scalar, register_ufunc
from .registry import cpu_kernel

__all__ = ["erf"]

for _op, _since, _uf, _what in [
    ("Abs", (1, 6, 13), np.absolute, "|X|"),
    ("Neg", (1, 6, 13), np.negative, "-X"),
    ("Ceil", (1, 6, 13), np.ceil, "ceil(X)"),
    ("Floor", (1, 6, 13), np.floor, "floor(X)"),
    ("Exp", (1, 6, 13), np.exp, "e ** X"),
    ("Log", (1, 6, 13), np.log, "natural log of X"),
    ("Sqrt", (1, 6, 13), np.sqrt, "square root of X"),
    ("Reciprocal", (1, 6, 13), np.reciprocal, "1 / X"),
    ("Tanh", (1, 6, 13), np.tanh, "tanh(X)"),
    ("Sin", (7, 22), np.sin, "sin(X)"),
    ("Cos", (7, 22), np.cos, "cos(X)"),
    ("Tan", (7, 22), np.tan, "tan(X)"),
    ("Asin", (7, 22), np.arcsin, "asin(X)"),
    ("Acos", (7, 22), np.arccos, "acos(X)"),
    ("Atan", (7, 22), np.arctan, "atan(X)"),
    ("Sinh", (9, 22), np.sinh, "sinh(X)"),
    ("Cosh", (9, 22), np.cosh, "cosh(X)"),
    ("Asinh", (9, 22), np.arcsinh, "asinh(X)"),
    ("Acosh", (9, 22), np.arccosh, "acosh(X)"),
    ("Atanh", (9, 22), np.arctanh, "atanh(X)"),
    ("Round", (11, 22), np.rint, "X rounded half to even"),
    ("Sign", (9, 13), np.sign, "sign(X) in {-1, 0, 1}"),
    ("IsNaN", (9, 13, 20), np.isnan, "X is NaN -> bool"),
]:
    register_ufunc(_op, _since, _uf,
                   f"ONNX {_op} (opsets {', '.join(map(str, _since))}): {_what}.")


# ------------------------------------------------------------------- erf

# float32: Eigen's rational approximation x * P(x^2) / Q(x^2) on [-4, 4]
# (relative error below 5e-7; erf is +-1 in float32 beyond 4).
_ERF32_P = tuple(np.float32(c) for c in (
    -2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
    -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
    -1.60960333262415e-02))
_ERF32_Q = tuple(np.float32(c) for c in (
    -1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
    -7.37332916720468e-03, -1.42647390514189e-02))


#: (P, Q) coefficients, highest power first, of the float32 erf above (for
#: compiled kernels that evaluate the same approximation)
ERF32_RATIONAL = (_ERF32_P, _ERF32_Q)


def _erf32(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, np.float32(-4.0), np.float32(4.0))
    x2 = x * x
    p = x2 * _ERF32_P[0]
    p += _ERF32_P[1]
    for c in _ERF32_P[2:]:
        p *= x2
        p += c
    p *= x
    q = x2 * _ERF32_Q[0]
    q += _ERF32_Q[1]
    for c in _ERF32_Q[2:]:
        q *= x2
        q += c
    p /= q
    return p


# float64: erf(u) / u interpolated on 12 pieces of [0, 6] by degree-14
# polynomials fitted at import to math.erf at Chebyshev nodes (relative error
# ~1e-15); erf is +-1 in float64 beyond 6.
_PIECES, _WIDTH, _DEG = 12, 0.5, 14


def _fit_erf64() -> np.ndarray:
    k = np.arange(_DEG + 1)
    nodes = np.cos(np.pi * (k + 0.5) / (_DEG + 1))
    vander = np.polynomial.polynomial.polyvander(nodes, _DEG)
    rows = []
    for piece in range(_PIECES):
        u = (piece + 0.5) * _WIDTH + nodes * (_WIDTH / 2)
        rows.append(np.linalg.solve(vander, [math.erf(v) / v for v in u]))
    return np.ascontiguousarray(np.array(rows).T[::-1])  # (deg + 1, pieces), highest first


_ERF64_C = _fit_erf64()


def _erf64(x: np.ndarray) -> np.ndarray:
    u = np.fmin(np.abs(x), 6.0)
    idx = np.minimum((u * (1 / _WIDTH)).astype(np.intp), _PIECES - 1)
    t = (u - (idx + 0.5) * _WIDTH) * (2 / _WIDTH)
    p = _ERF64_C[0][idx]
    for row in _ERF64_C[1:]:
        p *= t
        p += row[idx]
    p *= x
    return np.where(u >= 6.0, np.sign(x), p)


def erf(x: np.ndarray) -> np.ndarray:
    """The Gauss error function, elementwise, in ``x``'s float dtype (float16
    and bfloat16 are computed in float32)."""
    if x.dtype == np.float64:
        return _erf64(x)
    if x.dtype == np.float32:
        return _erf32(x)
    if x.dtype.kind in "iub":
        return _erf64(x.astype(np.float64)).astype(x.dtype)
    return _erf32(x.astype(np.float32)).astype(x.dtype)


@cpu_kernel("Erf", since=(9, 13))
def Erf(x):
    """ONNX Erf (opsets 9, 13): the Gauss error function."""
    return np.asarray(erf(np.asarray(x)))


# ------------------------------------------------------------ IsInf, Clip

@cpu_kernel("IsInf", since=(10, 20))
def IsInf(x, *, detect_negative=1, detect_positive=1):
    """ONNX IsInf (opsets 10, 20): X is +inf / -inf (as selected) -> bool."""
    inf = np.isinf(x)
    if detect_negative and detect_positive:
        return np.asarray(inf)
    if detect_positive:
        return np.asarray(inf & (x > 0))
    if detect_negative:
        return np.asarray(inf & (x < 0))
    return np.zeros(np.shape(x), dtype=bool)


def _bound(v, dtype: np.dtype) -> np.ndarray:
    v = np.asarray(v)
    if v.size == 1 and v.ndim:
        v = v.reshape(())
    if v.dtype == dtype:
        return v
    with np.errstate(over="ignore"):  # an attribute's +-FLT_MAX in float16 is +-inf
        return v.astype(dtype)


def _clip(x, lo, hi):
    r = x
    if lo is not None:
        r = np.maximum(r, _bound(lo, x.dtype))
    if hi is not None:
        r = np.minimum(r, _bound(hi, x.dtype))
    return np.array(x, copy=True) if r is x else np.asarray(r)


@cpu_kernel("Clip", since=(1, 6, 11, 12, 13))
class Clip(Kernel):
    """ONNX Clip (opsets 1-13): X limited to [min, max]; attributes before
    opset 11, optional scalar inputs from 11. With min > max every value is max.
    Constant bounds are converted to X's dtype once, at plan time."""

    def _bounds(self) -> tuple[bool, object, object]:
        """(known at plan time, min, max); None for an absent bound."""
        node = self.node
        if node.opset < 11:
            return True, node.attr("min"), node.attr("max")
        known, out = True, []
        for i in (1, 2):
            if not node.has_input(i):
                out.append(None)
            elif i in node.constant_inputs:
                out.append(node.constant_inputs[i])
            else:
                known = False
                out.append(None)
        return known, out[0], out[1]

    def compile(self):
        known, lo, hi = self._bounds()
        if self.node.opset < 11:
            return lambda x: _clip(x, lo, hi)
        dt = input_dtype(self.node)
        if not known or dt is None or may_be_scalar(self.node):
            return _clip_inputs
        lo = None if lo is None else _bound(lo, dt)
        hi = None if hi is None else _bound(hi, dt)
        if lo is not None and hi is not None:
            def run(x, *_):
                r = np.maximum(x, lo)
                return np.minimum(r, hi, out=r)
        elif lo is not None:
            def run(x, *_):
                return np.maximum(x, lo)
        elif hi is not None:
            def run(x, *_):
                return np.minimum(x, hi)
        else:
            def run(x, *_):
                return np.array(x, copy=True)
        return run

    def run(self, x, lo=None, hi=None):
        return self.compile()(x, lo, hi) if self.node.opset >= 11 else self.compile()(x)


def _clip_inputs(x, lo=None, hi=None):
    return _clip(x, lo, hi)
