"""com.microsoft QLinear* ops: the quantized operators onnxruntime's
quantization tool writes in its QOperator format and its optimizer writes
when it folds QDQ pairs (onnxruntime semantics).

Spec: onnxruntime ContribOperators (com.microsoft opset 1): QLinearAdd,
QLinearMul, QGemm, QLinearGlobalAveragePool, QLinearAveragePool,
QLinearConcat, QLinearLeakyRelu, QLinearSigmoid, QLinearSoftmax.

Every op dequantizes its 8-bit inputs (``scale * (x - zero_point)``, per
tensor), computes in float and quantizes the result as ONNX QuantizeLinear
does: ``saturate(round_half_even(y / y_scale) + y_zero_point)`` into the
output zero point's type (uint8 or int8). QLinearAdd / QLinearMul use
onnxruntime's float32 form (scale ratios times the centred integers, plus
the output zero point), which matches it bit for bit; the others compute in
float64 from exact integer sums. onnxruntime runs some through 256-entry
lookup tables or float32 pipelines, so an output can differ from it by one
quantization step where the value sits on a rounding tie; the tests bound
that.
"""

from __future__ import annotations

import numpy as np

from .registry import cpu_kernel

MS = "com.microsoft"


def _deq(x: np.ndarray, scale, zero_point) -> np.ndarray:
    zp = 0 if zero_point is None else np.asarray(zero_point).astype(np.float64)
    return (x.astype(np.float64) - zp) * np.asarray(scale, np.float64)


def _q(y: np.ndarray, scale, zero_point, like: np.ndarray) -> np.ndarray:
    """QuantizeLinear into the zero point's dtype (``like``'s when absent)."""
    dt = np.asarray(zero_point).dtype if zero_point is not None else like.dtype
    info = np.iinfo(dt)
    zp = 0 if zero_point is None else np.asarray(zero_point).astype(np.float64)
    q = np.rint(y.astype(np.float32) / np.float32(scale)).astype(np.float64) + zp
    return np.clip(q, info.min, info.max).astype(dt)


def _check_8bit(name: str, *xs: np.ndarray) -> None:
    for x in xs:
        if x.dtype not in (np.uint8, np.int8):
            raise ValueError(f"{name}: quantized inputs must be uint8 or int8, got {x.dtype}")


def _centred32(x: np.ndarray, zero_point) -> np.ndarray:
    zp = np.float32(0) if zero_point is None else np.float32(np.asarray(zero_point))
    return x.astype(np.float32) - zp


def _round_into(y: np.ndarray, zero_point, like: np.ndarray) -> np.ndarray:
    """``saturate(round_half_even(y))`` into the zero point's dtype (``y``
    already includes the zero point)."""
    dt = np.asarray(zero_point).dtype if zero_point is not None else like.dtype
    info = np.iinfo(dt)
    return np.clip(np.rint(y), info.min, info.max).astype(dt)


