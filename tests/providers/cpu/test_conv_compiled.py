"""The compiled (numba) 2-D Conv paths (im2col patch building, direct
depthwise, the direct register-blocked kernel of ``_conv_direct``) and the
numpy / BLAS paths they replace, both against onnxruntime, over
odd sizes, strides, pads (incl. asymmetric and SAME), dilations, groups and
depthwise channel multipliers; and intra_op_num_threads."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt.providers.cpu import _conv_direct, _conv_numba, _conv_util

RNG = np.random.default_rng(99)

CASES = [  # (n, c, h, w, m, (kh, kw), strides, pads, dilations, group, auto_pad)
    (1, 3, 17, 13, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None),
    (2, 4, 11, 9, 6, (3, 2), (2, 1), (0, 1, 2, 0), (1, 1), 2, None),
    (1, 6, 15, 15, 6, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 6, None),      # depthwise, dilated
    (2, 5, 14, 9, 10, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 5, None),      # depthwise x2 multiplier
    (1, 4, 9, 8, 4, (5, 5), (3, 3), (2, 2, 2, 2), (1, 1), 1, None),
    (1, 2, 5, 4, 2, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 2, None),        # kernel past the image
    (1, 3, 10, 7, 4, (3, 3), (2, 2), None, (1, 1), 1, "SAME_UPPER"),
    (3, 8, 6, 6, 8, (3, 3), (1, 2), (1, 0, 1, 0), (1, 2), 8, None),
    # depthwise 3x3 rows in one pass (interior) and tap by tap (edges)
    (2, 7, 9, 11, 7, (3, 3), (1, 1), None, (1, 1), 7, "SAME_LOWER"),
    (1, 4, 8, 13, 8, (3, 3), (2, 1), (0, 2, 1, 0), (1, 1), 4, None),       # x2, asymmetric pads
    (1, 3, 5, 2, 3, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 3, None),        # no interior column
]


def _model(case):
    n, c, h, w, m, k, s, p, d, g, auto = case
    attrs = dict(kernel_shape=list(k), strides=list(s), dilations=list(d), group=g)
    if auto:
        attrs["auto_pad"] = auto
    else:
        attrs["pads"] = list(p)
    inits = [numpy_helper.from_array(RNG.standard_normal((m, c // g, *k)).astype(np.float32), "W"),
             numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "B")]
    node = helper.make_node("Conv", ["x", "W", "B"], ["y"], **attrs)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TP.FLOAT, [n, c, h, w])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), \
        RNG.standard_normal((n, c, h, w)).astype(np.float32)


def _ort_and_traced(model, feeds: dict, opts=None):
    """onnxruntime's outputs, actorrt's (one run, ``opts`` with op tracing)
    and the run's op spans' args."""
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    opts = opts if opts is not None else actorrt.SessionOptions(trace="ops")
    with actorrt.InferenceSession(model, opts) as s:
        got = s.run(None, feeds)
        spans = [sp.args for sp in s.session.tracer.spans if sp.cat == "op"]
    return want, got, spans


def _direct_run(model, x, threads: int, runs: int = 2):
    """onnxruntime's outputs, actorrt's from ``runs`` runs of one session
    (``threads`` intra-op threads, op tracing) and that session's op spans' args."""
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    opts = actorrt.SessionOptions(trace="ops", intra_op_num_threads=threads)
    with actorrt.InferenceSession(model, opts) as s:
        gots = [s.run(None, {"x": x}) for _ in range(runs)]
        spans = [sp.args for sp in s.session.tracer.spans if sp.cat == "op"]
    return want, gots, spans


@pytest.mark.parametrize("drivers", ["chunks", "numba-pool", "serial"])
@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_conv_paths_match_onnxruntime(case, compiled, drivers, monkeypatch):
    """Each path with its work split in plane ranges / column blocks across
    the intra-op threads (``chunks``), on numba's own pool, or serial."""
    if compiled and not _conv_numba.HAVE_NUMBA:
        pytest.skip("numba not installed")
    if not compiled and drivers == "numba-pool":
        pytest.skip("the numpy path has no numba drivers")
    parallel = drivers != "serial"
    monkeypatch.setattr(_conv_numba, "USE_NUMBA_POOL", drivers == "numba-pool")
    monkeypatch.setattr(_conv_direct, "ENABLED", False)  # the im2col / BLAS paths (direct: below)
    monkeypatch.setattr(_conv_util, "COMPILED", compiled)
    monkeypatch.setattr(_conv_util, "IM2COL_MIN_THREADS", 1)  # the compiled im2col at any count
    monkeypatch.setattr(_conv_util, "IM2COL_MIN_WORK", 0)  # ... and any size
    # the parallel drivers (from any size) or the serial ones (always)
    monkeypatch.setattr(_conv_numba, "PARALLEL_MIN_WORK", 0 if parallel else 1 << 62)
    # the GEMMs threaded or on one BLAS thread
    monkeypatch.setattr(_conv_util, "GEMM_PARALLEL_MIN_FLOPS", 0 if parallel else 1 << 62)
    monkeypatch.setattr(_conv_util, "GEMM_BLOCK_MIN", 16)  # several column blocks per product
    model, x = _model(case)
    want, got, spans = _ort_and_traced(model, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert spans and all(("kernel_variant.conv_impl" in a) == compiled for a in spans), spans


DIRECT_CASES = [c for c in CASES if not (c[9] > 1 and c[1] == c[9])] + [  # not depthwise
    (2, 5, 19, 21, 6, (3, 3), (1, 1), None, (1, 1), 1, "SAME_LOWER"),     # 2 column tiles, M % 4
    (1, 4, 23, 18, 9, (3, 3), (2, 2), (1, 0, 2, 1), (2, 1), 1, None),     # stride x dilation
    (2, 6, 12, 40, 10, (2, 5), (1, 3), (0, 2, 1, 1), (1, 1), 2, None),    # stride 3, groups
]


@pytest.mark.parametrize("drivers", ["chunks", "serial"])
@pytest.mark.parametrize("case", DIRECT_CASES)
def test_direct_conv_matches_onnxruntime(case, drivers, monkeypatch):
    """The direct kernel (phase-split input, register-blocked tiles, masked
    stores) on every non-depthwise case, its rows split across two threads
    with the reduction in blocks of 7, or run serially in one block."""
    if not _conv_direct.HAVE_KERNEL:
        pytest.skip("no numba / AVX2+FMA: the direct kernel is not built")
    monkeypatch.setattr(_conv_direct, "PARALLEL_MIN_FLOPS", 0 if drivers == "chunks" else 1 << 62)
    monkeypatch.setattr(_conv_direct, "MIN_REDUCTION", 1)  # these small cases on the kernel too
    if drivers == "chunks":  # several reduction blocks (sums stored, added to, epilogue last)
        monkeypatch.setattr(_conv_direct, "REDUCTION_BLOCK", 7)
        monkeypatch.setattr(_conv_direct, "WEIGHT_BLOCK_BYTES", 200)
    model, x = _model(case)
    # the second run: cached geometry / packed weights
    want, (got, got2), spans = _direct_run(model, x, 2 if drivers == "chunks" else 1)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got2[0], got[0])
    direct = [a for a in spans if a.get("kernel_variant.conv", {}).get("variant") == "direct"]
    assert len(direct) == len(spans) == 2, spans


