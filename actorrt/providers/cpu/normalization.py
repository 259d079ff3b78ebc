"""Normalizations (and Dropout, the identity at inference).

Spec: ONNX BatchNormalization (1, 6, 7, 9, 14, 15), InstanceNormalization (1, 6,
22), LayerNormalization (17), GroupNormalization (18, 21), RMSNormalization (23),
LpNormalization (1, 22), MeanVarianceNormalization (9, 13), LRN (1, 13), Dropout
(1, 6, 7, 10, 12, 13, 22).

Layouts are NCHW-style: ``X`` is ``(N, C, D1, ..., Dk)``. float16 / bfloat16
compute in float32; ``Y`` keeps the input dtype.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ... import _dtypes
from ..._lazy import lazy_module
from .._contract import Kernel, NodeSpec
from ._reduce_util import acc_dtype, norm_axis, norm_axes, upcast
from .registry import cpu_kernel

_ln = lazy_module(f"{__package__}._layernorm_numba", globals(), "_ln")  # numba on first use


def _declared_dtype(node: NodeSpec, i: int, default: np.dtype) -> np.dtype:
    """The numpy dtype declared for output ``i`` of ``node``, else ``default``."""
    t = node.output_types[i] if i < len(node.output_types) else None
    if t is not None and t.kind == "tensor" and t.dtype:
        return _dtypes.to_numpy_dtype(t.dtype)
    return np.dtype(default)


def _channel_shape(p: np.ndarray, rank: int) -> np.ndarray:
    """Broadcast a per-channel parameter ``(C,)`` (or ``(C, D1, ...)`` for the
    pre-opset-9 ``spatial=0`` mode) against ``(N, C, D1, ..., Dk)``."""
    p = np.asarray(p)
    return p.reshape(p.shape + (1,) * (rank - 1 - p.ndim))


def _requested(node: NodeSpec) -> int:
    """Number of outputs up to the last named one."""
    n = 0
    for i, name in enumerate(node.outputs):
        if name:
            n = i + 1
    return n


# ------------------------------------------------------------- BatchNormalization

@cpu_kernel("BatchNormalization", since=(1, 6, 7, 9, 14, 15))
class BatchNormalization(Kernel):
    """ONNX BatchNormalization (opsets 1-15). Inference uses the running
    statistics, folded into one per-channel multiply-add (prepacked once when
    scale, B, mean and var are constants); ``training_mode=1`` (opset 14+), or
    extra outputs before opset 14, normalizes with the batch statistics and
    returns the updated running mean / variance ``running * momentum + batch *
    (1 - momentum)``."""

    multi_output = True

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self.eps = float(node.attr("epsilon", 1e-5))
        self.momentum = float(node.attr("momentum", 0.9))
        self.n_out = _requested(node)
        if node.opset >= 14:
            self.training = bool(node.attr("training_mode", 0))
        else:
            self.training = self.n_out > 1
        self.folded: tuple[np.ndarray, np.ndarray] | None = None

    def _fold(self, scale, b, mean, var) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel ``(a, shift)`` with ``y = x * a + shift``, in float32 or wider."""
        a = upcast(scale) / np.sqrt(upcast(var) + self.eps)
        return a, upcast(b) - upcast(mean) * a

    def prepare(self, constants, shared: dict) -> None:
        if self.training or not all(i in constants for i in (1, 2, 3, 4)):
            return
        if "folded" not in shared:
            shared["folded"] = self._fold(*(constants[i] for i in (1, 2, 3, 4)))
        self.folded = shared["folded"]

    def run(self, x, scale, b, mean, var):
        rank = x.ndim
        dt = acc_dtype(x.dtype)
        if not self.training:
            a, shift = self.folded if self.folded is not None else \
                self._fold(scale, b, mean, var)
            y = x.astype(dt, copy=False) * _channel_shape(a.astype(dt, copy=False), rank)
            y += _channel_shape(shift.astype(dt, copy=False), rank)
            return (y.astype(x.dtype, copy=False),)
        xa = x.astype(dt, copy=False)
        axes = (0,) + tuple(range(2, rank))
        bmean = xa.mean(axis=axes)
        bvar = xa.var(axis=axes)
        a = upcast(scale) / np.sqrt(bvar + dt.type(self.eps))
        y = (xa - _channel_shape(bmean, rank)) * _channel_shape(a, rank) \
            + _channel_shape(upcast(b), rank)
        m = self.momentum
        run_mean = upcast(mean) * m + bmean * (1 - m)
        run_var = upcast(var) * m + bvar * (1 - m)
        outs = [y.astype(x.dtype, copy=False)]
        stats = [run_mean, run_var] if self.node.opset >= 14 else \
            [run_mean, run_var, bmean, bvar]
        for i, st in enumerate(stats[:self.n_out - 1], start=1):
            default = mean.dtype if i <= 2 else x.dtype
            outs.append(np.asarray(st).astype(_declared_dtype(self.node, i, default)))
        return tuple(outs)


