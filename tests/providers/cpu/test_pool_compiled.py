"""The compiled (numba) 2-D MaxPool / AveragePool / GlobalAveragePool, the
vectorized direct MaxPool (``_pool_direct``) and the numpy paths they replace, both against onnxruntime: odd sizes, strides, pads
(asymmetric, SAME_UPPER / SAME_LOWER, VALID), dilations, ceil mode,
count_include_pad, float32 / float64."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper

import actorrt
from actorrt.providers.cpu import _dw_blocked, _pool_direct, _pool_flat, _pool_numba, _pool_rows, pool

RNG = np.random.default_rng(5)

CASES = [  # (shape, attrs)
    ((1, 3, 17, 13), {"kernel_shape": [3, 3]}),
    ((2, 5, 32, 32), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 3, 13, 13), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 1, 8, 9), {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER", "strides": [2, 1]}),
    ((1, 2, 9, 8), {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 3]}),
    ((1, 2, 11, 10), {"kernel_shape": [2, 3], "dilations": [2, 3], "pads": [1, 2, 0, 1]}),
    ((3, 4, 14, 14), {"kernel_shape": [7, 7], "strides": [1, 1]}),  # global-like window
]


def _run(op, x, attrs, compiled, monkeypatch, opset=19, direct=False, avg_dw=False, flat=False,
         blocked=False, rows=False, **extra):
    monkeypatch.setattr(pool, "COMPILED", compiled)
    monkeypatch.setattr(_pool_rows, "ENABLED", rows)
    monkeypatch.setattr(_dw_blocked, "ENABLED", blocked)
    monkeypatch.setattr(_dw_blocked, "MIN_FILL", 0.0)  # any channel count when on
    monkeypatch.setattr(_pool_flat, "ENABLED", flat)
    monkeypatch.setattr(pool, "AVG_DEPTHWISE", avg_dw)
    monkeypatch.setattr(_pool_direct, "ENABLED", direct)
    monkeypatch.setattr(_pool_direct, "MAX_ELEMENTS", 1 << 62)
    node = helper.make_node(op, ["x"], ["y"], **attrs, **extra)
    dt = TP.FLOAT if x.dtype == np.float32 else TP.DOUBLE
    g = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", dt, x.shape)],
                          [helper.make_tensor_value_info("y", dt, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with actorrt.InferenceSession(m, actorrt.SessionOptions(trace="ops")) as s:
        got = s.run(None, {"x": x})[0]
        spans = [sp.args for sp in s.session.tracer.spans if sp.cat == "op"]
    variant = "rows" if rows else "blocked" if blocked else "flat" if flat else "direct" if direct else \
        "depthwise" if avg_dw and op == "AveragePool" else "compiled"
    used = any((a.get("kernel_variant.pool") or {}).get("variant") == variant for a in spans)
    return got, want, used


@pytest.fixture(params=["chunks", "numba-pool", "serial", "numpy"])
def compiled(request, monkeypatch):
    """The compiled kernels split in plane ranges across the intra-op threads,
    on numba's pool, serial; and the numpy path."""
    if request.param != "numpy" and not _pool_numba.HAVE_NUMBA:
        pytest.skip("numba not installed")
    from actorrt.providers.cpu import _conv_numba
    monkeypatch.setattr(_conv_numba, "PARALLEL_MIN_WORK", 1 << 62 if request.param == "serial" else 0)
    monkeypatch.setattr(_conv_numba, "USE_NUMBA_POOL", request.param == "numba-pool")
    return request.param != "numpy"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,attrs", CASES)
def test_maxpool(shape, attrs, dtype, compiled, monkeypatch):
    x = RNG.standard_normal(shape).astype(dtype)
    got, want, used = _run("MaxPool", x, attrs, compiled, monkeypatch, opset=12)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert used == compiled


@pytest.mark.parametrize("shape,attrs", CASES)
def test_maxpool_separable(shape, attrs, monkeypatch):
    """The separable numpy MaxPool (rows, then columns) from any size, against
    onnxruntime, exactly."""
    if not _pool_numba.HAVE_NUMBA:
        pytest.skip("numba not installed")
    monkeypatch.setattr(pool, "SEPARABLE_MAX_MIN_WORK", 0)
    x = RNG.standard_normal(shape).astype(np.float32)
    got, want, compiled_loop = _run("MaxPool", x, attrs, True, monkeypatch, opset=12)
    assert got.shape == want.shape and not compiled_loop
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,attrs", CASES)
def test_maxpool_direct(shape, attrs, monkeypatch):
    """The vectorized MaxPool (phase-split -inf-padded input, maxnum tiles),
    exactly onnxruntime's values."""
    if not _pool_direct.HAVE_KERNEL:
        pytest.skip("no numba / AVX2: the direct MaxPool is not built")
    x = RNG.standard_normal(shape).astype(np.float32)
    got, want, used = _run("MaxPool", x, attrs, True, monkeypatch, opset=12, direct=True)
    assert got.shape == want.shape and used
    np.testing.assert_array_equal(got, want)


