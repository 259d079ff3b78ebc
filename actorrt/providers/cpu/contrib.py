"""com.microsoft LLM contrib ops on the CPU provider (onnxruntime semantics).

Spec: onnxruntime ContribOperators (com.microsoft opset 1): MatMulNBits,
GroupQueryAttention, RotaryEmbedding, SkipSimplifiedLayerNormalization,
SkipLayerNormalization, EmbedLayerNormalization, Gelu, FastGelu, QuickGelu, BiasGelu,
GatherBlockQuantized; and onnxruntime's SimplifiedLayerNormalization, which
it registers in the ai.onnx domain (opset 1). float16 / bfloat16 inputs are
computed in float32 and cast back, as onnxruntime's CPU kernels do.
"""

from __future__ import annotations

import math
import ml_dtypes
import numpy as np

from actorrt._lazy import lazy_module
from .._contract import Kernel, NodeSpec
from .registry import cpu_kernel

_nb = lazy_module(f"{__package__}.llm._contrib_numba", globals(), "_nb")  # numba on first use
_ln = lazy_module(f"{__package__}._layernorm_numba", globals(), "_ln")

MS = "com.microsoft"
_LOW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))

def _f32(x: np.ndarray) -> np.ndarray:
    """float32 view/copy of a 16-bit float array; other arrays unchanged."""
    return x.astype(np.float32) if x.dtype in _LOW else x


def _erf(x: np.ndarray) -> np.ndarray:
    """erf(x) in float64 (W. J. Cody's rational approximations, |err| < 1e-15
    on |x| < 0.5, else via erfc with relative error < 1.2e-7)."""
    x = np.asarray(x, np.float64)
    ax = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * ax)
    # Numerical Recipes erfc (Chebyshev fit, fractional error < 1.2e-7)
    poly = (-ax * ax - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277)))))))))
    erfc = t * np.exp(poly)
    r = np.where(x >= 0, 1.0 - erfc, erfc - 1.0)
    # small |x|: Maclaurin series is more accurate than 1 - erfc
    small = ax < 0.5
    if small.any():
        xs = x[small]
        x2 = xs * xs
        ser = xs * (1.0 + x2 * (-1.0 / 3 + x2 * (1.0 / 10 + x2 * (-1.0 / 42 + x2 * (
            1.0 / 216 + x2 * (-1.0 / 1320 + x2 * (1.0 / 9360 + x2 * (-1.0 / 75600))))))))
        r[small] = ser * (2.0 / math.sqrt(math.pi))
    return r


def _gelu(x: np.ndarray) -> np.ndarray:
    xf = x.astype(np.float64)
    return (0.5 * xf * (1.0 + _erf(xf * (1.0 / math.sqrt(2.0))))).astype(x.dtype)


# ------------------------------------------------------------------ activations

@cpu_kernel("Gelu", domain=MS)
def Gelu(X):
    """com.microsoft Gelu: 0.5 * x * (1 + erf(x / sqrt(2))); float32 in
    float32 (the Erf kernel's erf), in place on one copy."""
    if X.dtype == np.float32:
        from ._epilogue import gelu_inplace
        return gelu_inplace(np.array(X, copy=True))
    return _gelu(X)


@cpu_kernel("BiasGelu", domain=MS)
def BiasGelu(A, B):
    """com.microsoft BiasGelu: Gelu(A + B), B 1-D over the last axis."""
    return _gelu(np.add(A, B))


@cpu_kernel("FastGelu", domain=MS)
def FastGelu(X, bias=None):
    """com.microsoft FastGelu: tanh approximation of Gelu of X (+ bias)."""
    x = X if bias is None else np.add(X, bias)
    xf = _f32(x)
    y = 0.5 * xf * (1.0 + np.tanh(xf * (0.7978845608028654 + 0.035677408136300125 * xf * xf)))
    return y.astype(X.dtype, copy=False)


