"""Binary and variadic elementwise ops with numpy broadcasting (ONNX
multidirectional broadcasting equals numpy's), comparisons, logic and bitwise ops.

Spec: ONNX Add/Sub/Mul/Div (opsets 1, 6, 7, 13, 14), Pow (1, 7, 12, 13, 15),
Mod (10, 13, 28), Max/Min (1, 6, 8, 12, 13), Sum/Mean (1, 6, 8, 13),
Equal (1, 7, 11, 13, 19), Greater/Less (1, 7, 9, 13), GreaterOrEqual/LessOrEqual
(12, 16), And/Or/Xor (1, 7), Not (1), BitShift (11, 28), BitwiseAnd/Or/Xor/Not (18),
Where (9, 16).

The hot ops compile to the bare numpy ufunc: the executor calls ``np.add(a, b)``
with no Python frame of ours in between. Only when the output may be 0-d (a
ufunc then returns a numpy scalar) is the ufunc wrapped to return an array.
Opsets before 7 use the legacy ``broadcast``/``axis`` attributes (B broadcast
onto A from ``axis`` on); they get a small wrapper.
"""

from __future__ import annotations

from functools import reduce
from typing import Any, Callable, ClassVar

import numpy as np

from ..._dtypes import to_numpy_dtype
from .._contract import Kernel, NodeSpec, require
from .registry import cpu_kernel

__all__ = ["UfuncKernel", "register_ufunc", "as_array_fn", "input_dtype", "may_be_scalar"]


# ----------------------------------------------------------------- helpers

def may_be_scalar(node: NodeSpec) -> bool:
    """True unless the node's output is known to have rank >= 1 (then a numpy
    ufunc returns an ndarray, never a numpy scalar)."""
    for t in node.output_types[:1]:
        if t is not None and t.rank is not None:
            return t.rank == 0
    for t in node.input_types:
        if t is not None and t.rank is not None and t.rank > 0:
            return False
    return True


def as_array_fn(fn: Callable) -> Callable:
    """Wrap ``fn`` so a numpy-scalar result comes back as a 0-d array."""
    def run(*xs):
        r = fn(*xs)
        return r if type(r) is np.ndarray else np.asarray(r)
    run.__wrapped__ = fn
    return run


def _legacy_rhs(a: np.ndarray, b: np.ndarray, broadcast: int, axis: int | None) -> np.ndarray:
    """Opset < 7 broadcasting: B's dims line up with A's from ``axis`` on."""
    if broadcast and axis is not None and b.ndim:
        axis = axis + a.ndim if axis < 0 else axis
        trail = a.ndim - axis - b.ndim
        if trail > 0:
            b = b.reshape(b.shape + (1,) * trail)
    return b


class UfuncKernel(Kernel):
    """Shared base: :meth:`select` picks the numpy callable for the node, and
    :meth:`compile` hands it to the executor bare whenever possible."""

    fn: ClassVar[Callable]

    def select(self) -> Callable:
        return type(self).fn

    def compile(self) -> Callable:
        fn = self.select()
        node = self.node
        if node.opset < 7 and node.attr("broadcast", 0) and len(node.inputs) == 2:
            inner, bc, axis = fn, node.attr("broadcast", 0), node.attr("axis")

            def fn(a, b):
                return inner(a, _legacy_rhs(a, b, bc, axis))
        return as_array_fn(fn) if may_be_scalar(node) else fn

    def run(self, *xs: Any) -> Any:
        return self.compile()(*xs)


def register_ufunc(op: str, since: tuple[int, ...], fn: Callable, doc: str,
                   base: type[UfuncKernel] = UfuncKernel, **ns: Any) -> type[Kernel]:
    """Register a :class:`UfuncKernel` subclass named ``op`` running ``fn`` (a
    numpy ufunc or any function of the inputs) for the ``since`` opsets."""
    cls = type(op, (base,), {"fn": staticmethod(fn), "__doc__": doc,
                             "__module__": __name__, **ns})
    cpu_kernel(op, since=since)(cls)
    return cls


