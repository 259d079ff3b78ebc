"""Element type conversion following the ONNX Cast rules (opsets 1-28).

numpy and ml_dtypes do the rounding (round to nearest even); this module adds
what the spec asks on top: saturation of float8 targets, the FLOAT8E8M0
rounding modes, string parsing and formatting, and sub-byte types.
"""

from __future__ import annotations

import operator
from typing import Callable

import ml_dtypes
import numpy as np

__all__ = ["cast_array", "make_caster", "to_e8m0"]

_OBJ = np.dtype(object)
_F32 = np.dtype(np.float32)

#: float8 types whose conversion saturates to +-max when ``saturate`` is set.
_FLOAT8 = frozenset(np.dtype(t) for t in (
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz))
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
#: ml_dtypes floats; every value is exact in float32.
_ML_FLOATS = _FLOAT8 | {np.dtype(t) for t in (
    ml_dtypes.bfloat16, ml_dtypes.float8_e8m0fnu, ml_dtypes.float4_e2m1fn,
    ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn)}
#: sub-byte integers (one element per byte, unpacked).
_SMALL_INTS = {np.dtype(ml_dtypes.int4): np.dtype(np.int8),
               np.dtype(ml_dtypes.int2): np.dtype(np.int8),
               np.dtype(ml_dtypes.uint4): np.dtype(np.uint8),
               np.dtype(ml_dtypes.uint2): np.dtype(np.uint8)}
_F8_MAX = {dt: float(ml_dtypes.finfo(dt).max) for dt in _FLOAT8}


def _normalise(x: np.ndarray) -> np.ndarray:
    """Widen ml_dtypes sources to a numpy type holding every value exactly."""
    dt = x.dtype
    if dt in _ML_FLOATS:
        return x.astype(_F32)
    small = _SMALL_INTS.get(dt)
    if small is not None:
        return x.astype(small)
    return x


def to_e8m0(x: np.ndarray, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """Convert to FLOAT8E8M0 (a bare power-of-two exponent) per the Cast spec:
    ``round_mode`` 'up' / 'down' / 'nearest' on the float32 mantissa; with
    ``saturate`` inf and overflow give E8M0_MAX, else NaN (as does 0). The
    sign is ignored (negative inputs are unspecified)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int32)
    mant = bits & 0x7FFFFF
    special = exp == 0xFF
    if round_mode == "up":
        inc = mant != 0
    elif round_mode == "down":
        inc = np.zeros(exp.shape, dtype=bool)
    elif round_mode == "nearest":
        inc = ((mant & 0x400000) != 0) & (((mant & 0x3FFFFF) != 0) | (exp > 0))
    else:
        raise ValueError(f"Cast round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    e = exp + inc
    if saturate:
        e = np.minimum(e, 0xFE)
        e = np.where(special & (mant != 0), 0xFF, e)  # NaN stays NaN, inf saturates
    else:
        e = np.minimum(e, 0xFF)
        e = np.where(special | ((exp == 0) & (mant == 0)), 0xFF, e)
    return e.astype(np.uint8).view(_E8M0)


def _parse_strings(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """Numbers from a string tensor: floats as plain or scientific literals
    (INF/+INF/-INF/NaN any case); integers directly when they are integer
    literals, else through float64 (truncating); bools from numbers or the
    words true / false."""
    s = x.astype(np.str_)
    if to == np.bool_:  # numbers: nonzero is True; also the words true / false
        word = np.strings.lower(np.strings.strip(s))
        is_word = (word == "true") | (word == "false")
        return (np.where(is_word, "0", s).astype(np.float64) != 0) | (word == "true")
    if to.kind in "iu":
        try:
            return s.astype(to)
        except (ValueError, OverflowError):
            pass
    return s.astype(np.float64)


def _to_string(x: np.ndarray) -> np.ndarray:
    return _normalise(x).astype(np.str_).astype(_OBJ)


def cast_array(x: np.ndarray, to: np.dtype, saturate: bool = True,
               round_mode: str = "up") -> np.ndarray:
    """``x`` converted to numpy dtype ``to`` (object for ONNX strings).

    Raises:
        ValueError: a string that is not a number, or a bad ``round_mode``.
    """
    src = x.dtype
    if src == to:
        return x
    if to == _OBJ:
        return _to_string(x)
    if src == _OBJ:
        x = _parse_strings(x, to)
        if x.dtype == to:
            return x
    else:
        x = _normalise(x)
    if to in _FLOAT8:
        if x.dtype.kind != "f":
            x = x.astype(_F32)
        if saturate:
            m = _F8_MAX[to]
            x = np.clip(x, x.dtype.type(-m), x.dtype.type(m))
            return x.astype(to)
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(to)
    if to == _E8M0:
        return to_e8m0(x, saturate, round_mode)
    if to in _ML_FLOATS and x.dtype.kind not in "f":
        x = x.astype(_F32)
    return x.astype(to)


def make_caster(src: np.dtype | None, to: np.dtype, saturate: bool = True,
                round_mode: str = "up") -> Callable[[np.ndarray], np.ndarray]:
    """A one-argument converter to ``to``, specialised when the source dtype is
    known: a plain numpy-to-numpy cast is ``x.astype(to)`` with no Python frame."""
    plain = {"b", "i", "u", "f", "c"}
    if (src is not None and src.kind in plain and to.kind in plain
            and src not in _ML_FLOATS and to not in _ML_FLOATS
            and src not in _SMALL_INTS and to not in _SMALL_INTS):
        return operator.methodcaller("astype", to, copy=False)

    def run(x):
        return cast_array(x, to, saturate, round_mode)
    return run