@cpu_kernel("QLinearAdd", domain=MS)
def QLinearAdd(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    """``C = quantize(dequantize(A) + dequantize(B))`` with numpy broadcasting
    (8-bit A, B, C; scales / zero points per tensor), in float32 as
    onnxruntime's kernel computes it: ``(A_scale / C_scale) * (A - A_zp) +
    (B_scale / C_scale) * (B - B_zp) + C_zp``."""
    _check_8bit("QLinearAdd", A, B)
    ra = np.float32(np.float32(A_scale) / np.float32(C_scale))
    rb = np.float32(np.float32(B_scale) / np.float32(C_scale))
    zc = np.float32(0) if C_zero_point is None else np.float32(np.asarray(C_zero_point))
    y = ra * _centred32(A, A_zero_point) + rb * _centred32(B, B_zero_point) + zc
    return _round_into(y, C_zero_point, A)


@cpu_kernel("QLinearMul", domain=MS)
def QLinearMul(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    """``C = quantize(dequantize(A) * dequantize(B))`` with numpy broadcasting,
    in float32: ``(A_scale * B_scale / C_scale) * (A - A_zp) * (B - B_zp) +
    C_zp``."""
    _check_8bit("QLinearMul", A, B)
    r = np.float32(np.float32(A_scale) * np.float32(B_scale) / np.float32(C_scale))
    zc = np.float32(0) if C_zero_point is None else np.float32(np.asarray(C_zero_point))
    y = r * (_centred32(A, A_zero_point) * _centred32(B, B_zero_point)) + zc
    return _round_into(y, C_zero_point, A)


@cpu_kernel("QGemm", domain=MS)
def QGemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None,
          y_zero_point=None, *, alpha=1.0, transA=0, transB=0):
    """Quantized Gemm: ``alpha * ((A' - a_zp) @ (B' - b_zp) + C) * a_scale *
    b_scale`` (``C`` int32, already at the product's scale; alpha scales it
    too, as in onnxruntime's kernel),
    ``A'`` / ``B'`` transposed by ``transA`` / ``transB``; ``b_scale`` /
    ``b_zero_point`` per tensor or per column of B'. Quantized to
    ``y_scale`` / ``y_zero_point`` when ``y_scale`` is given, else float32."""
    _check_8bit("QGemm", A, B)
    a = A.T if transA else A
    bq = B.T if transB else B
    bz = np.asarray(0 if b_zero_point is None else b_zero_point).astype(np.float64)
    if bz.ndim == 1 and bz.size > 1:
        bz = bz.reshape(1, -1)
    az = 0 if a_zero_point is None else np.asarray(a_zero_point).astype(np.float64)
    acc = (a.astype(np.float64) - az) @ (bq.astype(np.float64) - bz)  # exact for 8-bit K < 2^37
    scale = np.asarray(a_scale, np.float64) * np.asarray(b_scale, np.float64).reshape(
        (1, -1) if np.size(b_scale) > 1 else ())
    if C is not None:
        acc = acc + np.asarray(C, np.float64)
    y = float(np.float32(alpha)) * acc * scale
    if y_scale is None:
        return y.astype(np.float32)
    return _q(y, y_scale, y_zero_point, A)


def _channels_last_to_first(x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, -1, 1)


@cpu_kernel("QLinearGlobalAveragePool", domain=MS)
def QLinearGlobalAveragePool(X, x_scale, x_zero_point, y_scale, y_zero_point=None, *,
                             channels_last=0):
    """Mean over every spatial axis of ``(N, C, *D)`` (``(N, *D, C)`` with
    ``channels_last``), keeping them as size-1 axes, requantized."""
    _check_8bit("QLinearGlobalAveragePool", X)
    x = _deq(X, x_scale, x_zero_point)
    axes = tuple(range(1, X.ndim - 1)) if channels_last else tuple(range(2, X.ndim))
    return _q(x.mean(axis=axes, keepdims=True), y_scale, y_zero_point, X)


@cpu_kernel("QLinearAveragePool", domain=MS)
def QLinearAveragePool(X, x_scale, x_zero_point, y_scale, y_zero_point=None, *,
                       auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, kernel_shape=None,
                       pads=None, strides=None, channels_last=0):
    """ONNX AveragePool's window (same attributes) on the dequantized input,
    requantized; ``channels_last`` takes and gives ``(N, *D, C)``."""
    from .pool import AveragePool
    _check_8bit("QLinearAveragePool", X)
    zx = 0.0 if x_zero_point is None else float(np.asarray(x_zero_point))
    x = X.astype(np.float64) - zx  # window means of the integers, exact in float64
    if channels_last:
        x = np.ascontiguousarray(_channels_last_to_first(x))
    mean = AveragePool(x, auto_pad=auto_pad, ceil_mode=ceil_mode,
                       count_include_pad=count_include_pad, kernel_shape=kernel_shape,
                       pads=pads, strides=strides)
    if channels_last:
        mean = np.moveaxis(mean, 1, -1)
    zy = 0.0 if y_zero_point is None else float(np.asarray(y_zero_point))
    y = np.asarray(mean, np.float64) * float(np.float32(x_scale)) / float(np.float32(y_scale))
    return _round_into(y + zy, y_zero_point, X)


@cpu_kernel("QLinearConcat", domain=MS)
def QLinearConcat(Y_scale, Y_zero_point, *inputs, axis):
    """``inputs`` = (X, X_scale, X_zero_point) triples, concatenated along
    ``axis`` after dequantizing, requantized to ``Y_scale`` / ``Y_zero_point``."""
    if len(inputs) % 3 or not inputs:
        raise ValueError(f"QLinearConcat: inputs after Y_scale, Y_zero_point come in "
                         f"(X, X_scale, X_zero_point) triples, got {len(inputs)}")
    parts = []
    for i in range(0, len(inputs), 3):
        _check_8bit("QLinearConcat", inputs[i])
        parts.append(_deq(inputs[i], inputs[i + 1], inputs[i + 2]))
    return _q(np.concatenate(parts, axis=int(axis)), Y_scale, Y_zero_point, inputs[0])


@cpu_kernel("QLinearLeakyRelu", domain=MS)
def QLinearLeakyRelu(X, X_scale, X_zero_point, Y_scale, Y_zero_point=None, *, alpha=0.01):
    """``LeakyRelu(dequantize(X), alpha)``, requantized."""
    _check_8bit("QLinearLeakyRelu", X)
    x = _deq(X, X_scale, X_zero_point).astype(np.float32)
    y = np.where(x >= 0, x, x * np.float32(alpha))
    return _q(y, Y_scale, Y_zero_point, X)


@cpu_kernel("QLinearSigmoid", domain=MS)
def QLinearSigmoid(X, X_scale, X_zero_point, Y_scale, Y_zero_point=None):
    """``Sigmoid(dequantize(X))``, requantized."""
    _check_8bit("QLinearSigmoid", X)
    x = _deq(X, X_scale, X_zero_point).astype(np.float32)
    return _q(1.0 / (1.0 + np.exp(-x)), Y_scale, Y_zero_point, X)


@cpu_kernel("QLinearSoftmax", domain=MS)
def QLinearSoftmax(X, X_scale, x_zero_point, y_scale, y_zero_point=None, *, axis=-1, opset=13):
    """``Softmax(dequantize(X))`` over ``axis`` (``opset`` < 13: the input
    flattened to 2-D at ``axis``, as ONNX Softmax before 13), requantized."""
    _check_8bit("QLinearSoftmax", X)
    x = _deq(X, X_scale, x_zero_point)
    ax = int(axis) % X.ndim
    if int(opset) < 13:
        flat = x.reshape(int(np.prod(X.shape[:ax])), -1)
        e = np.exp(flat - flat.max(axis=1, keepdims=True))
        y = (e / e.sum(axis=1, keepdims=True)).reshape(X.shape)
    else:
        e = np.exp(x - x.max(axis=ax, keepdims=True))
        y = e / e.sum(axis=ax, keepdims=True)
    return _q(y, y_scale, y_zero_point, X)
