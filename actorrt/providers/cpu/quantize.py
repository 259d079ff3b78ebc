"""Linear (de)quantization.

Spec: ONNX QuantizeLinear / DequantizeLinear (10, 13, 19, 21, 23, 24, 25, 28),
DynamicQuantizeLinear (11).

Granularity follows the shape of the scale: a scalar (or one element) is
per-tensor, a 1-D scale runs along ``axis`` (per-axis), a scale of the input's
rank with ``block_size > 0`` is blocked (each scale covers ``block_size``
consecutive elements along ``axis``). Quantized types: int8/uint8, int16/uint16,
int4/uint4, int2/uint2 (round half to even, then saturate), float8 (e4m3fn,
e4m3fnuz, e5m2, e5m2fnuz; ``saturate`` clamps out-of-range values to the
largest finite value), float4e2m1 and float6 (always saturating), all as
ml_dtypes dtypes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ... import _dtypes
from ._reduce_util import LOW_PRECISION_FLOATS, norm_axis
from .registry import cpu_kernel

_FLOAT8 = frozenset(np.dtype(t) for t in (
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e5m2fnuz))
_ALWAYS_SATURATING = frozenset(np.dtype(t) for t in (
    ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn))
_SUBBYTE_INTS = frozenset(np.dtype(t) for t in (
    ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2))


def _is_int(dtype: np.dtype) -> bool:
    return dtype.kind in "iu" or dtype in _SUBBYTE_INTS


def _broadcast_param(p: np.ndarray, shape: tuple[int, ...], axis: int,
                     block_size: int) -> np.ndarray:
    """Shape a scale / zero point so it broadcasts against an input of ``shape``.

    Raises:
        ValueError: the parameter's shape matches no granularity.
    """
    p = np.asarray(p)
    if p.ndim == 0 or p.size == 1:
        return p.reshape(())
    rank = len(shape)
    ax = norm_axis(axis, rank)
    if block_size and block_size > 0:
        if p.ndim != rank:
            raise ValueError(f"blocked quantization needs a scale of rank {rank}, "
                             f"got shape {p.shape}")
        full = np.repeat(p, block_size, axis=ax)
        if full.shape[ax] < shape[ax]:
            raise ValueError(f"scale shape {p.shape} with block_size={block_size} does not "
                             f"cover input shape {shape} along axis {ax}")
        full = np.take(full, np.arange(shape[ax]), axis=ax)
        if full.shape != tuple(shape):
            raise ValueError(f"scale shape {p.shape} does not match input shape {shape} "
                             f"outside axis {ax}")
        return full
    if p.ndim != 1 or p.shape[0] != shape[ax]:
        raise ValueError(f"per-axis scale must be 1-D of length {shape[ax]} "
                         f"(axis {ax} of {shape}), got shape {p.shape}")
    dims = [1] * rank
    dims[ax] = p.shape[0]
    return p.reshape(dims)


def _float_of(x: np.ndarray) -> np.ndarray:
    """``x`` as a numpy-native float (float32 for half / 8-bit floats)."""
    if x.dtype in LOW_PRECISION_FLOATS or x.dtype.kind == "V" or x.dtype.kind in "iub":
        return x.astype(np.float32)
    return x


def _quant_dtype(zp, output_dtype: int) -> np.dtype:
    if zp is not None:
        dt = zp.dtype
        if output_dtype and _dtypes.to_numpy_dtype(output_dtype) != dt:
            raise ValueError(f"output_dtype {output_dtype} disagrees with y_zero_point "
                             f"dtype {dt}")
        return dt
    if output_dtype:
        return _dtypes.to_numpy_dtype(output_dtype)
    return np.dtype(np.uint8)


@cpu_kernel("QuantizeLinear", since=(10, 13, 19, 21, 23, 24, 25, 28))
def QuantizeLinear(x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                   output_dtype=0, precision=0, node=None):
    """ONNX QuantizeLinear (opsets 10-28): ``y = saturate(round(x / y_scale) + y_zero_point)``;
    the output dtype is the zero point's, else ``output_dtype``, else uint8."""
    qdt = _quant_dtype(y_zero_point, output_dtype)
    if node.opset < 13 and np.asarray(y_scale).size != 1:
        raise ValueError("QuantizeLinear-10 supports per-tensor scales only")
    scale = _broadcast_param(y_scale, x.shape, axis, block_size)
    if precision:
        pdt = _dtypes.to_numpy_dtype(precision)
        q = x.astype(pdt) / scale.astype(pdt)
    else:  # numpy promotion (int32 x -> float64); ml_dtypes floats divide in float32
        xs = x.astype(np.float32) if x.dtype.kind == "V" else x
        ss = scale.astype(np.float32) if scale.dtype.kind == "V" else scale
        q = np.divide(xs, ss)
    zp = None if y_zero_point is None else _broadcast_param(y_zero_point, x.shape, axis,
                                                            block_size)
    if _is_int(qdt):
        info = ml_dtypes.iinfo(qdt)
        q = np.rint(q)
        if zp is not None:
            q = q + zp.astype(np.float64 if q.dtype == np.float64 else np.float32)
        return np.clip(q, info.min, info.max).astype(qdt)
    if qdt in _FLOAT8 or qdt in _ALWAYS_SATURATING:
        q = q.astype(np.float32, copy=False)
        if zp is not None:
            zf = zp.astype(np.float32)
            if np.any(zf):
                q = q + zf
        if saturate or qdt in _ALWAYS_SATURATING:
            m = float(ml_dtypes.finfo(qdt).max)
            q = np.clip(q, -m, m)
        return q.astype(qdt)
    raise ValueError(f"QuantizeLinear cannot quantize to {qdt}")


