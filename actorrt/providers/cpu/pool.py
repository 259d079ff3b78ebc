"""Pooling: AveragePool, MaxPool, LpPool, their Global forms, MaxUnpool, MaxRoiPool
and RoiAlign (ONNX spec, every since-version up to opset 28).

Layout ``(N, C, D1, ..., Dn)``. Windows are reduced with one vectorised
operation per kernel tap; float16/bfloat16 sums accumulate in float32. 2-D
float32 MaxPool (without Indices) and AveragePool with dilation 1, column
stride 1-2 on wide planes run first as a vertical then a horizontal vector
pass per output row (:mod:`._pool_rows`, :func:`._pool_rows.applies`). 2-D
float32/float64 stride-1 MaxPool (without Indices) and AveragePool at strides
up to 2 run as tap reductions over the flattened, padded planes
(:mod:`._pool_flat`); the others and GlobalAveragePool run compiled and
parallel over the planes (:mod:`._pool_numba`) when numba is installed and
:data:`COMPILED` is set; the numpy paths stay the fallback.
Strided 2-D float32 MaxPool (without Indices) runs as ``maxnum`` vector tiles
(:mod:`._pool_direct`, inputs up to :data:`._pool_direct.MAX_ELEMENTS`: no
limit by default), bit-equal to the numpy tap path. 2-D float32/float64
AveragePool that the flat kernel does not take, with output planes of
:data:`AVG_DEPTHWISE_MIN_PIXELS` or more, runs as the compiled depthwise
convolution with all-ones weights and a count division (:data:`AVG_DEPTHWISE`);
one unpadded window over the whole plane as the plane mean.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from ... import tracing
from .._contract import Kernel, require
from ._conv_util import compute_dtype, conv_geometry, decode_str, pad_spatial, spatial_params, \
    tap_slices
from .registry import cpu_kernel

#: use the compiled 2-D pooling (:mod:`._pool_numba`) when numba is there
COMPILED = True


def _compiled(x) -> object | None:
    """The compiled pooling module when it applies to ``x`` (4-D float32 /
    float64 with numba installed), else ``None``."""
    if not COMPILED or x.dtype not in (np.float32, np.float64):
        return None
    from . import _pool_numba
    return _pool_numba if _pool_numba.HAVE_NUMBA else None


def _window_setup(shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    """(kernel, strides, dilations, out, pads_begin, pads_end_padded, pads_end_declared)
    of a window over an input of ``shape`` ``(N, C, D1, ...)``."""
    nd = len(shape) - 2
    if not kernel_shape:
        raise ValueError("pooling needs kernel_shape")
    kernel, strides, dil, pb, pe = spatial_params(nd, kernel_shape, strides, dilations, pads)
    auto_pad = decode_str(auto_pad, "NOTSET")
    out, pb2, pe2 = conv_geometry(shape[2:], kernel, strides, dil, pb, pe, auto_pad,
                                  bool(ceil_mode) and auto_pad == "NOTSET")
    pe_decl = pe if auto_pad == "NOTSET" else pe2
    if auto_pad == "VALID":
        pe_decl = (0,) * nd
    return kernel, strides, dil, out, pb2, pe2, pe_decl


def _tap_positions(o: int, s: int, pb: int, k: int, d: int) -> np.ndarray:
    """Input positions ``(out, k)`` read along one axis."""
    return np.arange(o)[:, None] * s - pb + np.arange(k)[None, :] * d


def _outer(vectors):
    """Outer product of per-axis vectors as an array of shape ``(len(v0), len(v1), ...)``."""
    res = np.ones((), dtype=np.float64)
    for v in vectors:
        res = np.multiply.outer(res, v)
    return res


def _sum_taps(xp, kernel, out, strides, dil, fn=None):
    acc = None
    for _, _, sl in tap_slices(kernel, out, strides, dil):
        v = xp[(Ellipsis, *sl)]
        if fn is not None:
            v = fn(v)
        acc = v.copy() if acc is None else np.add(acc, v, out=acc)
    return acc


#: 2-D float32/float64 AveragePool as the compiled depthwise convolution
#: (:func:`._conv_numba.depthwise2d`: vectorized tap sums over the flat
#: zero-padded plane) with all-ones weights, then one division pass by the
#: window counts; 6-13x faster than :mod:`._pool_numba`'s per-element loop on
#: the inception / densenet pools (round 8). Off: that loop.
AVG_DEPTHWISE = True
#: ... for output planes of at least this many pixels: the depthwise kernel's
#: per-plane cost (row copies into its padded plane, the tile setup) lost on
#: small ones (bench_pool_layers, CPU time: 7x7 -> 1x1 343 vs 172 us, 14x14 2x2/2
#: -> 7x7 251 vs 185; 14x14 3x3 -> 14x14 230 vs 552, 56x56 2x2/2 291 vs 323)
AVG_DEPTHWISE_MIN_PIXELS = 64
_ONES: dict = {}


def _avg_depthwise(x, kernel, strides, dil, pb, out, count_h, count_w):
    """``AveragePool`` of 4-D float ``x`` by the depthwise kernel, or None
    where that kernel is not there (numba missing, no vector tiles) or the
    output plane is under :data:`AVG_DEPTHWISE_MIN_PIXELS`."""
    from . import _conv_numba as cn, _conv_util as cu
    if not (cn.HAVE_NUMBA and cu.COMPILED and cn.DW_TILE) or \
            out[0] * out[1] < AVG_DEPTHWISE_MIN_PIXELS:
        return None
    key = (x.shape[1], tuple(kernel), x.dtype)
    w = _ONES.get(key)
    if w is None:
        if len(_ONES) >= 64:
            _ONES.clear()
        w = _ONES[key] = np.ones((x.shape[1], 1, *kernel), x.dtype)
    y = cn.depthwise2d(x, w, strides, dil, pb, out)
    div = np.multiply.outer(np.asarray(count_h, x.dtype), np.asarray(count_w, x.dtype))
    np.divide(y, div, out=y)
    return y


def _key(v):
    return None if v is None else tuple(int(i) for i in v)


#: :func:`_window_setup` cached on hashable arguments (shape, int tuples or None)
_window_cached = functools.lru_cache(maxsize=256)(_window_setup)


@functools.lru_cache(maxsize=256)
def _avg_geometry(shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode,
                  count_include_pad):
    """AveragePool's ``(kernel, strides, dilations, out, pads_begin, pads_end,
    (count per output position along each axis, ...))`` for an input of
    ``shape`` (cached: the numpy geometry cost ~14 us a call)."""
    kernel, strides, dil, out, pb, pe, pe_decl = _window_setup(
        shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    counts = []
    for i, n in enumerate(shape[2:]):
        pos = _tap_positions(out[i], strides[i], pb[i], kernel[i], dil[i])
        lo, hi = (-pb[i], n + pe_decl[i]) if count_include_pad else (0, n)
        c = ((pos >= lo) & (pos < hi)).sum(axis=1)
        c.flags.writeable = False
        counts.append(c)
    return kernel, strides, dil, out, pb, pe, tuple(counts)


@cpu_kernel("AveragePool", since=(1, 7, 10, 11, 19, 22))
def AveragePool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                kernel_shape=None, pads=None, strides=None):
    """ONNX AveragePool (opsets 1-22): (N, C, *D) -> (N, C, *out); the divisor counts
    pads only with count_include_pad=1 and never the ceil-mode overhang."""
    kernel, strides, dil, out, pb, pe, counts = _avg_geometry(
        x.shape, _key(kernel_shape), _key(strides), _key(dilations), _key(pads),
        auto_pad if isinstance(auto_pad, str) else bytes(auto_pad), int(ceil_mode),
        bool(count_include_pad))
    cd = compute_dtype(x.dtype)
    pn = _compiled(x) if x.ndim == 4 else None
    if pn is not None and tuple(out) == (1, 1) and tuple(kernel) == x.shape[2:] \
            and not any(pb) and tuple(dil) == (1, 1):
        # one window that is the whole unpadded plane (a GlobalAveragePool as
        # Caffe2 / inception export it): the vectorized plane mean
        tracing.kernel_variant("pool", "global", "kernel=%s", kernel)
        return pn.global_avgpool(x.reshape(x.shape[0], x.shape[1], -1)).reshape(
            x.shape[0], x.shape[1], 1, 1)
    if pn is not None:
        y = _rows(x, kernel, strides, dil, pb, out, counts)
        if y is None:
            y = _blocked(x, kernel, strides, dil, pb, out, False, counts)
        if y is None:
            y = _flat(x, kernel, strides, dil, pb, out, False, counts)
        if y is not None:
            return y
        if AVG_DEPTHWISE:
            y = _avg_depthwise(x, kernel, strides, dil, pb, out, counts[0], counts[1])
            if y is not None:
                tracing.kernel_variant("pool", "depthwise", "kernel=%s", kernel)
                return y
        tracing.kernel_variant("pool", "compiled", "kernel=%s", kernel)
        return pn.avgpool2d(x, kernel, strides, dil, pb, out, counts[0], counts[1])
    xp = pad_spatial(x.astype(cd, copy=False), pb, pe, 0)
    acc = _sum_taps(xp, kernel, out, strides, dil)
    acc /= _outer(counts).astype(cd)
    return acc.astype(x.dtype, copy=False)


@cpu_kernel("LpPool", since=(1, 2, 11, 18, 22))
def LpPool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2,
           pads=None, strides=None):
    """ONNX LpPool (opsets 1-22): (sum over the window of |x|^p)^(1/p); pads add zero."""
    kernel, strides, dil, out, pb, pe, _ = _window_setup(
        x.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    cd = compute_dtype(x.dtype)
    xp = pad_spatial(x.astype(cd, copy=False), pb, pe, 0)
    p = float(p)
    fn = (lambda v: v * v) if p == 2 else (lambda v: np.abs(v) ** p)
    acc = _sum_taps(xp, kernel, out, strides, dil, fn)
    res = np.sqrt(acc) if p == 2 else acc ** (1.0 / p)
    return res.astype(x.dtype, copy=False)


#: plans of :mod:`._pool_flat` per (shape, dtype, window, strides), shared by
#: every node and session (geometry only: a call makes its own group buffers)
_FLAT_PLANS: dict = {}
#: ... at most this many (the oldest dropped first)
FLAT_PLANS_MAX = 16
_FLAT_LOCK = threading.Lock()


#: plans of :mod:`._pool_rows` per (shape, window, strides, pads, counts),
#: shared by every node and session (at most :data:`FLAT_PLANS_MAX`)
_ROW_PLANS: dict = {}


def _rows(x, kernel, strides, dil, pb, out, counts):
    """2-D pooling of 4-D float32 ``x`` by :mod:`._pool_rows` (a vertical,
    then a horizontal pass over each output row), or None where that kernel
    does not apply (:func:`._pool_rows.applies`). ``counts``: AveragePool's
    ``(count_h, count_w)``; None for MaxPool."""
    if x.ndim != 4 or len(kernel) != 2:
        return None
    from . import _pool_rows
    if not _pool_rows.applies(x, kernel, strides, dil, counts is None):
        return None
    plan = _row_plan(x.shape, kernel, strides, pb, out, counts)
    from ._threads import current
    tracing.kernel_variant("pool", "rows", "kernel=%s", kernel)
    return _pool_rows.pool2d(plan, x, current())


def _row_plan(shape, kernel, strides, pb, out, counts):
    """The shared :mod:`._pool_rows` plan of these shapes and window."""
    from . import _pool_rows
    key = (shape, tuple(kernel), tuple(strides), tuple(pb), tuple(out),
           None if counts is None else (counts[0].tobytes(), counts[1].tobytes()))
    with _FLAT_LOCK:
        plan = _ROW_PLANS.get(key)
        if plan is None:
            if len(_ROW_PLANS) >= FLAT_PLANS_MAX:
                _ROW_PLANS.pop(next(iter(_ROW_PLANS)))
            plan = _ROW_PLANS[key] = _pool_rows.make_plan(shape, kernel, strides, pb, out,
                                                          counts)
    return plan


def _blocked(x, kernel, strides, dil, pb, out, is_max, counts):
    """2-D pooling of 4-D float32 ``x`` in 16-channel blocks
    (:mod:`._dw_blocked`: small and mid-sized planes), or None where that
    kernel does not apply. ``counts``: AveragePool's ``(count_h, count_w)``;
    None for MaxPool."""
    from . import _dw_blocked
    if x.ndim != 4 or x.dtype != np.float32 or not _dw_blocked.pool_applies(x.shape, out):
        return None
    from . import _conv_split
    threads = 1
    if x.shape[0] * x.shape[1] * out[0] * out[1] * kernel[0] * kernel[1] >= \
            _conv_split.MIN_POOL_WORK:
        from ._threads import current
        threads = current()
    tracing.kernel_variant("pool", "blocked", "kernel=%s", kernel)
    return _dw_blocked.pool(x, is_max, kernel, strides, dil, pb, out, counts, threads)


def _flat(x, kernel, strides, dil, pb, out, is_max, counts):
    """2-D pooling of 4-D float ``x`` on :mod:`._pool_flat` (MaxPool at stride
    1, AveragePool at strides up to 2), or None where it does not apply (other
    strides, dtypes or ranks, numba missing).
    ``counts``: AveragePool's ``(count_h, count_w)``; None for MaxPool."""
    if not COMPILED or x.ndim != 4:
        return None
    if is_max and tuple(strides) != (1, 1):
        return None  # strided MaxPool: the direct kernel (_pool_direct) was faster
    from . import _pool_flat
    if not _pool_flat.applies(x, strides):
        return None
    key = (x.shape, x.dtype, tuple(kernel), tuple(strides), tuple(dil), tuple(pb), tuple(out),
           is_max, None if counts is None else (counts[0].tobytes(), counts[1].tobytes()))
    with _FLAT_LOCK:  # sessions on several threads share the plans
        plan = _FLAT_PLANS.get(key)
        if plan is None:
            if len(_FLAT_PLANS) >= FLAT_PLANS_MAX:
                _FLAT_PLANS.pop(next(iter(_FLAT_PLANS)))
            plan = _FLAT_PLANS[key] = _pool_flat.make_plan(
                x, kernel, strides, dil, pb, out, is_max,
                *(counts if counts is not None else (None, None)))
    tracing.kernel_variant("pool", "flat", "kernel=%s", kernel)
    return _pool_flat.pool2d(plan, x)


