"""Binary / variadic elementwise ops, comparisons, logic, bitwise, Where:
actorrt vs the ONNX reference evaluator."""

import numpy as np
import pytest

import actorrt
from actorrt.providers import NodeSpec, ValueType
from actorrt.providers.cpu import CPU_KERNELS
from tests.oracle import check_node, make_node_model, run_actorrt

RNG = np.random.default_rng(0)
INT_TYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOAT_TYPES = [np.float16, np.float32, np.float64]


def _data(dtype, shape, *, nonzero=False, low=None):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        x = RNG.standard_normal(shape) * 4
        if nonzero:
            x[np.abs(x) < 0.1] = 1.0
        return x.astype(dtype)
    info = np.iinfo(dtype)
    lo = max(int(info.min), -50) if low is None else low
    x = RNG.integers(lo, min(int(info.max), 50), size=shape)
    if nonzero:
        x[x == 0] = 3
    return x.astype(dtype)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", FLOAT_TYPES + INT_TYPES)
def test_arith(op, dtype):
    a = _data(dtype, (2, 3, 4))
    b = _data(dtype, (3, 1), nonzero=True)
    check_node(op, {"a": a, "b": b}, opset=14)


def test_int_div_truncates_toward_zero():
    a = np.array([-7, 7, -7, 7, -1, 0], np.int32)
    b = np.array([2, -2, -2, 2, 3, 5], np.int32)
    got = check_node("Div", {"a": a, "b": b}, opset=14)
    np.testing.assert_array_equal(got[0], [-3, -3, 3, 3, 0, 0])


@pytest.mark.parametrize("base,exp", [
    (np.float32, np.float32), (np.float32, np.int32), (np.float32, np.int64),
    (np.float32, np.uint64), (np.int32, np.float32), (np.int64, np.int64),
    (np.int32, np.int32), (np.float16, np.float16), (np.float64, np.int64)])
def test_pow_mixed_types(base, exp):
    a = np.abs(_data(base, (3, 4))) + np.dtype(base).type(1)
    b = np.array([0, 1, 2, 3], dtype=exp)
    check_node("Pow", {"a": a, "b": b}, opset=15)


# float Mod needs fmod=1 (the edge-case test covers floats)
@pytest.mark.parametrize("fmod, dtype", [
    (f, d) for f in (0, 1) for d in (np.int8, np.int32, np.int64, np.uint16, np.float32, np.float64)
    if f == 1 or np.dtype(d).kind != "f"])
def test_mod(fmod, dtype):
    a = _data(dtype, (3, 5))
    b = _data(dtype, (5,), nonzero=True)
    check_node("Mod", {"a": a, "b": b}, opset=13, fmod=fmod)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_mod_float_floor_edge_cases():
    a = np.array([5.5, -5.5, 0.0, -0.0, 3.0, -3.0, np.inf, 1.0], np.float32)
    b = np.array([2.0, 2.0, -2.0, 2.0, np.inf, np.inf, 2.0, 0.0], np.float32)
    check_node("Mod", {"a": a, "b": b}, opset=13, fmod=0)


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_variadic(op, n):
    shapes = [(2, 3, 4), (3, 1), (4,)][:n]
    ins = {f"x{i}": _data(np.float32, s) for i, s in enumerate(shapes)}
    check_node(op, ins, opset=13)


@pytest.mark.parametrize("dtype", [np.int8, np.uint64, np.float16])
def test_max_min_int(dtype):
    a, b = _data(dtype, (3, 4)), _data(dtype, (4,))
    check_node("Max", {"a": a, "b": b}, opset=13)
    check_node("Min", {"a": a, "b": b}, opset=13)


def test_max_nan_propagates():
    a = np.array([1.0, np.nan, 3.0], np.float32)
    b = np.array([np.nan, 2.0, 1.0], np.float32)
    check_node("Max", {"a": a, "b": b}, opset=13)