#: 1x1 convs (in place as flattened rows at stride 1 without pads, the used
#: phase copied otherwise) and rows of at most 8 columns (several rows in one
#: 16-lane tile)
WIDE_CASES = [
    (1, 5, 7, 5, 9, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, None),       # 35 pixels
    (2, 8, 16, 20, 17, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, None),    # 320 = 10 rows of 32
    (1, 6, 1, 1, 4, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, None),       # one pixel
    (1, 6, 9, 9, 12, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, None),      # strided: one phase
    (2, 8, 6, 7, 8, (1, 1), (1, 1), (1, 1, 0, 0), (1, 1), 2, None),       # padded 1x1, groups
    (1, 16, 4, 4, 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None),     # 4 rows of 4 per tile
    (2, 8, 7, 6, 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None),       # 2 rows of 6, 7 rows
    (1, 8, 5, 3, 8, (3, 3), (1, 1), None, (1, 1), 2, "SAME_UPPER"),       # 4 rows of 3, groups
    (1, 8, 11, 5, 9, (3, 3), (2, 2), (1, 0, 1, 2), (1, 1), 1, None),      # strided, 3 columns
    (1, 8, 3, 9, 8, (3, 3), (1, 1), (1, 1, 1, 1), (2, 1), 1, None),       # 9 columns: narrow
]


@pytest.mark.parametrize("copy", ["compiled", "numpy"])
@pytest.mark.parametrize("multi_row", [True, False])
@pytest.mark.parametrize("drivers", ["chunks", "serial"])
@pytest.mark.parametrize("case", WIDE_CASES)
def test_direct_wide_tiles_match_onnxruntime(case, drivers, multi_row, copy, monkeypatch):
    """The 16-lane (AVX-512) tiles' own cases: 1x1 convs read in place,
    short rows several to a tile (or one each), rows / channel parts split
    across two threads or run serially; the phase-split input copied by the
    compiled row copies or numpy's slice assignments."""
    if not _conv_direct.HAVE_KERNEL:
        pytest.skip("no numba / AVX2+FMA: the direct kernel is not built")
    monkeypatch.setattr(_conv_direct, "COMPILED_COPY", copy == "compiled")
    monkeypatch.setattr(_conv_direct, "PARALLEL_MIN_FLOPS", 0 if drivers == "chunks" else 1 << 62)
    monkeypatch.setattr(_conv_direct, "MIN_REDUCTION", 1)
    monkeypatch.setattr(_conv_direct, "MULTI_ROW", multi_row)
    model, x = _model(case)
    want, (got, got2), spans = _direct_run(model, x, 2 if drivers == "chunks" else 1)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got2[0], got[0])
    pointwise = case[5] == (1, 1)
    direct = [a for a in spans if a.get("kernel_variant.conv", {}).get("variant") == "direct"]
    takes = _conv_direct.takes_pointwise(case[:4])
    assert len(direct) == (2 if takes or not pointwise else 0), spans