def _lowest(dtype):
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return -np.inf


#: 2-D MaxPool (no Indices) of at least this many output elements times taps
#: runs separably in numpy (:func:`_max_separable`) on the calling thread
#: instead of the compiled tap loop, unless that loop would be split across
#: several intra-op threads. The compiled loop's row max does not vectorize
#: (numba 0.61); ``np.fmax`` over whole rows does: 1-7x faster from this size
#: on the bench shapes (squeezenet, resnet50 stems), slower below (round 4)
SEPARABLE_MAX_MIN_WORK = 1 << 17


def _separable_max_pays(nc, kernel, out) -> bool:
    from . import _conv_numba
    work = math.prod(nc) * math.prod(out) * math.prod(kernel)
    return work >= SEPARABLE_MAX_MIN_WORK and not _conv_numba.parallel_for(work)


def _max_separable(x, kernel, strides, dil, out, pb, pe) -> np.ndarray:
    """2-D max pooling as a max over the window's rows (``kh`` passes over
    whole rows), then over its columns (``kw`` strided passes), of float
    ``x (N, C, H, W)`` -> ``(N, C, OH, OW)``. Exact (max in any order).
    ``np.fmax`` skips NaN where the window has a number; an all-NaN window
    gives NaN (as the numpy tap path; the compiled loop gives ``-inf``), a
    window wholly in the padding ``-inf``."""
    xp = pad_spatial(x, pb, pe, _lowest(x.dtype))
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, strides, dil, out
    v = xp[:, :, 0:(oh - 1) * sh + 1:sh].copy()
    for i in range(1, kh):
        np.fmax(v, xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh], out=v)
    y = v[..., 0:(ow - 1) * sw + 1:sw].copy()
    for j in range(1, kw):
        np.fmax(y, v[..., j * dw:j * dw + (ow - 1) * sw + 1:sw], out=y)
    return y


