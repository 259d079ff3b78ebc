"""Compiled (numba) per-channel epilogues, one pass each, planes split across
the intra-op threads like the other compiled CNN kernels
(:func:`._conv_numba.run_planes`):

* :func:`bias_add_act` -- ``y = act(y + b[m] + z)`` in place over a freshly
  computed convolution output ``y (N, M, P)`` (Conv / FusedConv);
* :func:`affine_act` -- ``out = act(x * a[c] + t[c])`` (ChannelAffine: a
  BatchNormalization with what followed it).

Activations (codes of :data:`CODES`): none, ``Relu``, ``LeakyRelu`` (alpha),
``Clip`` (min, max). Others stay on the numpy epilogue of :mod:`._epilogue`.
Loaded lazily; :data:`HAVE_NUMBA` False without numba.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

from ._conv_numba import HAVE_NUMBA, run_planes

__all__ = ["HAVE_NUMBA", "CODES", "bias_add_act", "affine_act"]

#: activation name -> code of the compiled epilogue
CODES = {"": 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3}

if HAVE_NUMBA:
    from numba import njit

    @njit(nogil=True, cache=True)
    def _epilogue(y, b, z, has_b, has_z, act, p0, p1, zero, start, stop):  # pragma: no cover
        m, P = y.shape[1], y.shape[2]
        for nm in range(start, stop):
            n = nm // m
            ch = nm % m
            bv = b[ch if has_b else 0]  # b is zeros(1) without a bias
            for k in range(P):
                v = y[n, ch, k] + bv
                if has_z:
                    v += z[n, ch, k]
                if act == 1:
                    v = v if v > zero else zero
                elif act == 2:
                    v = v if v >= 0 else v * p0
                elif act == 3:
                    v = p0 if v < p0 else (p1 if v > p1 else v)
                y[n, ch, k] = v


    @njit(nogil=True, cache=True)
    def _affine(x, a, t, out, act, p0, p1, zero, start, stop):  # pragma: no cover
        c, P = x.shape[1], x.shape[2]
        for nc in range(start, stop):
            n = nc // c
            ch = nc % c
            av = a[ch]
            tv = t[ch]
            for k in range(P):
                v = x[n, ch, k] * av + tv
                if act == 1:
                    v = v if v > zero else zero
                elif act == 2:
                    v = v if v >= 0 else v * p0
                elif act == 3:
                    v = p0 if v < p0 else (p1 if v > p1 else v)
                out[n, ch, k] = v


def _params(code: int, params) -> tuple[float, float]:
    p = [float(v) for v in params]
    if code == 2:
        return (p[0] if p else 0.01), 0.0
    if code == 3:
        return (p[0] if len(p) > 0 else -np.inf), (p[1] if len(p) > 1 else np.inf)
    return 0.0, 0.0


def affine_act(x: np.ndarray, a: np.ndarray, t: np.ndarray, act: str, params=()) -> np.ndarray:
    """``act(x * a[c] + t[c])`` of float ``x (N, C, *spatial)`` with ``a``,
    ``t`` ``(C,)``, in ``x``'s dtype (``act`` one of :data:`CODES`)."""
    n, c = x.shape[:2]
    x3 = np.ascontiguousarray(x).reshape(n, c, -1)
    dt = x.dtype
    out = np.empty(x3.shape, dt)
    code = CODES[act]
    p0, p1 = _params(code, params)
    run_planes(_affine, None, (x3, np.ascontiguousarray(a, dtype=dt), np.ascontiguousarray(t, dtype=dt),
                               out, code, p0, p1, dt.type(0)), n * c, x3.size)
    return out.reshape(x.shape)


def bias_add_act(y: np.ndarray, b: np.ndarray | None, z: np.ndarray | None, act: str,
                 params=()) -> np.ndarray:
    """In place on C-contiguous float ``y (N, M, *spatial)``: add ``b (M,)``
    (optional) and ``z`` (optional, ``y``'s shape), then apply ``act`` (one of
    :data:`CODES`) with ``params`` as onnxruntime's FusedConv. Returns ``y``."""
    n, m = y.shape[:2]
    y3 = y.reshape(n, m, -1)
    dt = y.dtype
    bb = np.ascontiguousarray(b, dtype=dt).reshape(-1) if b is not None else np.zeros(1, dt)
    zz = np.ascontiguousarray(z, dtype=dt).reshape(n, m, -1) if z is not None else np.zeros((1, 1, 1), dt)
    code = CODES[act]
    p0, p1 = _params(code, params)
    args = (y3, bb, zz, b is not None, z is not None, code, p0, p1, dt.type(0))
    run_planes(_epilogue, None, args, n * m, y3.size)
    return y
