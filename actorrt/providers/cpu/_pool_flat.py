"""2-D MaxPool / AveragePool as tap reductions over the flattened, padded
planes (compiled with numba; float32 and float64; strides up to 2).

The planes are copied once into a buffer ``(N*C, Hp, Wp)`` whose border holds
the pad value (``-inf`` for MaxPool, 0 for AveragePool); an unpadded pool reads
the input itself (``Wp = W``). In that flat buffer the window of output
``(oy, ox)`` of plane ``c`` starts at ``c*Hp*Wp + oy*sh*Wp + ox*sw`` and tap
``(i, j)`` is at the fixed offset ``i*dh*Wp + j*dw``, so one loop over one long
contiguous range of start positions -- every row of every plane at once --
reduces each tap with full-width vectors, whatever the plane size. Every
position is reduced (the border columns, and with strides the rows and
columns between outputs, are computed and dropped); a last pass picks every
``sh``-th row and ``sw``-th column and, for AveragePool, divides by the
caller's window counts. Planes go in cache-sized groups, over the intra-op
threads in plane ranges.

It replaced the per-plane kernels for stride-1 pools and strided
AveragePool, whose per-row and per-plane costs dominated small planes (round
12 of ``docs/speed.md``: 3x3 / 1 on 14x14 x 576 235 -> 77 us, 2x2 / 2 on
56x56 x 128 227 -> 81 us; onnxruntime 38 and 61). Strided MaxPool keeps
:mod:`._pool_direct` (its phase-split tiles compute only the kept outputs:
3x3 / 2 on 56x56 x 192 160 us there, 274 here).

Values: AveragePool sums the taps in row-major tap order, then divides by
``count_h[oy] * count_w[ox]`` (as the depthwise path); MaxPool is IEEE
``maxNum`` over the taps in order starting from the first (a NaN loses to a
number, as ``np.fmax``; an all-NaN window gives NaN; a window wholly in the
padding ``-inf``) -- the numpy tap path's values.

Shapes: ``x (N, C, H, W)`` float32/float64 -> ``(N, C, OH, OW)`` of its dtype.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import math

import numpy as np

from ._conv_numba import HAVE_NUMBA

__all__ = ["ENABLED", "HAVE_NUMBA", "PARALLEL_MIN_WORK", "Plan", "applies", "make_plan", "pool2d"]

#: use this kernel for 2-D float pooling where it applies
ENABLED = True
#: strides up to this (both axes): every position is reduced, the pick takes
#: every ``sh``-th row and ``sw``-th column, so a stride of 2 computes 4x the
#: outputs it keeps (still faster than the per-plane kernels: round 12)
MAX_STRIDE = 2
#: split over the intra-op threads from this many computed positions x taps
PARALLEL_MIN_WORK = 1 << 18
#: positions per block of the tap loop (the block's sums stay in L1)
BLOCK = 4096
#: planes are copied, reduced and picked in groups of about this many padded
#: values (128 KiB of float32 per buffer: L2-resident next to the input)
GROUP_ELEMENTS = 1 << 15
#: row copies and picks move whole groups of this many values (a runtime
#: argument: numba's loop vectorizer then checks aliasing at run time; a
#: constant trip count went to the SLP vectorizer, which kept them scalar)
LANES = 16

if HAVE_NUMBA:
    from numba import njit

    # The tap loops index 1-D views from 0: numba vectorizes those (indexing
    # the buffer at ``b + off + q`` ran scalar, 15x slower). Taps are taken
    # four at a time so the partial sums go through memory once per four
    # taps, in tap order ((((s + a) + b) + c) + d: the sequential order).
    @njit(nogil=True, boundscheck=False, error_model="numpy", inline="always")
    def _sum_block(xp, offs, dst, b, m):  # pragma: no cover - compiled
        nt = len(offs)
        s0 = xp[b + offs[0]:b + offs[0] + m]
        t = 1
        if nt >= 4:
            s1 = xp[b + offs[1]:b + offs[1] + m]
            s2 = xp[b + offs[2]:b + offs[2] + m]
            s3 = xp[b + offs[3]:b + offs[3] + m]
            for q in range(m):
                dst[q] = s0[q] + s1[q] + s2[q] + s3[q]
            t = 4
        else:
            for q in range(m):
                dst[q] = s0[q]
        while t + 4 <= nt:
            s0 = xp[b + offs[t]:b + offs[t] + m]
            s1 = xp[b + offs[t + 1]:b + offs[t + 1] + m]
            s2 = xp[b + offs[t + 2]:b + offs[t + 2] + m]
            s3 = xp[b + offs[t + 3]:b + offs[t + 3] + m]
            for q in range(m):
                dst[q] = dst[q] + s0[q] + s1[q] + s2[q] + s3[q]
            t += 4
        while t < nt:
            s0 = xp[b + offs[t]:b + offs[t] + m]
            for q in range(m):
                dst[q] += s0[q]
            t += 1

    @njit(nogil=True, boundscheck=False, error_model="numpy", inline="always")
    def _maxnum(a, v):  # pragma: no cover - compiled
        # IEEE maxNum: the number where one is NaN, else the larger (a kept on ties)
        return v if (v > a or a != a) else a

    @njit(nogil=True, boundscheck=False, error_model="numpy", inline="always")
    def _max_block(xp, offs, dst, b, m):  # pragma: no cover - compiled
        nt = len(offs)
        s0 = xp[b + offs[0]:b + offs[0] + m]
        t = 1
        if nt >= 3:
            s1 = xp[b + offs[1]:b + offs[1] + m]
            s2 = xp[b + offs[2]:b + offs[2] + m]
            for q in range(m):
                dst[q] = _maxnum(_maxnum(s0[q], s1[q]), s2[q])
            t = 3
        else:
            for q in range(m):
                dst[q] = s0[q]
        while t + 3 <= nt:
            s0 = xp[b + offs[t]:b + offs[t] + m]
            s1 = xp[b + offs[t + 1]:b + offs[t + 1] + m]
            s2 = xp[b + offs[t + 2]:b + offs[t + 2] + m]
            for q in range(m):
                dst[q] = _maxnum(_maxnum(_maxnum(dst[q], s0[q]), s1[q]), s2[q])
            t += 3
        while t < nt:
            s0 = xp[b + offs[t]:b + offs[t] + m]
            for q in range(m):
                dst[q] = _maxnum(dst[q], s0[q])
            t += 1

    @njit(nogil=True, boundscheck=False, error_model="numpy")
    def _copy_rows(x, xp, h, w, hp, wp, pt, pl, pad, lanes, c0, c1):  # pragma: no cover - compiled
        # each row as whole groups of ``lanes`` (the cells past the row get the
        # pad value: the row's right pad, the next row's left pad and cells the
        # next row rewrites); exact where that would leave the plane or x
        plane = hp * wp
        wide = -(-w // lanes) * lanes
        for c in range(c0, c1):
            for r in range(h):
                s = (c * h + r) * w
                d = (c * hp + r + pt) * wp + pl
                n = wide if s + wide <= x.size and d + wide <= (c + 1) * plane else w
                src = x[s:s + n]
                dst = xp[d:d + n]
                for q in range(n):
                    dst[q] = src[q] if q < w else pad

    # Output rows move as whole groups of ``lanes`` where they stay in the
    # plane's outputs (the next row rewrites the cells past this one); ``yw``
    # and ``cnt`` carry ``lanes`` cells of slack for the over-read. One plain
    # loop per case (a call or a branch per row in the loop body kept numba's
    # vectorizer off: 13x slower)
    @njit(nogil=True, boundscheck=False, error_model="numpy")
    def _pick_max(yw, y, plane, wp, oh, ow, sh, lanes, c0, c1):  # pragma: no cover - compiled
        wide = -(-ow // lanes) * lanes
        for c in range(c0, c1):
            end = (c + 1) * oh * ow
            for oy in range(oh):
                s = c * plane + oy * sh * wp
                d = (c * oh + oy) * ow
                n = wide if d + wide <= end else ow
                src = yw[s:s + n]
                dst = y[d:d + n]
                for q in range(n):
                    dst[q] = src[q]

    @njit(nogil=True, boundscheck=False, error_model="numpy")
    def _pick_max2(yw, y, plane, wp, oh, ow, sh, lanes, c0, c1):  # pragma: no cover - compiled
        wide = -(-ow // lanes) * lanes
        for c in range(c0, c1):
            end = (c + 1) * oh * ow
            for oy in range(oh):
                s = c * plane + oy * sh * wp
                d = (c * oh + oy) * ow
                n = wide if d + wide <= end else ow
                src = yw[s:s + 2 * n]
                dst = y[d:d + n]
                for q in range(n):
                    dst[q] = src[2 * q]

    @njit(nogil=True, boundscheck=False, error_model="numpy")
    def _pick_avg(yw, y, cnt, plane, wp, oh, ow, sh, lanes, c0, c1):  # pragma: no cover - compiled
        wide = -(-ow // lanes) * lanes
        for c in range(c0, c1):
            end = (c + 1) * oh * ow
            for oy in range(oh):
                s = c * plane + oy * sh * wp
                d = (c * oh + oy) * ow
                n = wide if d + wide <= end else ow
                src = yw[s:s + n]
                dst = y[d:d + n]
                cq = cnt[oy * ow:oy * ow + n]
                for q in range(n):
                    dst[q] = src[q] / cq[q]

    @njit(nogil=True, boundscheck=False, error_model="numpy")
    def _pick_avg2(yw, y, cnt, plane, wp, oh, ow, sh, lanes, c0, c1):  # pragma: no cover - compiled
        wide = -(-ow // lanes) * lanes
        for c in range(c0, c1):
            end = (c + 1) * oh * ow
            for oy in range(oh):
                s = c * plane + oy * sh * wp
                d = (c * oh + oy) * ow
                n = wide if d + wide <= end else ow
                src = yw[s:s + 2 * n]
                dst = y[d:d + n]
                cq = cnt[oy * ow:oy * ow + n]
                for q in range(n):
                    dst[q] = src[2 * q] / cq[q]

    @njit(nogil=True, boundscheck=False, error_model="numpy")
    def _planes(x, y, offs, cnt, h, w, hp, wp, pt, pl, oh, ow, sh, sw, is_max, pad, padded,
                group, block, lanes, c0, c1):  # pragma: no cover - compiled
        """Planes ``[c0, c1)`` of ``x`` into ``y``, ``group`` planes at a
        time: their padded copy (unless unpadded: read in place), the taps
        and the pick, in buffers of one group (they stay in cache)."""
        plane = hp * wp
        xp = np.empty(group * plane + lanes, x.dtype)
        xp[:] = pad
        yw = np.empty(group * plane + 2 * lanes, x.dtype)  # the picks' over-read
        for g0 in range(c0, c1, group):
            ng = min(c1, g0 + group) - g0
            xg = x[g0 * h * w:(g0 + ng) * h * w]
            yg = y[g0 * oh * ow:(g0 + ng) * oh * ow]
            if padded:
                _copy_rows(xg, xp, h, w, hp, wp, pt, pl, pad, lanes, 0, ng)
                src = xp
            else:
                src = xg
            stop = ng * plane - offs[-1]
            for b in range(0, stop, block):
                m = min(block, stop - b)
                if is_max:
                    _max_block(src, offs, yw[b:b + m], b, m)
                else:
                    _sum_block(src, offs, yw[b:b + m], b, m)
            if is_max:
                if sw == 1:
                    _pick_max(yw, yg, plane, wp, oh, ow, sh, lanes, 0, ng)
                else:
                    _pick_max2(yw, yg, plane, wp, oh, ow, sh, lanes, 0, ng)
            elif sw == 1:
                _pick_avg(yw, yg, cnt, plane, wp, oh, ow, sh, lanes, 0, ng)
            else:
                _pick_avg2(yw, yg, cnt, plane, wp, oh, ow, sh, lanes, 0, ng)


class Plan:
    """The flat geometry of one pooling (input shape, window, strides, mode)."""

    def __init__(self, x_shape, dtype, kernel, strides, dilations, pads_begin, out_shape,
                 is_max: bool, count_h=None, count_w=None):
        """Raises ValueError: a stride past :data:`MAX_STRIDE` (or below 1)."""
        n, c, h, w = x_shape
        (kh, kw), (dh, dw), (sh, sw) = kernel, dilations, strides
        if not (1 <= sh <= MAX_STRIDE and 1 <= sw <= MAX_STRIDE):
            raise ValueError(f"_pool_flat takes strides 1-{MAX_STRIDE}, got strides {strides}")
        (pt, pl), (oh, ow) = pads_begin, out_shape
        self.dtype = np.dtype(dtype)
        self.is_max = bool(is_max)
        self.pad = -np.inf if is_max else 0.0
        self.planes = n * c
        self.h, self.w, self.pt, self.pl = h, w, pt, pl
        self.oh, self.ow, self.sh, self.sw = oh, ow, sh, sw
        # the buffer covers the image, the leading pads and every tap of every output
        self.hp = max(pt + h, (oh - 1) * sh + (kh - 1) * dh + 1)
        self.wp = max(pl + w, (ow - 1) * sw + (kw - 1) * dw + 1)
        self.padded = (pt, pl, self.hp, self.wp) != (0, 0, h, w)
        self.offs = np.array([i * dh * self.wp + j * dw for i in range(kh) for j in range(kw)],
                             np.int64)
        self.y_shape = (n, c, oh, ow)
        self.cnt = np.ones(oh * ow + LANES, self.dtype)  # LANES: the picks' over-read
        if not is_max:
            self.cnt[:oh * ow] = np.multiply.outer(np.asarray(count_h, self.dtype),
                                                   np.asarray(count_w, self.dtype)).reshape(-1)
        self.work = self.planes * self.hp * self.wp * len(self.offs)
        # planes per group: the group's padded copy and sums fit in L1 / L2
        self.group = max(1, GROUP_ELEMENTS // (self.hp * self.wp))


def applies(x: np.ndarray, strides) -> bool:
    """Whether :func:`pool2d` takes a pooling of ``x`` with ``strides``
    (strides up to :data:`MAX_STRIDE`, 4-D float32/float64, numba installed,
    :data:`ENABLED`)."""
    return ENABLED and HAVE_NUMBA and all(1 <= s <= MAX_STRIDE for s in strides) \
        and x.ndim == 4 and x.dtype in (np.float32, np.float64) and x.size > 0


def make_plan(x: np.ndarray, kernel, strides, dilations, pads_begin, out_shape, is_max: bool,
              count_h=None, count_w=None) -> Plan:
    """A :class:`Plan` for pooling ``x``'s shape and dtype. ``count_h (OH,)`` /
    ``count_w (OW,)``: AveragePool's divisor factors (pads counted or not, the
    caller decides); ignored for MaxPool."""
    return Plan(x.shape, x.dtype, tuple(kernel), tuple(strides), tuple(dilations),
                tuple(pads_begin), tuple(out_shape), is_max, count_h, count_w)


def pool2d(plan: Plan, x: np.ndarray) -> np.ndarray:
    """``y (N, C, OH, OW)`` of ``x`` (the plan's shape and dtype): see the
    module doc for the values."""
    xf = np.ascontiguousarray(x).reshape(-1)
    y = np.empty(plan.y_shape, plan.dtype)
    yf = y.reshape(-1)
    args = (xf, yf, plan.offs, plan.cnt, plan.h, plan.w, plan.hp, plan.wp, plan.pt, plan.pl,
            plan.oh, plan.ow, plan.sh, plan.sw, plan.is_max, plan.pad, plan.padded, plan.group,
            BLOCK, LANES)
    threads = 1
    if plan.planes > 1 and plan.work >= PARALLEL_MIN_WORK:
        from ._threads import current
        threads = current()
    if threads <= 1:
        _planes(*args, 0, plan.planes)
    else:
        from . import _parallel
        per = -(-plan.planes // (_parallel.CHUNKS_PER_THREAD * threads))
        _parallel.run_chunks(lambda i: _planes(*args, i * per, min(plan.planes, (i + 1) * per)),
                             -(-plan.planes // per), threads)
    return y