# ------------------------------------------------------------------ Instance/Group

def _standardize(xa: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    mean = xa.mean(axis=axes, keepdims=True)
    d = xa - mean
    var = np.mean(np.square(d), axis=axes, keepdims=True)
    d *= 1.0 / np.sqrt(var + eps)
    return d


#: ChannelAffine in one compiled pass (:mod:`._epilogue_numba`) when numba is there
COMPILED_AFFINE = True


@cpu_kernel("ChannelAffine", domain="ai.actorrt")
class ChannelAffine(Kernel):
    """``act(x * a[c] + t[c])`` over axis 1 of ``x (N, C, ...)`` (engine op from
    the graph optimizer: BatchNormalization + per-channel Mul / Add +
    activation); ``a``, ``t`` ``(C,)`` constants; attributes ``activation`` /
    ``activation_params`` as FusedConv's. One multiply, one add in place."""

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        from ._conv_util import decode_str
        from ._epilogue import activation
        self._act_name = decode_str(node.attr("activation"), "")
        self._act_params = tuple(node.attr("activation_params") or ())
        self._act = activation(self._act_name, self._act_params)

    def run(self, x, a, t):
        if x.ndim < 2 or x.shape[1] != a.shape[0]:
            raise ValueError(f"ChannelAffine: input {x.shape} has no channel axis of {a.shape[0]}")
        if COMPILED_AFFINE and x.dtype in (np.float32, np.float64) and x.size:
            from . import _epilogue_numba as en  # one compiled pass (Relu / LeakyRelu / Clip / none)
            if en.HAVE_NUMBA and self._act_name in en.CODES:
                return en.affine_act(x, a, t, self._act_name, self._act_params)
        dt = acc_dtype(x.dtype)
        y = x.astype(dt, copy=False) * _channel_shape(a.astype(dt, copy=False), x.ndim)
        y += _channel_shape(t.astype(dt, copy=False), x.ndim)
        return self._act(y).astype(x.dtype, copy=False)


@cpu_kernel("InstanceNormalization", since=(1, 6, 22))
def InstanceNormalization(input, scale, B, *, epsilon=1e-5):
    """ONNX InstanceNormalization (opsets 1, 6, 22): per (n, c) over the spatial dims."""
    xa = upcast(input)
    y = _standardize(xa, tuple(range(2, input.ndim)), epsilon)
    y = y * _channel_shape(upcast(scale), input.ndim) + _channel_shape(upcast(B), input.ndim)
    return y.astype(input.dtype, copy=False)


@cpu_kernel("GroupNormalization", since=(18, 21))
def GroupNormalization(X, scale, bias, *, epsilon=1e-5, num_groups=0, stash_type=1, node=None):
    """ONNX GroupNormalization: opset 18 takes ``scale``/``bias`` per group
    ``(G,)``, opset 21 per channel ``(C,)``."""
    n, c = X.shape[0], X.shape[1]
    g = int(num_groups)
    if g <= 0 or c % g:
        raise ValueError(f"num_groups={g} must be positive and divide the {c} channels")
    xa = upcast(X)
    y = _standardize(xa.reshape(n, g, -1), (2,), epsilon).reshape(X.shape)
    s, b = upcast(scale).reshape(-1), upcast(bias).reshape(-1)
    if node.opset < 21 or (s.shape[0] == g and g != c):
        s, b = np.repeat(s, c // g), np.repeat(b, c // g)
    y = y * _channel_shape(s, X.ndim) + _channel_shape(b, X.ndim)
    return y.astype(X.dtype, copy=False)


# ---------------------------------------------------------------- Layer / RMS

@functools.lru_cache(maxsize=64)
def _stash_dtype(x_dtype: np.dtype, stash_type: int) -> np.dtype:
    """The dtype statistics are computed in: the stash type, raised to float32
    at least and to the input's precision when that is wider. Cached: a
    decode step calls it with cold caches (4.5 us computed, measured after a
    16 MB sweep; one dict lookup cached)."""
    st = _dtypes.to_numpy_dtype(stash_type) if stash_type else np.dtype(np.float32)
    st = acc_dtype(st)
    return np.promote_types(st, acc_dtype(x_dtype))


@cpu_kernel("LayerNormalization", since=17)
class LayerNormalization(Kernel):
    """ONNX LayerNormalization (opset 17): normalizes ``X`` over dims
    ``axis..`` (attributes ``axis`` -1, ``epsilon`` 1e-5, ``stash_type`` 1);
    optional outputs Mean and InvStdDev have shape ``X.shape[:axis] + (1,)*``
    and the declared dtype. float32: one compiled call
    (:mod:`._layernorm_numba`); over the last axis, after a shape's first
    call with constant ``Scale`` / ``B``, the node keeps the prepared call
    (:class:`._layernorm_numba.RowsCall`). Raises ValueError for an axis
    outside ``[-rank, rank)``."""

    multi_output = True

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self._axis = node.attr("axis", -1)
        self._epsilon = node.attr("epsilon", 1e-5)
        self._stash = node.attr("stash_type", 1)
        n_out = _requested(node)
        # the prepared call's float32 statistics are what the node declares
        self._fast_ok = n_out <= 1 or all(
            _declared_dtype(node, i, np.float32) == np.float32 for i in range(1, n_out))
        self._n_out = n_out
        self._rows = None  # the prepared call of the last float32 shape

    def run(self, X, Scale, B=None):
        rows = self._rows
        if rows is not None and rows.fits(X, None, Scale, B, None):
            y, mean, inv, _ = rows.run(X, None)
            return (y,) if self._n_out <= 1 else (y, mean, inv)
        if self._fast_ok and X.dtype == np.float32 and self._stash == 1 and \
                self._axis in (-1, X.ndim - 1):
            self._rows = _ln.prepare(X, Scale, B, self._epsilon)
        return _layer_norm(X, Scale, B, axis=self._axis, epsilon=self._epsilon,
                           stash_type=self._stash, node=self.node)


def _layer_norm(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1, node=None):
    ax = norm_axis(axis, X.ndim)
    dt = _stash_dtype(X.dtype, stash_type)
    if X.dtype == np.float32 and dt == np.float32:  # one compiled call (numba)
        r = _ln.layer_norm(X, Scale, B, epsilon, ax)
        if r is not None:
            n_out = _requested(node)
            if n_out <= 1:
                return (r[0],)
            shp = X.shape[:ax] + (1,) * (X.ndim - ax)
            stat = _declared_dtype(node, 1, dt)
            return (r[0], r[1].reshape(shp).astype(stat, copy=False),
                    r[2].reshape(shp).astype(_declared_dtype(node, 2, stat), copy=False))
    xa = X.astype(dt, copy=False)
    axes = tuple(range(ax, X.ndim))
    mean = xa.mean(axis=axes, keepdims=True)
    d = xa - mean
    inv = 1.0 / np.sqrt(np.mean(np.square(d), axis=axes, keepdims=True) + dt.type(epsilon))
    d *= inv
    d *= upcast(Scale)
    if B is not None:
        d += upcast(B)
    y = d.astype(X.dtype, copy=False)
    n_out = _requested(node)
    if n_out <= 1:
        return (y,)
    stat = _declared_dtype(node, 1, dt if dt != np.float64 else np.float32)
    return (y, mean.astype(stat), inv.astype(_declared_dtype(node, 2, stat)))


@cpu_kernel("RMSNormalization", since=23)
def RMSNormalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """ONNX RMSNormalization (opset 23): ``X / sqrt(mean(X^2 over axis..) + eps) * scale``."""
    ax = norm_axis(axis, X.ndim)
    dt = _stash_dtype(X.dtype, stash_type)
    xa = X.astype(dt, copy=False)
    ms = np.mean(np.square(xa), axis=tuple(range(ax, X.ndim)), keepdims=True)
    y = xa * (1.0 / np.sqrt(ms + dt.type(epsilon)))
    y *= upcast(scale)
    return y.astype(X.dtype, copy=False)


# ------------------------------------------------------------- Lp / MVN / LRN

@cpu_kernel("LpNormalization", since=(1, 22))
def LpNormalization(input, *, axis=-1, p=2):
    """ONNX LpNormalization (opsets 1, 22): ``x / ||x||_p`` along ``axis`` (p in {1, 2});
    a zero norm gives 0."""
    if p not in (1, 2):
        raise ValueError(f"LpNormalization supports p=1 or p=2, got p={p}")
    ax = norm_axis(axis, input.ndim)
    xa = upcast(input)
    if p == 1:
        norm = np.sum(np.abs(xa), axis=ax, keepdims=True)
    else:
        norm = np.sqrt(np.sum(np.square(xa), axis=ax, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(norm == 0, 0, xa / norm)
    return y.astype(input.dtype, copy=False)


@cpu_kernel("MeanVarianceNormalization", since=(9, 13))
def MeanVarianceNormalization(X, *, axes=(0, 2, 3)):
    """ONNX MeanVarianceNormalization (opsets 9, 13): ``(X - E[X]) / (sqrt(Var[X]) + 1e-9)``
    over ``axes``."""
    ax = norm_axes(axes, X.ndim)
    xa = upcast(X)
    mean = xa.mean(axis=ax, keepdims=True)
    d = xa - mean
    std = np.sqrt(np.mean(np.square(d), axis=ax, keepdims=True))
    d /= std + xa.dtype.type(1e-9)
    return d.astype(X.dtype, copy=False)


@cpu_kernel("LRN", since=(1, 13))
def LRN(X, *, size, alpha=1e-4, beta=0.75, bias=1.0):
    """ONNX LRN (opsets 1, 13): cross-channel local response normalization,
    ``X / (bias + alpha / size * sum of squares in the window) ** beta``."""
    xa = upcast(X)
    c = X.shape[1]
    lo = (size - 1) // 2
    hi = int(math.ceil((size - 1) / 2))
    sq = np.square(xa)
    pad = [(0, 0)] * X.ndim
    pad[1] = (1, 0)
    csum = np.cumsum(np.pad(sq, pad), axis=1)  # csum[:, k] = sum of sq[:, :k]
    idx = np.arange(c)
    top = np.minimum(idx + hi + 1, c)
    bot = np.maximum(idx - lo, 0)
    window = np.take(csum, top, axis=1) - np.take(csum, bot, axis=1)
    y = xa / (xa.dtype.type(bias) + xa.dtype.type(alpha / size) * window) ** xa.dtype.type(beta)
    return y.astype(X.dtype, copy=False)


# ------------------------------------------------------------------------ Dropout

@cpu_kernel("Dropout", since=(1, 6, 7, 10, 12, 13, 22))
class Dropout(Kernel):
    """ONNX Dropout (opsets 1-22). Inference (no ``training_mode`` input, or it
    is false, or ``ratio`` is 0): ``output = data`` and ``mask`` all true. In
    training mode (opset 12+): ``mask = U(0, 1) >= ratio`` drawn from
    ``numpy.random.RandomState(seed)`` (fresh entropy without ``seed``) and
    ``output = data * mask / (1 - ratio)``. ``mask`` is bool from opset 10, the
    data dtype before."""

    multi_output = True
    view_outputs = True  # at inference ``output`` is ``data`` itself

    def compile(self):
        node = self.node
        want_mask = _requested(node) > 1
        mask_dtype = np.dtype(np.bool_) if node.opset >= 10 else None
        seed = node.attr("seed")
        default_ratio = float(node.attr("ratio", 0.5))

        def run(data, ratio=None, training_mode=None):
            r = default_ratio if ratio is None else float(np.asarray(ratio).reshape(()))
            training = node.opset >= 12 and training_mode is not None and \
                bool(np.asarray(training_mode).reshape(()))
            if not training or r == 0:
                if not want_mask:
                    return (data,)
                return (data, np.ones(data.shape, dtype=mask_dtype or data.dtype))
            if not 0 <= r < 1:
                raise ValueError(f"Dropout ratio must be in [0, 1), got {r}")
            rng = np.random.RandomState(seed) if seed is not None else np.random.RandomState()
            mask = rng.uniform(0.0, 1.0, data.shape) >= r
            xa = upcast(data)
            y = (xa * mask * xa.dtype.type(1.0 / (1.0 - r))).astype(data.dtype, copy=False)
            if not want_mask:
                return (y,)
            return (y, mask if mask_dtype is not None else mask.astype(data.dtype))

        return run

    def run(self, *inputs):
        return self.compile()(*inputs)