def input_dtype(node: NodeSpec, i: int = 0) -> np.dtype | None:
    """The numpy dtype of input ``i`` when known at plan time, else ``None``."""
    t = node.input_type(i)
    if t is None or t.dtype is None:
        return None
    try:
        return to_numpy_dtype(t.dtype)
    except (ValueError, TypeError):
        return None


# ------------------------------------------------------------ arithmetic

register_ufunc("Add", (1, 6, 7, 13, 14), np.add, "ONNX Add (opsets 1-14): A + B.")
register_ufunc("Sub", (1, 6, 7, 13, 14), np.subtract, "ONNX Sub (opsets 1-14): A - B.")
register_ufunc("Mul", (1, 6, 7, 13, 14), np.multiply, "ONNX Mul (opsets 1-14): A * B.")


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C semantics); x / 0 gives 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if a.dtype.kind == "u":
            return np.floor_divide(a, b)
        r = np.fmod(a, b)
        return np.floor_divide(a - r, b)


def _div_any(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return _int_div(a, b)
    return np.true_divide(a, b)


class _Div(UfuncKernel):
    def select(self):
        dt = input_dtype(self.node)
        if dt is None:
            return _div_any
        return _int_div if dt.kind in "iu" else np.true_divide


register_ufunc("Div", (1, 6, 7, 13, 14), _div_any,
               "ONNX Div (opsets 1-14): A / B; integers truncate toward zero.", base=_Div)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A ** B with the output in A's dtype (B may have another dtype)."""
    if a.dtype.kind in "iu":
        if b.dtype.kind in "iub":
            if b.dtype.kind != "u" and np.any(b < 0):
                with np.errstate(all="ignore"):
                    r = np.power(a.astype(np.float64), b.astype(np.float64))
                return np.trunc(r).astype(a.dtype)
            return np.asarray(np.power(a, b)).astype(a.dtype, copy=False)
        with np.errstate(all="ignore"):
            r = np.power(a.astype(np.float64), b.astype(np.float64))
        return r.astype(a.dtype)
    if b.dtype != a.dtype:
        b = b.astype(a.dtype)
    return np.power(a, b)


def _square(a, b):
    return np.square(a)


class _Pow(UfuncKernel):
    def select(self):
        node = self.node
        da, db = input_dtype(node, 0), input_dtype(node, 1)
        if da is not None and da.kind == "f":
            c, base = node.constant_inputs.get(1), node.input_type(0)
            if (c is not None and c.size == 1 and float(c.reshape(-1)[0]) == 2.0
                    and base is not None and base.rank is not None and c.ndim <= base.rank):
                return _square  # x ** 2 (layer norms): a multiply, not powf
            if da == db:
                return np.power
        return _pow


register_ufunc("Pow", (1, 7, 12, 13, 15), _pow,
               "ONNX Pow (opsets 1-15): A ** B; B may differ in dtype, output has A's.",
               base=_Pow)


def _mod(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.mod(a, b)


def _fmod(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(a, b)


class _Mod(UfuncKernel):
    def select(self):
        return _fmod if self.node.attr("fmod", 0) else _mod


register_ufunc("Mod", (10, 13, 28), _mod,
               "ONNX Mod (opsets 10, 13, 28): fmod=0 floor (sign of B), fmod=1 truncated.",
               base=_Mod)


# -------------------------------------------------------------- variadic

class _Variadic(UfuncKernel):
    """N-ary op folded pairwise with a binary ufunc."""

    def compile(self) -> Callable:
        uf = type(self).fn
        if len(self.node.inputs) == 2:
            return as_array_fn(uf) if may_be_scalar(self.node) else uf

        def run(*xs):
            if len(xs) == 1:
                return np.array(xs[0], copy=True)
            return np.asarray(reduce(uf, xs))
        return run


class _Mean(_Variadic):
    def compile(self) -> Callable:
        def run(*xs):
            r = np.asarray(reduce(np.add, xs)) if len(xs) > 1 else xs[0]
            return np.asarray(np.true_divide(r, len(xs))).astype(xs[0].dtype, copy=False)
        return run


register_ufunc("Max", (1, 6, 8, 12, 13), np.maximum,
               "ONNX Max (opsets 1-13): elementwise max of N inputs (NaN propagates).",
               base=_Variadic)
register_ufunc("Min", (1, 6, 8, 12, 13), np.minimum,
               "ONNX Min (opsets 1-13): elementwise min of N inputs (NaN propagates).",
               base=_Variadic)
register_ufunc("Sum", (1, 6, 8, 13), np.add,
               "ONNX Sum (opsets 1-13): elementwise sum of N inputs.", base=_Variadic)
register_ufunc("Mean", (1, 6, 8, 13), np.add,
               "ONNX Mean (opsets 1-13): elementwise mean of N inputs.", base=_Mean)


# ----------------------------------------------------- comparison / logic

register_ufunc("Equal", (1, 7, 11, 13, 19), np.equal,
               "ONNX Equal (opsets 1-19): A == B -> bool (strings too).")
register_ufunc("Greater", (1, 7, 9, 13), np.greater, "ONNX Greater (opsets 1-13): A > B -> bool.")
register_ufunc("Less", (1, 7, 9, 13), np.less, "ONNX Less (opsets 1-13): A < B -> bool.")
register_ufunc("GreaterOrEqual", (12, 16), np.greater_equal,
               "ONNX GreaterOrEqual (opsets 12, 16): A >= B -> bool.")
register_ufunc("LessOrEqual", (12, 16), np.less_equal,
               "ONNX LessOrEqual (opsets 12, 16): A <= B -> bool.")
register_ufunc("And", (1, 7), np.logical_and, "ONNX And (opsets 1, 7): logical and of bools.")
register_ufunc("Or", (1, 7), np.logical_or, "ONNX Or (opsets 1, 7): logical or of bools.")
register_ufunc("Xor", (1, 7), np.logical_xor, "ONNX Xor (opsets 1, 7): logical xor of bools.")
register_ufunc("Not", (1,), np.logical_not, "ONNX Not (opset 1): logical not of bools.")
register_ufunc("BitwiseAnd", (18,), np.bitwise_and, "ONNX BitwiseAnd (opset 18): A & B.")
register_ufunc("BitwiseOr", (18,), np.bitwise_or, "ONNX BitwiseOr (opset 18): A | B.")
register_ufunc("BitwiseXor", (18,), np.bitwise_xor, "ONNX BitwiseXor (opset 18): A ^ B.")
register_ufunc("BitwiseNot", (18,), np.invert, "ONNX BitwiseNot (opset 18): ~X.")
register_ufunc("Where", (9, 16), np.where,
               "ONNX Where (opsets 9, 16): X where condition else Y, broadcasting all three.")


def _shift_left(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    bits = x.dtype.itemsize * 8
    udt = np.dtype(f"u{x.dtype.itemsize}")
    valid = (y >= 0) & (y < bits) if y.dtype.kind == "i" else y < bits
    s = np.where(valid, y, 0).astype(udt)
    r = np.left_shift(x.view(udt) if x.dtype.kind == "i" else x, s)
    r = np.where(valid, r, udt.type(0))
    return r.view(x.dtype) if r.dtype != x.dtype else r


def _shift_right(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    bits = x.dtype.itemsize * 8
    valid = (y >= 0) & (y < bits) if y.dtype.kind == "i" else y < bits
    s = np.where(valid, y, 0).astype(x.dtype)
    r = np.right_shift(x, s)
    if x.dtype.kind == "i":  # out of range: what the sign extension alone gives
        fill = np.where(x < 0, x.dtype.type(-1), x.dtype.type(0))
    else:
        fill = x.dtype.type(0)
    return np.asarray(np.where(valid, r, fill))


def _direction(node: NodeSpec) -> str:
    d = node.attr("direction", "")
    return d.decode() if isinstance(d, bytes) else str(d)


class _BitShift(UfuncKernel):
    @classmethod
    def check(cls, node: NodeSpec) -> None:
        require(_direction(node) in ("LEFT", "RIGHT"),
                "BitShift direction must be 'LEFT' or 'RIGHT', got %r", _direction(node))

    def select(self):
        return _shift_left if _direction(self.node) == "LEFT" else _shift_right


register_ufunc("BitShift", (11, 28), _shift_left,
               "ONNX BitShift (opsets 11, 28): X << Y / X >> Y (arithmetic for signed); "
               "a shift outside [0, bits) gives the sign fill.", base=_BitShift)