@cpu_kernel("MaxPool", since=(1, 8, 10, 11, 12, 22))
class MaxPool(Kernel):
    """ONNX MaxPool (opsets 1-22): (N, C, *D) -> Y (N, C, *out) and optional int64
    Indices into the flattened input (row-major, or column-major spatial axes with
    storage_order=1)."""

    multi_output = True

    @classmethod
    def check(cls, node):
        require(node.attr("kernel_shape"), "MaxPool needs kernel_shape")
        require(int(node.attr("storage_order", 0)) in (0, 1), "MaxPool: storage_order must be 0/1")

    def run(self, x):
        rows = self.__dict__.get("_row_plans")
        if rows:  # a shape the row kernel took before: its plan
            plan = rows.get(x.shape)
            if plan is not None and x.dtype == np.float32 and COMPILED and \
                    self.node.num_outputs == 1:
                from . import _pool_rows
                if _pool_rows.ENABLED:
                    from ._threads import current
                    tracing.kernel_variant("pool", "rows", "kernel=%s", plan.args[5:7])
                    return (_pool_rows.pool2d(plan, x, current()),)
        a = self.node.attr
        auto_pad = a("auto_pad", "NOTSET")
        kernel, strides, dil, out, pb, pe, _ = _window_cached(
            x.shape, _key(a("kernel_shape")), _key(a("strides")), _key(a("dilations")),
            _key(a("pads")), auto_pad if isinstance(auto_pad, str) else bytes(auto_pad),
            int(a("ceil_mode", 0)))
        want_idx = self.node.num_outputs > 1 and self.node.outputs[1] != ""
        if COMPILED and not want_idx:
            y = _rows(x, kernel, strides, dil, pb, out, None)
            if y is not None and self.node.num_outputs == 1:
                rows = self.__dict__.setdefault("_row_plans", {})
                if len(rows) >= 64:
                    rows.clear()
                rows[x.shape] = _row_plan(x.shape, kernel, strides, pb, out, None)
            if y is None:
                y = _blocked(x, kernel, strides, dil, pb, out, True, None)
            if y is None:
                y = _flat(x, kernel, strides, dil, pb, out, True, None)
            if y is not None:
                return (y,)
        if COMPILED and x.ndim == 4 and x.dtype == np.float32 and not want_idx:
            from . import _pool_direct
            if _pool_direct.applies(x, want_idx):
                plan = self._plan(x.shape, lambda: _pool_direct.make_plan(
                    x.shape, kernel, strides, dil, pb, out))
                tracing.kernel_variant("pool", "direct", "kernel=%s", kernel)
                free = self._plan(("bufs", x.shape), list)  # -inf buffers to reuse
                try:
                    buf = free.pop()
                except IndexError:
                    buf = _pool_direct.new_buffer(plan)
                y = _pool_direct.maxpool2d(plan, x, buf)
                free.append(buf)
                return (y,)
        pn = _compiled(x) if x.ndim == 4 and not want_idx else None
        if pn is not None:
            if _separable_max_pays(x.shape[:2], kernel, out):
                tracing.kernel_variant("pool", "separable", "kernel=%s", kernel)
                return (_max_separable(x, kernel, strides, dil, out, pb, pe),)
            tracing.kernel_variant("pool", "compiled", "kernel=%s", kernel)
            return (pn.maxpool2d(x, kernel, strides, dil, pb, out),)
        xp = pad_spatial(x, pb, pe, _lowest(x.dtype))
        sp = x.shape[2:]
        padded = any(pb) or any(pe)
        y = best = have = None
        for kk, t, sl in tap_slices(kernel, out, strides, dil):
            v = xp[(Ellipsis, *sl)]
            if y is None:
                y = v.copy()
                if want_idx:
                    best = np.zeros(y.shape, dtype=np.int64)
                    have = self._valid(kk, out, strides, pb, dil, sp) if padded else None
                continue
            if not want_idx:
                np.fmax(y, v, out=y)  # NaN skipped where a number is, as onnxruntime
                continue
            better = v > y
            if padded:
                valid = self._valid(kk, out, strides, pb, dil, sp)
                better = (better | ~have) & valid
                have = have | valid
            np.copyto(y, v, where=better)
            best[better] = t
        tracing.kernel_variant("pool", "taps", "kernel=%s", kernel)
        if not want_idx:
            return (y,)
        return y, self._indices(best, x.shape, kernel, out, strides, pb, dil)

    def _plan(self, key, make):
        """A per-input-shape plan, made once (bounded cache)."""
        cache = self.__dict__.setdefault("_plans", {})
        plan = cache.get(key)
        if plan is None:
            if len(cache) >= 64:
                cache.clear()
            plan = cache[key] = make()
        return plan

    @staticmethod
    def _valid(kk, out, strides, pb, dil, sp):
        vs = []
        for i in range(len(kk)):
            pos = np.arange(out[i]) * strides[i] - pb[i] + kk[i] * dil[i]
            vs.append((pos >= 0) & (pos < sp[i]))
        return _outer(vs).astype(bool)

    def _indices(self, best, x_shape, kernel, out, strides, pb, dil):
        n, c = x_shape[:2]
        sp = x_shape[2:]
        nd = len(sp)
        taps = np.unravel_index(best, kernel)
        col_major = int(self.node.attr("storage_order", 0)) == 1
        sstride = [1] * nd
        if col_major:
            for i in range(1, nd):
                sstride[i] = sstride[i - 1] * sp[i - 1]
        else:
            for i in range(nd - 2, -1, -1):
                sstride[i] = sstride[i + 1] * sp[i + 1]
        flat = (np.arange(n * c, dtype=np.int64) * math.prod(sp)).reshape(
            (n, c) + (1,) * nd)
        for i in range(nd):
            o = np.arange(out[i], dtype=np.int64).reshape((-1,) + (1,) * (nd - 1 - i))
            coord = o * strides[i] - pb[i] + taps[i].astype(np.int64) * dil[i]
            flat = flat + coord * sstride[i]
        return flat


