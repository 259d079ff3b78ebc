"""Matrix products (BLAS through numpy).

Spec: ONNX MatMul (1, 9, 13), Gemm (1, 6, 7, 9, 11, 13), MatMulInteger (10),
QLinearMatMul (10, 21), Einsum (12, 28), Det (11, 22); onnxruntime's contrib
FusedGemm, FusedMatMul, DynamicQuantizeMatMul and MatMulIntegerToFloat
(com.microsoft 1), which its graph optimizer writes into the models it saves.

float32 / float64 products go to BLAS sgemm / dgemm: one call, or above a
flop threshold per-thread blocks of one-thread calls (:mod:`._matmul_split`).
float16 / bfloat16 multiply in float32 (numpy has no half-precision BLAS) and
round back; MatMulInteger / QLinearMatMul run in float64 BLAS, exact for 8-bit
operands up to ``K ~ 1e11``; integer Gemm uses numpy's exact integer matmul.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ... import _dtypes
from .._contract import Kernel, NodeSpec, require
from . import _epilogue, _matmul_split
from ._reduce_util import LOW_PRECISION_FLOATS, upcast
from .registry import cpu_kernel

_BLAS_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


def _constant_operand(constants: Mapping[int, Any], shared: dict
                      ) -> "_matmul_split.ConstantOperand | None":
    """The node's constant 2-D float32/64 B (input 1) as a
    :class:`._matmul_split.ConstantOperand` (kept in ``shared``), else None."""
    b = constants.get(1)
    if not isinstance(b, np.ndarray) or b.ndim != 2 or b.dtype not in _BLAS_DTYPES:
        return None
    if "constant_b" not in shared:
        shared["constant_b"] = _matmul_split.ConstantOperand(b)
    const = shared["constant_b"]
    return const if const.b is b else None


def _input_rank(node: NodeSpec, i: int) -> int | None:
    t = node.input_type(i)
    return None if t is None else t.rank


def _input_dtype(node: NodeSpec, i: int) -> np.dtype | None:
    t = node.input_type(i)
    if t is None or not t.dtype:
        return None
    return _dtypes.to_numpy_dtype(t.dtype)


def _compute(x: np.ndarray) -> np.ndarray:
    """``x`` in the dtype Gemm multiplies in: float32 for half floats, else
    unchanged (integers multiply exactly, with numpy's wrap-around)."""
    return upcast(x)


def _matmul_any(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for any dtype and rank, in the input dtype, always an ndarray."""
    if a.dtype in LOW_PRECISION_FLOATS:
        return np.asarray(_product(upcast(a), upcast(b))).astype(a.dtype)
    if a.dtype in _BLAS_DTYPES and b.dtype == a.dtype:
        return np.asarray(_product(a, b))
    return np.asarray(np.matmul(a, b))


matmul_rows = _matmul_split.matmul_rows  # the one-thread 2-D / GEMV product (public name kept)
_product = _matmul_split.matmul  # float32/64: split over the intra-op threads


# -------------------------------------------------------------------------- MatMul

@cpu_kernel("MatMul", since=(1, 9, 13))
class MatMul(Kernel):
    """ONNX MatMul (opsets 1, 9, 13): numpy ``matmul`` semantics (batch broadcasting,
    1-D operands promoted and squeezed)."""

    @classmethod
    def estimate_flops(cls, node: NodeSpec) -> float:
        out = super().estimate_flops(node)
        a = node.input_type(0)
        k = a.shape[-1] if a is not None and a.shape else None
        return 2.0 * out * (k if isinstance(k, int) and k > 0 else 1)

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self.constant_b: _matmul_split.ConstantOperand | None = None

    def prepare(self, constants: Mapping[int, Any], shared: dict) -> None:
        self.constant_b = _constant_operand(constants, shared)

    def compile(self) -> Callable:
        ra, rb = _input_rank(self.node, 0), _input_rank(self.node, 1)
        dt = _input_dtype(self.node, 0)
        if dt in _BLAS_DTYPES and ra is not None and rb is not None and ra >= 2 and rb >= 2:
            const = self.constant_b
            if const is not None:
                def product(a, b):
                    return const.product(a) if b is const.b else _product(a, b)
                return product
            return _product  # BLAS, one call or per-thread blocks (_matmul_split)
        return _matmul_any

    def run(self, a, b):
        return _matmul_any(a, b)


# ---------------------------------------------------------------------------- Gemm

@cpu_kernel("Gemm", since=(1, 6, 7, 9, 11, 13))
class Gemm(Kernel):
    """ONNX Gemm (opsets 1-13): ``Y = alpha * A' @ B' + beta * C`` with ``A'`` =
    ``A.T`` when ``transA`` (``(M, K)``), ``B'`` = ``B.T`` when ``transB`` (``(K, N)``)
    and ``C`` (optional from opset 11) unidirectionally broadcast to ``(M, N)``.

    A constant ``B`` is packed once as a contiguous ``B'`` (in the compute dtype);
    a constant ``C`` is pre-scaled by ``beta``."""

    @classmethod
    def estimate_flops(cls, node: NodeSpec) -> float:
        out = super().estimate_flops(node)
        a = node.input_type(0)
        k = None
        if a is not None and a.shape is not None and len(a.shape) == 2:
            k = a.shape[0] if node.attr("transA", 0) else a.shape[1]
        return 2.0 * out * (k if isinstance(k, int) and k > 0 else 1)

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self.alpha = float(node.attr("alpha", 1.0))
        self.beta = float(node.attr("beta", 1.0))
        self.trans_a = bool(node.attr("transA", 0))
        self.trans_b = bool(node.attr("transB", 0))
        self.packed_b: np.ndarray | None = None
        self.scaled_c: np.ndarray | None = None
        # the compiled float32 GEMM of a constant B (its bias row: a constant
        # C of N values, alpha 1): ``_matmul_split.ConstantOperand.compiled``
        self._const: _matmul_split.ConstantOperand | None = None
        self._bias_row: np.ndarray | None = None

    def prepare(self, constants: Mapping[int, Any], shared: dict) -> None:
        b = constants.get(1)
        if b is not None:
            if "packed_b" not in shared:
                bt = _compute(b)
                shared["packed_b"] = np.ascontiguousarray(bt.T if self.trans_b else bt)
            self.packed_b = shared["packed_b"]
        c = constants.get(2)
        if c is not None and self.beta != 0:
            if "scaled_c" not in shared:
                ca = _compute(c)
                if self.beta != 1:
                    ca = ca * (self.beta if ca.dtype.kind in "iu" else ca.dtype.type(self.beta))
                shared["scaled_c"] = ca
            self.scaled_c = shared["scaled_c"]
        pb = self.packed_b
        if pb is not None and pb.dtype == np.float32 and pb.ndim == 2 and self.alpha == 1.0:
            if "constant_op" not in shared:
                shared["constant_op"] = _matmul_split.ConstantOperand(pb)
            self._const = shared["constant_op"]
            sc = self.scaled_c
            if sc is not None and sc.dtype == np.float32 and sc.size == pb.shape[1] and \
                    (sc.ndim == 1 or sc.shape == (1, pb.shape[1])):
                self._bias_row = np.ascontiguousarray(sc.reshape(-1))

    #: the activation the compiled path applies in its store ("" / "Relu" / "Gelu")
    _store_act = ""

    def _compiled(self, a, c):
        """The compiled path's result (None: it does not apply to this call)."""
        if a.dtype != np.float32 or a.ndim != 2:
            return None
        if self._bias_row is not None:
            bias = self._bias_row
        elif self.scaled_c is None and (c is None or self.beta == 0):
            bias = None
        else:
            return None
        return self._const.compiled(a.T if self.trans_a else a, bias, self._store_act)

    def run(self, a, b, c=None):
        if self._const is not None:
            y = self._compiled(a, c)
            if y is not None:
                return y
        return self._run_blas(a, b, c)

    def _run_blas(self, a, b, c=None):
        out_dtype = a.dtype
        integer = out_dtype.kind in "iu"
        aa = _compute(a)
        if self.trans_a:
            aa = aa.T
        if self.packed_b is not None:
            bb = self.packed_b
        else:
            bb = _compute(b)
            if self.trans_b:
                bb = bb.T
        y = _product(aa, bb) if aa.dtype in _BLAS_DTYPES and bb.dtype == aa.dtype \
            else np.matmul(aa, bb)
        if integer:  # rare: exact integer product, float scaling, truncating cast
            if self.alpha != 1:
                y = y * self.alpha
            if self.scaled_c is not None:
                y = y + self.scaled_c
            elif c is not None and self.beta != 0:
                y = y + c * self.beta
            return y.astype(out_dtype)
        if self.alpha != 1:
            y *= y.dtype.type(self.alpha)
        if self.scaled_c is not None:
            y += self.scaled_c
        elif c is not None and self.beta != 0:
            cc = upcast(c)
            y += cc if self.beta == 1 else cc * cc.dtype.type(self.beta)
        return y.astype(out_dtype, copy=False)


#: onnxruntime FusedGemm's parameter attributes per activation, with their defaults
_FUSED_GEMM_PARAMS = {"LeakyRelu": (("activation_alpha", 0.01),),
                      "HardSigmoid": (("activation_alpha", 0.2), ("activation_beta", 0.5))}


def fused_gemm_params(node: NodeSpec, name: str) -> tuple[float, ...]:
    """The activation parameters of a FusedGemm node (see :class:`FusedGemm`),
    in :func:`._epilogue.activation`'s order."""
    params = node.attr("activation_params")
    if params:
        return tuple(float(v) for v in params)
    spec = _FUSED_GEMM_PARAMS.get(name, ())
    if not any(node.attr(a) is not None for a, _ in spec):
        return ()
    return tuple(float(node.attr(a)) if node.attr(a) is not None else d for a, d in spec)


@cpu_kernel("FusedGemm", domain="com.microsoft")
class FusedGemm(Gemm):
    """com.microsoft FusedGemm (onnxruntime's contrib op): ``act(Gemm(A, B,
    C))`` with Gemm's attributes plus ``activation`` and its parameters; the
    activation runs in place on the product.

    Parameters as onnxruntime's schema names them: ``activation_alpha`` /
    ``activation_beta`` (LeakyRelu's alpha, default 0.01; HardSigmoid's alpha
    and beta, defaults 0.2 and 0.5). Our graph optimizer's own FusedGemm nodes
    may carry FusedConv's ``activation_params`` list instead (which also
    carries Clip's min and max); when both are set, ``activation_params``
    wins."""

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        from ._conv_util import decode_str
        act = decode_str(node.attr("activation"), "")
        require(act in _epilogue.ACTIVATIONS, "FusedGemm: unsupported activation %r", act)

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        from ._conv_util import decode_str
        name = decode_str(node.attr("activation"), "")
        self._act = _epilogue.activation(name, fused_gemm_params(node, name))
        if name in ("Relu", "Gelu"):  # parameterless: applied in the compiled GEMM's store
            self._store_act = name

    def run(self, a, b, c=None):
        if self._const is not None and self._store_act:
            y = self._compiled(a, c)
            if y is not None:
                return y
            y = self._run_blas(a, b, c)
        else:
            y = super().run(a, b, c)
        if y.dtype.kind != "f":
            raise ValueError(f"FusedGemm needs float inputs, got {y.dtype}")
        return self._act(y)


@cpu_kernel("MatMulEpilogue", domain="ai.actorrt")
class MatMulEpilogue(Kernel):
    """``act(A @ B + bias)`` (engine op from the graph optimizer's MatMul + Add
    [+ Gelu / Relu] fusion): A ``(..., M, K)`` float, B ``(K, N)`` constant,
    bias ``(N,)``; numpy matmul semantics for A, bias and activation applied
    in place on the product. Attribute ``activation``: ``""``, ``"Relu"`` or
    ``"Gelu"`` (erf form)."""

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        require(node.attr("activation", "") in ("", "Relu", "Gelu"),
                "MatMulEpilogue: unsupported activation %r", node.attr("activation"))

    @classmethod
    def estimate_flops(cls, node: NodeSpec) -> float:
        return MatMul.estimate_flops(node)

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self._act = _epilogue.activation(node.attr("activation", ""))
        self._gelu = node.attr("activation", "") == "Gelu"
        self._act_name = node.attr("activation", "")
        self.constant_b: _matmul_split.ConstantOperand | None = None

    def prepare(self, constants: Mapping[int, Any], shared: dict) -> None:
        self.constant_b = _constant_operand(constants, shared)

    def run(self, a, b, bias):
        const = self.constant_b
        if const is not None and b is const.b:
            if self._act_name in ("", "Relu", "Gelu") and bias.ndim == 1:
                y = const.compiled(a, bias, self._act_name)  # one pass: bias + act in the store
                if y is not None:
                    return y
            y = const.product(a) if a.dtype == b.dtype else np.matmul(a, b)
        else:
            y = _product(a, b) if a.dtype in _BLAS_DTYPES and a.dtype == b.dtype \
                else np.matmul(a, b)
        if y.dtype != bias.dtype or not isinstance(y, np.ndarray) or y.ndim == 0:
            y = np.asarray(y + bias)
        elif self._gelu and bias.ndim == 1:
            return _epilogue.bias_gelu_inplace(y, bias)  # one pass (float32, numba)
        else:
            y += bias
        return self._act(y)


def fused_matmul_perm(rank: int, trans_batch: bool, trans: bool) -> list[int]:
    """The axis order FusedMatMul reads an operand of ``rank`` in: with
    ``trans_batch`` and ``rank > 2`` the first axis moves behind the other
    batch axes (``(d0, d1, .., d[r-2], d[r-1])`` -> ``(d1, .., d[r-2], d0,
    d[r-1])``), then with ``trans`` the last two axes swap; rank < 2 stays
    as it is (MatMul's promotion rules apply)."""
    perm = list(range(rank))
    if rank < 2:
        return perm
    if trans_batch and rank > 2:
        perm = list(range(1, rank - 1)) + [0, rank - 1]
    if trans:
        perm[-1], perm[-2] = perm[-2], perm[-1]
    return perm


def fused_matmul_operand(x: np.ndarray, trans_batch: bool, trans: bool) -> np.ndarray:
    """FusedMatMul's view of an operand ``x`` (:func:`fused_matmul_perm`; a
    view, no copy)."""
    perm = fused_matmul_perm(x.ndim, trans_batch, trans)
    return x if perm == list(range(x.ndim)) else x.transpose(perm)


@cpu_kernel("FusedMatMul", domain="com.microsoft")
class FusedMatMul(Kernel):
    """com.microsoft FusedMatMul (onnxruntime's contrib op; its optimizer fuses
    ``MatMul`` with a ``Transpose`` of an input and with a scalar ``Mul`` /
    ``Div`` into it): ``Y = alpha * matmul(A', B')`` with numpy ``matmul``
    semantics (batch broadcasting), where ``A'`` / ``B'`` are the operands
    viewed by :func:`fused_matmul_operand` (attributes ``transBatchA`` /
    ``transA`` and ``transBatchB`` / ``transB``, default 0; ``alpha`` default
    1.0). float32 / float64 through BLAS or the compiled GEMM (a constant 2-D
    ``B`` is laid out once), float16 / bfloat16 multiplied in float32 and
    rounded back. A ``K`` mismatch of ``A'`` and ``B'``, or ``transBatchA`` /
    ``transBatchB`` on operands that are not of one rank >= 3 (onnxruntime's
    rule), raises at run time (:class:`~actorrt.KernelError` naming the
    node)."""

    @classmethod
    def estimate_flops(cls, node: NodeSpec) -> float:
        return MatMul.estimate_flops(node)

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self.alpha = float(node.attr("alpha", 1.0))
        self.trans_a = (bool(node.attr("transBatchA", 0)), bool(node.attr("transA", 0)))
        self.trans_b = (bool(node.attr("transBatchB", 0)), bool(node.attr("transB", 0)))
        self._b_source: np.ndarray | None = None
        self.constant_b: _matmul_split.ConstantOperand | None = None

    def prepare(self, constants: Mapping[int, Any], shared: dict) -> None:
        b = constants.get(1)
        if isinstance(b, np.ndarray) and b.ndim == 2 and b.dtype in _BLAS_DTYPES:
            if "fused_matmul_b" not in shared:
                shared["fused_matmul_b"] = _matmul_split.ConstantOperand(
                    np.ascontiguousarray(fused_matmul_operand(b, *self.trans_b)))
            self._b_source, self.constant_b = b, shared["fused_matmul_b"]

    def run(self, a, b):
        if (self.trans_a[0] or self.trans_b[0]) and (a.ndim != b.ndim or a.ndim < 3):
            raise ValueError(f"FusedMatMul: transBatchA / transBatchB need inputs of one rank "
                             f">= 3, got A {a.shape} and B {b.shape}")
        aa = fused_matmul_operand(a, *self.trans_a)
        const = self.constant_b
        if const is not None and b is self._b_source and aa.ndim >= 2 and aa.dtype == b.dtype:
            y = const.product(aa)
        else:
            y = _matmul_any(aa, fused_matmul_operand(b, *self.trans_b))
        if self.alpha != 1.0:
            if y.dtype.kind == "f" and y.dtype in _BLAS_DTYPES:
                y *= y.dtype.type(self.alpha)  # a fresh product: scaled in place
            else:
                y = (upcast(y) * np.float32(self.alpha)).astype(y.dtype)
        return y


# ------------------------------------------------------------ integer / quantized

def _zero_point_rows(zp, a: np.ndarray) -> np.ndarray:
    """A scalar zero point, or a per-row one ``(M,)`` reshaped to ``(M, 1)``."""
    zp = np.asarray(zp)
    if zp.ndim >= 1 and zp.size > 1 and a.ndim >= 2:
        return zp.reshape(-1, 1)
    return zp.reshape(()) if zp.size == 1 else zp


def _centered(x: np.ndarray, zp, rows: bool) -> np.ndarray:
    """``x - zp`` in float64 (exact for 8/16-bit integers and float8)."""
    xf = x.astype(np.float64)
    if zp is None:
        return xf
    z = (_zero_point_rows(zp, x) if rows else np.asarray(zp)).astype(np.float64)
    return xf - z


@cpu_kernel("MatMulInteger", since=10)
def MatMulInteger(A, B, a_zero_point=None, b_zero_point=None):
    """ONNX MatMulInteger (opset 10): ``(A - a_zp) @ (B - b_zp)`` as int32; ``a_zp``
    is scalar or per row of A, ``b_zp`` scalar or per column of B."""
    y = np.matmul(_centered(A, a_zero_point, True), _centered(B, b_zero_point, False))
    return np.asarray(y).astype(np.int32)


def _saturate_to(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round and clip ``y`` into integer ``dtype``, or cast (saturating) to a float8."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.rint(y), info.min, info.max).astype(dtype)
    finfo_max = float(np.finfo(dtype).max)
    return np.clip(y, -finfo_max, finfo_max).astype(dtype)


def _float_of_int_product(acc: np.ndarray, a_scale, b_scale, bias) -> np.ndarray:
    """``float32(acc) * (a_scale * b_scale) (+ bias)`` as onnxruntime's
    integer-to-float kernels compute it: the scale product in float32, a
    per-row ``a_scale`` ``(M,)`` or per-column ``b_scale`` ``(N,)``."""
    sa = np.asarray(a_scale, np.float32)
    sa = sa.reshape(-1, 1) if sa.size > 1 and acc.ndim >= 2 else sa.reshape(()) \
        if sa.size == 1 else sa
    scale = (sa * np.asarray(b_scale, np.float32)).astype(np.float32)
    y = acc.astype(np.float32) * scale
    if bias is not None:
        y += np.asarray(bias, np.float32)
    return y


@cpu_kernel("MatMulIntegerToFloat", domain="com.microsoft")
def MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None,
                         bias=None):
    """com.microsoft MatMulIntegerToFloat (onnxruntime's fusion of
    MatMulInteger + Cast + Mul [+ Add]): ``float((A - a_zp) @ (B - b_zp)) *
    a_scale * b_scale (+ bias)`` with 8-bit ``A`` / ``B`` (numpy matmul
    ranks), scales and zero points per tensor, ``a_*`` per row of A or
    ``b_*`` per column of B; float32 out. The integer product is exact
    (float64 BLAS, as :func:`MatMulInteger`)."""
    acc = np.matmul(_centered(A, a_zero_point, True), _centered(B, b_zero_point, False))
    return _float_of_int_product(np.asarray(acc), a_scale, b_scale, bias)


@cpu_kernel("DynamicQuantizeMatMul", domain="com.microsoft")
def DynamicQuantizeMatMul(A, B, b_scale, b_zero_point=None, bias=None):
    """com.microsoft DynamicQuantizeMatMul (onnxruntime's fusion of
    DynamicQuantizeLinear + MatMulInteger + scale [+ bias]): float32 ``A``
    quantized to uint8 as ONNX DynamicQuantizeLinear does (scale
    ``(max(0, max A) - min(0, min A)) / 255``), then
    :func:`MatMulIntegerToFloat` with the 8-bit ``B``. float32 out."""
    from .quantize import DynamicQuantizeLinear as _dql
    qa, a_scale, a_zp = _dql(A)
    return MatMulIntegerToFloat(qa, B, a_scale, b_scale, a_zp, b_zero_point, bias)


@cpu_kernel("QLinearMatMul", since=(10, 21))
def QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """ONNX QLinearMatMul (opsets 10, 21): ``y = saturate(round((a - a_zp) @ (b - b_zp)
    * a_scale * b_scale / y_scale) + y_zp)``; scales per tensor or per row (a, y) /
    per column (b). The output dtype is ``y_zero_point``'s."""
    acc = np.matmul(_centered(a, a_zero_point, True), _centered(b, b_zero_point, False))
    sa = _zero_point_rows(a_scale, a)
    sy = _zero_point_rows(y_scale, acc)
    factor = (sa * np.asarray(b_scale) / sy).astype(np.float64)
    y = acc * factor
    out_dtype = y_zero_point.dtype if y_zero_point is not None else a.dtype
    if out_dtype.kind in "iu":
        y = np.rint(y)
    if y_zero_point is not None:
        y = y + _zero_point_rows(y_zero_point, acc).astype(np.float64)
    return _saturate_to(np.asarray(y), np.dtype(out_dtype))


# ------------------------------------------------------------------- Einsum / Det

@cpu_kernel("Einsum", since=(12, 28))
def Einsum(*inputs, equation):
    """ONNX Einsum (opsets 12, 28): numpy ``einsum`` (optimized contraction order)."""
    eq = equation.decode() if isinstance(equation, bytes) else str(equation)
    eq = eq.replace(" ", "")
    dtype = inputs[0].dtype
    if dtype in LOW_PRECISION_FLOATS:
        args = [upcast(x) for x in inputs]
    else:
        args = list(inputs)
    out = np.einsum(eq, *args, optimize=len(args) > 1)
    return np.asarray(out).astype(dtype, copy=False)


@cpu_kernel("Det", since=(11, 22))
def Det(X):
    """ONNX Det (opsets 11, 22): determinant of ``(..., M, M)`` matrices, shape ``(...)``."""
    out = np.linalg.det(upcast(X))
    return np.asarray(out).astype(X.dtype, copy=False)