#: rows of at most 8 columns: the channel-vector tiles (kinds 4-6) by width
#: and channel count (4x4 from 48 channels; channel counts off the 32 / 64
#: blocks), strided and dilated, groups
CHANNEL_TILE_CASES = [
    (1, 16, 4, 4, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None),     # 4x4 tile
    (2, 8, 3, 3, 50, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None),      # 4x4 tile, 50 channels
    (1, 8, 4, 2, 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None),      # 2 columns, 24 channels
    (1, 12, 7, 7, 40, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None),     # 7x2 tile
    (1, 10, 6, 5, 33, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None),     # 5 columns
    (2, 8, 8, 8, 70, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2, None),      # 8x2 tile, groups
    (1, 9, 15, 15, 36, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, None),    # stride 2 -> 8 columns
    (1, 8, 9, 9, 20, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1, None),      # dilated, 9 -> 9
    (1, 32, 7, 7, 96, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, None),     # 1x1 strided -> 4x4
    (1, 40, 7, 7, 70, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, None),     # 1x1 in place: rows of 7
    (2, 24, 8, 6, 36, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, None),     # 1x1 in place: rows of 8
]


@pytest.mark.parametrize("rows_pass", [False, True])
@pytest.mark.parametrize("drivers", ["chunks", "serial"])
@pytest.mark.parametrize("case", CHANNEL_TILE_CASES)
def test_channel_tiles_and_weight_passes_match_onnxruntime(case, drivers, rows_pass, monkeypatch):
    """The channel-vector tiles (kinds 4-6: vectors over output channels,
    scattered stores) on rows of 2-9 columns, with the reduction in blocks
    of 7 (sums gathered back and added to) or whole; work items of one row
    group or all of an image's rows (one pass over the weights), split over
    two threads or serial: onnxruntime's values."""
    if not _conv_direct.HAVE_KERNEL or _conv_direct.VW != 16:
        pytest.skip("no AVX-512 16-lane tiles: no channel-vector tiles")
    monkeypatch.setattr(_conv_direct, "PARALLEL_MIN_FLOPS", 0 if drivers == "chunks" else 1 << 62)
    monkeypatch.setattr(_conv_direct, "MIN_REDUCTION", 1)
    monkeypatch.setattr(_conv_direct, "ROWS_PASS_MIN_WEIGHT_BYTES", 0 if rows_pass else 1 << 62)
    monkeypatch.setattr(_conv_direct, "CT_MIN_REDUCTION", 1)  # these short reductions too
    if drivers == "chunks":
        monkeypatch.setattr(_conv_direct, "REDUCTION_BLOCK", 7)
        monkeypatch.setattr(_conv_direct, "WEIGHT_BLOCK_BYTES", 200)
    model, x = _model(case)
    want, (got,), spans = _direct_run(model, x, 2 if drivers == "chunks" else 1, runs=1)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert [a.get("kernel_variant.conv", {}).get("variant") for a in spans] == ["direct"]
    ow, mg = want[0].shape[3], case[4] // case[9]
    assert _conv_direct.block_for(ow, mg) >= 4 or ow > 8 or case[5] == (1, 1)


def test_channel_tile_kinds_by_width_and_channels():
    """Rows of 1-4 columns with 48+ channels take the 4-pixel x 64-channel
    tile, up to 7 columns the 7 x 32, 8 columns the 8 x 32, wider the row
    tiles; off (CHANNEL_TILES False), the row tiles."""
    if _conv_direct.VW != 16:
        pytest.skip("no AVX-512 16-lane tiles")
    assert [_conv_direct.block_for(ow, 64) for ow in (1, 4, 5, 7, 8, 9, 16, 17)] == \
        [4, 4, 5, 5, 6, 1, 1, 0]
    assert _conv_direct.block_for(4, 32) == 5 and _conv_direct.BLOCKS[4][0] == 64
    assert _conv_direct.block_of(7, 100) == (32, 1)
    # short reductions keep the row tiles (multi-row for rows of at most 8)
    r = _conv_direct.CT_MIN_REDUCTION
    assert _conv_direct.block_for(7, 64, r) == 5 and _conv_direct.block_for(7, 64, r - 1) == 2
    assert _conv_direct.block_for(4, 64, r - 1) == 3
    # 1x1 convs read in place: rows of 8 / 7 pixels up to POINTWISE_CT_MAX_PIXELS
    kinds = {}
    for h, w in ((7, 7), (8, 6), (5, 5), (14, 14)):
        plan = _conv_direct.make_plan((1, 600, h, w), (1, 70, 600), 1, (1, 1), (1, 1), (1, 1),
                                      (0, 0), (h, w), flatten=True)
        kinds[h, w] = (plan.ints[7], plan.ints[11])  # (row width, kind)
    assert kinds == {(7, 7): (7, 5), (8, 6): (8, 6), (5, 5): (25, 0), (14, 14): (196, 0)}
    short = _conv_direct.make_plan((1, 40, 7, 7), (1, 70, 40), 1, (1, 1), (1, 1), (1, 1),
                                   (0, 0), (7, 7), flatten=True)
    assert short.ints[11] < 4  # reduction 40: the row tiles