@cpu_kernel("GlobalAveragePool", since=(1, 22))
def GlobalAveragePool(x):
    """ONNX GlobalAveragePool (opsets 1, 22): (N, C, *D) -> (N, C, 1, ..., 1)."""
    axes = tuple(range(2, x.ndim))
    pn = _compiled(x) if x.ndim >= 3 and x.size else None
    if pn is not None:
        y = pn.global_avgpool(x.reshape(x.shape[0], x.shape[1], -1))
        return y.reshape(x.shape[:2] + (1,) * (x.ndim - 2))
    return x.mean(axis=axes, keepdims=True, dtype=compute_dtype(x.dtype)).astype(x.dtype)


@cpu_kernel("GlobalMaxPool", since=(1, 22))
def GlobalMaxPool(x):
    """ONNX GlobalMaxPool (opsets 1, 22): (N, C, *D) -> (N, C, 1, ..., 1)."""
    return np.asarray(x.max(axis=tuple(range(2, x.ndim)), keepdims=True))


@cpu_kernel("GlobalLpPool", since=(1, 2, 22))
def GlobalLpPool(x, *, p=2):
    """ONNX GlobalLpPool (opsets 1, 2, 22): (N, C, *D) -> (N, C, 1, ..., 1)."""
    xf = np.abs(x.astype(compute_dtype(x.dtype), copy=False))
    p = float(p)
    s = np.sum(xf ** p, axis=tuple(range(2, x.ndim)), keepdims=True)
    return (s ** (1.0 / p)).astype(x.dtype)


