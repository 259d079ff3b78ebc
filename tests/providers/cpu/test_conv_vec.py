"""The vectorized row kernels of ``_conv_vec`` (depthwise plane sum, row
store with its epilogue, stride-1 / 2 row copies, the phase copy) against
numpy float64 on their stated formulas, float32 and float64, at lengths
around the vector width (masked tails) and offsets into larger arrays."""

from __future__ import annotations

import numpy as np
import pytest

from actorrt.providers.cpu import _conv_vec

pytestmark = pytest.mark.skipif(not _conv_vec.HAVE_KERNEL, reason="the LLVM row kernels are not built")
RNG = np.random.default_rng(5)
LENGTHS = [1, 7, 8, 15, 16, 17, 31, 33, 127, 129, 300]

if _conv_vec.HAVE_KERNEL:
    from numba import njit

    @njit
    def _sum(ph, offs, kk, w, w_off, acc, n, bias):
        _conv_vec.dw_sum(ph, offs, kk, w, w_off, acc, n, bias)

    @njit
    def _store(acc, a_off, y, y_off, z, z_off, has_z, n, alpha, lo, hi):
        _conv_vec.dw_store(acc, a_off, y, y_off, z, z_off, has_z, n, alpha, lo, hi)

    @njit
    def _copy(step, src, s_off, dst, d_off, n):
        if step == 1:
            _conv_vec.copy1(src, s_off, dst, d_off, n)
        else:
            _conv_vec.copy2(src, s_off, dst, d_off, n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", LENGTHS)
def test_dw_sum(n, dtype):
    kk = 5
    offs = np.array([0, 3, 11, 40, 41], np.int64)
    ph = RNG.standard_normal(n + 60).astype(dtype)
    w = RNG.standard_normal(kk + 4).astype(dtype)
    acc = np.full(n + 20, 7.0, dtype)
    bias = dtype(0.25)
    _sum(ph, offs, kk, w, 2, acc, n, bias)
    want = 0.25 + sum(np.float64(w[2 + k]) * ph[offs[k]:offs[k] + n].astype(np.float64) for k in range(kk))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(acc[:n], want, rtol=tol, atol=tol)
    assert (acc[n:] == 7.0).all()  # nothing stored past n


@pytest.mark.parametrize("has_z", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", LENGTHS)
def test_dw_store(n, dtype, has_z):
    acc = RNG.standard_normal(n + 9).astype(dtype)
    z = RNG.standard_normal(n + 13).astype(dtype)
    y = np.full(n + 30, 9.0, dtype)
    _store(acc, 4, y, 6, z, 3, has_z, n, dtype(0.1), dtype(-0.5), dtype(1.5))
    v = acc[4:4 + n].astype(np.float64) + (z[3:3 + n] if has_z else 0)
    want = np.clip(np.where(v < 0, 0.1 * v, v), -0.5, 1.5)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y[6:6 + n], want, rtol=tol, atol=tol)
    assert (y[:6] == 9.0).all() and (y[6 + n:] == 9.0).all()


@pytest.mark.parametrize("step", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", LENGTHS)
def test_row_copies(n, dtype, step):
    """Exactly ``n`` elements at the source stride; the source ends right at
    its last element read (a read past it would be outside the array)."""
    src = RNG.standard_normal(3 + (n - 1) * step + 1).astype(dtype)
    dst = np.full(n + 20, 5.0, dtype)
    _copy(step, src, 3, dst, 2, n)
    np.testing.assert_array_equal(dst[2:2 + n], src[3::step][:n])
    assert (dst[:2] == 5.0).all() and (dst[2 + n:] == 5.0).all()


@pytest.mark.parametrize("strides,pads", [((1, 1), (1, 1)), ((2, 2), (1, 0)), ((3, 2), (2, 1)), ((2, 3), (0, 2))])
def test_phase_copy_rows_matches_the_numpy_copies(strides, pads):
    """The direct conv's phase copy (compiled rows) equals its numpy slice
    assignments, pads untouched."""
    from actorrt.providers.cpu import _conv_direct as cd
    x = RNG.standard_normal((2, 3, 11, 13)).astype(np.float32)
    kernel, dil = (3, 3), (1, 1)
    out = tuple((d + 2 * p - k) // s + 1 for d, p, k, s in zip(x.shape[2:], pads, kernel, strides))
    plan = cd.make_plan(x.shape, (1, 4, 27), 1, kernel, strides, dil, pads, out)
    got = np.full(plan.total, -3.0, np.float32)
    want = got.copy()
    cd.phase_copy(plan, x, got)
    xs = want[:np.prod(plan.xs_shape)].reshape(plan.xs_shape)
    for dst, src in plan.copies:
        xs[dst] = x[src]
    np.testing.assert_array_equal(got, want)