def _with_nans(shape):
    """float32 normal values with every third one NaN and an all-NaN 3x3
    corner (windows wholly NaN, NaN next to pads)."""
    x = RNG.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::3] = np.nan
    x[..., :3, :3] = np.nan
    return x


@pytest.mark.parametrize("case", [0, 1, 4, 8])
def test_maxpool_direct_nan_equals_the_numpy_taps(case, monkeypatch):
    """NaN inputs (some windows all NaN, some NaN next to pads): the direct
    MaxPool gives the numpy tap path's np.fmax values, bit for bit."""
    if not _pool_direct.HAVE_KERNEL:
        pytest.skip("no numba / AVX2: the direct MaxPool is not built")
    shape, attrs = CASES[case]
    x = _with_nans(shape)
    got, _, used = _run("MaxPool", x, attrs, True, monkeypatch, opset=12, direct=True)
    want, _, _ = _run("MaxPool", x, attrs, False, monkeypatch, opset=12)
    assert used
    if "pads" not in attrs:  # a 3x3 all-NaN corner: NaN there (padded: -inf from the pad)
        assert np.isnan(got).any()
    np.testing.assert_array_equal(got, want)


def test_maxpool_separable_skips_nan(monkeypatch):
    """NaN is skipped where the window has a number; an all-NaN window gives
    NaN (np.nanmax over 2x2 blocks as the oracle)."""
    monkeypatch.setattr(pool, "SEPARABLE_MAX_MIN_WORK", 0)
    monkeypatch.setattr(_pool_direct, "ENABLED", False)
    x = RNG.standard_normal((2, 3, 6, 8)).astype(np.float32)
    x.reshape(-1)[::3] = np.nan
    x[0, 0, :2, :2] = np.nan
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    g = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", TP.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    with actorrt.InferenceSession(m) as s:
        got = s.run(None, {"x": x})[0]
    with np.errstate(invalid="ignore"), __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore", RuntimeWarning)
        want = np.nanmax(x.reshape(2, 3, 3, 2, 4, 2), axis=(3, 5))
    assert np.isnan(got[0, 0, 0, 0])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("shape,attrs", CASES)