@cpu_kernel("DequantizeLinear", since=(10, 13, 19, 21, 23, 24, 25, 28))
def DequantizeLinear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0,
                     node=None):
    """ONNX DequantizeLinear (opsets 10-28): ``y = (x - x_zero_point) * x_scale``; the
    output dtype is ``output_dtype``, else the scale's."""
    if node.opset < 13 and np.asarray(x_scale).size != 1:
        raise ValueError("DequantizeLinear-10 supports per-tensor scales only")
    if output_dtype:
        out_dt = _dtypes.to_numpy_dtype(output_dtype)
    else:
        out_dt = x_scale.dtype
        if out_dt == np.dtype(ml_dtypes.float8_e8m0fnu):
            out_dt = np.dtype(np.float32)
    work = np.float64 if x.dtype in (np.dtype(np.int32), np.dtype(np.uint32)) else np.float32
    dx = x.astype(work)
    if x_zero_point is not None:
        zp = _broadcast_param(x_zero_point, x.shape, axis, block_size)
        dx -= zp.astype(work)
    scale = _broadcast_param(x_scale, x.shape, axis, block_size)
    y = dx * _float_of(scale).astype(work, copy=False)
    return y.astype(out_dt, copy=False)


@cpu_kernel("DynamicQuantizeLinear", since=11, multi_output=True)
def DynamicQuantizeLinear(x):
    """ONNX DynamicQuantizeLinear (opset 11): uint8 ``y``, float32 scalar ``y_scale``
    ``(max(0, max x) - min(0, min x)) / 255`` and uint8 scalar ``y_zero_point``."""
    xf = x.astype(np.float32, copy=False)
    hi = np.float32(max(0.0, float(xf.max()))) if xf.size else np.float32(0)
    lo = np.float32(min(0.0, float(xf.min()))) if xf.size else np.float32(0)
    scale = np.float32((hi - lo) if hi != lo else 1.0) / np.float32(255)
    zp = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    y = np.clip(np.rint(xf / scale) + zp, 0, 255).astype(np.uint8)
    return y, np.asarray(scale, dtype=np.float32), np.asarray(zp).astype(np.uint8)