@cpu_kernel("MaxUnpool", since=(9, 11, 22))
def MaxUnpool(X, I, output_shape=None, *, kernel_shape=None, pads=None, strides=None):
    """ONNX MaxUnpool (opsets 9, 11, 22): scatter X into zeros at the flat indices I
    (as MaxPool returns them) of the inferred shape (in - 1) * stride + k - pads, then
    place that at the start of ``output_shape`` when given."""
    nd = X.ndim - 2
    kernel, strides, _, pb, pe = spatial_params(nd, kernel_shape, strides, None, pads)
    inferred = X.shape[:2] + tuple((X.shape[2 + i] - 1) * strides[i] + kernel[i] - pb[i] - pe[i]
                                   for i in range(nd))
    if I.shape != X.shape:
        raise ValueError(f"MaxUnpool: indices shape {I.shape} differs from X {X.shape}")
    out = np.zeros(math.prod(inferred), dtype=X.dtype)
    idx = I.ravel()
    if idx.size and (idx.min() < 0 or idx.max() >= out.size):
        raise ValueError(f"MaxUnpool: index out of range for unpooled shape {inferred}")
    out[idx] = X.ravel()
    out = out.reshape(inferred)
    if output_shape is None:
        return out
    shape = tuple(int(v) for v in np.asarray(output_shape).ravel())
    if len(shape) != X.ndim:
        raise ValueError(f"MaxUnpool: output_shape {shape} has the wrong rank")
    res = np.zeros(shape, dtype=X.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(shape, inferred))
    res[common] = out[common]
    return res