@cpu_kernel("QuickGelu", domain=MS)
def QuickGelu(X, *, alpha=1.702):
    """com.microsoft QuickGelu: x * sigmoid(alpha * x)."""
    xf = _f32(X)
    a = xf.dtype.type(alpha)
    y = xf * (0.5 + 0.5 * np.tanh(xf * (a * xf.dtype.type(0.5))))
    return y.astype(X.dtype, copy=False)


# ---------------------------------------------------------------- normalization

def _rms(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    ms = np.mean(np.square(x), axis=axes, keepdims=True)
    return 1.0 / np.sqrt(ms + x.dtype.type(eps))


@cpu_kernel("SimplifiedLayerNormalization", domain="", since=1, multi_output=True)
def SimplifiedLayerNormalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """onnxruntime SimplifiedLayerNormalization (RMSNorm, ai.onnx domain opset 1):
    Y = X / sqrt(mean(X^2 over axis..) + eps) * scale; Y has scale's dtype,
    inv_std_var is float32 (float64 for double X) with kept dims."""
    ax = axis % X.ndim
    f32 = np.float32
    if (_nb.HAVE_NUMBA and ax == X.ndim - 1 and X.dtype == f32 and scale.dtype == f32
            and scale.shape == X.shape[-1:] and X.size):
        # one compiled pass (the numpy expression below is five array passes)
        hidden = X.shape[-1]
        y, inv = _nb.rms_norm(np.ascontiguousarray(X).reshape(-1, hidden),
                              np.ascontiguousarray(scale), epsilon)
        return y.reshape(X.shape), inv.reshape(_stats_shape(X))
    axes = tuple(range(ax, X.ndim))
    xf = _f32(X)
    inv = _rms(xf, axes, epsilon)
    y = (xf * inv) * _f32(scale)
    return y.astype(scale.dtype, copy=False), inv


def _skip_sum(input, skip, bias):
    s = np.add(_f32(input), _f32(skip))
    if bias is not None:
        s = s + _f32(bias)
    return s


def _stats_shape(x: np.ndarray) -> tuple[int, ...]:
    return x.shape[:-1] + (1,)


@cpu_kernel("SkipSimplifiedLayerNormalization", domain=MS, multi_output=True)
def SkipSimplifiedLayerNormalization(input, skip, gamma, bias=None, *, epsilon=1e-12):
    """com.microsoft SkipSimplifiedLayerNormalization: s = input + skip (+ bias);
    outputs (RMSNorm(s) * gamma, mean (zeros, unused), inv_std_var, s)."""
    f32 = np.float32
    if (_nb.HAVE_NUMBA and input.dtype == f32 and skip.shape == input.shape
            and skip.dtype == f32 and gamma.dtype == f32 and gamma.shape == input.shape[-1:]
            and (bias is None or (bias.dtype == f32 and bias.shape == gamma.shape))):
        hidden = input.shape[-1]
        y, inv, s = _nb.skip_rms_norm(
            np.ascontiguousarray(input).reshape(-1, hidden),
            np.ascontiguousarray(skip).reshape(-1, hidden), np.ascontiguousarray(gamma),
            None if bias is None else np.ascontiguousarray(bias), epsilon)
        shp = _stats_shape(input)
        return (y.reshape(input.shape), np.zeros(shp, f32), inv.reshape(shp),
                s.reshape(input.shape))
    s = _skip_sum(input, skip, bias)
    inv = _rms(s, (-1,), epsilon)
    y = (s * inv) * _f32(gamma)
    dt = input.dtype
    shp = _stats_shape(s)
    return (y.astype(dt, copy=False), np.zeros(shp, np.float32),
            inv.astype(np.float32).reshape(shp), s.astype(dt, copy=False))


@cpu_kernel("SkipLayerNormalization", domain=MS)
class SkipLayerNormalization(Kernel):
    """com.microsoft SkipLayerNormalization: s = input + skip (+ bias); outputs
    (LayerNorm(s) * gamma (+ beta), mean, inv_std_var, s), ``input`` / ``skip``
    ``(..., D)``, ``gamma`` / ``beta`` / ``bias`` ``(D,)``, statistics float32
    ``(..., 1)``; attribute ``epsilon`` (default 1e-12). float32 with a
    same-shape skip: one compiled call (:mod:`._layernorm_numba`); after a
    shape's first call with constant parameters the node keeps the prepared
    call (:class:`._layernorm_numba.RowsCall`); other dtypes in float32 and
    cast back."""

    multi_output = True

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self._epsilon = node.attr("epsilon", 1e-12)
        self._rows = None  # the prepared call of the last float32 shape

    def run(self, input, skip, gamma, beta=None, bias=None):
        rows = self._rows
        if rows is not None and rows.fits(input, skip, gamma, beta, bias):
            return rows.run(input, skip)
        if input.dtype == np.float32:
            self._rows = _ln.prepare(input, gamma, beta, self._epsilon, skip, bias)
        return _skip_layer_norm(input, skip, gamma, beta, bias, self._epsilon)


def _skip_layer_norm(input, skip, gamma, beta, bias, epsilon):
    if input.dtype == np.float32:
        r = _ln.layer_norm(input, gamma, beta, epsilon, -1, skip, bias, keep_sum=True)
        if r is not None:
            shp = _stats_shape(input)
            return r[0], r[1].reshape(shp), r[2].reshape(shp), r[3]
    s = _skip_sum(input, skip, bias)
    mean = np.mean(s, axis=-1, keepdims=True)
    d = s - mean
    inv = 1.0 / np.sqrt(np.mean(np.square(d), axis=-1, keepdims=True) + s.dtype.type(epsilon))
    y = d * inv * _f32(gamma)
    if beta is not None:
        y = y + _f32(beta)
    dt = input.dtype
    shp = _stats_shape(s)
    return (y.astype(dt, copy=False), mean.astype(np.float32).reshape(shp),
            inv.astype(np.float32).reshape(shp), s.astype(dt, copy=False))


@cpu_kernel("EmbedLayerNormalization", domain=MS, multi_output=True)
def EmbedLayerNormalization(input_ids, segment_ids, word_embedding, position_embedding,
                            segment_embedding=None, gamma=None, beta=None, mask=None,
                            position_ids=None, *, epsilon=1e-12, mask_index_type=1):
    """com.microsoft EmbedLayerNormalization (BERT's embedding block as
    onnxruntime's transformer optimizer fuses it): ``e = word_embedding[ids]
    + position_embedding[pos] (+ segment_embedding[segment_ids])`` with
    ``input_ids`` / ``segment_ids`` int32 ``(B, S)``, ``pos`` = ``position_ids``
    ``(B | 1, S)`` or ``0 .. S-1``; outputs ``(LayerNorm(e) * gamma + beta``
    ``(B, S, D)``, ``mask_index`` int32 ``(B,)`` = the nonzero count of each
    ``mask`` row (zeros without a mask), ``e``).

    Raises:
        ValueError: an id outside its embedding table (named), ``gamma``
            missing, ids not 2-D.
    """
    if gamma is None:
        raise ValueError("EmbedLayerNormalization: gamma (input 5) is required")
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"EmbedLayerNormalization: input_ids must be (B, S), got {ids.shape}")
    b, s = ids.shape
    pos = np.arange(s)[None, :] if position_ids is None else np.asarray(position_ids)
    tables = [("input_ids", ids, word_embedding), ("position_ids", np.broadcast_to(pos, (b, s)),
                                                   position_embedding)]
    if segment_ids is not None and segment_embedding is not None:
        tables.append(("segment_ids", np.asarray(segment_ids), segment_embedding))
    e = None
    for name, idx, table in tables:
        if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
            raise ValueError(f"EmbedLayerNormalization: {name} holds ids outside "
                             f"[0, {table.shape[0]})")
        rows = _f32(table)[idx]
        e = rows if e is None else e + rows
    mean = e.mean(axis=-1, keepdims=True)
    d = e - mean
    inv = 1.0 / np.sqrt(np.mean(np.square(d), axis=-1, keepdims=True) + np.float32(epsilon))
    y = d * inv * _f32(gamma)
    if beta is not None:
        y = y + _f32(beta)
    dt = word_embedding.dtype
    mi = (np.count_nonzero(np.asarray(mask), axis=-1).astype(np.int32) if mask is not None
          else np.zeros(b, np.int32))
    return y.astype(dt, copy=False), mi, e.astype(dt, copy=False)