def test_averagepool(shape, attrs, count_include_pad, compiled, monkeypatch):
    x = RNG.standard_normal(shape).astype(np.float32)
    got, want, used = _run("AveragePool", x, attrs, compiled, monkeypatch,
                           count_include_pad=count_include_pad)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert used == compiled


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("shape", [(1, 8, 7, 7), (2, 5, 3, 9), (1, 3, 1, 1)])
def test_averagepool_whole_plane_is_the_plane_mean(shape, count_include_pad, compiled, monkeypatch):
    """One unpadded window over the whole plane (inception's 7x7 head) takes
    the plane mean, against onnxruntime."""
    x = RNG.standard_normal(shape).astype(np.float32)
    got, want, _ = _run("AveragePool", x, {"kernel_shape": list(shape[2:])}, compiled, monkeypatch,
                        count_include_pad=count_include_pad)
    assert got.shape == want.shape == shape[:2] + (1, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_averagepool_small_planes_keep_the_compiled_loop(monkeypatch):
    """Output planes under AVG_DEPTHWISE_MIN_PIXELS stay on the per-element loop."""
    if not _pool_numba.HAVE_NUMBA:
        pytest.skip("numba not installed")
    x = RNG.standard_normal((1, 8, 14, 14)).astype(np.float32)
    got, want, used = _run("AveragePool", x, {"kernel_shape": [2, 2], "strides": [2, 2]}, True,
                           monkeypatch, avg_dw=True)
    assert not used
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("shape,attrs", CASES + [
    ((1, 6, 28, 28), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # inception's
    ((1, 4, 56, 56), {"kernel_shape": [2, 2], "strides": [2, 2]})])  # densenet's transition
def test_averagepool_depthwise(shape, attrs, count_include_pad, compiled, monkeypatch):
    """AveragePool as the compiled depthwise conv with ones + the count
    division, against onnxruntime (float32)."""
    from actorrt.providers.cpu import _conv_numba
    if not compiled or not _conv_numba.DW_TILE:
        pytest.skip("the depthwise tiles are not built")
    monkeypatch.setattr(pool, "AVG_DEPTHWISE_MIN_PIXELS", 0)
    x = RNG.standard_normal(shape).astype(np.float32)
    got, want, used = _run("AveragePool", x, attrs, compiled, monkeypatch, avg_dw=True,
                           count_include_pad=count_include_pad)
    assert got.shape == want.shape and used
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", [1, 3, 4, 8])
def test_averagepool_depthwise_float64(case, monkeypatch):
    """float64 AveragePool by the depthwise kernel, against onnx's reference
    evaluator."""
    from actorrt.providers.cpu import _conv_numba
    if not _conv_numba.DW_TILE:
        pytest.skip("the depthwise tiles are not built")
    from onnx.reference import ReferenceEvaluator
    monkeypatch.setattr(pool, "AVG_DEPTHWISE", True)
    monkeypatch.setattr(pool, "AVG_DEPTHWISE_MIN_PIXELS", 0)
    monkeypatch.setattr(_pool_flat, "ENABLED", False)
    shape, attrs = CASES[case]
    x = RNG.standard_normal(shape)
    node = helper.make_node("AveragePool", ["x"], ["y"], **attrs, count_include_pad=1)
    g = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", TP.DOUBLE, x.shape)],
                          [helper.make_tensor_value_info("y", TP.DOUBLE, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    with actorrt.InferenceSession(m, actorrt.SessionOptions(trace="ops")) as s:
        got = s.run(None, {"x": x})[0]
        variants = [(sp.args.get("kernel_variant.pool") or {}).get("variant")
                    for sp in s.session.tracer.spans if sp.cat == "op"]
    assert "depthwise" in variants and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 7, 13, 13), (2, 2, 3, 2, 4), (1, 1000, 1, 1)])
def test_global_average_pool(shape, compiled, monkeypatch):
    x = (RNG.standard_normal(shape) * 100 + 50).astype(np.float32)
    got, want, _ = _run("GlobalAveragePool", x, {}, compiled, monkeypatch, opset=21)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_global_average_pool_float64(compiled, monkeypatch):
    """onnxruntime has no float64 GlobalAveragePool: numpy's mean is the peer."""
    monkeypatch.setattr(pool, "COMPILED", compiled)
    x = RNG.standard_normal((2, 5, 9, 7)) * 100 + 50
    from tests.oracle import make_node_model
    with actorrt.InferenceSession(make_node_model("GlobalAveragePool", {"x": x}, ["y"], opset=21)) as s:
        (got,) = s.run(None, {"x": x})
    np.testing.assert_allclose(got, x.mean(axis=(2, 3), keepdims=True), rtol=1e-13)


@pytest.mark.parametrize("case", [1, 2, 8, 9])
def test_maxpool_direct_split_over_threads(case, monkeypatch):
    """The direct MaxPool with its planes split over 2 intra-op threads (copy
    and tiles per plane range) and a reused buffer, exactly onnxruntime's."""
    if not _pool_direct.HAVE_KERNEL:
        pytest.skip("no numba / AVX2: the direct MaxPool is not built")
    monkeypatch.setattr(_pool_direct, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(_pool_flat, "ENABLED", False)
    monkeypatch.setattr(_pool_rows, "ENABLED", False)
    shape, attrs = CASES[case]
    x = RNG.standard_normal(shape).astype(np.float32)
    monkeypatch.setattr(pool, "COMPILED", True)
    monkeypatch.setattr(_pool_direct, "ENABLED", True)
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    g = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", TP.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with actorrt.InferenceSession(m, actorrt.SessionOptions(intra_op_num_threads=2)) as s:
        for _ in range(3):  # the second and third run reuse the -inf buffer
            got = s.run(None, {"x": x * 1})[0]
            np.testing.assert_array_equal(got, want)


FLAT_CASES = [  # stride-1 pools: (shape, attrs)
    CASES[0], CASES[8], CASES[9],
    ((1, 6, 28, 28), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # inception's
    ((2, 37, 6, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # small planes
    ((1, 9, 7, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 0, 0]}),  # no bottom / right pad
    ((1, 5, 9, 19), {"kernel_shape": [2, 4], "pads": [0, 2, 1, 0]}),  # asymmetric, w > 16
    ((1, 4, 8, 9), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}),
    ((1, 4, 8, 9), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 3, 5, 33), {"kernel_shape": [5, 1], "pads": [2, 0, 2, 0]}),
    ((3, 2, 4, 4), {"kernel_shape": [1, 1]}),
    ((1, 3, 6, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 6, 5, 5), {"kernel_shape": [1, 2], "pads": [0, 1, 0, 0]}),  # planes meet at data rows
    ((1, 4, 56, 56), {"kernel_shape": [2, 2], "strides": [2, 2]}),  # densenet's transition
    ((2, 5, 14, 15), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]}),
    ((1, 3, 13, 13), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 9, 40), {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 1]}),  # w > 32
    ((1, 2, 11, 10), {"kernel_shape": [2, 3], "strides": [2, 1], "dilations": [2, 3]}),
]