def test_pointwise_past_input_limit_takes_the_gemm(monkeypatch):
    """A 1x1 conv on an input past POINTWISE_MAX_INPUT_BYTES declines the
    direct kernel (the GEMM on the input's view), the same values."""
    monkeypatch.setattr(_conv_direct, "POINTWISE_MAX_INPUT_BYTES", 64)
    model, x = _model(WIDE_CASES[1])
    want, got, spans = _ort_and_traced(model, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert [a["kernel_variant.conv"]["variant"] for a in spans] == ["1x1"]


def test_flat_rows_and_blocks():
    """The flattened 1x1 row width divides the pixel count and wastes the
    fewest lanes; the multi-row blocks fit their rows in one tile."""
    for hw in (1, 7, 35, 100, 400, 1600, 3136, 6400):
        for cols in (16, 32):
            d = _conv_direct._flat_rows(hw, cols)
            assert hw % d == 0 and d <= max(_conv_direct.FLAT_ROW_MAX, 1)
    assert _conv_direct._flat_rows(1600, 32) % 32 == 0
    for ow in range(1, 40):
        mr, nv, rpt = _conv_direct.BLOCKS[_conv_direct.block_for(ow)]
        assert rpt == 1 or rpt * ow <= _conv_direct.VW * nv


def test_im2col_numpy_below_min_threads(monkeypatch):
    """One numba thread: patch building stays numpy (depthwise stays compiled)."""
    if not _conv_numba.HAVE_NUMBA:
        pytest.skip("numba not installed")
    monkeypatch.setattr(_conv_util, "IM2COL_MIN_THREADS", 10 ** 6)
    monkeypatch.setattr(_conv_direct, "ENABLED", False)
    model, x = _model(CASES[0])
    want, got, spans = _ort_and_traced(model, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert spans and not any("kernel_variant.conv_impl" in a for a in spans)


def test_intra_op_num_threads():
    import threadpoolctl
    model, x = _model(CASES[0])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    before = threadpoolctl.threadpool_info()
    try:
        with actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=1)) as s:
            np.testing.assert_allclose(s.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4)
            blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
            assert blas and all(i["num_threads"] == 1 for i in blas)
    finally:
        for info in before:
            if info["user_api"] == "blas":
                threadpoolctl.threadpool_limits(limits=info["num_threads"], user_api="blas")
    for bad in (-1, 1.5, "2"):
        with pytest.raises(actorrt.InvalidArgumentError):
            actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=bad))


def test_serial_blas_nests_and_restores_the_pool():
    """Small convolution GEMMs run inside ``serial_blas``: one BLAS thread
    there (nested and from several Python threads), the count as set outside."""
    import threading

    import threadpoolctl
    from actorrt.providers.cpu import _threads

    def blas_counts():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]

    before = threadpoolctl.threadpool_info()
    try:
        _threads.apply(2)
        outside = blas_counts()
        assert outside and all(n == 2 for n in outside)
        seen = []

        def worker():
            with _threads.serial_blas():
                seen.append(blas_counts())

        with _threads.serial_blas():
            with _threads.serial_blas():
                assert all(n == 1 for n in blas_counts())
            assert all(n == 1 for n in blas_counts())
            t = threading.Thread(target=worker)
            t.start()
            t.join()
        assert seen and all(n == 1 for n in seen[0])
        assert blas_counts() == outside
        _threads.apply(1)
        with _threads.serial_blas():  # one thread already: nothing to switch
            assert all(n == 1 for n in blas_counts())
    finally:
        for info in before:
            if info["user_api"] == "blas":
                threadpoolctl.threadpool_limits(limits=info["num_threads"], user_api="blas")
                _threads.apply(info["num_threads"])


@pytest.mark.parametrize("k", [3, 1, "dw"])
@pytest.mark.parametrize("epilogue", ["compiled", "numpy", "direct"])
@pytest.mark.parametrize("act,params", [("", []), ("Relu", []), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.7]),
                                        ("Sigmoid", []), ("HardSigmoid", [0.3, 0.4])])
