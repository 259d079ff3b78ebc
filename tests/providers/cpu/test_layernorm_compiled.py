"""LayerNormalization and com.microsoft SkipLayerNormalization: the compiled
one-call path (``_layernorm_numba``) and the numpy fallback, both against
onnxruntime, over odd sizes, every normalized axis, optional bias/beta,
the statistics outputs, the parallel row split, non-contiguous inputs and a
broadcast skip (which takes the numpy path)."""

from __future__ import annotations

import numpy as np
import pytest

from actorrt.providers.cpu import _layernorm_numba as ln
from tests.oracle import check_node

RNG = np.random.default_rng(21)
MS = "com.microsoft"


@pytest.fixture(params=["compiled", "numpy"])
def path(request, monkeypatch):
    if request.param == "compiled" and not ln.HAVE_NUMBA:
        pytest.skip("numba not installed")
    monkeypatch.setattr(ln, "COMPILED", request.param == "compiled")
    return request.param


def _f(shape, scale=2.0):
    return (RNG.standard_normal(shape) * scale + 0.5).astype(np.float32)


@pytest.mark.parametrize("shape,axis", [((1, 1, 256), -1), ((2, 3, 7), -1), ((5, 33), 1),
                                        ((2, 3, 5), 1), ((4, 9), 0), ((3, 1), -1),
                                        ((96, 1024), -1), ((1,), 0)])
@pytest.mark.parametrize("with_b", [True, False])
def test_layer_norm_equals_onnxruntime(path, shape, axis, with_b):
    x = _f(shape)
    norm = shape[axis % len(shape):]
    ins = {"x": x, "g": _f(norm, 1.0)}
    if with_b:
        ins["b"] = _f(norm, 1.0)
    check_node("LayerNormalization", ins, ("y", "mean", "inv"), opset=17, peer="ort",
               axis=axis, epsilon=1e-5)
    check_node("LayerNormalization", ins, ("y",), opset=17, peer="ort", axis=axis, epsilon=1e-3)


@pytest.mark.parametrize("shape", [(1, 1, 256), (2, 5, 31), (1, 128, 64), (3, 97, 769)])
@pytest.mark.parametrize("extras", [(), ("be",), ("bias",), ("be", "bias")])
def test_skip_layer_norm_equals_onnxruntime(path, shape, extras):
    h = shape[-1]
    ins = {"x": _f(shape), "s": _f(shape), "g": _f((h,), 1.0)}
    ins["be"] = _f((h,), 1.0) if "be" in extras else None
    if "bias" in extras:
        ins["bias"] = _f((h,), 1.0)
    check_node("SkipLayerNormalization", ins, ("y", "m", "i", "sum"), domain=MS, peer="ort",
               rtol=1e-4, atol=1e-5, epsilon=1e-5)


def test_skip_broadcast_and_a_non_contiguous_input(path):
    x = _f((4, 6, 3)).transpose(1, 0, 2)  # (6, 4, 3), strided
    check_node("SkipLayerNormalization", {"x": x, "s": _f((4, 3)), "g": _f((3,))}, ("y",),
               domain=MS, peer="ort", epsilon=1e-5)
    check_node("LayerNormalization", {"x": x, "g": _f((3,))}, ("y",), opset=17, peer="ort")


