"""CUDA execution provider on cupy.

The provider actor owns its device allocations (accounted like every provider)
and one CUDA stream: every segment its workers run is issued on that stream, in
order. Values cross to and from host providers through the executor's import
hooks (:meth:`CUDAExecutionProvider.import_value` /
:meth:`CUDAExecutionProvider.export_value`); constants are uploaded once when
the plan is compiled.
"""

from __future__ import annotations

import contextlib
from typing import Any

import cupy as cp
import numpy as np

from .._contract import DeviceProfile, NodeSpec, deny, require
from .._registry import KernelRegistry
from ..base import ExecutionProvider

__all__ = ["CUDAExecutionProvider", "CUDA_KERNELS"]

CUDA_KERNELS = KernelRegistry("cuda")
cuda_kernel = CUDA_KERNELS.kernel

#: Rough figures for a datacenter GPU; launch and PCIe costs keep small ops on the CPU.
CUDA_PROFILE = DeviceProfile(gflops=20000.0, gbytes_per_s=2000.0, launch_us=8.0,
                             transfer_gbytes_per_s=20.0)

_FLOATS = (1, 10, 11)  # FLOAT, FLOAT16, DOUBLE


def _floats_only(node: NodeSpec) -> None:
    for i, t in enumerate(node.input_types):
        if t is not None and t.kind == "tensor" and t.dtype is not None and node.inputs[i]:
            require(t.dtype in _FLOATS, "the cuda provider runs %s on float tensors only "
                    "(input %d is element type %d)", node.op_type, i, t.dtype)
        elif t is None and node.inputs and i < len(node.inputs) and node.inputs[i]:
            deny("input %d of %s has no known type; the cuda provider needs float tensors",
                 i, node.op_type)


class CUDAExecutionProvider(ExecutionProvider):
    """Runs cupy kernels on one GPU.

    Args:
        device_id: CUDA device ordinal.
        workers: worker actors (segments issued concurrently; default 1).
        memory_limit: bytes this provider may hold (``None``: no limit).
    """

    name = "cuda"
    aliases = ("CUDAExecutionProvider", "CUDA")
    host_accessible = False
    registry = CUDA_KERNELS

    def __init__(self, *, device_id: int = 0, workers: int | None = 1,
                 memory_limit: int | None = None):
        super().__init__(workers=workers or 1, memory_limit=memory_limit, profile=CUDA_PROFILE)
        self.device = cp.cuda.Device(device_id)
        with self.device:
            self.stream = cp.cuda.Stream(non_blocking=True)

    def segment_context(self):
        """Segments run on this provider's device and stream."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.device)
        stack.enter_context(self.stream)
        return stack

    # device primitives -------------------------------------------------------
    def alloc_array(self, shape, dtype, zero):
        with self.device, self.stream:
            return cp.zeros(shape, dtype) if zero else cp.empty(shape, dtype)

    def to_host(self, array: Any) -> np.ndarray:
        with self.device:
            out = cp.asnumpy(array, stream=self.stream)
            self.stream.synchronize()
            return out

    def from_host(self, array: np.ndarray) -> Any:
        with self.device, self.stream:
            return cp.asarray(array)

    def write_bytes(self, array, offset, data):
        flat = array.reshape(-1).view(cp.uint8)
        if offset < 0 or offset + len(data) > flat.nbytes:
            raise ValueError(f"write of {len(data)} bytes at offset {offset} exceeds the "
                             f"buffer's {flat.nbytes} bytes")
        with self.device, self.stream:
            flat[offset:offset + len(data)] = cp.asarray(np.frombuffer(data, np.uint8))

    def argmax(self, array, n):
        with self.device, self.stream:
            a = array if not n else array[..., :n]
            idx = cp.argmax(a, axis=-1).astype(cp.uint32)
            return self.to_host(idx)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def import_dlpack(self, obj: Any) -> Any:
        with self.device:
            return cp.from_dlpack(obj)

    # values crossing providers ----------------------------------------------------
    def import_value(self, v: Any) -> Any:
        """A host value as a device array (device arrays pass through)."""
        if isinstance(v, np.ndarray):
            return self.from_host(v)
        if isinstance(v, list):
            return [self.import_value(x) for x in v]
        return v

    @staticmethod
    def export_value(v: Any) -> Any:
        """A device array as numpy (anything else passes through)."""
        if isinstance(v, cp.ndarray):
            return cp.asnumpy(v)
        if isinstance(v, list):
            return [CUDAExecutionProvider.export_value(x) for x in v]
        return v


# ------------------------------------------------------------------------ kernels
# ONNX semantics equal numpy's for these; cupy mirrors numpy.

def _ufunc_kernel(op: str, fn, sinces) -> None:
    def kernel(*xs):
        return fn(*xs)
    kernel.__name__ = op
    kernel.__doc__ = f"ONNX {op} on cupy ({fn.__name__})."
    cuda_kernel(op, since=sinces, check=_floats_only)(kernel)


for _op, _fn, _s in (("Add", cp.add, (7, 13, 14)), ("Sub", cp.subtract, (7, 13, 14)),
                     ("Mul", cp.multiply, (7, 13, 14)), ("Div", cp.true_divide, (7, 13, 14)),
                     ("Exp", cp.exp, (6, 13)), ("Tanh", cp.tanh, (6, 13)),
                     ("Sqrt", cp.sqrt, (6, 13)), ("Neg", cp.negative, (6, 13))):
    _ufunc_kernel(_op, _fn, _s)


@cuda_kernel("Relu", since=(6, 13, 14), check=_floats_only)
def Relu(x):
    """ONNX Relu on cupy."""
    return cp.maximum(x, 0).astype(x.dtype, copy=False)


@cuda_kernel("Sigmoid", since=(6, 13), check=_floats_only)
def Sigmoid(x):
    """ONNX Sigmoid on cupy."""
    return (1 / (1 + cp.exp(-x))).astype(x.dtype, copy=False)


@cuda_kernel("MatMul", since=(1, 9, 13), check=_floats_only,
             flops=lambda node: _matmul_flops(node))
def MatMul(a, b):
    """ONNX MatMul on cupy (cuBLAS)."""
    return cp.matmul(a, b)


@cuda_kernel("Gemm", since=(7, 9, 11, 13), check=_floats_only,
             flops=lambda node: _matmul_flops(node))
def Gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """ONNX Gemm on cupy (cuBLAS): alpha * A' B' + beta * C."""
    a = a.T if transA else a
    b = b.T if transB else b
    y = cp.matmul(a, b)
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    if c is not None and beta != 0.0:
        y += c * y.dtype.type(beta) if beta != 1.0 else c
    return y


@cuda_kernel("Softmax", since=13, check=_floats_only)
def Softmax(x, *, axis=-1):
    """ONNX Softmax-13 on cupy."""
    e = cp.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _matmul_flops(node: NodeSpec) -> float:
    a, b = node.input_type(0), node.input_type(1)
    if a is None or b is None or a.static_shape is None or b.static_shape is None:
        return 1.0
    k = a.static_shape[-1]
    out = 1
    for t in node.output_types:
        if t is not None and t.static_shape is not None:
            out = int(np.prod(t.static_shape))
    return 2.0 * out * k