def _flat_planes_in_reverse(monkeypatch, threads: int):
    """Split every flat pool into plane ranges and run the ranges last first
    (a range that wrote past its planes would then spoil an earlier one's)."""
    from actorrt.providers.cpu import _parallel
    monkeypatch.setattr(_pool_flat, "PARALLEL_MIN_WORK", 0 if threads > 1 else 1 << 62)
    monkeypatch.setattr(_parallel, "run_chunks",
                        lambda fn, n, threads: [fn(i) for i in reversed(range(n))])


def _flat_pool_cases():
    """(shape, attrs, op, count_include_pad) for the flat kernel: MaxPool at
    stride 1 (strided MaxPool is the direct kernel's), AveragePool at any."""
    for shape, attrs in FLAT_CASES:
        strided = any(s > 1 for s in attrs.get("strides", [1, 1]))
        if not strided:
            yield shape, attrs, "MaxPool", None
        yield shape, attrs, "AveragePool", 0
        yield shape, attrs, "AveragePool", 1


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape,attrs,op,count_include_pad", list(_flat_pool_cases()))
def test_flat_pool_matches_onnxruntime(shape, attrs, op, count_include_pad, threads, monkeypatch):
    """MaxPool (stride 1) / AveragePool (strides 1-2) on the flat kernel
    (``_pool_flat``), its planes whole or split over threads (ranges run last
    first), against onnxruntime: MaxPool exactly, AveragePool within float32
    rounding. Strided MaxPool stays on the direct kernel."""
    if not _pool_flat.HAVE_NUMBA:
        pytest.skip("numba not installed")
    _flat_planes_in_reverse(monkeypatch, threads)
    x = RNG.standard_normal(shape).astype(np.float32)
    extra = {} if count_include_pad is None else {"count_include_pad": count_include_pad}
    opset = 12 if op == "MaxPool" else 19
    got, want, used = _run(op, x, attrs, True, monkeypatch, opset=opset, flat=True, **extra)
    assert used and got.shape == want.shape and got.dtype == want.dtype
    if op == "MaxPool":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case,kernel", [(c, "flat") for c in (0, 4, 5, 11)] +  # stride 1
                         [(c, "blocked") for c in (0, 4, 5, 11, 13)])
