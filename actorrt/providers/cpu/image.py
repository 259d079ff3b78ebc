"""Image ops: Resize, Upsample, GridSample, AffineGrid, CenterCropPad, DepthToSpace,
SpaceToDepth and ImageDecoder (ONNX spec, every since-version up to opset 28).

Resize is separable: each resized axis is one gather per interpolation tap
(1 nearest, 2 linear, 4 cubic, more with antialias) weighted and summed.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ... import tracing
from .._contract import Kernel, deny
from ._conv_util import compute_dtype, decode_str, reflect
from .registry import cpu_kernel

_CTMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
         "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")


def _source_coords(ctm, out_len, in_len, scale, roi):
    """Input coordinate of every output index along one axis (float64), and the
    out-of-range mask for tf_crop_and_resize (else ``None``)."""
    y = np.arange(out_len, dtype=np.float64)
    out_w = scale * in_len  # the real-valued output length
    if ctm == "align_corners":
        x = np.zeros(out_len) if out_w == 1 else y * (in_len - 1) / (out_w - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    elif ctm == "tf_crop_and_resize":
        start, end = roi
        if out_w == 1:
            x = np.full(out_len, (end - start) * (in_len - 1) / 2)
        else:
            x = y * (end - start) * (in_len - 1) / (out_w - 1)
        x = x + start * (in_len - 1)
        return x, (x < 0) | (x > in_len - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(out_len, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_w)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"Resize: unknown coordinate_transformation_mode {ctm!r}")
    return x, None


def _nearest_index(x, nearest_mode, in_len, downsample):
    frac = x - np.floor(x)
    if nearest_mode == "round_prefer_floor":
        idx = np.where(frac <= 0.5, np.floor(x), np.ceil(x))
    elif nearest_mode == "round_prefer_ceil":
        idx = np.where(frac < 0.5, np.floor(x), np.ceil(x))
    elif nearest_mode == "floor":
        idx = np.floor(x)
    elif nearest_mode == "ceil":
        idx = np.ceil(x)
    elif nearest_mode == "simple":  # Resize-10 / Upsample (onnxruntime's rule)
        idx = np.ceil(x) if downsample else np.floor(x)
    else:
        raise ValueError(f"Resize: unknown nearest_mode {nearest_mode!r}")
    return np.clip(idx, 0, in_len - 1).astype(np.intp)


def _kernel_weights(x, mode, scale, in_len, cubic_a, antialias, exclude_outside):
    """Indices and weights ``(out, taps)`` for linear / cubic interpolation."""
    x0 = np.ceil(x) - 1  # the neighbour left of x (x itself counts as right)
    r = x - x0
    s = min(scale, 1.0) if antialias else 1.0
    reach = 1.0 if mode == "linear" else 2.0
    start = int(math.floor(-reach / s) + 1) if antialias else (0 if mode == "linear" else -1)
    taps = np.arange(start, 2 - start)
    d = np.abs((taps[None, :] - r[:, None]) * s)
    if mode == "linear":
        w = np.clip(1 - d, 0, 1)
    else:
        a = cubic_a
        w = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                     np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    idx = x0[:, None].astype(np.int64) + taps[None, :]
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        tot = w.sum(axis=1, keepdims=True)
        w = w / np.where(tot == 0, 1.0, tot)
    return np.clip(idx, 0, in_len - 1).astype(np.intp), w


def _resize(X, scales, sizes, roi, *, mode, ctm, nearest_mode, cubic_a=-0.75,
            exclude_outside=False, antialias=False, extrapolation_value=0.0):
    """Resize every axis of ``X`` with full-rank ``scales`` (floats) and ``sizes``
    (ints) and ``roi`` ``[(start, end)] * rank``."""
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"Resize: unknown mode {mode!r}")
    data = X
    out_dtype = X.dtype
    if mode != "nearest":
        data = X.astype(compute_dtype(X.dtype) if X.dtype.kind not in "iub" else np.float64)
    for axis in range(X.ndim):
        in_len, out_len, scale = X.shape[axis], int(sizes[axis]), float(scales[axis])
        if math.isclose(scale, 1.0) and out_len == in_len and \
                math.isclose(roi[axis][0], 0.0) and math.isclose(roi[axis][1], 1.0):
            continue
        if out_len < 0:
            raise ValueError(f"Resize: negative output size {out_len} on axis {axis}")
        x, extrap = _source_coords(ctm, out_len, in_len, scale, roi[axis])
        bshape = (-1,) + (1,) * (X.ndim - axis - 1)
        if mode == "nearest":
            idx = _nearest_index(x, nearest_mode, in_len, scale < 1)
            data = np.take(data, idx, axis=axis)
        else:
            idx, w = _kernel_weights(x, mode, scale, in_len, cubic_a, antialias,
                                     exclude_outside)
            w = w.astype(data.dtype)
            acc = None
            for t in range(idx.shape[1]):
                term = np.take(data, idx[:, t], axis=axis) * w[:, t].reshape(bshape)
                acc = term if acc is None else np.add(acc, term, out=acc)
            data = acc
        if extrap is not None and extrap.any():
            ev = np.asarray(extrapolation_value, dtype=np.float64)
            if data.dtype.kind in "iu":
                info = np.iinfo(data.dtype)
                ev = np.clip(np.rint(ev), info.min, info.max)
            data = np.where(extrap.reshape(bshape), ev.astype(data.dtype), data)
    if data.dtype != out_dtype:
        if out_dtype.kind in "iu":
            info = np.iinfo(out_dtype)
            data = np.clip(np.rint(data), info.min, info.max)
        data = data.astype(out_dtype)
    return data if data is not X else X.copy()


def _opt(a):
    """An optional tensor input as a 1-D float64/int array, ``None`` when absent or empty."""
    if a is None:
        return None
    a = np.asarray(a).ravel()
    return a if a.size else None


@cpu_kernel("Resize", since=(10, 11, 13, 18, 19))
def Resize(X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor", node=None):
    """ONNX Resize (opsets 10-19): nearest / linear / cubic over any axes, every
    coordinate_transformation_mode, antialias, axes and keep_aspect_ratio_policy;
    output size floor(in * scale) or ``sizes``."""
    opset = node.opset if node is not None else 19
    mode = decode_str(mode)
    ctm = decode_str(coordinate_transformation_mode)
    nearest_mode = decode_str(nearest_mode)
    if opset < 11:  # Resize-10: (X, scales), asymmetric, Upsample's nearest rule
        scales, roi, sizes = roi, None, None
        ctm, nearest_mode = "asymmetric", "simple"
    r = X.ndim
    ax = list(range(r)) if not axes else [int(a) % r for a in axes]
    roi, scales, sizes = _opt(roi), _opt(scales), _opt(sizes)
    full_roi = [(0.0, 1.0)] * r
    if roi is not None and ctm == "tf_crop_and_resize":
        k = len(roi) // 2
        if k != len(ax):
            raise ValueError(f"Resize: roi has {len(roi)} values for {len(ax)} axes")
        for i, a in enumerate(ax):
            full_roi[a] = (float(roi[i]), float(roi[k + i]))
    full_scale = [1.0] * r
    full_size = list(X.shape)
    if scales is not None:
        if len(scales) != len(ax):
            raise ValueError(f"Resize: {len(scales)} scales for {len(ax)} axes")
        for i, a in enumerate(ax):
            full_scale[a] = float(scales[i])
            full_size[a] = int(np.float64(scales[i]) * X.shape[a])
    elif sizes is not None:
        if len(sizes) != len(ax):
            raise ValueError(f"Resize: {len(sizes)} sizes for {len(ax)} axes")
        for i, a in enumerate(ax):
            full_size[a] = int(sizes[i])
            full_scale[a] = int(sizes[i]) / X.shape[a]
        policy = decode_str(keep_aspect_ratio_policy)
        if policy != "stretch":
            pick = {"not_larger": min, "not_smaller": max}.get(policy)
            if pick is None:
                raise ValueError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
            s = pick(full_scale[a] for a in ax)
            for a in ax:
                full_scale[a] = s
                full_size[a] = int(s * X.shape[a] + 0.5)
    else:
        raise ValueError("Resize needs scales or sizes")
    if antialias and mode == "nearest":
        raise ValueError("Resize: antialias is not defined for mode 'nearest'")
    tracing.kernel_variant("resize", mode, "coordinate_transformation_mode=%s", ctm)
    return _resize(X, full_scale, full_size, full_roi, mode=mode, ctm=ctm,
                   nearest_mode=nearest_mode, cubic_a=float(cubic_coeff_a),
                   exclude_outside=bool(exclude_outside), antialias=bool(antialias),
                   extrapolation_value=float(extrapolation_value))


@cpu_kernel("Upsample", since=(1, 7, 9, 10))
def Upsample(X, scales=None, *, mode="nearest", height_scale=None, width_scale=None,
             node=None):
    """ONNX Upsample (opsets 1, 7, 9, 10): nearest (floor) or (bi)linear, asymmetric
    coordinates, output floor(in * scale). Scales: attributes before opset 9."""
    opset = node.opset if node is not None else 10
    if opset < 7:
        sc = [1.0, 1.0, float(height_scale), float(width_scale)]
    elif opset < 9:
        sc = [float(s) for s in node.attr("scales")]
    else:
        sc = [float(s) for s in np.asarray(scales).ravel()]
    if len(sc) != X.ndim:
        raise ValueError(f"Upsample: {len(sc)} scales for rank {X.ndim}")
    mode = decode_str(mode)
    mode = "linear" if mode == "bilinear" else mode
    sizes = [int(np.float64(np.float32(s)) * n) for s, n in zip(sc, X.shape)]
    return _resize(X, sc, sizes, [(0.0, 1.0)] * X.ndim, mode=mode, ctm="asymmetric",
                   nearest_mode="simple")


def _cubic_coeffs(t, a=-0.75):
    return [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]


@cpu_kernel("GridSample", since=(16, 20, 22))
def GridSample(X, grid, *, align_corners=0, mode=None, padding_mode="zeros", node=None):
    """ONNX GridSample (opsets 16, 20, 22): X (N, C, *D), grid (N, *out, n) with
    (x, y, ...) in [-1, 1] -> (N, C, *out); nearest / (bi)linear / (bi)cubic,
    zeros / border / reflection padding, any spatial rank."""
    mode = decode_str(mode, "bilinear" if node is not None and node.opset < 20 else "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding_mode = decode_str(padding_mode)
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"GridSample: unknown mode {mode!r}")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"GridSample: unknown padding_mode {padding_mode!r}")
    n, c = X.shape[:2]
    sp = X.shape[2:]
    nd = len(sp)
    if grid.shape[0] != n or grid.shape[-1] != nd:
        raise ValueError(f"GridSample: grid {grid.shape} does not fit input {X.shape}")
    out_sp = grid.shape[1:-1]
    P = math.prod(out_sp)
    gdt = np.float64 if grid.dtype == np.float64 else np.float32
    g = grid.astype(gdt).reshape(n, P, nd)
    taps = []  # per spatial axis: list of (index array, weight array or None, valid or None)
    for i in range(nd):
        size = sp[i]
        v = g[:, :, nd - 1 - i]
        x = (v + 1) / 2 * (size - 1) if align_corners else ((v + 1) * size - 1) / 2
        lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        if mode == "nearest":
            x = np.rint(x)
        if padding_mode == "border":
            x = np.where((x < lo) | (x > hi), np.clip(x, 0, size - 1), x)
        elif padding_mode == "reflection":
            x = reflect(x, lo, hi)
        if mode == "nearest":
            cand = [(x, None)]
        else:
            x0 = np.floor(x)
            t = x - x0
            if mode == "linear":
                cand = [(x0, 1 - t), (x0 + 1, t)]
            else:
                cand = list(zip((x0 - 1, x0, x0 + 1, x0 + 2), _cubic_coeffs(t)))
        axis_taps = []
        for idx, w in cand:
            valid = None
            if padding_mode == "zeros":
                valid = (idx >= 0) & (idx < size)
            elif padding_mode == "reflection":
                idx = reflect(idx, lo, hi)
            idx = np.clip(np.trunc(idx), 0, size - 1).astype(np.intp)
            axis_taps.append((idx, w, valid))
        taps.append(axis_taps)
    strides = [math.prod(sp[i + 1:]) for i in range(nd)]
    xf = X.reshape(n, c, -1)
    if mode != "nearest":
        xf = xf.astype(compute_dtype(X.dtype) if X.dtype.kind == "f" or X.dtype.kind == "V"
                       else np.float64)
    acc = None
    for combo in itertools.product(*taps):
        flat = sum(idx * st for (idx, _, _), st in zip(combo, strides))
        vals = np.take_along_axis(xf, flat[:, None, :], axis=2)
        w = None
        for _, wi, valid in combo:
            if wi is not None:
                w = wi if w is None else w * wi
            if valid is not None:
                w = valid if w is None else w * valid
        if w is not None:
            vals = vals * w[:, None, :].astype(vals.dtype)
        acc = vals if acc is None else acc + vals
    tracing.kernel_variant("gridsample", mode, "padding_mode=%s", padding_mode)
    return acc.reshape(n, c, *out_sp).astype(X.dtype)


@cpu_kernel("AffineGrid", since=20)
def AffineGrid(theta, size, *, align_corners=0):
    """ONNX AffineGrid (opset 20): theta (N, 2, 3) / (N, 3, 4), size (N, C, H, W) /
    (N, C, D, H, W) -> grid (N, H, W, 2) / (N, D, H, W, 3), (x, y[, z]) order."""
    dims = [int(v) for v in np.asarray(size).ravel()]
    sp = dims[2:]
    nd = len(sp)
    if theta.shape[1:] != (nd, nd + 1):
        raise ValueError(f"AffineGrid: theta {theta.shape} does not fit size {dims}")
    bases = []
    for d in sp:
        if align_corners:
            bases.append(np.linspace(-1.0, 1.0, d) if d > 1 else np.full(d, -1.0))
        else:
            bases.append((np.arange(d) * 2.0 + 1) / d - 1)
    mesh = np.meshgrid(*bases, indexing="ij")
    homo = np.stack([*mesh[::-1], np.ones(sp)], axis=-1).reshape(-1, nd + 1)
    out = np.matmul(homo[None], np.swapaxes(theta.astype(np.float64), 1, 2))
    return out.reshape(dims[0], *sp, nd).astype(theta.dtype)


@cpu_kernel("CenterCropPad", since=18)
def CenterCropPad(input_data, shape, *, axes=None):
    """ONNX CenterCropPad (opset 18): centre-crop or zero-pad ``axes`` to ``shape``
    (the odd element goes to the end)."""
    r = input_data.ndim
    ax = list(range(r)) if axes is None else [int(a) % r for a in axes]
    target = [int(v) for v in np.asarray(shape).ravel()]
    if len(target) != len(ax):
        raise ValueError(f"CenterCropPad: {len(target)} sizes for {len(ax)} axes")
    src = [slice(None)] * r
    dst = [slice(None)] * r
    new_shape = list(input_data.shape)
    for a, t in zip(ax, target):
        dim = input_data.shape[a]
        new_shape[a] = t
        if t < dim:
            s = (dim - t) // 2
            src[a] = slice(s, s + t)
        elif t > dim:
            s = (t - dim) // 2
            dst[a] = slice(s, s + dim)
    out = np.zeros(new_shape, dtype=input_data.dtype)
    if input_data.dtype == object:
        out[...] = ""
    out[tuple(dst)] = input_data[tuple(src)]
    return out


@cpu_kernel("DepthToSpace", since=(1, 11, 13, 28))
def DepthToSpace(input, *, blocksize, mode="DCR"):
    """ONNX DepthToSpace (opsets 1-28): (N, C, H, W) -> (N, C/b^2, H*b, W*b), DCR or CRD."""
    b = int(blocksize)
    n, c, h, w = input.shape
    if c % (b * b):
        raise ValueError(f"DepthToSpace: {c} channels not divisible by blocksize^2={b * b}")
    mode = decode_str(mode)
    if mode == "DCR":
        t = input.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        t = input.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"DepthToSpace: unknown mode {mode!r}")
    return t.reshape(n, c // (b * b), h * b, w * b)


@cpu_kernel("SpaceToDepth", since=(1, 13, 28))
def SpaceToDepth(input, *, blocksize, mode="DCR"):
    """ONNX SpaceToDepth (opsets 1, 13, 28): (N, C, H, W) -> (N, C*b^2, H/b, W/b);
    mode (DCR / CRD) from opset 28."""
    b = int(blocksize)
    n, c, h, w = input.shape
    if h % b or w % b:
        raise ValueError(f"SpaceToDepth: spatial {(h, w)} not divisible by blocksize {b}")
    t = input.reshape(n, c, h // b, b, w // b, b)
    mode = decode_str(mode)
    if mode == "DCR":
        t = t.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        t = t.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"SpaceToDepth: unknown mode {mode!r}")
    return t.reshape(n, c * b * b, h // b, w // b)


@cpu_kernel("ImageDecoder", since=20)
class ImageDecoder(Kernel):
    """ONNX ImageDecoder (opset 20): declined — decoding JPEG/PNG/WebP/TIFF needs an
    image codec, and the CPU kernels are numpy only."""

    @classmethod
    def check(cls, node):
        deny("ImageDecoder needs an image codec (JPEG/PNG/...); the numpy-only CPU "
             "provider cannot decode images — decode before the model instead")

    def run(self, encoded_stream):  # pragma: no cover - check() declines every node
        raise RuntimeError("ImageDecoder is declined at plan time on the CPU provider")
