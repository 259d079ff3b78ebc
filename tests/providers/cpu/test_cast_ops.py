"""Cast, CastLike and BitCast: actorrt vs the ONNX reference evaluator."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from actorrt.providers import NodeSpec, ValueType
from actorrt.providers.cpu import CPU_KERNELS
from actorrt.providers.cpu._cast_util import to_e8m0
from tests.oracle import check_node, make_node_model, run_actorrt, run_reference

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

RNG = np.random.default_rng(3)

STD = [np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8,
       np.uint16, np.uint32, np.uint64, np.bool_]
ML = [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
      ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz, ml_dtypes.float4_e2m1fn,
      ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2]


def _onnx_type(dt) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def _values(dt):
    dt = np.dtype(dt)
    if dt == np.bool_:
        return RNG.integers(0, 2, (3, 4)).astype(bool)
    if dt.kind in "iu":
        return RNG.integers(0 if dt.kind == "u" else -100, 100, (3, 4)).astype(dt)
    return (RNG.standard_normal((3, 4)) * 3).astype(dt)


@pytest.mark.parametrize("src", STD)
@pytest.mark.parametrize("dst", STD)
def test_cast_standard_types(src, dst):
    check_node("Cast", {"x": _values(src)}, opset=21, to=_onnx_type(dst), rtol=1e-3)


@pytest.mark.parametrize("dst", ML)
@pytest.mark.parametrize("src", [np.float32, np.float16, np.float64])
def test_cast_float_to_small_types(src, dst):
    x = np.array([0.48, 0.25, 1.05, -3.5, -8, 9, 1e6, 1e-7, -1e-7, 0.0, -0.0, 300.0, 470.0,
                  -500.0, 7.5, -14.0], dtype=src)
    check_node("Cast", {"x": x}, opset=25, to=_onnx_type(dst))


@pytest.mark.parametrize("dst", ML[:5])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_float8_specials(dst, saturate):
    x = np.array([np.nan, np.inf, -np.inf, 1e6, -1e6, 0.0, -0.0, 460.0, 60000.0], np.float32)
    check_node("Cast", {"x": x}, opset=21, to=_onnx_type(dst), saturate=saturate)


@pytest.mark.parametrize("src", ML)
@pytest.mark.parametrize("dst", [np.float32, np.float16, np.int8, np.int64, np.uint8])
def test_cast_small_types_to_standard(src, dst):
    if np.dtype(src) in (np.dtype(ml_dtypes.uint4), np.dtype(ml_dtypes.uint2)) or dst == np.uint8:
        x = np.arange(0, 4).astype(np.float32)
    else:
        x = np.array([-2.0, -1.0, 0.0, 1.0, 0.5, 1.5], np.float32)
    x = x.astype(src)
    check_node("Cast", {"x": x}, opset=25, to=_onnx_type(dst))


@pytest.mark.parametrize("src", [np.int32, np.int64, np.uint8, np.bool_])
@pytest.mark.parametrize("dst", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.int4])
def test_cast_ints_to_small_types(src, dst):
    x = np.array([0, 1, 3, 7, 100, 1000], np.int64) if src != np.bool_ else np.array([0, 1, 1, 0])
    check_node("Cast", {"x": x.astype(src)}, opset=25, to=_onnx_type(dst))


def test_cast_int_wraps():
    check_node("Cast", {"x": np.array([200, -129, 70000], np.int32)}, opset=21,
               to=TensorProto.INT8)


STRINGS = np.array(["0.5", "-3.25", "1e-5", "1E8", "+INF", "INF", "-INF", "NaN", "nan", "inf"],
                   dtype=object)


@pytest.mark.parametrize("dst", [np.float32, np.float64, np.float16])
def test_cast_from_string(dst):
    check_node("Cast", {"x": STRINGS}, opset=21, to=_onnx_type(dst))


def test_cast_from_string_to_bfloat16():
    # the reference cannot parse strings into bfloat16: parse with it to float32
    (f32,) = run_reference(make_node_model("Cast", {"x": STRINGS}, ["y"], opset=21,
                                           to=TensorProto.FLOAT), {"x": STRINGS})
    model = make_node_model("Cast", {"x": STRINGS}, ["y"], opset=21, to=TensorProto.BFLOAT16)
    (got,) = run_actorrt(model, {"x": STRINGS})
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.astype(np.float32), f32.astype(ml_dtypes.bfloat16)
                                  .astype(np.float32))


def _check_strings(x, to):
    """The reference returns numpy unicode arrays for strings: compare text."""
    model = make_node_model("Cast", {"x": x}, ["y"], opset=21, to=to)
    (got,) = run_actorrt(model, {"x": x})
    (want,) = run_reference(model, {"x": x})
    if to == TensorProto.STRING:
        assert got.dtype == object
        assert got.astype(str).tolist() == want.astype(str).tolist()
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    return got


def test_cast_string_to_int_and_back():
    x = np.array(["100", "-7", "0"], dtype=object)
    got = _check_strings(x, TensorProto.INT64)
    _check_strings(got, TensorProto.STRING)


@pytest.mark.parametrize("src", [np.float32, np.float64, np.int32, np.int8])
def test_cast_to_string(src):
    _check_strings(np.array([1.5, -2.0, 0.0, 100.0, 0.1]).astype(src), TensorProto.STRING)


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("src", [np.float32, np.float16])
def test_cast_e8m0(mode, src):
    x = np.array([0.124, 0.25, 0.5, 0.75, 1.1, 1.5, 1.6, 2.0, 3.0, 4.0, 8.0, 1e-3], src)
    check_node("Cast", {"x": x}, opset=25, to=TensorProto.FLOAT8E8M0, round_mode=mode)


def test_e8m0_specials_follow_the_spec_table():
    f = np.float32
    x = np.array([0.0, np.nan, np.inf, 3e38], f)
    sat = to_e8m0(x, True, "up").view(np.uint8)
    np.testing.assert_array_equal(sat, [0x00, 0xFF, 0xFE, 0xFE])
    raw = to_e8m0(x, False, "nearest").view(np.uint8)
    np.testing.assert_array_equal(raw, [0xFF, 0xFF, 0xFF, 0xFF])


def test_castlike():
    x = (RNG.standard_normal((3, 4)) * 100).astype(np.float32)
    check_node("CastLike", {"x": x, "t": np.zeros(1, np.float16)}, opset=21)
    check_node("CastLike", {"x": x, "t": np.zeros(1, ml_dtypes.float8_e5m2)}, opset=21,
               saturate=0)
    check_node("CastLike", {"x": x, "t": np.zeros(1, np.int32)}, opset=21)


def test_cast_opset1_string_to():
    x = np.array([1.7, -2.2], np.float32)
    model = make_node_model("Cast", {"x": x}, ["y"], opset=5, to="INT32")
    (got,) = run_actorrt(model, {"x": x})
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [1, -2])


def test_plain_cast_compiles_to_astype():
    node = NodeSpec(name="c", op_type="Cast", domain="", opset=21,
                    attrs={"to": TensorProto.FLOAT16}, inputs=("x",), outputs=("y",),
                    input_types=(ValueType("tensor", TensorProto.FLOAT, (2,)),))
    fn = CPU_KERNELS.lookup("", "Cast", 21)(node).compile()
    assert type(fn).__name__ == "methodcaller"
    assert fn(np.ones(2, np.float32)).dtype == np.float16


@pytest.mark.parametrize("src,dst", [
    (np.float32, np.int32), (np.int32, np.float32), (np.float64, np.int64),
    (np.uint16, np.int16), (np.float16, ml_dtypes.bfloat16), (np.bool_, np.uint8),
    (np.uint8, np.int8), (ml_dtypes.int4, ml_dtypes.uint4), (ml_dtypes.uint4, ml_dtypes.int4),
    (ml_dtypes.float8_e4m3fn, np.uint8), (np.uint8, ml_dtypes.float8_e5m2)])
def test_bitcast(src, dst):
    if np.dtype(src) in (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)):
        x = np.arange(-8 if src == ml_dtypes.int4 else 0, 8).astype(src)
    elif np.dtype(src) == np.bool_:
        x = np.array([True, False, True])
    else:
        x = _values(src) if np.dtype(src).kind in "iuf" else np.arange(12).astype(np.float32).astype(src)
    check_node("BitCast", {"x": x}, opset=26, to=_onnx_type(dst))


def test_bitcast_rejects_width_mismatch():
    x = np.ones(3, np.float32)
    with pytest.raises(Exception, match="bit widths differ"):
        run_actorrt(make_node_model("BitCast", {"x": x}, ["y"], opset=26,
                                    to=TensorProto.INT16), {"x": x})


def test_every_since_version_registered():
    import onnx.defs
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "" and s.name in ("Cast", "CastLike", "BitCast") and s.since_version <= 28:
            assert s.since_version in CPU_KERNELS.versions("", s.name), (s.name, s.since_version)


def test_cast_string_to_bool():
    x = np.array(["True", "false", "1", "0", " 2.5", "FALSE", "-0.0"], dtype=object)
    model = make_node_model("Cast", {"x": x}, ["y"], opset=21, to=TensorProto.BOOL)
    (got,) = run_actorrt(model, {"x": x})
    np.testing.assert_array_equal(got, [True, False, True, False, True, False, False])


@pytest.mark.parametrize("dst", [TensorProto.FLOAT6E2M3, TensorProto.FLOAT6E3M2])
def test_cast_float6_round_trip(dst):
    x = np.array([0.3, -2.5, 100.0, -0.0, 1.75], np.float32)
    model = make_node_model("Cast", {"x": x}, ["y"], opset=28, to=dst)
    (got,) = run_actorrt(model, {"x": x})
    want = x.astype(helper.tensor_dtype_to_np_dtype(dst))  # ml_dtypes' RNE, saturating
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
