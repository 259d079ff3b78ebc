"""Compiled (numba) LayerNormalization and SkipLayerNormalization for float32:
one kernel call per node, each row read twice (sum, then centred sum of
squares from the row in cache) and written once, statistics accumulated in
float64 by vectorized reductions (a fixed order: a row's bits do not depend
on the thread that runs it). numpy needs ~8 passes and as many temporaries
for the same (the decode step's ``(1, 1, 256)`` SkipLayerNormalization cost
~50 µs of Python and allocation, the compiled call a few); a node keeps a
prepared call per input shape (:class:`RowsCall`).

Loaded lazily (``lazy_module``) by :mod:`.normalization` and :mod:`.contrib`;
without numba :data:`HAVE_NUMBA` is False and their numpy paths run (both are
tested against onnxruntime, ``COMPILED`` switches this path off).

Rows: every index of ``x.shape[:axis]``; a row is the ``D = prod(x.shape[axis:])``
contiguous values that are normalized together.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import numpy as np

__all__ = ["HAVE_NUMBA", "COMPILED", "PREPARED", "RowsCall", "layer_norm", "prepare", "rows_range",
           "PARALLEL_MIN_ELEMENTS", "PARTNER_MIN_ELEMENTS", "USE_PARTNERS"]

#: the compiled path runs (tests switch it off to check the numpy one)
COMPILED = True
#: nodes keep a prepared call per shape (:class:`RowsCall`; False: every call
#: through :func:`layer_norm`, for A/B runs)
PREPARED = True
#: from this many elements (and two rows) the rows are split over the intra-op
#: threads: row blocks, one serial compiled call each, on the help-first chunk
#: loop (:func:`._parallel.run_chunks`; numba's own parallel region waited for
#: descheduled pool threads on the loaded 2-core machine)
PARALLEL_MIN_ELEMENTS = 1 << 16
#: with the compiled partner threads (:mod:`._partner`: a hand-off of about a
#: microsecond, no Python) the rows split from this many elements
PARTNER_MIN_ELEMENTS = 1 << 14
#: split through the compiled partners where they exist (False: the chunk loop)
USE_PARTNERS = True

try:
    from numba import njit
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

_NONE = np.zeros(1, np.float32)
_NONE2 = _NONE.reshape(1, 1)
# reassociation lets the row sums vectorize (one float64 add chain a row was
# latency-bound: a (64, 256) SkipLayerNormalization 30 vs ~5 µs); no 'nnan' /
# 'ninf', so NaN and inf propagate as before. The order is fixed by the
# compiled loop: a row's bits do not depend on the thread that runs it. The
# flags must be on the outer functions: numba inlines inline="always" helpers
# with their caller's flags.
_FLAGS = {"nsz", "arcp", "contract", "reassoc"}
#: epsilon -> its float32 value as a Python float (a few distinct values a process)
_EPS: dict = {}

if HAVE_NUMBA:
    @njit(nogil=True, cache=True, inline="always", fastmath=_FLAGS)
    def _row_sum(row):  # pragma: no cover - compiled
        # the row's sum in float64 (a vectorized reduction under the callers' _FLAGS)
        acc = 0.0
        for j in range(row.shape[0]):
            acc += np.float64(row[j])
        return acc

    @njit(nogil=True, cache=True, inline="always", fastmath=_FLAGS)
    def _row_sq(row, mean):  # pragma: no cover - compiled
        # the row's sum of squared deviations from mean, in float64
        acc = 0.0
        for j in range(row.shape[0]):
            t = np.float64(row[j]) - mean
            acc += t * t
        return acc

    @njit(nogil=True, cache=True, fastmath=_FLAGS)
    def _rows_beta(src, gamma, beta, eps, y, mean_o, inv_o, r0, r1):  # pragma: no cover
        # rows r0 .. r1 - 1: y = (src - mean) * inv * gamma + beta. The row loops live
        # in functions of their own: next to the skip sums' loops (or the other
        # variant's) in one function they ran 1.5-2x slower
        for r in range(r0, r1):
            sr, yr = src[r], y[r]
            d = sr.shape[0]
            mean = _row_sum(sr) / d
            inv = 1.0 / np.sqrt(_row_sq(sr, mean) / d + eps)
            for j in range(d):
                yr[j] = (sr[j] - mean) * inv * gamma[j] + beta[j]
            mean_o[r] = mean
            inv_o[r] = inv

    @njit(nogil=True, cache=True, fastmath=_FLAGS)
    def _rows_scale(src, gamma, eps, y, mean_o, inv_o, r0, r1):  # pragma: no cover
        # _rows_beta without the shift
        for r in range(r0, r1):
            sr, yr = src[r], y[r]
            d = sr.shape[0]
            mean = _row_sum(sr) / d
            inv = 1.0 / np.sqrt(_row_sq(sr, mean) / d + eps)
            for j in range(d):
                yr[j] = (sr[j] - mean) * inv * gamma[j]
            mean_o[r] = mean
            inv_o[r] = inv

    @njit(nogil=True, cache=True, fastmath=_FLAGS)
    def _sums(x, skip, bias, s, flags, r0, r1):  # pragma: no cover - compiled
        # s = x (+ skip) (+ bias) over rows r0 .. r1 - 1
        for r in range(r0, r1):
            xr, sr = x[r], s[r]
            if flags & 1:
                kr = skip[r]
                if flags & 2:
                    for j in range(xr.shape[0]):
                        sr[j] = xr[j] + kr[j] + bias[j]
                else:
                    for j in range(xr.shape[0]):
                        sr[j] = xr[j] + kr[j]
            else:
                for j in range(xr.shape[0]):
                    sr[j] = xr[j] + bias[j]

    @njit(nogil=True, cache=True, fastmath=_FLAGS)
    def rows_range(x, skip, bias, gamma, beta, eps, y, s, mean_o, inv_o, flags, r0,
                   r1):  # pragma: no cover - compiled
        """Rows ``r0 .. r1 - 1`` of the normalization (:func:`layer_norm`'s
        operands as 2-D (rows, D) float32 arrays; ``flags``: 1 skip, 2 bias,
        4 beta; ``skip`` / ``s`` may be (1, 1) and ``bias`` / ``beta`` (1,)
        placeholders when their flag is off)."""
        src = x
        if flags & 3:  # s = x + skip + bias, kept; normalized from there
            _sums(x, skip, bias, s, flags, r0, r1)
            src = s
        if flags & 4:
            _rows_beta(src, gamma, beta, eps, y, mean_o, inv_o, r0, r1)
        else:
            _rows_scale(src, gamma, eps, y, mean_o, inv_o, r0, r1)

    @njit(nogil=True, cache=True, fastmath=_FLAGS)
    def _rows_serial(x, skip, bias, gamma, beta, eps, y, s, mean_o, inv_o, flags):  # pragma: no cover
        rows_range(x, skip, bias, gamma, beta, eps, y, s, mean_o, inv_o, flags, 0, x.shape[0])

    @njit(nogil=True, cache=True, fastmath=_FLAGS)
    def _rows_nd(x, skip, bias, gamma, beta, eps, y, s, stats, flags):  # pragma: no cover
        # every row of C-contiguous x (any rank, rows of gamma's size) into y, the
        # kept sum s and stats (2, ...): means, then inverse deviations
        d = gamma.shape[0]
        rows = x.size // d
        sk = skip.reshape(rows, d) if flags & 1 else skip.reshape(1, 1)
        s2 = s.reshape(rows, d) if flags & 3 else s.reshape(1, 1)
        st = stats.reshape(2, rows)
        rows_range(x.reshape(rows, d), sk, bias, gamma, beta, eps, y.reshape(rows, d), s2,
                   st[0], st[1], flags, 0, rows)



def _vector(p, d: int):
    """``p`` as a contiguous float32 vector of ``d`` values, or None."""
    if p is None or p.dtype != np.float32 or p.size != d:
        return None
    if p.ndim == 1 and p.flags.c_contiguous:  # the usual constant: no new array object
        return p
    return np.ascontiguousarray(p).reshape(d)


def _is_vector(p, d: int) -> bool:
    return p.dtype == np.float32 and p.shape == (d,) and p.flags.c_contiguous


def _last_axis_serial(x, gamma, beta, epsilon, skip, bias, keep_sum):
    # the usual case in few Python steps (a decode step's (1, 1, D) rows): C-contiguous
    # x normalized over its last axis, 1-D contiguous parameters, a same-shape
    # contiguous skip, one thread; None: the general path decides
    d = x.shape[-1]
    rows = x.size // d if d else 0
    if rows == 0 or (rows >= 2 and rows * d >= PARTNER_MIN_ELEMENTS) or \
            not _is_vector(gamma, d):
        return None
    flags = 0
    b = bi = _NONE
    if beta is not None:
        if not _is_vector(beta, d):
            return None
        b, flags = beta, 4
    if bias is not None:
        if not _is_vector(bias, d):
            return None
        bi, flags = bias, flags | 2
    x2 = x.reshape(rows, d)
    if skip is not None:
        if skip.dtype != np.float32 or skip.shape != x.shape or not skip.flags.c_contiguous:
            return None
        sk, flags = skip.reshape(rows, d), flags | 1
        s = np.empty((rows, d), np.float32)
    elif flags & 2:
        sk, s = _NONE2, np.empty((rows, d), np.float32)
    else:
        sk = s = _NONE2
    y = np.empty(x.shape, np.float32)
    mean = np.empty(rows, np.float32)
    inv = np.empty(rows, np.float32)
    eps = _EPS.get(epsilon)
    if eps is None:
        eps = float(np.float32(epsilon))
        if len(_EPS) < 64:
            _EPS[epsilon] = eps
    _rows_serial(x2, sk, bi, gamma, b, eps, y.reshape(rows, d), s, mean, inv, flags)
    total = None
    if keep_sum:
        total = s.reshape(x.shape) if flags & 3 else x
    return y, mean, inv, total


_F32 = np.dtype(np.float32)


class RowsCall:
    """One node's prepared serial call of the normalization for one input
    shape (:func:`prepare`): C-contiguous float32 ``x`` normalized over its
    last axis, constant ``gamma`` / ``beta`` / ``bias`` (the very arrays),
    a same-shape skip or none; few enough values for one thread. A decode
    step's ``(1, 1, D)`` (Skip)LayerNormalization spent ~3 µs of its ~4 µs in
    the checks and reshapes of :func:`layer_norm`; :meth:`fits` is a few
    identity and shape tests, :meth:`run` three allocations and the compiled
    call (the same rows kernel, so the same bits)."""

    __slots__ = ("shape", "gamma", "beta", "bias", "has_skip", "eps", "flags", "stats_shape",
                 "b", "bi")

    def __init__(self, shape, gamma, beta, bias, has_skip, eps, flags):
        self.shape, self.gamma, self.beta, self.bias = shape, gamma, beta, bias
        self.has_skip, self.eps, self.flags = has_skip, eps, flags
        self.stats_shape = (2,) + shape[:-1] + (1,)
        self.b = beta if beta is not None else _NONE
        self.bi = bias if bias is not None else _NONE

    def fits(self, x, skip, gamma, beta, bias) -> bool:
        """Whether this call takes these operands (else :func:`layer_norm`)."""
        return (x.shape == self.shape and gamma is self.gamma and beta is self.beta
                and bias is self.bias and x.dtype is _F32 and x.flags.c_contiguous
                and COMPILED and PREPARED
                and (skip is None if not self.has_skip else
                     (skip is not None and skip.shape == self.shape and skip.dtype is _F32
                      and skip.flags.c_contiguous)))

    def run(self, x, skip):
        """``(y, mean, inv_std, s)`` as :func:`layer_norm` with ``keep_sum``,
        ``mean`` / ``inv_std`` shaped ``x.shape[:-1] + (1,)``."""
        shape = self.shape
        flags = self.flags
        y = np.empty(shape, _F32)
        stats = np.empty(self.stats_shape, _F32)
        s = np.empty(shape, _F32) if flags & 3 else _NONE2
        _rows_nd(x, skip if flags & 1 else _NONE2, self.bi, self.gamma, self.b, self.eps, y, s,
                 stats, flags)
        return y, stats[0], stats[1], (s if flags & 3 else x)


def prepare(x, gamma, beta, epsilon, skip=None, bias=None) -> RowsCall | None:
    """A :class:`RowsCall` for these operands (normalized over ``x``'s last
    axis; ``skip`` / ``bias`` as :func:`layer_norm`), or None where the
    prepared call does not apply: numba missing or off, other dtypes or
    layouts, parameters that are not 1-D contiguous float32 of ``D`` values,
    a broadcast skip, an empty ``x``, or enough rows for the row split."""
    if not (HAVE_NUMBA and COMPILED and PREPARED) or x.dtype is not _F32 or x.ndim == 0 or \
            not x.flags.c_contiguous:
        return None
    d = x.shape[-1]
    rows = x.size // d if d else 0
    if rows == 0 or (rows >= 2 and rows * d >= PARTNER_MIN_ELEMENTS) or not _is_vector(gamma, d):
        return None
    flags = 0
    if beta is not None:
        if not _is_vector(beta, d):
            return None
        flags |= 4
    if bias is not None:
        if not _is_vector(bias, d):
            return None
        flags |= 2
    if skip is not None:
        if skip.dtype is not _F32 or skip.shape != x.shape or not skip.flags.c_contiguous:
            return None
        flags |= 1
    return RowsCall(x.shape, gamma, beta, bias, skip is not None, float(np.float32(epsilon)),
                    flags)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, epsilon: float,
               axis: int = -1, skip: np.ndarray | None = None,
               bias: np.ndarray | None = None, keep_sum: bool = False):
    """``LayerNorm(x [+ skip] [+ bias]) * gamma [+ beta]`` over dims ``axis..``.

    Args:
        x: float32, any layout (made contiguous).
        gamma, beta: float32 with ``D`` values (the normalized dims' product).
        epsilon: added to the variance (rounded to float32).
        axis: first normalized dim (negative counts from the end).
        skip: float32 of ``x``'s shape, added first (SkipLayerNormalization).
        bias: float32 ``D`` values, added after ``skip``.
        keep_sum: also return ``x + skip + bias`` (SkipLayerNormalization's
            4th output).

    Returns:
        ``(y, mean, inv_std, s)``: ``y`` float32 of ``x``'s shape, ``mean`` and
        ``inv_std`` float32 ``x.shape[:axis]`` (flattened rows, reshape to the
        op's statistics shape), ``s`` the sum when asked (else ``None``); or
        ``None`` when numba is missing, the path is switched off, or the
        operands do not qualify (other dtypes, a broadcast ``skip``): the
        caller runs its numpy path then.
    """
    if not (HAVE_NUMBA and COMPILED) or x.dtype != np.float32 or x.ndim == 0:
        return None
    if (axis == -1 or axis == x.ndim - 1) and x.flags.c_contiguous:
        r = _last_axis_serial(x, gamma, beta, epsilon, skip, bias, keep_sum)
        if r is not None:
            return r
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax < x.ndim:
        return None
    rows = 1
    for n in x.shape[:ax]:
        rows *= n
    d = x.size // rows if rows else 0
    if d == 0 or rows == 0:
        return None
    g = _vector(gamma, d)
    b = _vector(beta, d) if beta is not None else _NONE
    bi = _vector(bias, d) if bias is not None else _NONE
    if g is None or b is None or bi is None:
        return None
    flags = 0
    sk = _NONE.reshape(1, 1)
    if skip is not None:
        if skip.dtype != np.float32 or skip.shape != x.shape:
            return None
        sk = np.ascontiguousarray(skip).reshape(rows, d)
        flags |= 1
    if bias is not None:
        flags |= 2
    if beta is not None:
        flags |= 4
    x2 = np.ascontiguousarray(x).reshape(rows, d)
    y = np.empty((rows, d), np.float32)
    s = np.empty((rows, d), np.float32) if flags & 3 else sk
    mean = np.empty(rows, np.float32)
    inv = np.empty(rows, np.float32)
    eps = float(np.float32(epsilon))
    threads = 1
    if rows >= 2 and rows * d >= PARTNER_MIN_ELEMENTS:
        from . import _threads
        threads = min(_threads.current(), rows)
    team = None
    if threads > 1:
        from . import _partner
        team = _partner.team(threads) if USE_PARTNERS else None
        if team is None and rows * d < PARALLEL_MIN_ELEMENTS:
            threads = 1
    if threads <= 1:
        _rows_serial(x2, sk, bi, g, b, eps, y, s, mean, inv, flags)
    elif team is not None:  # row ranges over the compiled partner threads
        from . import _partner
        _partner.layer_norm_rows(team, x2, sk, bi, g, b, eps, y, s, mean, inv, flags,
                                 min(rows, 2 * threads))
    else:  # row blocks, one serial call each, on the help-first chunk loop
        from . import _parallel
        per = -(-rows // threads)

        def block(i: int) -> None:
            r = slice(i * per, (i + 1) * per)
            _rows_serial(x2[r], sk[r] if flags & 1 else sk, bi, g, b, eps, y[r],
                         s[r] if flags & 3 else s, mean[r], inv[r], flags)
        _parallel.run_chunks(block, -(-rows // per), threads)
    total = None
    if keep_sum:
        total = s.reshape(x.shape) if flags & 3 else x
    return y.reshape(x.shape), mean, inv, total
