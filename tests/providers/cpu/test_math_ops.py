"""Unary math ops, Erf, Clip, IsInf/IsNaN: actorrt vs the ONNX reference
evaluator (Erf also vs Python's math.erf)."""

import math

import ml_dtypes
import numpy as np
import pytest

from actorrt.providers.cpu.math import erf
from tests.oracle import check_node

RNG = np.random.default_rng(1)

UNARY = {
    "Abs": (13, None), "Neg": (13, None), "Ceil": (13, None), "Floor": (13, None),
    "Exp": (13, None), "Log": (13, "pos"), "Sqrt": (13, "pos"), "Reciprocal": (13, "nonzero"),
    "Tanh": (13, None), "Sin": (22, None), "Cos": (22, None), "Tan": (22, None),
    "Asin": (22, "unit"), "Acos": (22, "unit"), "Atan": (22, None), "Sinh": (22, None),
    "Cosh": (22, None), "Asinh": (22, None), "Acosh": (22, "ge1"), "Atanh": (22, "unit"),
    "Round": (22, None), "Sign": (13, None), "Erf": (13, None), "IsNaN": (20, None),
}


def _domain(kind, shape, dtype):
    x = RNG.standard_normal(shape) * 2
    if kind == "pos":
        x = np.abs(x) + 0.1
    elif kind == "nonzero":
        x[np.abs(x) < 0.1] = 0.5
    elif kind == "unit":
        x = np.tanh(x) * 0.99
    elif kind == "ge1":
        x = np.abs(x) + 1
    return x.astype(dtype)


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_unary(op, dtype):
    opset, kind = UNARY[op]
    rtol = 2e-3 if dtype == np.float16 else 1e-5
    x = _domain(kind, (3, 4, 5), dtype)
    if op == "IsNaN":
        x[0, 0, :2] = np.nan
    check_node(op, {"x": x}, opset=opset, rtol=rtol, atol=1e-6 if dtype != np.float16 else 1e-3)


# Neg is defined for signed types only
@pytest.mark.parametrize("op, dtype", [
    (op, d) for op in ("Abs", "Neg", "Sign") for d in (np.int8, np.int64, np.uint8)
    if not (op == "Neg" and d is np.uint8)])
def test_unary_int(op, dtype):
    check_node(op, {"x": RNG.integers(-5 if dtype != np.uint8 else 0, 6, (3, 4)).astype(dtype)},
               opset=13)


def test_round_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6], np.float32)
    (got,) = check_node("Round", {"x": x}, opset=22)
    np.testing.assert_array_equal(got, [0, 2, 2, -0, -2, 2, -3])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_accuracy_against_math_erf(dtype):
    x = np.concatenate([np.linspace(-7, 7, 20001), np.logspace(-30, 1, 500),
                        -np.logspace(-30, 1, 500), [0.0, 6.0, -6.0]]).astype(dtype)
    want = np.array([math.erf(float(v)) for v in x])
    got = erf(x)
    assert got.dtype == dtype
    tol = 1e-6 if dtype == np.float32 else 5e-15
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=0)
    special = erf(np.array([np.nan, np.inf, -np.inf], dtype))
    assert np.isnan(special[0]) and special[1] == 1 and special[2] == -1


def test_erf_bfloat16_keeps_dtype():
    x = np.linspace(-3, 3, 13).astype(ml_dtypes.bfloat16)
    got = erf(x)
    assert got.dtype == ml_dtypes.bfloat16
    want = np.array([math.erf(float(v)) for v in x.astype(np.float32)])
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2)


@pytest.mark.parametrize("dn,dp", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_isinf(dn, dp):
    x = np.array([1.0, np.inf, -np.inf, np.nan, -2.0], np.float32)
    check_node("IsInf", {"x": x}, opset=20, detect_negative=dn, detect_positive=dp)


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.int64, np.uint8, np.float16])
@pytest.mark.parametrize("bounds", ["both", "min", "max", "none", "crossed"])
def test_clip_inputs(dtype, bounds):
    x = (RNG.standard_normal((3, 4)) * 10).astype(dtype) if np.dtype(dtype).kind != "u" else \
        RNG.integers(0, 20, (3, 4)).astype(dtype)
    lo = np.array(2 if bounds != "crossed" else 7, dtype)
    hi = np.array(6 if bounds != "crossed" else 3, dtype)
    ins = {"x": x, "lo": lo if bounds in ("both", "min", "crossed") else None,
           "hi": hi if bounds in ("both", "max", "crossed") else None}
    check_node("Clip", ins, opset=13)


def test_clip_attributes_opset6():
    x = (RNG.standard_normal((3, 4)) * 3).astype(np.float32)
    check_node("Clip", {"x": x}, opset=6, min=-1.0, max=1.5)
    check_node("Clip", {"x": x}, opset=6, max=0.5)


def test_every_since_version_registered():
    import onnx.defs
    from actorrt.providers.cpu import CPU_KERNELS
    ops = set(UNARY) | {"IsInf", "Clip"}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "" and s.name in ops and s.since_version <= 28:
            assert s.since_version in CPU_KERNELS.versions("", s.name), (s.name, s.since_version)


@pytest.mark.parametrize("which", ["both", "min", "max", "crossed"])
def test_clip_constant_bounds(which):
    """Bounds as initializers take the plan-time path (relu6-style)."""
    from onnx import TensorProto, helper, numpy_helper
    from tests.oracle import check_model
    lo, hi = (0.0, 6.0) if which != "crossed" else (4.0, 1.0)
    inits = [numpy_helper.from_array(np.array(lo, np.float32), "lo"),
             numpy_helper.from_array(np.array(hi, np.float32), "hi")]
    ins = {"both": ["x", "lo", "hi"], "min": ["x", "lo"], "max": ["x", "", "hi"],
           "crossed": ["x", "lo", "hi"]}[which]
    graph = helper.make_graph(
        [helper.make_node("Clip", ins, ["y"])], "clip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    check_model(model, {"x": (RNG.standard_normal((3, 4)) * 8).astype(np.float32)})