@pytest.mark.parametrize("op,opset", [("Equal", 19), ("Greater", 13), ("Less", 13),
                                      ("GreaterOrEqual", 16), ("LessOrEqual", 16)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
def test_compare(op, opset, dtype):
    a = _data(dtype, (3, 4)) % 3 if np.dtype(dtype).kind != "f" else np.round(_data(dtype, (3, 4)))
    b = a[1:2].copy()
    check_node(op, {"a": a, "b": b}, opset=opset)


def test_equal_strings():
    a = np.array(["a", "bc", "", "d"], dtype=object)
    b = np.array(["a", "b", "", "e"], dtype=object)
    check_node("Equal", {"a": a, "b": b}, opset=19)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    a = RNG.integers(0, 2, (2, 3, 4)).astype(bool)
    b = RNG.integers(0, 2, (3, 4)).astype(bool)
    check_node(op, {"a": a, "b": b}, opset=7)


def test_not():
    check_node("Not", {"x": RNG.integers(0, 2, (3, 4)).astype(bool)}, opset=1)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int16, np.uint8, np.uint64])
def test_bitwise(op, dtype):
    check_node(op, {"a": _data(dtype, (3, 4)), "b": _data(dtype, (4,))}, opset=18)


def test_bitwise_not():
    check_node("BitwiseNot", {"x": _data(np.int32, (3, 4))}, opset=18)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8, np.uint64])
def test_bitshift(direction, dtype):
    x = _data(dtype, (6,))
    bits = np.dtype(dtype).itemsize * 8
    shifts = [0, 1, 3, bits - 1, bits, bits + 2]
    if np.dtype(dtype).kind == "i":
        shifts[-1] = -1
    y = np.array(shifts, dtype=dtype)
    check_node("BitShift", {"a": x, "b": y}, opset=28, direction=direction)


def test_where():
    c = RNG.integers(0, 2, (3, 1)).astype(bool)
    check_node("Where", {"c": c, "a": _data(np.float32, (3, 4)), "b": _data(np.float32, (4,))},
               opset=16)
    s = np.array(["a", "b"], dtype=object)
    check_node("Where", {"c": np.array([True, False]), "a": s, "b": s[::-1].copy()}, opset=16)


def test_legacy_broadcast_axis():
    """Opset 6 Add with broadcast=1, axis=1: B (3,) lines up with A's dim 1."""
    a = _data(np.float32, (2, 3, 4))
    b = _data(np.float32, (3,))
    model = make_node_model("Add", {"a": a, "b": b}, ["y"], opset=6, broadcast=1, axis=1)
    (got,) = run_actorrt(model, {"a": a, "b": b})
    np.testing.assert_allclose(got, a + b[None, :, None])


def test_scalar_inputs_give_arrays():
    a = np.array(2.0, np.float32)
    b = np.array(3.0, np.float32)
    for op in ("Add", "Mul", "Div", "Pow", "Max"):
        (got,) = check_node(op, {"a": a, "b": b}, opset=15 if op != "Max" else 13)
        assert type(got) is np.ndarray and got.shape == ()


def test_hot_binary_ops_compile_to_bare_ufunc():
    vt = ValueType("tensor", 1, (2, 3))
    for op, uf in [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply),
                   ("Div", np.true_divide), ("Pow", np.power), ("Where", np.where)]:
        n = 3 if op == "Where" else 2
        node = NodeSpec(name="n", op_type=op, domain="", opset=17, attrs={},
                        inputs=("a", "b", "c")[:n], outputs=("y",),
                        input_types=(vt,) * n, output_types=(vt,))
        k = CPU_KERNELS.lookup("", op, 17)(node)
        assert k.compile() is uf, op


def test_every_since_version_registered():
    import onnx.defs
    ops = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Mean", "Sum", "Equal",
           "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Not",
           "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "Where"}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "" and s.name in ops and s.since_version <= 28:
            assert s.since_version in CPU_KERNELS.versions("", s.name), (s.name, s.since_version)


@pytest.mark.parametrize("exp_value,exp_dtype", [(2.0, np.float32), (2, np.int64), (3.0, np.float32)])
def test_pow_constant_exponent(exp_value, exp_dtype):
    from onnx import TensorProto, helper, numpy_helper
    from tests.oracle import check_model
    e = numpy_helper.from_array(np.array(exp_value, exp_dtype), "e")
    graph = helper.make_graph(
        [helper.make_node("Pow", ["x", "e"], ["y"])], "pow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], [e])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    check_model(model, {"x": _data(np.float32, (3, 4))})
