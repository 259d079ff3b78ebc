"""Convolutions: Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv,
CausalConvWithState and Col2Im (ONNX spec, every since-version up to opset 28).

Layout ``(N, C, D1, ..., Dn)``; weights ``(M, C/group, k1, ..., kn)`` (Conv) or
``(C, M/group, k1, ..., kn)`` (ConvTranspose). Float16/bfloat16 accumulate in
float32; the integer convolutions accumulate exactly in float64 GEMMs.
Float32 2-D Conv / FusedConv that :func:`._conv_direct.applies` to (not
depthwise; on AVX2 hosts small channel counts and not 1x1, on AVX-512 hosts
every one up to 4 MB of weights, 1x1 included) run the direct register-blocked
kernel with the epilogue in its store; 2-D depthwise convs run the compiled
depthwise kernels (rows of :mod:`._dw_rows` on wide planes, 16-channel blocks
of :mod:`._dw_blocked`, or the plane kernel of :mod:`._conv_numba`) with the
epilogue in their store; the rest go through
:func:`._conv_util.conv_core` (im2col / 1x1 GEMM on OpenBLAS). A shape seen
before with a constant weight goes straight to its kernel through the call
kept by :mod:`._conv_prepared`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ... import tracing
from ..._dtypes import to_numpy_dtype
from .._contract import Kernel, NodeSpec, WorkspaceRequest, require
from . import _conv_prepared as _prep, _epilogue
from ._conv_util import (compute_dtype, conv_core, conv_workspace, conv_geometry, decode_str, scatter_taps,
                         spatial_params)
from .registry import cpu_kernel

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _check_conv_attrs(node: NodeSpec) -> None:
    auto_pad = decode_str(node.attr("auto_pad"), "NOTSET")
    require(auto_pad in _AUTO_PADS, "%s: unknown auto_pad %r", node.op_type, auto_pad)
    require(int(node.attr("group", 1)) >= 1, "%s: group must be >= 1", node.op_type)
    vt = node.input_type(0)
    require(vt is None or vt.rank is None or vt.rank >= 3,
            "%s needs an input of rank >= 3 (N, C, D1...), got rank %s", node.op_type,
            None if vt is None else vt.rank)


def _geometry(node: NodeSpec, x_shape, w_shape):
    """(kernel, strides, dilations, out_shape, pads_begin, pads_end) of a Conv-like node."""
    nd = len(x_shape) - 2
    kernel = node.attr("kernel_shape") or w_shape[2:]
    kernel, strides, dil, pb, pe = spatial_params(nd, kernel, node.attr("strides"),
                                                  node.attr("dilations"), node.attr("pads"))
    auto_pad = decode_str(node.attr("auto_pad"), "NOTSET")
    out, pb, pe = conv_geometry(x_shape[2:], kernel, strides, dil, pb, pe, auto_pad)
    return kernel, strides, dil, out, pb, pe


#: public name of :func:`_geometry` (the NCHWc ops and the layout pass)
node_geometry = _geometry


def _pack(w: np.ndarray, group: int, dtype: np.dtype) -> np.ndarray:
    """Conv weight ``(M, C/g, *k)`` -> GEMM layout ``(g, M/g, C/g * prod(k))``."""
    m = w.shape[0]
    if m % group:
        raise ValueError(f"weight has {m} output channels, not divisible by group={group}")
    return np.ascontiguousarray(w.reshape(group, m // group, -1), dtype=dtype)


def _conv_flops(node: NodeSpec) -> float:
    wt, yt = node.input_type(1), node.output_types[0] if node.output_types else None
    if wt is None or yt is None or wt.static_shape is None or yt.static_shape is None:
        return Kernel.estimate_flops(node)
    return 2.0 * math.prod(yt.static_shape) * math.prod(wt.static_shape[1:])


#: a cache marker: nothing cached / the kernel never applies to this node
_NEVER = object()
#: run a conv whose shapes were seen before through its prepared call (the
#: shape work, packed weights and bias kept; ~3 us less per node; off: the
#: full path each call, the A/B baseline)
PREPARED_CALLS = True


def _finish(y: np.ndarray, b, out_dtype) -> np.ndarray:
    if b is not None:
        y += np.asarray(b, dtype=y.dtype).reshape((1, -1) + (1,) * (y.ndim - 2))
    return y.astype(out_dtype, copy=False)


#: apply Conv / FusedConv bias, Z and Relu / LeakyRelu / Clip in one compiled
#: pass (:mod:`._epilogue_numba`) when numba is there
COMPILED_EPILOGUE = True


def _compiled_epilogue(y: np.ndarray, b, z, act: str, params=()) -> bool:
    """Apply bias ``b``, residual ``z`` and ``act`` to the fresh float32/64
    ``y`` in one compiled pass; False (nothing done) where that path does not
    apply (numba missing, another activation, dtype, shapes)."""
    if not COMPILED_EPILOGUE or y.dtype not in (np.float32, np.float64) or not y.flags.c_contiguous:
        return False
    if b is None and z is None and not act:
        return True  # nothing to apply
    from . import _epilogue_numba as en
    if not en.HAVE_NUMBA or act not in en.CODES:
        return False
    if b is not None and np.size(b) != y.shape[1]:
        return False
    if z is not None and z.shape != y.shape:
        return False
    en.bias_add_act(y, b, z, act, params)
    tracing.kernel_variant("epilogue", "compiled", "activation=%r", act)
    return True


class _PackedWeightConv(Kernel):
    """Conv-like kernels whose constant weight ``(M, C/g, *k)`` is packed once into
    the GEMM layout, shared by every instance of the node."""

    _wpack = None

    @classmethod
    def estimate_flops(cls, node):
        return _conv_flops(node)

    def prepare(self, constants, shared):
        w = constants.get(1)
        if w is not None:
            if "wpack" not in shared:
                shared["wpack"] = _pack(w, int(self.node.attr("group", 1)),
                                        compute_dtype(w.dtype))
            self._wpack = shared["wpack"]


@cpu_kernel("Conv", since=(1, 11, 22))
class Conv(_PackedWeightConv):
    """ONNX Conv (opsets 1, 11, 22): X (N, C, *D), W (M, C/group, *k), B (M,) ->
    Y (N, M, *out). A constant W is prepacked once into ``(group, M/group, C/group*K)``."""

    @classmethod
    def check(cls, node):
        _check_conv_attrs(node)

    uses_workspace = True
    #: the node's constant bias (input 2), if any: its packed form is kept
    #: with the prepared calls
    _bconst = None

    def prepare(self, constants, shared):
        super().prepare(constants, shared)
        self._bconst = constants.get(2)

    #: per-kernel caches of the shape work, keyed by input shapes (bounded)
    _CACHE_SIZE = 64

    def _cached(self, name: str, key, make):
        cache = self.__dict__.setdefault(name, {})
        v = cache.get(key)
        if v is None:
            if len(cache) >= self._CACHE_SIZE:
                cache.clear()
            v = cache[key] = make()
        return v

    def workspace(self, input_shapes):
        """Exact im2col scratch for these shapes: the padded input (when padded)
        and one chunk of the patch matrix, in the compute dtype (computed once
        per input signature)."""
        x_shape, w_shape = input_shapes[0], input_shapes[1]
        if x_shape is None or w_shape is None or len(x_shape) < 3:
            return []
        return self._cached("_ws_cache", (x_shape, w_shape),
                            lambda: self._workspace(x_shape, w_shape))

    def _workspace(self, x_shape, w_shape):
        vt = self.node.input_type(0)
        dt = to_numpy_dtype(vt.dtype) if vt is not None and vt.dtype else np.dtype(np.float32)
        from . import _conv_direct as cdr
        if dt == np.float32 and cdr.ENABLED and cdr.act_params(
                getattr(self, "_act_name", ""), getattr(self, "_act_params", ())) is not None:
            key = (tuple(x_shape), tuple(w_shape))
            if self._cached("_dplan_cache", key, lambda: self._direct_plan(*key)) is not False:
                return []  # the direct kernel allocates its own (smaller) padded copy
        kernel, _, _, out, pb, pe = _geometry(self.node, x_shape, w_shape)
        sizes = conv_workspace(x_shape, kernel, pb, pe, out, int(self.node.attr("group", 1)),
                               compute_dtype(dt).itemsize)
        return [WorkspaceRequest(n, 64, "step", role) for n, role in
                zip(sizes, ("pad", "im2col") if len(sizes) == 2 else ("im2col",))]

    def _conv(self, x, w, workspace):
        """The convolution in the compute dtype, before bias (a fresh C-contiguous array)."""
        group = int(self.node.attr("group", 1))
        cd = compute_dtype(x.dtype)
        if x.shape[1] != w.shape[1] * group:
            raise ValueError(f"input has {x.shape[1]} channels, weight {w.shape} with "
                             f"group={group} expects {w.shape[1] * group}")
        kernel, strides, dil, out, pb, pe = self._cached(
            "_geo_cache", (x.shape, w.shape), lambda: _geometry(self.node, x.shape, w.shape))
        wpack = self._wpack if self._wpack is not None else _pack(w, group, cd)
        y, path = conv_core(x.astype(cd, copy=False), wpack, group, kernel, strides, dil,
                            pb, pe, out, workspace=workspace)
        tracing.kernel_variant("conv", path, "group=%d kernel=%s", group, kernel)
        return y

    def _direct(self, x, w, b, z, act: str, params=()):
        """The convolution with its epilogue by the direct kernel
        (:mod:`._conv_direct`), or None where that path does not apply
        (dtype, rank, a 1x1 or depthwise conv, an activation its store lacks,
        shapes the other paths reject with their own errors)."""
        calls = self.__dict__.get("_prepared")
        if calls and PREPARED_CALLS:
            f = calls.get((x.shape, w.shape))
            if f is not None and f.usable(x, z):
                y = f.call(x, b, z)
                if y is not None:
                    return y
        from . import _conv_direct as cdr
        if not cdr.ENABLED or x.dtype != np.float32 or x.ndim != 4 or w.ndim != 4:
            return None
        ap = cdr.act_params(act, params)
        if ap is None:
            return None
        y = self._blocked(x, w, b, z, ap)
        if y is not None:
            return y
        plan = self._cached("_dplan_cache", (x.shape, w.shape),
                            lambda: self._direct_plan(x.shape, w.shape))
        if plan is False:
            return None
        m = plan.y_shape[1]
        if b is not None and np.size(b) != m:
            return None
        if z is not None and z.shape != plan.y_shape:
            return None
        if self._wpack is not None:
            wpack = self._wpack
            wp = self._cached("_dwp_cache", plan.mr,
                              lambda: cdr.pack_weights(wpack, plan.y_shape[3], plan.mr))
        else:
            wp = cdr.pack_weights(_pack(w, int(self.node.attr("group", 1)), np.float32),
                                  plan.y_shape[3], plan.mr)
        y = cdr.run(plan, x, wp, b, z, *ap)
        tracing.kernel_variant("conv", "direct", "kernel=%s", plan.key[3])
        if self._wpack is not None:  # later calls of this shape: the prepared call
            self._keep((x.shape, w.shape), _prep.Prepared(
                "direct", None, cdr, plan, plan.y_shape, ap, False, plan.key[3], False,
                lambda bias: cdr.pack_bias(plan, bias), self._bconst, wp=wp))
        return y

    def _keep(self, key, f) -> None:
        """Keep prepared call ``f`` for inputs of shapes ``key`` (bounded)."""
        calls = self.__dict__.setdefault("_prepared", {})
        if len(calls) >= self._CACHE_SIZE:
            calls.clear()
        calls[key] = f

    def _blocked(self, x, w, b, z, ap):
        """The convolution by :mod:`._conv_blocked`'s channel blocks (float32
        4-D, one group, small planes: :func:`._conv_blocked.applies`), or
        None where it does not apply (decided once per input shapes)."""
        cache = self.__dict__.get("_cbplan_cache")
        if cache is None:
            if int(self.node.attr("group", 1)) != 1:  # never this kernel's case
                self._cbplan_cache = cache = _NEVER
            else:
                self._cbplan_cache = cache = {}
        if cache is _NEVER:
            return None
        key = (x.shape, w.shape)
        plan = cache.get(key, _NEVER)
        if plan is _NEVER:
            if len(cache) >= self._CACHE_SIZE:
                cache.clear()
            plan = cache[key] = self._blocked_plan(x.shape, w.shape)
        if plan is None:
            return None
        from . import _conv_blocked as cb
        if not cb.ENABLED:
            return None
        kernel, strides, dil, pb, out, split, planes = plan
        m = w.shape[0]
        if b is not None and np.size(b) != m:
            return None
        if z is not None and z.shape != (x.shape[0], m, *out):
            return None
        if self._wpack is not None:  # a constant weight: packed once
            wt, groups, _ = self._cached("_cb_cache", (w.shape, planes),
                                         lambda: cb.pack(w, None, planes))
            bt = cb.pack_bias(b, m)
        else:
            wt, groups, bt = cb.pack(w, b, planes)
        from . import _conv_direct as cdr
        prep = cb.prepare(x.shape, wt, groups, kernel, strides, dil, pb, m, out, planes)
        ep = tuple(np.float32(v) for v in ap)
        y = cb.execute(prep, x, bt, z, *ep, threads=cdr.current_threads() if split else 1)
        tracing.kernel_variant("conv", "direct", "kernel=%s, channel blocks%s", kernel,
                               " (input planes)" if planes else "")
        if self._wpack is not None:  # later calls of this shape: the prepared call
            self._keep(key, _prep.Prepared("blocked", cb, cdr, prep, prep.y_shape, ep, split,
                                           kernel, planes, lambda bias: cb.pack_bias(bias, m),
                                           self._bconst))
        return y

    def _blocked_plan(self, x_shape, w_shape):
        """``(kernel, strides, dilations, pads_begin, out, split, planes)``
        where :mod:`._conv_blocked` takes these shapes (``planes``: an input
        of few channels read as planes), else None."""
        from . import _conv_blocked as cb
        if int(self.node.attr("group", 1)) != 1 or len(x_shape) != 4 \
                or len(w_shape) != 4 or x_shape[1] != w_shape[1]:
            return None
        kernel, strides, dil, out, pb, pe = _geometry(self.node, x_shape, w_shape)
        if tuple(kernel) != tuple(w_shape[2:]):
            return None
        if cb.fits(x_shape, w_shape, 1, out):  # (ENABLED is checked per call)
            planes = False
        elif cb.planes_fit(x_shape, w_shape, 1, out, strides):
            planes = True
        else:
            return None
        from . import _conv_split
        work = 2 * x_shape[0] * w_shape[0] * out[0] * out[1] * w_shape[1] * kernel[0] * kernel[1]
        return (tuple(kernel), tuple(strides), tuple(dil), tuple(pb), tuple(out),
                work >= _conv_split.MIN_CONV_FLOPS, planes)

    def _depthwise(self, x, w, b, z, act: str, params=()):
        """A 2-D depthwise conv (one input channel per group) with bias, Z and
        the activation in the compiled kernel's store (wide output rows:
        :mod:`._dw_rows`; small planes: :mod:`._dw_blocked`'s 16-channel
        blocks; else :func:`._conv_numba.depthwise2d`'s planes), or None where that path does not
        apply (numba missing, dtype, rank, not depthwise, an activation the
        store lacks, shapes the other paths reject with their own errors)."""
        from . import _conv_direct as cdr, _conv_util as cu
        if x.ndim != 4 or w.ndim != 4 or x.dtype not in (np.float32, np.float64) or not cu.COMPILED:
            return None
        group = int(self.node.attr("group", 1))
        if w.shape[1] != 1 or group == 1 or x.shape[1] != group or w.shape[0] % group:
            return None
        ap = cdr.act_params(act, params)
        if ap is None:
            return None
        from . import _conv_numba as cn
        if not cn.HAVE_NUMBA:
            return None
        kernel, strides, dil, out, pb, pe = self._cached(
            "_geo_cache", (x.shape, w.shape), lambda: _geometry(self.node, x.shape, w.shape))
        if tuple(kernel) != tuple(w.shape[2:]):
            return None
        m = w.shape[0]
        if b is not None and np.size(b) != m:
            return None
        if z is not None and z.shape != (x.shape[0], m, *out):
            return None
        alpha, lo, hi = ap
        from . import _dw_blocked as dwb, _dw_rows as dwr
        blocked = x.dtype == np.float32 and dwb.applies(x.shape, w.shape, group, out)
        if x.dtype == np.float32 and dwr.applies(x.shape, w.shape, group, out, strides, dil) \
                and (not blocked or out[1] >= dwr.PREFER_WIDTH):
            plan = self._cached("_dwr_cache", x.shape, lambda: dwr.make_plan(
                x.shape, kernel, strides, pb, out))
            bt = dwr.pack_bias(b, m)
            wt = np.ascontiguousarray(w, dtype=np.float32)
            y = dwr.run(plan, x, wt, bt, z, alpha, lo, hi, cdr.current_threads())
            tracing.kernel_variant("conv", "depthwise", "kernel=%s, rows", kernel)
            tracing.kernel_variant("conv_impl", "compiled")
            if self._wpack is not None:  # later calls of this shape: the prepared call
                self._keep((x.shape, w.shape), _prep.Prepared(
                    "dwr", dwr, cu, plan, y.shape, ap, True, kernel, False,
                    lambda bias: dwr.pack_bias(bias, m), self._bconst, wp=wt, threads=cdr))
            return y
        if blocked:
            if self._wpack is not None:  # a constant weight: packed once
                wt = self._cached("_dwb_cache", w.shape, lambda: dwb.pack(w, None)[0])
                bt = dwb.pack_bias(b, x.shape[1])
            else:
                wt, bt = dwb.pack(w, b)
            work = x.shape[0] * m * out[0] * out[1] * kernel[0] * kernel[1]
            from . import _conv_split
            split = work >= _conv_split.MIN_DEPTHWISE_WORK
            threads = cdr.current_threads() if split else 1
            y = dwb.run(x, wt, bt, kernel, strides, dil, pb, out, z, alpha, lo, hi, threads)
            tracing.kernel_variant("conv", "depthwise", "kernel=%s, channel blocks", kernel)
            tracing.kernel_variant("conv_impl", "compiled")
            if self._wpack is not None:  # later calls of this shape: the prepared call
                self._keep((x.shape, w.shape), _prep.Prepared(
                    "dw", dwb, cu, (kernel, strides, dil, pb, out), y.shape, ap, split, kernel,
                    False, lambda bias: dwb.pack_bias(bias, m), self._bconst, wp=wt,
                    threads=cdr))
            return y
        y = cn.depthwise2d(x, w, strides, dil, pb, out, b, z, alpha, lo, hi)
        tracing.kernel_variant("conv", "depthwise", "kernel=%s, epilogue in the store", kernel)
        tracing.kernel_variant("conv_impl", "compiled")
        return y

    def _direct_plan(self, x_shape, w_shape):
        """The direct kernel's plan for float32 inputs of these shapes, or
        False (not its case)."""
        from . import _conv_direct as cdr
        group = int(self.node.attr("group", 1))
        cg = w_shape[1]
        if len(x_shape) != 4 or len(w_shape) != 4 or x_shape[1] != cg * group \
                or w_shape[0] % group:
            return False
        kernel, strides, dil, out, pb, pe = _geometry(self.node, x_shape, w_shape)
        if tuple(kernel) != tuple(w_shape[2:]):
            return False
        if kernel[0] * kernel[1] == 1 and not cdr.takes_pointwise(x_shape):
            return False  # 1x1 on the 8-lane tiles: the GEMM on the input's view is faster
        if not cdr.applies(np.float32, x_shape[1], kernel, group, w_shape[0] // group, out):
            return False
        return cdr.make_plan(tuple(x_shape), (group, w_shape[0] // group, cg * kernel[0] * kernel[1]),
                             group, kernel, strides, dil, pb, out, flatten=True)

    def run(self, x, w, b=None, *, workspace=()):
        y = self._direct(x, w, b, None, "")
        if y is None:
            y = self._depthwise(x, w, b, None, "")
        if y is not None:
            return y
        y = self._conv(x, w, workspace)
        if _compiled_epilogue(y, b, None, ""):
            return y.astype(x.dtype, copy=False)
        return _finish(y, b, x.dtype)


@cpu_kernel("FusedConv", domain="com.microsoft")
class FusedConv(Conv):
    """com.microsoft FusedConv (onnxruntime's contrib op, what the graph
    optimizer makes of ``Conv [+ Add] + activation``): ``Y = act(Conv(X, W) + B
    + Z)``; X, W, B as Conv, Z (optional) of Y's shape, attribute
    ``activation`` one of Relu, LeakyRelu, Sigmoid, Tanh, Clip, HardSigmoid
    with ``activation_params`` as onnxruntime's. Bias, Z and the activation
    are applied in place on the convolution's result."""

    @classmethod
    def check(cls, node):
        _check_conv_attrs(node)
        act = decode_str(node.attr("activation"), "")
        require(act in _epilogue.ACTIVATIONS and act != "Gelu",
                "FusedConv: unsupported activation %r", act)

    def __init__(self, node):
        super().__init__(node)
        self._act_name = decode_str(node.attr("activation"), "")
        self._act_params = tuple(node.attr("activation_params") or ())
        self._act = _epilogue.activation(self._act_name, self._act_params)

    def run(self, x, w, b=None, z=None, *, workspace=()):
        y = self._direct(x, w, b, z, self._act_name, self._act_params)
        if y is None:
            y = self._depthwise(x, w, b, z, self._act_name, self._act_params)
        if y is not None:
            return y
        y = self._conv(x, w, workspace)
        if _compiled_epilogue(y, b, z, self._act_name, self._act_params):
            return y.astype(x.dtype, copy=False)
        y = _finish(y, b, x.dtype)
        if y.dtype.kind != "f" or not y.flags.writeable:
            y = np.array(y, dtype=np.result_type(y.dtype, np.float32))
        if z is not None:
            if z.shape != y.shape:
                raise ValueError(f"FusedConv: Z has shape {z.shape}, the convolution's output {y.shape}")
            y += z
        return self._act(y).astype(x.dtype, copy=False)


