"""Per-shape prepared calls of the compiled float32 convolutions.

After a Conv / FusedConv with a constant weight ran a shape through one of
the compiled kernels, :class:`.conv.Conv` keeps a :class:`Prepared` for that
``(x shape, w shape)``: the kernel's shape work (plan, offset tables), the
packed weights, the bias packed for ``b=None`` and for the node's constant
bias, the epilogue's parameters and the thread split. Later calls of that
shape go straight to the kernel: ~3-4 us less a node than the full path's
checks, geometry lookups and packing (docs/speed.md round 15). A call
re-checks the switches of the kernels it uses (``ENABLED`` / ``COMPILED``:
tests turn kernels off at run time); a bias that is neither absent nor the
constant one is packed per call. A call also checks that the switches
of every kernel the full path could choose (``ENABLED`` of the direct,
channel-blocked, blocked-depthwise and row-depthwise kernels,
``_conv_util.COMPILED``) are as they were when it was made: tests and the
A/B benchmarks flip them between runs of one session, and the full path
then chooses again.

Kinds: ``"blocked"`` (:mod:`._conv_blocked`), ``"direct"``
(:mod:`._conv_direct`), ``"dw"`` (:mod:`._dw_blocked`'s depthwise) and
``"dwr"`` (:mod:`._dw_rows`).
"""

from __future__ import annotations

import numpy as np

from ... import tracing

__all__ = ["Prepared", "switches"]

_MODULES: list = []


def switches() -> tuple:
    """The kernel switches the full path's choice depends on (module doc)."""
    if not _MODULES:
        from . import _conv_blocked, _conv_direct, _conv_util, _dw_blocked, _dw_rows
        _MODULES.extend((_conv_direct, _conv_blocked, _dw_blocked, _dw_rows))
        _MODULES.append(_conv_util)
    d, b, dwb, dwr, cu = _MODULES
    return d.ENABLED, b.ENABLED, dwb.ENABLED, dwr.ENABLED, cu.COMPILED


class Prepared:
    """One shape's prepared call.

    Args:
        kind: ``"blocked"``, ``"direct"``, ``"dw"`` or ``"dwr"``.
        cb: the blocked conv's / depthwise kernel's module (None for direct).
        cdr: :mod:`._conv_direct` (``"blocked"``, ``"direct"``) or
            :mod:`._conv_util` (the depthwise kinds): the module whose switch
            is checked with ``cb``'s.
        prep: the kernel's shape work (the blocked conv's ``Prepared``, the
            direct kernel's or the row depthwise's plan, or the blocked
            depthwise's ``(kernel, strides, dilations, pads_begin, out)``).
        y_shape: the output shape ``(N, M, OH, OW)``.
        ep: the epilogue's ``(alpha, lo, hi)``.
        split: whether the work is large enough for the intra-op threads.
        kernel: the kernel size (traced).
        planes: a stem read as channel planes (traced).
        pack_b: ``bias or None -> the kernel's bias array``.
        bconst: the node's constant bias (or None).
        wp: the packed weights (direct, depthwise kinds).
        threads: the module giving ``current_threads()`` (depthwise kinds).
    """

    __slots__ = ("kind", "cb", "cdr", "prep", "wp", "y_shape", "b_none", "b_const",
                 "bt_const", "ep", "split", "kernel", "planes", "threads", "pack_b", "made")

    def __init__(self, kind, cb, cdr, prep, y_shape, ep, split, kernel, planes, pack_b, bconst,
                 wp=None, threads=None):
        self.kind, self.cb, self.cdr, self.prep, self.y_shape = kind, cb, cdr, prep, y_shape
        self.ep = tuple(np.float32(v) for v in ep) if kind == "blocked" else tuple(ep)
        self.split, self.kernel, self.planes, self.wp = split, kernel, planes, wp
        self.threads = threads if threads is not None else cdr
        self.pack_b = pack_b
        self.made = switches()
        m = y_shape[1]
        self.b_none = pack_b(None)
        self.b_const = bconst
        self.bt_const = None if bconst is None or np.size(bconst) != m \
            or bconst.dtype != np.float32 else pack_b(bconst)

    def usable(self, x: np.ndarray, z) -> bool:
        """Whether this call takes ``x`` (float32) and ``z`` (None or of the
        output's shape), the kernel switches as they were (module doc)."""
        return x.dtype == np.float32 and (z is None or z.shape == self.y_shape) \
            and switches() == self.made

    def call(self, x: np.ndarray, b, z) -> np.ndarray | None:
        """``y`` of ``x`` (the shapes matched), bias ``b`` and residual ``z``;
        None where ``b`` is neither absent, the constant one, nor of M values
        (the full path then decides)."""
        m = self.y_shape[1]
        if b is None:
            bt = self.b_none
        elif b is self.b_const and self.bt_const is not None:
            bt = self.bt_const
        elif np.size(b) == m:
            bt = self.pack_b(b)
        else:
            return None
        kind = self.kind
        if kind == "dwr":
            y = self.cb.run(self.prep, x, self.wp, bt, z, *self.ep, self.threads.current_threads())
            tracing.kernel_variant("conv", "depthwise", "kernel=%s, rows", self.kernel)
            tracing.kernel_variant("conv_impl", "compiled")
        elif kind == "dw":
            kernel, strides, dil, pb, out = self.prep
            y = self.cb.run(x, self.wp, bt, kernel, strides, dil, pb, out, z, *self.ep,
                            self.threads.current_threads() if self.split else 1)
            tracing.kernel_variant("conv", "depthwise", "kernel=%s, channel blocks", kernel)
            tracing.kernel_variant("conv_impl", "compiled")
        elif kind == "blocked":
            y = self.cb.execute(self.prep, x, bt, z, *self.ep,
                                threads=self.cdr.current_threads() if self.split else 1)
            tracing.kernel_variant("conv", "direct", "kernel=%s, channel blocks%s", self.kernel,
                                   " (input planes)" if self.planes else "")
        else:
            y = self.cdr.run(self.prep, x, self.wp, None, z, *self.ep, packed_bias=bt)
            tracing.kernel_variant("conv", "direct", "kernel=%s", self.kernel)
        return y