def _round_half_away(v):
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


@cpu_kernel("MaxRoiPool", since=(1, 22))
def MaxRoiPool(X, rois, *, pooled_shape=None, spatial_scale=1.0):
    """ONNX MaxRoiPool (opsets 1, 22): X (N, C, H, W), rois (R, 5) [batch, x1, y1, x2, y2]
    -> (R, C, ph, pw); max over each bin, 0 for an empty bin."""
    if not pooled_shape or len(pooled_shape) != 2:
        raise ValueError("MaxRoiPool needs pooled_shape of length 2")
    ph, pw = (int(v) for v in pooled_shape)
    _, c, H, W = X.shape
    out = np.zeros((rois.shape[0], c, ph, pw), dtype=X.dtype)
    hh, ww = np.arange(H), np.arange(W)
    for r in range(rois.shape[0]):  # one vectorised step per region
        roi = rois[r].astype(np.float64)
        b = int(roi[0])
        x1, y1, x2, y2 = _round_half_away(roi[1:5] * float(spatial_scale)).astype(np.int64)
        bh = max(y2 - y1 + 1, 1) / ph
        bw = max(x2 - x1 + 1, 1) / pw
        hs = np.clip(np.floor(np.arange(ph) * bh).astype(np.int64) + y1, 0, H)
        he = np.clip(np.ceil(np.arange(1, ph + 1) * bh).astype(np.int64) + y1, 0, H)
        ws = np.clip(np.floor(np.arange(pw) * bw).astype(np.int64) + x1, 0, W)
        we = np.clip(np.ceil(np.arange(1, pw + 1) * bw).astype(np.int64) + x1, 0, W)
        mh = (hh >= hs[:, None]) & (hh < he[:, None])  # (ph, H)
        mw = (ww >= ws[:, None]) & (ww < we[:, None])  # (pw, W)
        xb = X[b].astype(np.float64)
        t = np.where(mw[None, None], xb[:, :, None, :], -np.inf).max(axis=-1)  # (C, H, pw)
        t = np.where(mh[None, :, :, None], t[:, None, :, :], -np.inf).max(axis=2)  # (C, ph, pw)
        empty = (he <= hs)[:, None] | (we <= ws)[None, :]
        out[r] = np.where(empty[None], 0, t)
    return out