@pytest.mark.parametrize("with_z", [False, True])
@pytest.mark.parametrize("with_b", [False, True])
def test_fused_conv_epilogue_matches_onnxruntime(act, params, with_z, with_b, epilogue, k, monkeypatch):
    """com.microsoft FusedConv: bias, residual Z and the activation in one
    compiled pass (Relu / LeakyRelu / Clip / none), in the direct kernel's
    store (the same four; a 1x1 conv there read in place; a depthwise conv
    in the compiled depthwise kernel's store) or the numpy epilogue."""
    from actorrt.providers.cpu import conv as conv_mod
    monkeypatch.setattr(conv_mod, "COMPILED_EPILOGUE", epilogue == "compiled")
    monkeypatch.setattr(_conv_direct, "ENABLED", epilogue == "direct")
    monkeypatch.setattr(_conv_direct, "MIN_REDUCTION", 1)
    monkeypatch.setattr(_conv_numba, "PARALLEL_MIN_WORK", 0)  # plane ranges split across threads
    n, c, h, w, m = 2, 3, 9, 11, 5
    group = 1
    if k == "dw":
        k, c, m, group = 3, 4, 8, 4
    ins = ["x", "W", "B" if with_b else ""]
    if with_z:
        ins.append("Z")
    while ins and not ins[-1]:
        ins.pop()
    attrs = {"kernel_shape": [k, k], "pads": [k // 2] * 4, "group": group}
    if act:
        attrs["activation"] = act
    if params:
        attrs["activation_params"] = params
    node = helper.make_node("FusedConv", ins, ["y"], domain="com.microsoft", **attrs)
    inits = [numpy_helper.from_array(RNG.standard_normal((m, c // group, k, k)).astype(np.float32), "W")]
    if with_b:
        inits.append(numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "B"))
    vis = [helper.make_tensor_value_info("x", TP.FLOAT, [n, c, h, w])]
    feeds = {"x": RNG.standard_normal((n, c, h, w)).astype(np.float32)}
    if with_z:
        vis.append(helper.make_tensor_value_info("Z", TP.FLOAT, [n, m, h, w]))
        feeds["Z"] = RNG.standard_normal((n, m, h, w)).astype(np.float32)
    g = helper.make_graph([node], "fc", vis, [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with actorrt.InferenceSession(model, actorrt.SessionOptions(trace="ops")) as s:
        got = s.run(None, feeds)[0]
        spans = [sp.args for sp in s.session.tracer.spans if sp.cat == "op"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    fusable = act in ("", "Relu", "LeakyRelu", "Clip")
    direct = epilogue == "direct" and fusable and _conv_direct.HAVE_KERNEL and group == 1 and (
        k > 1 or _conv_direct.takes_pointwise((n, c, h, w)))
    if group > 1:  # depthwise: the compiled kernel's store unless numba is missing
        dw = fusable and _conv_numba.HAVE_NUMBA
        assert any("epilogue in the store" in a.get("kernel_variant.conv", {}).get("reason", "")
                   for a in spans) == dw
        assert not any("kernel_variant.epilogue" in a for a in spans) or not dw
        return
    assert any(a.get("kernel_variant.conv", {}).get("variant") == "direct" for a in spans) == direct
    compiled = epilogue != "numpy" and not direct and fusable and (with_b or with_z or act)
    assert any("kernel_variant.epilogue" in a for a in spans) == bool(compiled and _conv_numba.HAVE_NUMBA)


def test_apply_skips_a_numba_still_being_imported(monkeypatch):
    """Another segment's thread may be importing numba while a segment starts:
    the half-made module in sys.modules has no ``config`` yet (this failed the
    benchmark's shufflenet / squeezenet runs at random with AttributeError)."""
    import sys
    import types

    from actorrt.providers.cpu import _threads
    half = types.ModuleType("numba")  # what sys.modules holds mid-import
    monkeypatch.setitem(sys.modules, "numba", half)
    _threads.apply(1)  # no AttributeError


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_store_epilogue(stride):
    """depthwise2d's store epilogue (bias, residual z, LeakyRelu slope, Clip
    bounds) equals numpy float64 applied to its plain result (which the
    onnxruntime cases above check)."""
    if not _conv_numba.HAVE_NUMBA:
        pytest.skip("numba not installed")
    x = RNG.standard_normal((2, 5, 13, 11)).astype(np.float32)
    w = RNG.standard_normal((10, 1, 3, 3)).astype(np.float32)
    out = ((13 + 2 - 3) // stride + 1, (11 + 2 - 3) // stride + 1)
    b = RNG.standard_normal(10).astype(np.float32)
    z = RNG.standard_normal((2, 10, *out)).astype(np.float32)
    plain = _conv_numba.depthwise2d(x, w, (stride, stride), (1, 1), (1, 1), out).astype(np.float64)
    got = _conv_numba.depthwise2d(x, w, (stride, stride), (1, 1), (1, 1), out, b, z, 0.1, -0.5, 2.0)
    v = plain + b.reshape(1, -1, 1, 1) + z
    want = np.clip(np.where(v < 0, 0.1 * v, v), -0.5, 2.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


DEPTHWISE_CASES = [c for c in CASES if c[9] > 1 and c[1] == c[9]] + [
    (1, 3, 17, 40, 3, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 3, None),    # rows past one vector, s2
    (1, 2, 9, 20, 4, (5, 3), (2, 3), (2, 1, 2, 1), (1, 2), 2, None),     # stride 3: numba's copy
]


def _depthwise_reference(x, w, case):
    """onnx's reference evaluator (float64 in, float64 out)."""
    from onnx.reference import ReferenceEvaluator
    n, c, h, wd, m, k, s, p, d, g, auto = case
    attrs = dict(kernel_shape=list(k), strides=list(s), dilations=list(d), group=g)
    if auto:
        attrs["auto_pad"] = auto
    else:
        attrs["pads"] = list(p)
    node = helper.make_node("Conv", ["x", "W"], ["y"], **attrs)
    graph = helper.make_graph([node], "dw", [helper.make_tensor_value_info("x", TP.DOUBLE, None),
                                             helper.make_tensor_value_info("W", TP.DOUBLE, None)],
                              [helper.make_tensor_value_info("y", TP.DOUBLE, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ReferenceEvaluator(model).run(None, {"x": x, "W": w})[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tile", [True, False])
@pytest.mark.parametrize("case", DEPTHWISE_CASES)
def test_depthwise_tile_and_loops_match_reference(case, tile, dtype, monkeypatch):
    """depthwise2d with its plane sum, row copies and row stores on the
    vectorized LLVM tiles (float32 and float64 lanes) or numba's loops, with
    the store epilogue, against onnx's reference evaluator in float64."""
    if not _conv_numba.HAVE_NUMBA:
        pytest.skip("numba not installed")
    if tile and not _conv_direct.HAVE_KERNEL:
        pytest.skip("the LLVM tiles are not built")
    monkeypatch.setattr(_conv_numba, "DW_TILE", tile)
    from actorrt.providers.cpu._conv_util import conv_geometry, spatial_params
    n, c, h, wd, m, k, s, p, d, g, auto = case
    x = RNG.standard_normal((n, c, h, wd))
    w = RNG.standard_normal((m, 1, *k))
    kernel, strides, dil, pb, pe = spatial_params(2, k, s, d, p)
    out, pb, pe = conv_geometry((h, wd), kernel, strides, dil, pb, pe, auto or "NOTSET")
    b = RNG.standard_normal(m)
    z = RNG.standard_normal((n, m, *out))
    got = _conv_numba.depthwise2d(x.astype(dtype), w.astype(dtype), strides, dil, pb, out,
                                  b.astype(dtype), z.astype(dtype), 0.1, -0.5, 2.0)
    v = _depthwise_reference(x, w, case) + b.reshape(1, -1, 1, 1) + z
    want = np.clip(np.where(v < 0, 0.1 * v, v), -0.5, 2.0)
    assert got.dtype == dtype
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


#: (case, fused residual?) for the absent-operand extent checks: the direct
#: kernel (wide, narrow, multi-row tiles; stride 2) and depthwise (stride 1, 2)
EXTENT_CASES = [
    (1, 3, 40, 37, 16, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, None),
    (2, 8, 12, 12, 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None),
    (1, 16, 6, 5, 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None),
    (1, 24, 20, 19, 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 24, None),
    (2, 16, 21, 40, 16, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 16, None),
]


def _residual_model(case, residual: bool):
    """Conv (+ Add of a second input) + Relu: FusedConv with or without Z."""
    n, c, h, w, m, k, s, p, d, g, _ = case
    oh, ow = (h + p[0] + p[2] - k[0]) // s[0] + 1, (w + p[1] + p[3] - k[1]) // s[1] + 1
    inits = [numpy_helper.from_array(RNG.standard_normal((m, c // g, *k)).astype(np.float32), "W"),
             numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=list(k), strides=list(s),
                              pads=list(p), dilations=list(d), group=g)]
    ins = [helper.make_tensor_value_info("x", TP.FLOAT, [n, c, h, w])]
    feeds = {"x": RNG.standard_normal((n, c, h, w)).astype(np.float32)}
    last = "c"
    if residual:
        ins.append(helper.make_tensor_value_info("r", TP.FLOAT, [n, m, oh, ow]))
        feeds["r"] = RNG.standard_normal((n, m, oh, ow)).astype(np.float32)
        nodes.append(helper.make_node("Add", ["c", "r"], ["a"]))
        last = "a"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    graph = helper.make_graph(nodes, "cr", ins, [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("case", EXTENT_CASES)
def test_absent_residual_operand_spans_the_output(case, residual, threads, monkeypatch):
    """Without a residual Z the compiled tiles still form Z's addresses (base
    plus the output's offsets; every lane masked off): the array they get in
    Z's place must span the output, so no masked load reaches past it (a
    masked load whose masked-off lanes reach a page not present, unmapped or
    never touched, is a microcode assist on AMD Zen: 1.1-8x the conv's time).
    Checked on every call of the direct kernel's rows, its partner split,
    the depthwise planes, the channel-blocked depthwise kernel and their
    splits; values as onnxruntime's."""
    if not (_conv_numba.HAVE_NUMBA and _conv_direct.HAVE_KERNEL):
        pytest.skip("the compiled kernels are not built")
    from actorrt.providers.cpu import _conv_blocked, _conv_split
    monkeypatch.setattr(_conv_blocked, "ENABLED", False)  # its own test: test_conv_blocked.py
    seen = []

    def spans(z, y, has_z):
        seen.append(has_z)
        assert z.size >= y.size, (z.shape, y.shape)

    def wrap(fn, y_at, z_at, has_z_at):
        def checked(*args):
            spans(args[z_at], args[y_at], args[has_z_at])
            return fn(*args)
        return checked

    monkeypatch.setattr(_conv_direct, "_rows", wrap(_conv_direct._rows, 3, 5, 6))
    monkeypatch.setattr(_conv_split, "conv_rows", wrap(_conv_split.conv_rows, 4, 6, 7))
    monkeypatch.setattr(_conv_numba, "_depthwise_serial", wrap(_conv_numba._depthwise_serial, 4, 3, 12))
    monkeypatch.setattr(_conv_split, "depthwise", wrap(_conv_split.depthwise, 4, 3, 9))
    from actorrt.providers.cpu import _dw_blocked
    if _dw_blocked.HAVE_KERNEL:  # the channel-blocked depthwise kernel and its split
        monkeypatch.setattr(_dw_blocked, "_blocks", wrap(_dw_blocked._blocks, 5, 3, 4))
        monkeypatch.setattr(_conv_split, "depthwise_blocks",
                            wrap(_conv_split.depthwise_blocks, 5, 3, 4))
    monkeypatch.setattr(_conv_direct, "PARALLEL_MIN_FLOPS", 0 if threads > 1 else 1 << 62)
    monkeypatch.setattr(_conv_split, "MIN_CONV_FLOPS", 0 if threads > 1 else 1 << 62)
    monkeypatch.setattr(_conv_split, "MIN_DEPTHWISE_WORK", 0 if threads > 1 else 1 << 62)
    model, feeds = _residual_model(case, residual)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    with actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=threads)) as s:
        got = s.run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert seen and all(bool(h) == residual for h in seen), seen


@pytest.mark.parametrize("case, split", [
    ((2, 12, 5, 5, 100, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, None), True),    # 1x1: 4 row blocks of 25
    ((1, 8, 6, 7, 36, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2, None), True),      # im2col, groups of 18 rows
    ((3, 6, 4, 4, 7, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, None), False),      # fewer rows than a block
])
def test_gemm_splits_rows_of_small_planes(case, split, monkeypatch):
    """A conv GEMM whose plane fits in fewer column blocks than the chunks
    wanted is split over output-channel rows too (uneven last block) on two
    threads, unless it has fewer rows than GEMM_ROW_BLOCK_MIN; onnxruntime's
    values either way."""
    from actorrt.providers.cpu import _parallel
    monkeypatch.setattr(_conv_direct, "ENABLED", False)
    monkeypatch.setattr(_conv_util, "GEMM_PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(_conv_util, "GEMM_ROW_BLOCK_MIN", 8)
    monkeypatch.setattr(_parallel, "CHUNKS_PER_THREAD", 4)  # 8 chunks wanted
    chunks = []
    real = _parallel.run_chunks

    def counted(fn, n, threads):
        chunks.append(n)
        return real(fn, n, threads)

    monkeypatch.setattr(_parallel, "run_chunks", counted)
    model, x = _model(case)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=2)) as s:
        got = s.run(None, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    products = case[0] * case[9]  # one column block per (image, group): the plane is under 128 pixels
    assert chunks and (max(chunks) > products) == split, (chunks, products)


@pytest.mark.parametrize("channels, direct", [(384, True), (768, False)])
def test_weight_bytes_bound_of_the_direct_kernel(channels, direct, monkeypatch):
    """A 3x3 conv with 5.3 MB of weights (384 -> 384) takes the direct kernel
    (under WIDE_MAX_WEIGHT_BYTES, 16 MB), one with 21 MB (768 -> 768) the
    GEMM path; onnxruntime's values either way."""
    if not (_conv_direct.HAVE_KERNEL and _conv_direct.VW == 16 and _conv_direct.WIDE_ALL):
        pytest.skip("the 16-lane direct tiles are not built")
    from actorrt.providers.cpu import _conv_blocked
    monkeypatch.setattr(_conv_blocked, "ENABLED", False)  # (it takes these shapes)
    case = (1, channels, 5, 4, channels, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, None)
    assert (4 * channels * channels * 9 <= _conv_direct.WIDE_MAX_WEIGHT_BYTES) == direct
    model, x = _model(case)
    want, got, spans = _ort_and_traced(model, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=2e-3)
    variants = [a["kernel_variant.conv"]["variant"] for a in spans]
    assert variants == (["direct"] if direct else ["im2col"]), variants


def test_prefetch_by_output_size(monkeypatch):
    """The direct plan's prefetch flag (its 15th int): outputs of at least
    PREFETCH_MIN_BYTES get the output / residual hints, smaller outputs and
    PREFETCH = 0 none; 1x1 convs read in place the same."""
    def flag(x_shape, m, k, pads=(0, 0)):
        n, c, h, w = x_shape
        return _conv_direct.make_plan(x_shape, (1, m, c * k * k), 1, (k, k), (1, 1), (1, 1),
                                      pads, (h + 2 * pads[0] - k + 1, w + 2 * pads[1] - k + 1),
                                      flatten=True).ints[14]
    limit = _conv_direct.PREFETCH_MIN_BYTES
    side = int(np.ceil(np.sqrt(limit / (4 * 64)))) + 1  # 64 channels past the limit
    assert flag((1, 32, side, side), 64, 3, (1, 1)) == 1
    assert flag((1, 32, side, side), 64, 1) == 1
    assert flag((1, 32, 8, 8), 64, 3, (1, 1)) == 0
    monkeypatch.setattr(_conv_direct, "PREFETCH", 0)
    assert flag((1, 32, side, side), 64, 3, (1, 1)) == 0


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("case", EXTENT_CASES + [
    (1, 32, 20, 20, 48, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, None),  # 1x1 read in place
    (2, 8, 19, 23, 40, (3, 3), (2, 1), (1, 0, 2, 1), (1, 1), 1, None),
    (1, 16, 9, 30, 24, (5, 3), (1, 2), (2, 1, 2, 1), (1, 1), 2, None)])
def test_direct_conv_with_prefetch_hints_matches_onnxruntime(case, residual, threads, monkeypatch):
    """Every direct conv with the prefetch hints on (PREFETCH_MIN_BYTES 0:
    each row group prefetches the next one's output and residual lines), one
    and two threads, with and without a residual: onnxruntime's values, on
    the direct kernel."""
    if not _conv_direct.HAVE_KERNEL:
        pytest.skip("the compiled kernels are not built")
    monkeypatch.setattr(_conv_direct, "PREFETCH_MIN_BYTES", 0)
    monkeypatch.setattr(_conv_direct, "MIN_REDUCTION", 1)
    monkeypatch.setattr(_conv_direct, "PARALLEL_MIN_FLOPS", 0 if threads > 1 else 1 << 62)
    model, feeds = _residual_model(case, residual)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    opts = actorrt.SessionOptions(trace="ops", intra_op_num_threads=threads)
    with actorrt.InferenceSession(model, opts) as s:
        got = s.run(None, feeds)
        variants = [sp.args.get("kernel_variant.conv", {}).get("variant")
                    for sp in s.session.tracer.spans if sp.cat == "op"]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    if case[9] != case[1]:  # not depthwise
        assert "direct" in variants, variants


def _placed(shape, at_page_end: bool):
    """A float32 array of ``shape`` in a fresh mapping, ending exactly at a
    page end (the next page never touched) or 1 KiB before one."""
    import mmap
    nbytes = 4 * int(np.prod(shape))
    pages = -(-nbytes // 4096) + 2
    m = mmap.mmap(-1, (pages + 1) * 4096)
    raw = np.frombuffer(m, np.uint8)
    start = pages * 4096 - nbytes - (0 if at_page_end else 1024)
    x = raw[start:start + nbytes].view(np.float32).reshape(shape)
    x[...] = RNG.standard_normal(shape)
    return x, m


PAGE_END_CASES = [  # (name, op, x shape, attrs, weight shape or None)
    ("1x1 in place", "Conv", (1, 24, 10, 10), {"kernel_shape": [1, 1]}, (40, 24, 1, 1)),
    ("3x3 row copies", "Conv", (1, 8, 9, 11), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
     (16, 8, 3, 3)),
    ("depthwise planes", "Conv", (1, 6, 40, 33),
     {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 6}, (6, 1, 3, 3)),
    ("direct MaxPool", "MaxPool", (1, 5, 17, 19), {"kernel_shape": [3, 3], "strides": [2, 2]}, None),
]


@pytest.mark.parametrize("at_page_end", [True, False])
@pytest.mark.parametrize("case", PAGE_END_CASES, ids=[c[0] for c in PAGE_END_CASES])
def test_masked_vector_kernels_never_address_past_a_page_end(case, at_page_end, monkeypatch):
    """Kernels that read an input with masked row vectors (the direct conv in
    place or through its row copies, the depthwise plane kernel, the direct
    MaxPool) read a copy with slack when the input ends within OVERRUN_BYTES
    of a page end, else the input itself; their outputs always have the
    slack (a masked load or store whose masked-off lanes reach a page not
    present is a microcode assist on AMD Zen). onnxruntime's values."""
    if not _conv_direct.HAVE_KERNEL:
        pytest.skip("the compiled kernels are not built")
    from actorrt.providers.cpu import _conv_tiles, _dw_blocked, _dw_rows
    monkeypatch.setattr(_dw_blocked, "ENABLED", False)  # (its chunks stay inside planes)
    monkeypatch.setattr(_dw_rows, "ENABLED", False)  # (its rows too: test_dw_rows)
    monkeypatch.setattr(_conv_tiles, "SLACK_MIN_BYTES", 0)  # these small outputs too
    name, op, shape, attrs, w_shape = case
    x, mapping = _placed(shape, at_page_end)
    assert _conv_tiles.overrun_leaves_page(x) == at_page_end
    copies, outs = [], []
    real_readable, real_empty = _conv_tiles.readable, _conv_tiles.empty_with_slack

    def readable(a):
        r = real_readable(a)
        if a.ctypes.data == x.ctypes.data:
            copies.append(r.ctypes.data != a.ctypes.data)
        return r

    monkeypatch.setattr(_conv_tiles, "readable", readable)
    monkeypatch.setattr(_conv_tiles, "empty_with_slack",
                        lambda s, d: outs.append(real_empty(s, d)) or outs[-1])
    inits, ins = [], ["x"]
    if w_shape is not None:
        inits = [numpy_helper.from_array(RNG.standard_normal(w_shape).astype(np.float32), "W")]
        ins.append("W")
    node = helper.make_node(op, ins, ["y"], **attrs)
    g = helper.make_graph([node], "c", [helper.make_tensor_value_info("x", TP.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.array(x)})[0]
    with actorrt.InferenceSession(model, actorrt.SessionOptions(intra_op_num_threads=1)) as s:
        got = s.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert copies == [at_page_end], copies
    assert outs and all(o.base is not None and o.base.nbytes >= o.nbytes + _conv_tiles.OVERRUN_BYTES
                        for o in outs)