def test_compiled_function_declines_what_it_does_not_take():
    if not ln.HAVE_NUMBA:
        pytest.skip("numba not installed")
    x = _f((2, 8))
    assert ln.layer_norm(x.astype(np.float64), _f((8,)), None, 1e-5) is None
    assert ln.layer_norm(x, _f((4,)), None, 1e-5) is None  # gamma of another size
    assert ln.layer_norm(x, _f((8,)), None, 1e-5, skip=_f((1, 8))) is None  # broadcast skip
    assert ln.layer_norm(np.zeros((0, 8), np.float32), _f((8,)), None, 1e-5) is None
    y, mean, inv, s = ln.layer_norm(x, np.ones(8, np.float32), None, 1e-5, keep_sum=True)
    assert s is x and mean.shape == (2,) and inv.shape == (2,)
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,d", [(96, 1024), (97, 769), (3, 40000), (5, 3300)])
@pytest.mark.parametrize("skip,bias,beta", [(False, False, True), (True, True, True), (True, False, False)])
@pytest.mark.parametrize("split", ["partners", "chunks"])
def test_row_blocks_on_two_threads_equal_one_thread_and_numpy(rows, d, skip, bias, beta, split,
                                                              monkeypatch):
    """At 2 intra-op threads the rows run as ranges over the compiled partner
    threads (from PARTNER_MIN_ELEMENTS), or without them as blocks on the
    chunk loop (from PARALLEL_MIN_ELEMENTS; odd row counts: a short last
    block): the same bits as one thread."""
    if not ln.HAVE_NUMBA:
        pytest.skip("numba not installed")
    from actorrt.providers.cpu import _parallel, _partner, _threads
    if split == "partners" and not _partner.AVAILABLE:
        pytest.skip("no compiled partner threads here")
    monkeypatch.setattr(ln, "USE_PARTNERS", split == "partners")
    x, g = _f((rows, d)), _f((d,), 1.0)
    sk = _f((rows, d)) if skip else None
    bi = _f((d,), 1.0) if bias else None
    be = _f((d,), 1.0) if beta else None
    monkeypatch.setattr(_threads, "current", lambda: 1)
    one = ln.layer_norm(x, g, be, 1e-5, skip=sk, bias=bi, keep_sum=True)
    real, seen = _parallel.run_chunks, []
    monkeypatch.setattr(_parallel, "run_chunks", lambda fn, n, th: (seen.append(n), real(fn, n, th)))
    real_p, seen_p = _partner.layer_norm_rows, []
    monkeypatch.setattr(_partner, "layer_norm_rows",
                        lambda *a: (seen_p.append(a[-1]), real_p(*a))[1])
    monkeypatch.setattr(_threads, "current", lambda: 2)
    two = ln.layer_norm(x, g, be, 1e-5, skip=sk, bias=bi, keep_sum=True)
    if split == "partners":
        assert seen_p == [min(rows, 4)] and not seen
    else:
        assert seen == ([2] if rows * d >= ln.PARALLEL_MIN_ELEMENTS else []) and not seen_p
    s64 = x.astype(np.float64) + (sk if skip else 0) + (bi if bias else 0)
    mu = s64.mean(-1, keepdims=True)
    want = (s64 - mu) / np.sqrt(((s64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + (be if beta else 0)
    np.testing.assert_allclose(two[0], want, rtol=1e-4, atol=1e-4)
    for a, b in zip(one, two):
        if a is not None:
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rows", [1, 5, 96])
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("beta", [False, True])
@pytest.mark.skipif(not ln.HAVE_NUMBA, reason="numba not installed")
def test_non_finite_rows_propagate_as_numpy(rows, skip, beta):
    # the compiled row passes reassociate their sums (vectorized) but keep NaN / inf
    # semantics: a row holding a NaN or an inf normalizes to NaN, the other rows are
    # untouched
    d = 37
    x = _f((rows, d))
    x[0, 3] = np.nan
    if rows > 1:
        x[-1, 0] = np.inf
    g, b = _f((d,), 1.0), _f((d,), 1.0)
    s = _f((rows, d)) if skip else None
    r = ln.layer_norm(x, g, b if beta else None, 1e-5, -1, s, None, keep_sum=True)
    t = x.astype(np.float64) + (0 if s is None else s)
    with np.errstate(invalid="ignore"):
        mean = t.mean(-1, keepdims=True)
        want = (t - mean) / np.sqrt(((t - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * g
    if beta:
        want = want + b
    assert np.isnan(r[0][0]).all() and (rows == 1 or np.isnan(r[0][-1]).all())
    np.testing.assert_allclose(r[0][1:-1], want[1:-1], rtol=1e-5, atol=1e-5)