def test_flat_and_blocked_maxpool_nan_equal_the_numpy_taps(case, kernel, monkeypatch):
    """NaN inputs (all-NaN windows, NaN next to pads): the flat MaxPool (stride
    1) and the 16-channel-block one give the numpy tap path's np.fmax values
    bit for bit, on two inputs in turn."""
    if kernel == "flat" and not _pool_flat.HAVE_NUMBA:
        pytest.skip("numba not installed")
    if kernel == "blocked" and not _dw_blocked.HAVE_KERNEL:
        pytest.skip("no AVX-512 16-lane kernels on this host")
    shape, attrs = FLAT_CASES[case]
    for _ in range(2):
        x = _with_nans(shape)
        got, _, used = _run("MaxPool", x, attrs, True, monkeypatch, opset=12,
                            **{kernel: True})
        want, _, _ = _run("MaxPool", x, attrs, False, monkeypatch, opset=12)
        assert used
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", [1, 4, 6, 7, 13, 14, 16, 17])
def test_flat_averagepool_float64(case, monkeypatch):
    """float64 AveragePool (strides 1-2) on the flat kernel against onnx's
    reference evaluator, three runs."""
    if not _pool_flat.HAVE_NUMBA:
        pytest.skip("numba not installed")
    from onnx.reference import ReferenceEvaluator
    shape, attrs = FLAT_CASES[case]
    node = helper.make_node("AveragePool", ["x"], ["y"], **attrs, count_include_pad=1)
    g = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", TP.DOUBLE, shape)],
                          [helper.make_tensor_value_info("y", TP.DOUBLE, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    with actorrt.InferenceSession(m, actorrt.SessionOptions(trace="ops")) as s:
        for _ in range(3):
            x = RNG.standard_normal(shape) * 10
            want = ReferenceEvaluator(m).run(None, {"x": x})[0]
            got = s.run(None, {"x": x})[0]
            assert got.dtype == np.float64
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
        variants = [(sp.args.get("kernel_variant.pool") or {}).get("variant")
                    for sp in s.session.tracer.spans if sp.cat == "op"]
    assert "flat" in variants


def test_flat_pool_takes_strides_up_to_two():
    """The flat kernel takes strides 1-2 and refuses larger ones (they keep
    the direct and per-plane kernels); pool.py sends only stride-1 MaxPools."""
    x = np.zeros((1, 2, 8, 8), np.float32)
    assert _pool_flat.applies(x, (2, 2)) == _pool_flat.applies(x, (1, 2)) == _pool_flat.HAVE_NUMBA
    assert not _pool_flat.applies(x, (3, 3)) and not _pool_flat.applies(x, (1, 3))
    assert not _pool_flat.applies(x.astype(np.float16), (1, 1))
    with pytest.raises(ValueError, match="strides 1-2"):
        _pool_flat.make_plan(x, (3, 3), (3, 3), (1, 1), (0, 0), (2, 2), True)
    assert pool._flat(x, (2, 2), (2, 2), (1, 1), (0, 0), (4, 4), True, None) is None


@pytest.mark.parametrize("group", [1, 2, 3])
@pytest.mark.parametrize("case", [4, 5, 12, 14])
def test_flat_pool_plane_range_writes_only_its_planes(case, group, monkeypatch):
    """A plane range of the flat kernel (what one thread runs), in groups of
    1-3 planes, writes its planes' outputs and nothing else, though its rows
    move as whole vectors; its values are onnxruntime's."""
    if not _pool_flat.HAVE_NUMBA:
        pytest.skip("numba not installed")
    shape, attrs = FLAT_CASES[case]
    x = RNG.standard_normal(shape).astype(np.float32)
    _, want, _ = _run("MaxPool", x, attrs, True, monkeypatch, opset=12, flat=True)
    pads = attrs.get("pads", [0, 0, 0, 0])
    kh, kw = attrs["kernel_shape"]
    out = want.shape[2:]
    plan = _pool_flat.make_plan(x, (kh, kw), attrs.get("strides", (1, 1)), (1, 1), pads[:2],
                                out, True)
    planes, q = shape[0] * shape[1], out[0] * out[1]
    for c0 in range(planes):
        for c1 in range(c0 + 1, min(planes, c0 + 4) + 1):
            y = np.full(planes * q, 7.0, np.float32)
            _pool_flat._planes(x.reshape(-1), y, plan.offs, plan.cnt, plan.h, plan.w, plan.hp,
                               plan.wp, plan.pt, plan.pl, plan.oh, plan.ow, plan.sh, plan.sw,
                               True, -np.inf, plan.padded, group, _pool_flat.BLOCK,
                               _pool_flat.LANES, c0, c1)
            assert (y[:c0 * q] == 7).all() and (y[c1 * q:] == 7).all()
            np.testing.assert_array_equal(y[c0 * q:c1 * q], want.reshape(-1)[c0 * q:c1 * q])


def _blocked_pool_cases():
    for shape, attrs in CASES + FLAT_CASES:
        yield shape, attrs, "MaxPool", None
        for cip in (0, 1):
            yield shape, attrs, "AveragePool", cip


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape,attrs,op,count_include_pad", list(_blocked_pool_cases()))
def test_blocked_pool_matches_onnxruntime(shape, attrs, op, count_include_pad, threads, monkeypatch):
    """MaxPool / AveragePool in 16-channel blocks (``_dw_blocked``; any
    channel count: partial blocks), one and two threads (the partner split
    forced), against onnxruntime: MaxPool exactly, AveragePool within
    float32 rounding."""
    if not _dw_blocked.HAVE_KERNEL:
        pytest.skip("no AVX-512 16-lane kernels on this host")
    from actorrt.providers.cpu import _conv_split
    monkeypatch.setattr(_conv_split, "MIN_POOL_WORK", 0 if threads > 1 else 1 << 62)
    x = RNG.standard_normal(shape).astype(np.float32)
    extra = {} if count_include_pad is None else {"count_include_pad": count_include_pad}
    opset = 12 if op == "MaxPool" else 19
    got, want, used = _run(op, x, attrs, True, monkeypatch, opset=opset, blocked=True, **extra)
    assert got.shape == want.shape and got.dtype == want.dtype
    window_is_plane = tuple(attrs["kernel_shape"]) == shape[2:] and "pads" not in attrs
    if op == "AveragePool" and window_is_plane:
        assert not used  # the plane mean
    else:  # planes of 16+ pixels in and out: a chunk is 16 pixels of one plane
        assert used == _dw_blocked.pool_applies(shape, got.shape[2:])
    if op == "MaxPool":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