def _roi_axis(start, size, pooled, grid, limit):
    """Per-axis bilinear sample data for RoiAlign: (low, high, w_low, w_high) each
    ``(pooled, grid)``; samples outside ``[-1, limit]`` get zero weight."""
    bin_size = size / pooled
    pos = (start + np.arange(pooled)[:, None] * bin_size
           + (np.arange(grid)[None, :] + 0.5) * bin_size / grid)
    valid = (pos >= -1.0) & (pos <= limit)
    pos = np.maximum(pos, 0)
    low = np.floor(pos).astype(np.int64)
    edge = low >= limit - 1
    low = np.where(edge, limit - 1, low)
    high = np.where(edge, limit - 1, low + 1)
    pos = np.where(edge, low, pos)
    lw = pos - low
    return low, high, (1 - lw) * valid, lw * valid


@cpu_kernel("RoiAlign", since=(10, 16, 22))
def RoiAlign(X, rois, batch_indices, *, coordinate_transformation_mode="half_pixel", mode="avg",
             output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0, node=None):
    """ONNX RoiAlign (opsets 10, 16, 22): X (N, C, H, W), rois (R, 4) [x1, y1, x2, y2],
    batch_indices (R,) -> (R, C, output_height, output_width); avg or max of bilinear
    samples (opset 10 behaves as output_half_pixel)."""
    half_pixel = (node is None or node.opset >= 16) and \
        decode_str(coordinate_transformation_mode) == "half_pixel"
    mode = decode_str(mode)
    if mode not in ("avg", "max"):
        raise ValueError(f"RoiAlign: unknown mode {mode!r}")
    ph, pw = int(output_height), int(output_width)
    _, c, H, W = X.shape
    cd = compute_dtype(X.dtype)
    out = np.zeros((rois.shape[0], c, ph, pw), dtype=cd)
    off = 0.5 if half_pixel else 0.0
    scale = float(spatial_scale)
    for r in range(rois.shape[0]):  # one vectorised step per region
        x1, y1, x2, y2 = (float(v) * scale - off for v in rois[r, :4])
        rw, rh = x2 - x1, y2 - y1
        if not half_pixel:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        gh = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(rh / ph))
        gw = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(rw / pw))
        if gh <= 0 or gw <= 0:
            continue
        yl, yh, wyl, wyh = _roi_axis(y1, rh, ph, gh, H)
        xl, xh, wxl, wxh = _roi_axis(x1, rw, pw, gw, W)
        xb = X[int(batch_indices[r])].astype(cd, copy=False)
        if mode == "avg":
            ay = np.zeros((ph, H), dtype=cd)
            ax = np.zeros((pw, W), dtype=cd)
            rows = np.repeat(np.arange(ph), gh)
            np.add.at(ay, (rows, yl.ravel()), wyl.ravel())
            np.add.at(ay, (rows, yh.ravel()), wyh.ravel())
            cols = np.repeat(np.arange(pw), gw)
            np.add.at(ax, (cols, xl.ravel()), wxl.ravel())
            np.add.at(ax, (cols, xh.ravel()), wxh.ravel())
            out[r] = (ay @ xb @ ax.T) / max(gh * gw, 1)
        else:
            def corner(iy, ix, wy, wx):
                v = xb[:, iy[:, :, None, None], ix[None, None, :, :]]
                return v * (wy[:, :, None, None] * wx[None, None, :, :]).astype(cd)
            v = np.maximum(np.maximum(corner(yl, xl, wyl, wxl), corner(yl, xh, wyl, wxh)),
                           np.maximum(corner(yh, xl, wyh, wxl), corner(yh, xh, wyh, wxh)))
            out[r] = v.max(axis=(2, 4))
    return out.astype(X.dtype, copy=False)