@cpu_kernel("ConvTranspose", since=(1, 11, 22))
class ConvTranspose(Kernel):
    """ONNX ConvTranspose (opsets 1, 11, 22): X (N, C, *D), W (C, M/group, *k), B (M,)
    -> Y (N, M, *out); output_shape / output_padding / auto_pad as the spec.
    One GEMM per group then a col2im scatter per kernel tap."""

    _wpack = None

    @classmethod
    def check(cls, node):
        _check_conv_attrs(node)

    @classmethod
    def estimate_flops(cls, node):
        xt, wt = node.input_type(0), node.input_type(1)
        if xt is None or wt is None or xt.static_shape is None or wt.static_shape is None:
            return Kernel.estimate_flops(node)
        return 2.0 * math.prod(xt.static_shape) * math.prod(wt.static_shape[1:])

    @staticmethod
    def _pack(w, group, dtype):
        c = w.shape[0]
        if c % group:
            raise ValueError(f"weight has {c} input channels, not divisible by group={group}")
        wg = w.reshape(group, c // group, -1)  # (G, Cg, Mg*K)
        return np.ascontiguousarray(wg.transpose(0, 2, 1), dtype=dtype)

    def prepare(self, constants, shared):
        w = constants.get(1)
        if w is not None:
            if "wpack" not in shared:
                shared["wpack"] = self._pack(w, int(self.node.attr("group", 1)),
                                             compute_dtype(w.dtype))
            self._wpack = shared["wpack"]

    def _shape(self, x_shape, w_shape):
        node = self.node
        nd = len(x_shape) - 2
        kernel = node.attr("kernel_shape") or w_shape[2:]
        kernel, strides, dil, pb, pe = spatial_params(nd, kernel, node.attr("strides"),
                                                      node.attr("dilations"), node.attr("pads"))
        opad = tuple(node.attr("output_padding") or (0,) * nd)[-nd:]
        auto_pad = decode_str(node.attr("auto_pad"), "NOTSET")
        in_sp = x_shape[2:]
        natural = [strides[i] * (in_sp[i] - 1) + opad[i] + (kernel[i] - 1) * dil[i] + 1
                   for i in range(nd)]
        out_shape = node.attr("output_shape")
        if out_shape:
            out = tuple(int(v) for v in out_shape)[-nd:]
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = tuple(in_sp[i] * strides[i] for i in range(nd))
        else:
            if auto_pad == "VALID":
                pb = pe = (0,) * nd
            return kernel, strides, dil, pb, tuple(natural[i] - pb[i] - pe[i] for i in range(nd))
        total = [natural[i] - out[i] for i in range(nd)]
        if auto_pad == "SAME_UPPER":
            pb = tuple(t // 2 for t in total)
        else:
            pb = tuple(t - t // 2 for t in total)
        return kernel, strides, dil, pb, out

    def run(self, x, w, b=None):
        group = int(self.node.attr("group", 1))
        cd = compute_dtype(x.dtype)
        n, c = x.shape[:2]
        if c != w.shape[0]:
            raise ValueError(f"input has {c} channels, weight {w.shape} expects {w.shape[0]}")
        kernel, strides, dil, pb, out = self._shape(x.shape, w.shape)
        if min(out) < 1:
            raise ValueError(f"ConvTranspose output shape {out} is empty")
        wpack = self._wpack if self._wpack is not None else self._pack(w, group, cd)
        m = w.shape[1] * group
        in_sp = x.shape[2:]
        xg = x.astype(cd, copy=False).reshape(n, group, c // group, -1)
        cols = np.matmul(wpack, xg)  # (N, G, Mg*K, P_in)
        cols = cols.reshape(n, m, *kernel, *in_sp)
        y = np.zeros((n, m, *out), dtype=cd)
        scatter_taps(cols, y, kernel, in_sp, strides, dil, pb)
        tracing.kernel_variant("conv", "gemm+col2im", "group=%d kernel=%s", group, kernel)
        return _finish(y, b, x.dtype)


def _int_conv(node: NodeSpec, x, xzp, wpack, w_shape, group):
    """Integer convolution of ``x - xzp`` with a prepacked ``w - wzp``, exact in
    float64 (returns float64 holding integers)."""
    xf = x.astype(np.float64)
    if xzp is not None:
        xf -= np.asarray(xzp, dtype=np.float64)
    kernel, strides, dil, out, pb, pe = _geometry(node, x.shape, w_shape)
    y, path = conv_core(xf, wpack, group, kernel, strides, dil, pb, pe, out)
    tracing.kernel_variant("conv", path, "integer conv group=%d kernel=%s", group, kernel)
    return y


def _pack_int(w, wzp, group):
    wf = w.astype(np.float64)
    if wzp is not None:
        wzp = np.asarray(wzp, dtype=np.float64)
        if wzp.ndim == 1 and wzp.size == w.shape[0] and wzp.size > 1:
            wzp = wzp.reshape((-1,) + (1,) * (w.ndim - 1))
        wf -= wzp
    return _pack(wf, group, np.float64)


class _IntConvBase(Kernel):
    _wpack = None
    _w_index = 1
    _wzp_index = 3

    @classmethod
    def check(cls, node):
        _check_conv_attrs(node)

    @classmethod
    def estimate_flops(cls, node):
        return _conv_flops(node)

    def prepare(self, constants, shared):
        w = constants.get(self._w_index)
        has_zp = self.node.has_input(self._wzp_index)
        if w is not None and (not has_zp or self._wzp_index in constants):
            if "wpack" not in shared:
                shared["wpack"] = _pack_int(w, constants.get(self._wzp_index),
                                            int(self.node.attr("group", 1)))
            self._wpack = shared["wpack"]

    def _weights(self, w, wzp, group):
        return self._wpack if self._wpack is not None else _pack_int(w, wzp, group)


@cpu_kernel("ConvInteger", since=10)
class ConvInteger(_IntConvBase):
    """ONNX ConvInteger (opset 10): x, w (u)int8 with zero points -> int32 (N, M, *out)."""

    _w_index, _wzp_index = 1, 3

    def run(self, x, w, x_zero_point=None, w_zero_point=None):
        group = int(self.node.attr("group", 1))
        y = _int_conv(self.node, x, x_zero_point, self._weights(w, w_zero_point, group),
                      w.shape, group)
        return np.rint(y).astype(np.int32)


@cpu_kernel("QLinearConv", since=10)
class QLinearConv(_IntConvBase):
    """ONNX QLinearConv (opset 10): quantized (u)int8 conv, per-tensor or per-output-channel
    w_scale / w_zero_point, int32 bias; output dtype of y_zero_point."""

    _w_index, _wzp_index = 3, 5

    def run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
            y_zero_point=None, B=None):
        group = int(self.node.attr("group", 1))
        acc = _int_conv(self.node, x, x_zero_point, self._weights(w, w_zero_point, group),
                        w.shape, group)
        if B is not None:
            acc += np.asarray(B, dtype=np.float64).reshape((1, -1) + (1,) * (acc.ndim - 2))
        ws = np.asarray(w_scale, dtype=np.float32)
        mult = (np.asarray(x_scale, dtype=np.float32) * ws / np.asarray(y_scale, np.float32))
        if mult.size > 1:
            mult = mult.reshape((1, -1) + (1,) * (acc.ndim - 2))
        r = acc * mult.astype(np.float64)
        out_dtype = np.dtype(y_zero_point.dtype if y_zero_point is not None else x.dtype)
        if y_zero_point is not None:
            r += np.asarray(y_zero_point, dtype=np.float64)
        info = np.iinfo(out_dtype)
        return np.clip(np.rint(r), info.min, info.max).astype(out_dtype)


@cpu_kernel("DeformConv", since=(19, 22))
class DeformConv(_PackedWeightConv):
    """ONNX DeformConv (opsets 19, 22): X (N, C, *D), W (M, C/group, *k), offset
    (N, offset_group*K*n, *out), B (M,), mask (N, offset_group*K, *out) -> Y (N, M, *out).
    Multilinear sampling with zeros outside, then one GEMM per group."""

    @classmethod
    def check(cls, node):
        require(int(node.attr("group", 1)) >= 1, "DeformConv: group must be >= 1")
        require(int(node.attr("offset_group", 1)) >= 1, "DeformConv: offset_group must be >= 1")


    def run(self, x, w, offset, B=None, mask=None):
        node = self.node
        group = int(node.attr("group", 1))
        og = int(node.attr("offset_group", 1))
        cd = compute_dtype(x.dtype)
        n, c = x.shape[:2]
        sp = x.shape[2:]
        nd = len(sp)
        kernel = node.attr("kernel_shape") or w.shape[2:]
        kernel, strides, dil, pb, pe = spatial_params(nd, kernel, node.attr("strides"),
                                                      node.attr("dilations"), node.attr("pads"))
        out, pb, pe = conv_geometry(sp, kernel, strides, dil, pb, pe)
        K, P, S = math.prod(kernel), math.prod(out), math.prod(sp)
        if c % og or c != w.shape[1] * group:
            raise ValueError(f"DeformConv: {c} input channels do not fit weight {w.shape}, "
                             f"group={group}, offset_group={og}")
        if offset.shape != (n, og * K * nd, *out):
            raise ValueError(f"DeformConv: offset shape {offset.shape}, expected "
                             f"{(n, og * K * nd, *out)}")
        off = offset.astype(cd, copy=False).reshape(n, og, K, nd, P)
        msk = None if mask is None else mask.astype(cd, copy=False).reshape(n, og, K, P)
        xg = x.astype(cd, copy=False).reshape(n, og, c // og, S)
        base = [g.ravel() for g in np.meshgrid(
            *(np.arange(out[i], dtype=cd) * strides[i] - pb[i] for i in range(nd)),
            indexing="ij")]
        cols = np.empty((n, og, c // og, K, P), dtype=cd)
        for t, kk in enumerate(itertools.product(*(range(k) for k in kernel))):
            coords = [base[d] + kk[d] * dil[d] + off[:, :, t, d, :] for d in range(nd)]
            floors = [np.floor(cc) for cc in coords]
            acc = np.zeros((n, og, c // og, P), dtype=cd)
            for corner in itertools.product((0, 1), repeat=nd):
                wgt = np.ones((n, og, P), dtype=cd)
                flat = np.zeros((n, og, P), dtype=np.intp)
                for d in range(nd):
                    idx = floors[d] + corner[d]
                    wgt *= (1 - np.abs(coords[d] - idx)) * ((idx >= 0) & (idx < sp[d]))
                    flat = flat * sp[d] + np.clip(idx, 0, sp[d] - 1).astype(np.intp)
                vals = np.take_along_axis(xg, flat[:, :, None, :], axis=3)
                acc += vals * wgt[:, :, None, :]
            if msk is not None:
                acc *= msk[:, :, None, t, :]
            cols[:, :, :, t, :] = acc
        wpack = self._wpack if self._wpack is not None else _pack(w, group, cd)
        y = np.matmul(wpack, cols.reshape(n, group, -1, P))
        tracing.kernel_variant("conv", "deform-im2col", "offset_group=%d", og)
        return _finish(y.reshape(n, -1, *out), B, x.dtype)


@cpu_kernel("CausalConvWithState", since=27)
class CausalConvWithState(Kernel):
    """ONNX CausalConvWithState (opset 27): input (B, C, L), weight (C, 1, k), bias (C,),
    past_state (B, C, k-1) -> output (B, C, L), present_state (B, C, k-1); causal
    depthwise conv with optional fused SiLU/Swish."""

    multi_output = True

    @classmethod
    def check(cls, node):
        act = decode_str(node.attr("activation"), "none")
        require(act in ("none", "silu", "swish"),
                "CausalConvWithState: unknown activation %r (expected none, silu or swish)", act)

    def run(self, x, weight, bias=None, past_state=None):
        if x.ndim != 3 or weight.ndim != 3 or weight.shape[1] != 1:
            raise ValueError(f"CausalConvWithState expects input (B, C, L) and weight "
                             f"(C, 1, k), got {x.shape} and {weight.shape}")
        b, c, length = x.shape
        k = weight.shape[2]
        if past_state is None:
            past_state = np.zeros((b, c, k - 1), dtype=x.dtype)
        elif past_state.shape != (b, c, k - 1):
            raise ValueError(f"past_state shape {past_state.shape}, expected {(b, c, k - 1)}")
        padded = np.concatenate([past_state, x], axis=2)
        cd = compute_dtype(x.dtype)
        pf = padded.astype(cd, copy=False)
        wf = weight.astype(cd, copy=False)[:, 0, :]
        y = np.zeros((b, c, length), dtype=cd)
        for t in range(k):
            y += pf[:, :, t:t + length] * wf[:, t, None]
        if bias is not None:
            y += bias.astype(cd)[:, None]
        if decode_str(self.node.attr("activation"), "none") in ("silu", "swish"):
            y = y / (1 + np.exp(-y))
        tracing.kernel_variant("conv", "causal-depthwise", "k=%d", k)
        return y.astype(x.dtype, copy=False), np.ascontiguousarray(padded[:, :, length:])


@cpu_kernel("Col2Im", since=18)
def Col2Im(input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """ONNX Col2Im (opset 18): input (N, C*prod(block), L) -> (N, C, *image_shape),
    overlapping blocks summed."""
    img = tuple(int(v) for v in np.asarray(image_shape).ravel())
    kernel = tuple(int(v) for v in np.asarray(block_shape).ravel())
    nd = len(img)
    kernel, strides, dil, pb, pe = spatial_params(nd, kernel, strides, dilations, pads)
    blocks, _, _ = conv_geometry(img, kernel, strides, dil, pb, pe)
    n, ck, L = input.shape
    K = math.prod(kernel)
    if ck % K or L != math.prod(blocks):
        raise ValueError(f"Col2Im: input {input.shape} does not fit image {img}, blocks "
                         f"{kernel} ({math.prod(blocks)} block positions)")
    dt = input.dtype if input.dtype.kind in "iub" else compute_dtype(input.dtype)
    cols = input.astype(dt, copy=False).reshape(n, ck // K, *kernel, *blocks)
    y = np.zeros((n, ck // K, *img), dtype=dt)
    scatter_taps(cols, y, kernel, blocks, strides, dil, pb)
    return y.astype(input.dtype, copy=False)
