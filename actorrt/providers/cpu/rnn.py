"""Recurrent layers: vanilla RNN, GRU and LSTM.

Spec: ONNX RNN (opsets 1, 7, 14, 22), GRU (1, 3, 7, 14, 22), LSTM (1, 7, 14, 22).

Shapes (layout 0): X (seq, batch, input); W (dirs, gates * hidden, input);
R (dirs, gates * hidden, hidden); B (dirs, 2 * gates * hidden); sequence_lens
(batch,); initial states (dirs, batch, hidden). Outputs Y (seq, dirs, batch,
hidden), Y_h / Y_c (dirs, batch, hidden). layout 1 swaps the seq/dirs and batch
axes to batch-first: X (batch, seq, input), Y (batch, seq, dirs, hidden), states
(batch, dirs, hidden).

The input projection X W^T + Wb is one GEMM over all time steps; the loop runs
over time steps only, vectorised over batch and hidden. float16 / bfloat16 run
in float32. With ``sequence_lens``, outputs past a sequence's end are 0 and its
state stops updating (the reverse direction starts at its last valid step).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ._attention_util import compute_dtype
from .registry import cpu_kernel

__all__ = ["RNN", "GRU", "LSTM"]


# ---------------------------------------------------------------- activations

def _sigmoid(x):
    # exp of a non-positive number never overflows
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


# name -> (number of alphas, number of betas, default alpha, default beta, factory)
_ACTS: dict[str, tuple[int, int, float, float, Callable]] = {
    "relu": (0, 0, 0.0, 0.0, lambda a, b: lambda x: np.maximum(x, 0)),
    "tanh": (0, 0, 0.0, 0.0, lambda a, b: np.tanh),
    "sigmoid": (0, 0, 0.0, 0.0, lambda a, b: _sigmoid),
    "affine": (1, 1, 1.0, 0.0, lambda a, b: lambda x: a * x + b),
    "leakyrelu": (1, 0, 0.01, 0.0, lambda a, b: lambda x: np.where(x >= 0, x, a * x)),
    "thresholdedrelu": (1, 0, 1.0, 0.0, lambda a, b: lambda x: np.where(x > a, x, 0)),
    "scaledtanh": (1, 1, 1.0, 1.0, lambda a, b: lambda x: a * np.tanh(b * x)),
    "hardsigmoid": (1, 1, 0.2, 0.5, lambda a, b: lambda x: np.clip(a * x + b, 0, 1)),
    "elu": (1, 0, 1.0, 0.0, lambda a, b: lambda x: np.where(x >= 0, x, a * np.expm1(
        np.minimum(x, 0)))),
    "softsign": (0, 0, 0.0, 0.0, lambda a, b: lambda x: x / (1 + np.abs(x))),
    "softplus": (0, 0, 0.0, 0.0, lambda a, b: lambda x: np.logaddexp(x, 0)),
}


def _activations(names: Sequence[str] | None, alphas: Sequence[float] | None,
                 betas: Sequence[float] | None, defaults: Sequence[str],
                 num_dirs: int) -> list[list[Callable]]:
    """Per direction, the activation functions (f, g[, h]).

    ``activations`` lists them for the forward direction then the reverse one;
    alphas/betas are consumed in that order by the functions that take them.

    Raises:
        ValueError: an unknown activation or a wrong number of activations.
    """
    n = len(defaults)
    names = list(names) if names else list(defaults) * num_dirs
    if len(names) == n and num_dirs == 2:
        names = names * 2
    if len(names) != n * num_dirs:
        raise ValueError(f"expected {n * num_dirs} activations, got {len(names)}")
    ai, bi = iter(alphas or ()), iter(betas or ())
    fns = []
    for name in names:
        key = name.lower()
        if key not in _ACTS:
            raise ValueError(f"unknown RNN activation {name!r}")
        na, nb, da, db, make = _ACTS[key]
        a = next(ai, da) if na else da
        b = next(bi, db) if nb else db
        fns.append(make(np.float32(a), np.float32(b)))
    return [fns[d * n:(d + 1) * n] for d in range(num_dirs)]


def _clipper(clip: float | None) -> Callable:
    if clip is None:
        return lambda x: x
    c = float(clip)
    return lambda x: np.clip(x, -c, c, out=x)


# --------------------------------------------------------------------- driver

class _Setup:
    """Inputs normalised to layout 0 and the compute dtype."""

    def __init__(self, X, W, R, B, sequence_lens, inits, *, bias_gates, direction,
                 hidden_size, layout):
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ValueError(f"unknown direction {direction!r}")
        self.dtype = X.dtype
        ct = compute_dtype(X.dtype)
        self.ct = ct
        self.num_dirs = 2 if direction == "bidirectional" else 1
        self.reverse = [False, True] if self.num_dirs == 2 else [direction == "reverse"]
        if W.shape[0] != self.num_dirs:
            raise ValueError(f"direction {direction!r} needs W with {self.num_dirs} "
                             f"directions, got {W.shape[0]}")
        self.layout = int(layout)
        if self.layout:
            X = np.swapaxes(X, 0, 1)
            inits = [None if s is None else np.swapaxes(s, 0, 1) for s in inits]
        self.T, self.batch, _ = X.shape
        H = int(hidden_size) if hidden_size else R.shape[-1]
        self.H = H
        self.X = X.astype(ct, copy=False)
        self.W = W.astype(ct, copy=False)
        self.R = R.astype(ct, copy=False)
        if B is None:
            B = np.zeros((self.num_dirs, 2 * bias_gates * H), dtype=ct)
        self.B = B.astype(ct, copy=False)
        self.inits = [np.zeros((self.num_dirs, self.batch, H), ct) if s is None
                      else s.astype(ct, copy=False) for s in inits]
        self.lens = None
        if sequence_lens is not None:
            lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
            if lens.shape[0] != self.batch:
                raise ValueError(f"sequence_lens has {lens.shape[0]} entries for batch "
                                 f"{self.batch}")
            if (lens < self.T).any():
                self.lens = lens

    def x_proj(self, d: int) -> np.ndarray:
        """X W^T for direction ``d``: (seq, batch, gates * hidden), one GEMM."""
        T, b, i = self.X.shape
        return np.matmul(self.X.reshape(T * b, i), self.W[d].T).reshape(T, b, -1)

    def steps(self, d: int):
        """(t, live mask or None) in processing order for direction ``d``."""
        order = range(self.T - 1, -1, -1) if self.reverse[d] else range(self.T)
        for t in order:
            live = None if self.lens is None else (t < self.lens)[:, None]
            yield t, live

    def finish(self, Y: np.ndarray, states: list[np.ndarray]):
        """Y (seq, dirs, batch, hidden) and final states to the output layout/dtype."""
        if self.layout:
            Y = Y.transpose(2, 0, 1, 3)
            states = [s.transpose(1, 0, 2) for s in states]
        outs = [np.ascontiguousarray(Y, dtype=self.dtype)]
        outs += [np.ascontiguousarray(s, dtype=self.dtype) for s in states]
        return tuple(outs)


def _update(live, new, old):
    return new if live is None else np.where(live, new, old)


# ------------------------------------------------------------------------ RNN

@cpu_kernel("RNN", since=(1, 7, 14, 22), multi_output=True)
def RNN(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0):
    """ONNX RNN: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb). Outputs (Y, Y_h)."""
    s = _Setup(X, W, R, B, sequence_lens, [initial_h], bias_gates=1,
               direction=direction, hidden_size=hidden_size, layout=layout)
    acts = _activations(activations, activation_alpha, activation_beta, ["Tanh"], s.num_dirs)
    clip_ = _clipper(clip)
    H = s.H
    Y = np.zeros((s.T, s.num_dirs, s.batch, H), dtype=s.ct)
    h_last = np.empty((s.num_dirs, s.batch, H), dtype=s.ct)
    for d in range(s.num_dirs):
        (f,) = acts[d]
        xw = s.x_proj(d) + (s.B[d, :H] + s.B[d, H:])
        rt = s.R[d].T
        h = s.inits[0][d]
        for t, live in s.steps(d):
            h_new = f(clip_(xw[t] + h @ rt))
            h = _update(live, h_new, h)
            Y[t, d] = h if live is None else np.where(live, h, 0)
        h_last[d] = h
    return s.finish(Y, [h_last])


# ------------------------------------------------------------------------ GRU

@cpu_kernel("GRU", since=(1, 3, 7, 14, 22), multi_output=True)
def GRU(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0, linear_before_reset=0):
    """ONNX GRU, gates ordered z, r, h; ``linear_before_reset`` applies the reset
    gate after the recurrent projection. Outputs (Y, Y_h)."""
    s = _Setup(X, W, R, B, sequence_lens, [initial_h], bias_gates=3,
               direction=direction, hidden_size=hidden_size, layout=layout)
    acts = _activations(activations, activation_alpha, activation_beta,
                        ["Sigmoid", "Tanh"], s.num_dirs)
    clip_ = _clipper(clip)
    H = s.H
    Y = np.zeros((s.T, s.num_dirs, s.batch, H), dtype=s.ct)
    h_last = np.empty((s.num_dirs, s.batch, H), dtype=s.ct)
    for d in range(s.num_dirs):
        f, g = acts[d]
        wb, rb = s.B[d, :3 * H], s.B[d, 3 * H:]
        xw = s.x_proj(d)
        xw[..., :2 * H] += wb[:2 * H] + rb[:2 * H]
        xw[..., 2 * H:] += wb[2 * H:]
        r_zr, r_h = s.R[d, :2 * H].T, s.R[d, 2 * H:].T
        rbh = rb[2 * H:]
        h = s.inits[0][d]
        for t, live in s.steps(d):
            x = xw[t]
            zr = x[:, :2 * H] + h @ r_zr
            z = f(clip_(zr[:, :H]))
            r = f(clip_(zr[:, H:]))
            if linear_before_reset:
                hh = g(clip_(x[:, 2 * H:] + r * (h @ r_h + rbh)))
            else:
                hh = g(clip_(x[:, 2 * H:] + (r * h) @ r_h + rbh))
            h_new = (1 - z) * hh + z * h
            h = _update(live, h_new, h)
            Y[t, d] = h if live is None else np.where(live, h, 0)
        h_last[d] = h
    return s.finish(Y, [h_last])


# ----------------------------------------------------------------------- LSTM

@cpu_kernel("LSTM", since=(1, 7, 14, 22), multi_output=True)
def LSTM(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
         activation_alpha=None, activation_beta=None, activations=None, clip=None,
         direction="forward", hidden_size=None, input_forget=0, layout=0):
    """ONNX LSTM, gates ordered i, o, f, c; peepholes P (dirs, 3 * hidden) in
    order i, o, f; ``input_forget`` couples f = 1 - i. Outputs (Y, Y_h, Y_c)."""
    s = _Setup(X, W, R, B, sequence_lens, [initial_h, initial_c], bias_gates=4,
               direction=direction, hidden_size=hidden_size, layout=layout)
    acts = _activations(activations, activation_alpha, activation_beta,
                        ["Sigmoid", "Tanh", "Tanh"], s.num_dirs)
    clip_ = _clipper(clip)
    H = s.H
    Y = np.zeros((s.T, s.num_dirs, s.batch, H), dtype=s.ct)
    h_last = np.empty((s.num_dirs, s.batch, H), dtype=s.ct)
    c_last = np.empty((s.num_dirs, s.batch, H), dtype=s.ct)
    for d in range(s.num_dirs):
        f, g, hf = acts[d]
        xw = s.x_proj(d) + (s.B[d, :4 * H] + s.B[d, 4 * H:])
        rt = s.R[d].T
        if P is not None:
            pd = P[d].astype(s.ct)
            p_i, p_o, p_f = pd[:H], pd[H:2 * H], pd[2 * H:]
        h, c = s.inits[0][d], s.inits[1][d]
        for t, live in s.steps(d):
            gates = xw[t] + h @ rt
            gi, go, gf, gc = (gates[:, k * H:(k + 1) * H] for k in range(4))
            if P is not None:
                gi = gi + p_i * c
                gf = gf + p_f * c
            i = f(clip_(gi))
            fg = 1 - i if input_forget else f(clip_(gf))
            c_new = fg * c + i * g(clip_(gc))
            if P is not None:
                go = go + p_o * c_new
            o = f(clip_(go))
            h_new = o * hf(c_new)
            h = _update(live, h_new, h)
            c = _update(live, c_new, c)
            Y[t, d] = h if live is None else np.where(live, h, 0)
        h_last[d], c_last[d] = h, c
    return s.finish(Y, [h_last, c_last])
