"""Activation functions: actorrt vs the ONNX reference evaluator."""

import ml_dtypes
import numpy as np
import pytest

from actorrt.providers.cpu import activation
from tests.oracle import check_node, make_node_model, run_actorrt, run_reference

RNG = np.random.default_rng(2)

CASES = [
    ("Relu", 14, {}), ("Sigmoid", 13, {}), ("Elu", 22, {"alpha": 0.7}), ("Selu", 22, {}),
    ("Celu", 12, {"alpha": 2.0}), ("LeakyRelu", 16, {"alpha": 0.1}),
    ("LeakyRelu", 16, {"alpha": 1.7}), ("HardSigmoid", 22, {"alpha": 0.3, "beta": 0.4}),
    ("HardSwish", 22, {}), ("Softplus", 22, {}), ("Softsign", 22, {}),
    ("Gelu", 20, {}), ("Gelu", 20, {"approximate": "tanh"}), ("Mish", 22, {}),
    ("Swish", 24, {}), ("Swish", 24, {"alpha": 1.5}), ("Shrink", 9, {"bias": 0.5, "lambd": 1.0}),
    ("ThresholdedRelu", 22, {"alpha": 0.5}),
]


@pytest.mark.parametrize("op,opset,attrs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_activation(op, opset, attrs, dtype):
    x = (RNG.standard_normal((2, 3, 5)) * 3).astype(dtype)
    tol = 3e-3 if dtype == np.float16 else 1e-5
    check_node(op, {"x": x}, opset=opset, rtol=tol, atol=tol, **attrs)


@pytest.mark.parametrize("op", ["Sigmoid", "Softplus", "Elu", "Selu", "Celu", "Mish", "Swish",
                                "Gelu"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference overflows
def test_extreme_inputs_no_overflow(op):
    x = np.array([-1e4, -100.0, -30.0, 0.0, 30.0, 100.0, 1e4], np.float32)
    with np.errstate(over="raise", divide="raise", invalid="raise"):  # direct call, this thread
        direct = getattr(activation, op)(x)
    (got,) = run_actorrt(make_node_model(op, {"x": x}, ["y"], opset=24), {"x": x})
    (want,) = run_reference(make_node_model(op, {"x": x}, ["y"], opset=24), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)
    np.testing.assert_array_equal(direct, got)


@pytest.mark.parametrize("op,opset,attrs", [("Celu", 12, {}), ("Relu", 14, {}),
                                            ("HardSigmoid", 22, {}), ("Elu", 22, {}),
                                            ("LeakyRelu", 16, {}), ("Gelu", 20, {}),
                                            ("Sigmoid", 13, {})])
def test_bfloat16_stays_bfloat16(op, opset, attrs):
    x = (RNG.standard_normal((4, 5)) * 2).astype(ml_dtypes.bfloat16)
    check_node(op, {"x": x}, opset=opset, rtol=2e-2, atol=2e-2, **attrs)


@pytest.mark.parametrize("dtype", [np.int8, np.int32])
def test_int_relu_prelu(dtype):
    x = RNG.integers(-10, 10, (3, 4)).astype(dtype)
    check_node("Relu", {"x": x}, opset=14)
    check_node("PRelu", {"x": x, "slope": np.array([2, 3, 1, 0], dtype)}, opset=16)


def test_prelu_broadcast():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    check_node("PRelu", {"x": x, "slope": RNG.random((3, 1, 1)).astype(np.float32)}, opset=16)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_swiglu(alpha, dtype):
    a = RNG.standard_normal((3, 8)).astype(dtype)
    b = RNG.standard_normal((3, 8)).astype(dtype)
    tol = 3e-3 if dtype == np.float16 else 1e-5
    check_node("SwiGLU", {"a": a, "b": b}, opset=28, alpha=alpha, rtol=tol, atol=tol)


def test_scalar_input_gives_array():
    for op in ("Relu", "Sigmoid", "Mish", "HardSwish"):
        (got,) = check_node(op, {"x": np.array(-0.5, np.float32)}, opset=22)
        assert type(got) is np.ndarray and got.shape == ()


def test_every_since_version_registered():
    import onnx.defs
    from actorrt.providers.cpu import CPU_KERNELS
    ops = {c[0] for c in CASES} | {"PRelu", "SwiGLU"}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "" and s.name in ops and s.since_version <= 28:
            assert s.since_version in CPU_KERNELS.versions("", s.name), (s.name, s.since_version)


def test_relu_compiles_without_python_frame():
    from functools import partial

    from actorrt.providers import NodeSpec, ValueType
    from actorrt.providers.cpu import CPU_KERNELS
    vt = ValueType("tensor", 1, (2, 3))
    node = NodeSpec(name="r", op_type="Relu", domain="", opset=14, attrs={}, inputs=("x",),
                    outputs=("y",), input_types=(vt,), output_types=(vt,))
    fn = CPU_KERNELS.lookup("", "Relu", 14)(node).compile()
    assert isinstance(fn, partial) and fn.func is np.maximum
    x = np.array([[-1.0, 2.0, np.nan]] * 2, np.float32)
    got = fn(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [[0.0, 2.0, np.nan]] * 2)