# ---------------------------------------------------------------------- rotary

def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rot: int,
            interleaved: bool) -> np.ndarray:
    """Rotate the first ``rot`` features of ``x`` (..., D); ``cos``/``sin``
    broadcast against (..., rot // 2). Returns a new float array."""
    out = np.array(x, dtype=np.result_type(x.dtype, cos.dtype), copy=True)
    if interleaved:
        x1 = x[..., 0:rot:2]
        x2 = x[..., 1:rot:2]
        out[..., 0:rot:2] = x1 * cos - x2 * sin
        out[..., 1:rot:2] = x2 * cos + x1 * sin
    else:
        h = rot // 2
        x1 = x[..., :h]
        x2 = x[..., h:rot]
        out[..., :h] = x1 * cos - x2 * sin
        out[..., h:rot] = x2 * cos + x1 * sin
    return out


@cpu_kernel("RotaryEmbedding", domain=MS)
def RotaryEmbedding(input, position_ids, cos_cache, sin_cache, *, interleaved=0,
                    is_packed_batching=0, num_heads=0, rotary_embedding_dim=0, scale=1.0,
                    node=None):
    """com.microsoft RotaryEmbedding: input (B, S, hidden) or (B, N, S, head);
    position_ids (1,) start offset or (B, S) int64; caches (max_pos, rot/2).
    ``scale`` and ``is_packed_batching`` do not change the result (as in
    onnxruntime's CPU kernel)."""
    xf = _f32(input)
    cos_c, sin_c = _f32(cos_cache), _f32(sin_cache)
    four_d = input.ndim == 4
    if four_d:
        b, n, s, d = input.shape
        x = xf
    else:
        b, s, hidden = input.shape
        if num_heads > 0:
            d = hidden // num_heads
        else:
            d = cos_cache.shape[1] * 2
        n = hidden // d
        x = xf.reshape(b, s, n, d)
    rot = rotary_embedding_dim if rotary_embedding_dim > 0 else d
    if cos_cache.shape[1] * 2 != rot:
        raise ValueError(f"RotaryEmbedding: cos_cache has {cos_cache.shape[1]} columns, "
                         f"expected rotary_embedding_dim / 2 = {rot // 2}")
    pos = np.asarray(position_ids, np.int64)
    if pos.size == 1 and (b * s != 1 or pos.ndim == 1):
        pos = pos.reshape(-1)[0] + np.arange(s, dtype=np.int64)[None, :].repeat(b, 0)
    pos = pos.reshape(b, s)
    if pos.size and (pos.min() < 0 or pos.max() >= cos_cache.shape[0]):
        raise ValueError(f"RotaryEmbedding: position ids must be in [0, {cos_cache.shape[0]})")
    cos = cos_c[pos]  # (B, S, rot/2)
    sin = sin_c[pos]
    if four_d:  # (B, N, S, D): broadcast over heads
        cos, sin = cos[:, None], sin[:, None]
    else:  # (B, S, N, D)
        cos, sin = cos[:, :, None], sin[:, :, None]
    y = _rotate(x, cos, sin, rot, bool(interleaved))
    return y.reshape(input.shape).astype(input.dtype, copy=False)


from .llm._contrib_gqa import GroupQueryAttention  # noqa: E402,F401  (registers itself)
from .llm._contrib_quant import GatherBlockQuantized, MatMulNBits  # noqa: E402,F401
