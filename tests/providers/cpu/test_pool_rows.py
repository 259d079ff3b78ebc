"""The row MaxPool / AveragePool (``_pool_rows``: a vertical, then a
horizontal pass per output row) against onnxruntime and the numpy tap path:
row widths under, at and past 16 (masked vectors, the recomputed last
vector), strides 1-3 down the plane and 1-2 along it, asymmetric / SAME /
ceil-mode pads, count_include_pad, NaN, one and two threads (partners and the
chunk loop), plane ranges."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper

import actorrt
from actorrt.providers.cpu import _conv_split, _pool_rows, pool

from .test_pool_compiled import CASES, FLAT_CASES, _with_nans

RNG = np.random.default_rng(15)

pytestmark = pytest.mark.skipif(not _pool_rows.HAVE_KERNEL,
                                reason="no AVX-512 16-lane kernels on this host")

ROW_CASES = [  # (shape, attrs): the zoo pools and the edges of the row loops
    ((1, 5, 112, 112), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]}),
    ((1, 4, 112, 112), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 3, 56, 56), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 6, 27, 27), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    ((1, 3, 109, 109), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ((1, 2, 16, 16), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),  # 16 wide
    ((1, 2, 9, 17), {"kernel_shape": [2, 2], "strides": [1, 1]}),  # 17 in, 16 out
    ((1, 2, 8, 33), {"kernel_shape": [3, 3], "strides": [1, 2], "pads": [0, 1, 2, 0]}),  # 17 out
    ((1, 2, 11, 34), {"kernel_shape": [3, 2], "strides": [3, 2], "ceil_mode": 1}),
    ((2, 2, 13, 40), {"kernel_shape": [5, 3], "strides": [2, 1], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 12, 30), {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 7, 48), {"kernel_shape": [7, 7], "strides": [1, 2], "pads": [3, 3, 3, 3]}),
    ((1, 3, 10, 24), {"kernel_shape": [1, 1], "strides": [2, 2]}),
    ((3, 1, 6, 20), {"kernel_shape": [3, 4], "strides": [1, 1], "pads": [2, 3, 2, 3]}),
]


def _model(op, shape, attrs, **extra):
    node = helper.make_node(op, ["x"], ["y"], **attrs, **extra)
    g = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", TP.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 12 if op == "MaxPool" else 19)])


def _force(monkeypatch, threads_mode):
    """Rows for every width; ``threads_mode``: one thread, the partners or
    the chunk loop at any size."""
    monkeypatch.setattr(_pool_rows, "ENABLED", True)
    monkeypatch.setattr(_pool_rows, "MIN_WIDTH", 1)
    monkeypatch.setattr(_pool_rows, "AVG_MIN_WIDTH", 1)
    monkeypatch.setattr(_pool_rows, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(_conv_split, "ENABLED", threads_mode == "partners")
    return 1 if threads_mode == "one" else 2


def _run(model, x, threads):
    opts = actorrt.SessionOptions(trace="ops", intra_op_num_threads=threads)
    with actorrt.InferenceSession(model, opts) as s:
        got = s.run(None, {"x": x})[0]
        got2 = s.run(None, {"x": x})[0]
        variants = [(sp.args.get("kernel_variant.pool") or {}).get("variant")
                    for sp in s.session.tracer.spans if sp.cat == "op"]
    return got, got2, variants


def _cases():
    for shape, attrs in ROW_CASES + CASES + FLAT_CASES:
        if attrs.get("dilations", [1, 1]) != [1, 1] or attrs.get("strides", [1, 1])[1] > 2:
            continue
        yield shape, attrs, "MaxPool", None
        for cip in (0, 1):
            yield shape, attrs, "AveragePool", cip


@pytest.mark.parametrize("threads_mode", ["one", "partners", "python"])
@pytest.mark.parametrize("shape,attrs,op,count_include_pad", list(_cases()))
def test_row_pool_matches_onnxruntime(shape, attrs, op, count_include_pad, threads_mode,
                                      monkeypatch):
    """MaxPool exactly, AveragePool within float32 rounding of onnxruntime;
    the second run (the plan and its blocks reused) equal to the first."""
    threads = _force(monkeypatch, threads_mode)
    extra = {} if count_include_pad is None else {"count_include_pad": count_include_pad}
    model = _model(op, shape, attrs, **extra)
    x = RNG.standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got, got2, variants = _run(model, x, threads)
    window_is_plane = tuple(attrs["kernel_shape"]) == shape[2:] and "pads" not in attrs
    assert ("rows" in variants) == (not (op == "AveragePool" and window_is_plane))
    assert got.shape == want.shape and got.dtype == np.float32
    if op == "MaxPool":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got2, got)


def test_row_pool_posts_planes_to_the_partners(monkeypatch):
    """Two threads with the partners: the planes go out as the row-pool job,
    and the result equals one thread's bit for bit."""
    if not _conv_split.HAVE_SPLIT:
        pytest.skip("no compiled partner threads")
    from actorrt.providers.cpu import _partner
    seen = []
    real = _partner.run_items

    def spy(t, fn, params, items, chunks, linger=0):
        seen.append((fn, items))
        return real(t, fn, params, items, chunks, linger)

    monkeypatch.setattr(_partner, "run_items", spy)
    shape, attrs = ROW_CASES[0]
    x = RNG.standard_normal(shape).astype(np.float32)
    for op in ("MaxPool", "AveragePool"):
        model = _model(op, shape, attrs)
        _force(monkeypatch, "one")
        one, _, _ = _run(model, x, 1)
        seen.clear()
        _force(monkeypatch, "partners")
        two, _, _ = _run(model, x, 2)
        assert seen and all(fn == _conv_split.ROWPOOL_ITEMS and items == shape[0] * shape[1]
                            for fn, items in seen)
        np.testing.assert_array_equal(two, one)


