"""NCHWc layout ops (domain ``ai.actorrt``): chains of convolutions and pools
on 16-channel blocks, onnxruntime's NCHWc transformer for AVX-512.

The graph optimizer's layout pass (:func:`actorrt.optimizer.layout.nchwc_layout`,
level 99 / ``ORT_ENABLE_ALL``) rewrites each chain of convolutions whose
kernels take 16-channel blocks into these ops, so values inside the chain
stay blocked -- float32 ``(N, ceil(C/16), H, W, 16)``, channel ``c`` at
``[:, c // 16, :, :, c % 16]``, the lanes past ``C`` zero -- and only its
ends are transposed:

* ``ReorderInput(X) -> Y``: NCHW float32 ``X (N, C, H, W)`` -> blocked.
* ``ReorderOutput(X) -> Y``, attribute ``channels`` (``C``): blocked -> NCHW.
* ``NchwcConv(X, W, B?, Z?) -> Y``: Conv's attributes (``auto_pad``,
  ``dilations``, ``group``, ``kernel_shape``, ``pads``, ``strides``), FusedConv's
  ``activation`` / ``activation_params`` (none, Relu, LeakyRelu, Clip), and
  ``channels`` (the input's ``C``). ``W (M, C/group, KH, KW)`` and ``B (M,)``
  as Conv's (constants); X blocked, or with ``input_layout = "NCHW"`` (a stem
  of at most 8 channels) NCHW; ``Z`` a blocked residual of Y's shape; Y
  blocked ``(N, ceil(M/16), OH, OW, 16)``: ``act(conv(X, W) + B + Z)``. One
  group, or depthwise (``group == C == M``, no ``Z``).
* ``NchwcAffine(X, a, t) -> Y``: ``ai.actorrt:ChannelAffine`` (a folded
  BatchNormalization and its activation) on blocks; attribute ``channels``.
* ``NchwcGlobalAveragePool(X) -> Y``: GlobalAveragePool / ReduceMean over H
  and W of a blocked value, NCHW out (attributes ``channels``, ``keepdims``).
* ``NchwcPool(X) -> Y``, attributes of MaxPool / AveragePool (2-D, no
  ``ceil_mode``, ``storage_order`` 0) plus ``mode`` (``"max"`` / ``"avg"``)
  and ``channels``: blocked in and out.

The compiled kernels are :mod:`._nchwc`'s; :func:`available` says whether
this host has them (numba, AVX-512): the pass rewrites nothing otherwise.
"""

from __future__ import annotations

import numpy as np

from ... import tracing
from .._contract import Kernel, NodeSpec, require
from ._conv_util import decode_str
from ._threads import current as _thread_count
from .conv import node_geometry
from .registry import cpu_kernel

__all__ = ["available", "node_epilogue", "conv_kind", "pool_applies", "affine_applies",
           "ReorderInput", "ReorderOutput", "NchwcConv", "NchwcAffine", "NchwcGlobalAveragePool",
           "NchwcPool"]

LANES = 16
#: channels filling at least this share of their 16-lane blocks
MIN_FILL = 0.75
#: stems (NCHW input) of at most this many channels
STEM_MAX_CHANNELS = 8
#: ... and reductions (``C * KH * KW``) of at least this many values
STEM_MIN_REDUCTION = 27
#: stems into blocks at all
STEMS = True


def _kernels():
    """:mod:`._nchwc` (imported on first use: it loads numba)."""
    from . import _nchwc
    return _nchwc


def _windows():
    """:mod:`._nchwc_window` (imported on first use: it loads numba)."""
    from . import _nchwc_window
    return _nchwc_window


def available() -> bool:
    """Whether this host has the NCHWc kernels (numba, AVX-512, partners)."""
    return _kernels().HAVE_KERNEL