@pytest.mark.parametrize("case", range(len(ROW_CASES)))
def test_row_maxpool_nan_equals_the_numpy_taps(case, monkeypatch):
    """NaN inputs (all-NaN windows, NaN next to the pads): the numpy tap
    path's np.fmax values bit for bit (maxNum is exact in any order; a
    window wholly in the padding gives -inf)."""
    shape, attrs = ROW_CASES[case]
    model = _model("MaxPool", shape, attrs)
    x = _with_nans(shape)
    _force(monkeypatch, "one")
    got, _, variants = _run(model, x, 1)
    monkeypatch.setattr(pool, "COMPILED", False)
    want, _, _ = _run(model, x, 1)
    assert "rows" in variants
    np.testing.assert_array_equal(got, want)


def test_window_in_the_padding_only():
    """Rows whose window lies wholly in the padding: -inf (MaxPool, as the
    numpy tap path) and the pad count's zero sum (AveragePool with
    count_include_pad), computed on the plan directly."""
    x = RNG.standard_normal((1, 2, 3, 20)).astype(np.float32)
    # 4 rows of pads above, stride 2: output rows 0 and 1 (input rows -4..-1)
    # are all padding, row 2 reads input rows 0 and 1
    for counts, want0 in ((None, -np.inf), ((np.array([2, 2, 2]), np.full(18, 3)), 0.0)):
        plan = _pool_rows.make_plan(x.shape, (2, 3), (2, 1), (4, 0), (3, 18), counts)
        y = _pool_rows.pool2d(plan, x)
        assert np.all(y[:, :, :2] == want0)
        if counts is None:
            rows = x[:, :, 0:2].max(axis=2)
            row2 = np.maximum.reduce([rows[..., k:k + 18] for k in range(3)])
        else:
            rows = x[:, :, 0:2].sum(axis=2, dtype=np.float64)
            row2 = sum(rows[..., k:k + 18] for k in range(3)) / 6
        np.testing.assert_allclose(y[:, :, 2], row2, rtol=1e-6)


@pytest.mark.parametrize("p0,p1", [(0, 1), (1, 3), (2, 5), (4, 5)])
def test_plane_range_writes_only_its_planes(p0, p1):
    """:func:`planes_range` over planes ``[p0, p1)`` leaves the others'
    outputs untouched (rows under 16 outputs store masked vectors)."""
    shape = (1, 5, 9, 20)
    x = RNG.standard_normal(shape).astype(np.float32)
    plan = _pool_rows.make_plan(shape, (3, 3), (2, 2), (1, 1), (5, 10))
    h, w, oh, ow, kh, kw, sh, sw, pt, pl, vlen, is_max = (int(v) for v in plan.ints)
    y = np.full((1, 5, oh, ow), 7.0, np.float32)
    _pool_rows.planes_range(x.reshape(-1), y.reshape(-1), plan.inv, h, w, oh, ow, kh, kw, sh,
                            sw, pt, pl, vlen, True, p0, p1)
    full = _pool_rows.pool2d(plan, x)
    np.testing.assert_array_equal(y[:, p0:p1], full[:, p0:p1])
    assert np.all(y[:, :p0] == 7.0) and np.all(y[:, p1:] == 7.0)


def test_applies():
    """Float32 4-D, dilations 1, column stride 1-2, from the width rules."""
    x = np.zeros((1, 2, 8, 40), np.float32)
    assert _pool_rows.applies(x, (3, 3), (2, 2), (1, 1), True)
    assert _pool_rows.applies(x, (3, 3), (3, 1), (1, 1), False)
    assert not _pool_rows.applies(x, (3, 3), (1, 3), (1, 1), True)  # column stride 3
    assert not _pool_rows.applies(x, (3, 3), (1, 1), (2, 1), True)  # dilated
    assert not _pool_rows.applies(x.astype(np.float64), (3, 3), (1, 1), (1, 1), True)
    narrow = np.zeros((1, 2, 8, _pool_rows.MIN_WIDTH - 1), np.float32)
    assert not _pool_rows.applies(narrow, (3, 3), (1, 1), (1, 1), True)
    mid = np.zeros((1, 2, 8, _pool_rows.AVG_MIN_WIDTH - 1), np.float32)
    assert not _pool_rows.applies(mid, (3, 3), (1, 1), (1, 1), False)