def _fills(c: int) -> bool:
    return c >= MIN_FILL * LANES * -(-c // LANES)


def _epilogue_params(act: str, params) -> tuple[float, float, float] | None:
    from . import _conv_direct as cdr
    return cdr.act_params(act, tuple(params or ()))


def node_epilogue(node: NodeSpec) -> tuple[float, float, float] | None:
    """The ``(alpha, lo, hi)`` epilogue of a node's ``activation`` /
    ``activation_params`` (FusedConv's), or None where the blocked kernels
    have none for it."""
    return _epilogue_params(decode_str(node.attr("activation"), ""),
                            node.attr("activation_params"))


def conv_kind(x_shape, w_shape, group: int, out, strides, act: str, act_params,
              has_z: bool) -> str | None:
    """How an NCHW float32 2-D convolution of these static shapes runs on
    blocks: ``"conv"`` (one group, blocked in), ``"stem"`` (one group, at most
    :data:`STEM_MAX_CHANNELS` input channels read as NCHW planes, a reduction
    of at least :data:`STEM_MIN_REDUCTION`; A/B against the NCHW stem and a
    reorder: resnetish 0.99x / 0.90x the time at 1 / 2 threads, vgg19 0.99x),
    ``"depthwise"``, or None (not this module's case: the reason is one of
    no kernels, an activation other than none / Relu / LeakyRelu / Clip,
    planes under 16 pixels, channels filling under :data:`MIN_FILL` of their
    blocks, other groupings, a depthwise residual)."""
    if not available() or _epilogue_params(act, act_params) is None:
        return None
    if len(x_shape) != 4 or len(w_shape) != 4 or len(out) != 2:
        return None
    n, c, h, w = x_shape
    m = w_shape[0]
    if h * w < LANES or out[0] * out[1] < LANES:
        return None
    if group == 1 and w_shape[1] == c:
        if c <= STEM_MAX_CHANNELS:
            return "stem" if STEMS and _fills(m) and c * w_shape[2] * w_shape[3] >= \
                STEM_MIN_REDUCTION else None
        return "conv" if _fills(c) and _fills(m) else None
    if group == c == m and w_shape[1] == 1 and not has_z and _fills(c):
        return "depthwise"
    return None


def pool_applies(x_shape, out) -> bool:
    """Whether a 2-D MaxPool / AveragePool of these NCHW shapes runs on blocks."""
    return available() and len(x_shape) == 4 and x_shape[2] * x_shape[3] >= LANES and \
        out[0] * out[1] >= LANES and _fills(x_shape[1])


def affine_applies(x_shape, act: str, act_params) -> bool:
    """Whether ``ai.actorrt:ChannelAffine`` on this NCHW shape runs on blocks
    (an activation of none / Relu / LeakyRelu / Clip)."""
    return available() and len(x_shape) == 4 and x_shape[2] * x_shape[3] >= LANES and \
        _fills(x_shape[1]) and _epilogue_params(act, act_params) is not None


def _threads() -> int:
    """The intra-op thread count (:func:`._threads.current`: no numba import)."""
    return _thread_count()


def _require_kernels(node: NodeSpec) -> None:
    require(available(), "%s needs the NCHWc kernels (numba with AVX-512)", node.op_type)


@cpu_kernel("ReorderInput", domain="ai.actorrt")
class ReorderInput(Kernel):
    """NCHW float32 ``X (N, C, H, W)`` (``H * W >= 16``) -> blocked ``(N,
    ceil(C/16), H, W, 16)``, lanes past ``C`` zero. Raises ValueError for
    another rank or smaller planes."""

    @classmethod
    def check(cls, node):
        _require_kernels(node)

    def run(self, x):
        y = _kernels().to_blocks(np.asarray(x, np.float32), _threads())
        tracing.kernel_variant("layout", "nchwc", "reorder input")
        return y


@cpu_kernel("ReorderOutput", domain="ai.actorrt")
class ReorderOutput(Kernel):
    """Blocked float32 ``X (N, ceil(C/16), H, W, 16)`` -> NCHW ``(N, C, H, W)``
    (attribute ``channels`` = ``C``). Raises ValueError where X is not such
    an array."""

    @classmethod
    def check(cls, node):
        _require_kernels(node)
        require(int(node.attr("channels", 0)) >= 1, "ReorderOutput needs channels >= 1")

    def __init__(self, node):
        super().__init__(node)
        self._c = int(node.attr("channels", 0))

    def run(self, x):
        return _kernels().from_blocks(x, self._c, _threads())


class _Calls:
    """Prepared calls by (input shape, threads), bounded."""

    LIMIT = 64

    def __init__(self, make):
        self._make = make
        self._d: dict = {}

    def get(self, shape, threads: int):
        key = (shape, threads)
        f = self._d.get(key)
        if f is None:
            if len(self._d) >= self.LIMIT:
                self._d.clear()
            f = self._d[key] = self._make(shape, threads)
        return f


@cpu_kernel("NchwcConv", domain="ai.actorrt")
class NchwcConv(Kernel):
    """``act(conv(X, W) + B + Z)`` on 16-channel blocks (module docstring).

    Inputs: X float32 blocked ``(N, ceil(C/16), H, W, 16)`` (or NCHW ``(N, C,
    H, W)`` with ``input_layout = "NCHW"``), W ``(M, C/group, KH, KW)``
    constant, B ``(M,)`` optional, Z blocked of Y's shape optional. Output Y
    blocked ``(N, ceil(M/16), OH, OW, 16)``. Raises ValueError for inputs
    of other shapes."""

    @classmethod
    def check(cls, node):
        _require_kernels(node)
        require(1 in node.constant_inputs, "NchwcConv needs a constant weight")
        require(node_epilogue(node) is not None,
                "NchwcConv: activation %r has no blocked epilogue",
                decode_str(node.attr("activation"), ""))

    @classmethod
    def estimate_flops(cls, node):
        w = node.constant_inputs.get(1)
        out = node.output_types[0].shape if node.output_types and node.output_types[0] else None
        if w is None or out is None or any(not isinstance(d, int) for d in out):
            return 0.0
        return 2.0 * w.size * out[0] * out[2] * out[3]

    def __init__(self, node):
        super().__init__(node)
        self._c = int(node.attr("channels", 0))
        self._group = int(node.attr("group", 1))
        self._nchw = decode_str(node.attr("input_layout"), "NCHWc") == "NCHW"
        self._ep = tuple(np.float32(v) for v in node_epilogue(node))
        self._w = None
        self._packed = None
        self._bias_const = None
        self._bias = None
        self._calls = _Calls(self._make_call)

    def prepare(self, constants, shared):
        w = constants.get(1)
        if w is None:
            return
        self._w = w
        depthwise = self._group != 1
        if "nchwc" not in shared:
            from . import _conv_blocked as cb, _dw_blocked as dwb
            w32 = np.asarray(w, np.float32)
            shared["nchwc"] = (dwb.pack(w32, None)[0],) if depthwise else \
                cb.pack(w32, None, self._nchw)[:2]
        self._packed = shared["nchwc"]
        self._bias_const = constants.get(2)
        if self._bias_const is not None:
            self._bias = self._pad_bias(self._bias_const)

    def _pad_bias(self, b) -> np.ndarray:
        from . import _dw_blocked as dwb
        m = self._w.shape[0]
        if np.size(b) != m:
            raise ValueError(f"NchwcConv {self.node.name!r}: B has {np.size(b)} values, W has "
                             f"{m} output channels")
        return dwb.pack_bias(np.asarray(b, np.float32), m)

    def _nchw_shape(self, x_shape):
        if self._nchw:
            return tuple(x_shape)
        return (x_shape[0], self._c, x_shape[2], x_shape[3])

    def _make_call(self, x_shape, threads):
        w = self._w
        if self._nchw:
            ok = len(x_shape) == 4 and x_shape[1] == self._c
        else:
            ok = len(x_shape) == 5 and x_shape[4] == LANES and x_shape[1] == -(-self._c // LANES)
        if not ok or self._c != w.shape[1] * self._group:
            raise ValueError(
                f"NchwcConv {self.node.name!r}: input X has shape {tuple(x_shape)}, expected "
                + (f"(N, {self._c}, H, W)" if self._nchw else
                   f"(N, {-(-self._c // LANES)}, H, W, 16) (blocked {self._c} channels)"))
        nchw = self._nchw_shape(x_shape)
        kernel, strides, dil, out, pb, _ = node_geometry(self.node, nchw, w.shape)
        if self._group == 1:
            wt, groups = self._packed
            return _kernels().ConvCall(x_shape, self._c, wt, groups, w.shape[0], kernel,
                                       strides, dil, pb, out, self._nchw, threads)
        return _windows().DepthwiseCall(x_shape, self._c, self._packed[0], kernel, strides, dil,
                                        pb, out, 0, None, threads)

    def _bias_for(self, b):
        if b is not None and b is self._bias_const:
            return self._bias
        return self._pad_bias(b if b is not None else np.zeros(self._w.shape[0], np.float32))

    def run(self, x, w, b=None, z=None):
        if self._w is None or w.shape != self._w.shape:
            raise ValueError(f"NchwcConv {self.node.name!r} needs its constant weight "
                             f"{None if self._w is None else self._w.shape}, got {w.shape}")
        call = self._calls.get(x.shape, _threads())
        x = np.ascontiguousarray(x, np.float32)
        bias = self._bias_for(b)
        alpha, lo, hi = self._ep
        if self._group != 1:
            return call(x, bias, alpha, lo, hi)
        if z is not None:
            if z.shape != call.y_shape:
                raise ValueError(f"NchwcConv {self.node.name!r}: Z has shape {z.shape}, the "
                                 f"output {call.y_shape}")
            z = np.ascontiguousarray(z, np.float32)
        return call(x, bias, z, alpha, lo, hi)

    def compile(self):
        """:meth:`run` with the common case first: a C-contiguous float32 X
        of a shape seen before, the constant bias, no Z (a depthwise or
        one-group call straight to the kept call)."""
        get, run, threads = self._calls.get, self.run, _threads
        bias_const, depthwise = self._bias_const, self._group != 1
        alpha, lo, hi = self._ep
        f32 = np.dtype(np.float32)

        if self._w is None:
            return run
        bias = self._bias if bias_const is not None else self._bias_for(None)
        w_shape = self._w.shape

        def nchwc_conv(x, w, b=None, z=None):
            if z is not None or b is not bias_const or x.dtype is not f32 or \
                    not x.flags.c_contiguous or w.shape != w_shape:
                return run(x, w, b, z)
            call = get(x.shape, threads())
            if depthwise:
                return call(x, bias, alpha, lo, hi)
            return call(x, bias, None, alpha, lo, hi)
        return nchwc_conv


@cpu_kernel("NchwcAffine", domain="ai.actorrt")
class NchwcAffine(Kernel):
    """``act(X * a[c] + t[c])`` on blocked float32 ``X (N, ceil(C/16), H, W,
    16)`` (attribute ``channels`` = ``C``; ``a``, ``t`` ``(C,)`` constants;
    ``activation`` / ``activation_params`` as FusedConv's: none, Relu,
    LeakyRelu, Clip): ``ai.actorrt:ChannelAffine`` on blocks. Output blocked,
    lanes past ``C`` zero. Raises ValueError for other input shapes."""

    @classmethod
    def check(cls, node):
        _require_kernels(node)
        require(1 in node.constant_inputs and 2 in node.constant_inputs,
                "NchwcAffine needs constant a and t")
        require(node_epilogue(node) is not None,
                "NchwcAffine: activation %r has no blocked form",
                decode_str(node.attr("activation"), ""))

    def __init__(self, node):
        super().__init__(node)
        self._c = int(node.attr("channels", 0))
        self._ep = tuple(np.float32(v) for v in node_epilogue(node))
        self._at = None

    def prepare(self, constants, shared):
        a, t = constants.get(1), constants.get(2)
        if a is None or t is None:
            return
        if "nchwc_affine" not in shared:
            pad = -(-self._c // LANES) * LANES
            ap, tp = np.zeros(pad, np.float32), np.zeros(pad, np.float32)
            ap[:a.size], tp[:t.size] = np.ravel(a), np.ravel(t)
            shared["nchwc_affine"] = (ap, tp, a.size, t.size)
        self._at = shared["nchwc_affine"]

    def run(self, x, a, t):
        c = self._c
        if x.ndim != 5 or x.shape[4] != LANES or x.shape[1] != -(-c // LANES) or \
                self._at is None or self._at[2] != c or self._at[3] != c:
            raise ValueError(f"NchwcAffine {self.node.name!r}: input X has shape {x.shape}, "
                             f"expected (N, {-(-c // LANES)}, H, W, 16) with a and t of {c}")
        return _kernels().channel_affine(np.ascontiguousarray(x, np.float32), self._at[0],
                                         self._at[1], c, *self._ep, _threads())


@cpu_kernel("NchwcGlobalAveragePool", domain="ai.actorrt")
class NchwcGlobalAveragePool(Kernel):
    """GlobalAveragePool (or ReduceMean over H and W) of blocked float32 ``X
    (N, ceil(C/16), H, W, 16)`` to NCHW: ``(N, C, 1, 1)``, or ``(N, C)`` with
    ``keepdims = 0`` (attribute ``channels`` = ``C``): the chain's last
    blocked reader needs no ReorderOutput. The sum over the plane divided
    by ``H * W``. Raises ValueError for other input shapes."""

    @classmethod
    def check(cls, node):
        _require_kernels(node)
        require(int(node.attr("channels", 0)) >= 1, "NchwcGlobalAveragePool needs channels")

    def __init__(self, node):
        super().__init__(node)
        self._c = int(node.attr("channels", 0))
        self._keep = bool(int(node.attr("keepdims", 1)))

    def run(self, x):
        c = self._c
        if x.ndim != 5 or x.shape[4] != LANES or x.shape[1] != -(-c // LANES):
            raise ValueError(f"NchwcGlobalAveragePool {self.node.name!r}: input X has shape "
                             f"{x.shape}, expected (N, {-(-c // LANES)}, H, W, 16)")
        y = _kernels().global_mean(np.ascontiguousarray(x, np.float32), c, _threads())
        return y.reshape((x.shape[0], c, 1, 1) if self._keep else (x.shape[0], c))


@cpu_kernel("NchwcPool", domain="ai.actorrt")
class NchwcPool(Kernel):
    """MaxPool (``mode = "max"``) / AveragePool (``"avg"``) on blocked float32
    ``X (N, ceil(C/16), H, W, 16)`` -> blocked ``(N, ceil(C/16), OH, OW,
    16)``; attributes as ONNX's 2-D pools (``kernel_shape``, ``strides``,
    ``pads``, ``auto_pad``, ``dilations``; AveragePool's
    ``count_include_pad``; ``ceil_mode`` 0) and ``channels``. MaxPool is IEEE
    ``maxNum`` over the window (padding ``-inf``), AveragePool the taps' sum
    over the counted taps. Raises ValueError for other input shapes."""

    @classmethod
    def check(cls, node):
        _require_kernels(node)
        require(not int(node.attr("ceil_mode", 0)), "NchwcPool: ceil_mode is not taken")
        require(decode_str(node.attr("mode"), "") in ("max", "avg"),
                "NchwcPool: mode must be max or avg")

    def __init__(self, node):
        super().__init__(node)
        self._c = int(node.attr("channels", 0))
        self._max = decode_str(node.attr("mode"), "") == "max"
        self._calls = _Calls(self._make_call)

    def _make_call(self, x_shape, threads):
        if len(x_shape) != 5 or x_shape[4] != LANES or x_shape[1] != -(-self._c // LANES):
            raise ValueError(f"NchwcPool {self.node.name!r}: input X has shape {tuple(x_shape)}, "
                             f"expected (N, {-(-self._c // LANES)}, H, W, 16)")
        nchw = (x_shape[0], self._c, x_shape[2], x_shape[3])
        kshape = tuple(self.node.attr("kernel_shape"))
        kernel, strides, dil, out, pb, pe = node_geometry(self.node, nchw, (0, 0) + kshape)
        counts = None
        if not self._max:
            counts = tuple(_counts(nchw[2 + i], kernel[i], strides[i], pb[i], pe[i], out[i],
                                   bool(int(self.node.attr("count_include_pad", 0))))
                           for i in range(2))
        return _windows().DepthwiseCall(x_shape, self._c, None, kernel, strides, dil, pb, out,
                                        1 if self._max else 2, counts, threads)

    def run(self, x):
        call = self._calls.get(x.shape, _threads())
        return call(np.ascontiguousarray(x, np.float32), None)


def _counts(size: int, k: int, s: int, pb: int, pe: int, out: int,
            include_pad: bool) -> np.ndarray:
    """AveragePool's divisor factor per output index along one axis: the taps
    inside the input (or, with ``include_pad``, inside the padded input:
    the window clipped to ``size + pads``, as ONNX counts explicit pads)."""
    starts = np.arange(out) * s - pb
    if include_pad:
        lo, hi = -pb, size + pe
    else:
        lo, hi = 0, size
    return (np.minimum(starts + k, hi) - np.maximum(starts, lo)).astype(np.float32)
