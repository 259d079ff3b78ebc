"""ONNX element types <-> numpy dtypes (ml_dtypes for bfloat16, float8, float4,
int4/uint4 and int2/uint2), with storage sizes that count sub-byte packing.

The enum is ``onnx_ir.DataType`` (values equal ``onnx.TensorProto`` data types).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ._errors import OutOfMemoryError

DataType = ir.DataType

_NP_CACHE: dict[int, np.dtype] = {}


def to_numpy_dtype(dtype: int | ir.DataType) -> np.dtype:
    """The numpy dtype holding elements of ONNX type ``dtype`` (one element per
    numpy item; sub-byte types are unpacked, one item each).

    Raises:
        ValueError: ``dtype`` is not a tensor element type numpy can hold.
    """
    key = int(dtype)
    try:
        return _NP_CACHE[key]
    except KeyError:
        pass
    dt = ir.DataType(key)
    if dt == ir.DataType.STRING:
        out = np.dtype(object)
    else:
        out = np.dtype(dt.numpy())
    _NP_CACHE[key] = out
    return out


def native(arr: np.ndarray) -> np.ndarray:
    """``arr`` carrying numpy's own dtype object where its dtype is a
    native-order builtin type spelled as another object (onnx-ir's
    ``Tensor.numpy()`` returns ``dtype('<f4')`` built with an explicit byte
    order, equal to ``np.dtype(np.float32)`` but not the same object). Hot
    paths test dtypes by identity (``x.dtype is F32``: ~30 ns against ~100
    for ``==``), which such constants and everything computed from them
    failed. A view (no copy) where the dtype is replaced; other arrays as
    they are."""
    dt = arr.dtype
    if dt.kind in "biufc?" and dt.isnative:
        canon = np.dtype(dt.char)
        if canon is not dt and canon == dt:
            return arr.view(canon)
    return arr


def from_numpy_dtype(dtype: np.dtype) -> ir.DataType:
    """The ONNX element type of a numpy dtype (object/str arrays are STRING).

    Raises:
        ValueError: numpy dtype with no ONNX equivalent.
    """
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "U", "S"):
        return ir.DataType.STRING
    return ir.DataType.from_numpy(dtype)


def type_string(dtype: int | ir.DataType) -> str:
    """onnxruntime-style element name, e.g. ``'float'``, ``'int64'``, ``'bfloat16'``."""
    dt = ir.DataType(int(dtype))
    name = dt.name.lower()
    return {"float": "float", "double": "double"}.get(name, name)


def storage_bits(dtype: int | ir.DataType) -> int:
    """Bits one element occupies in packed storage (4 for int4, 2 for int2, 32 for float)."""
    dt = ir.DataType(int(dtype))
    if dt == ir.DataType.STRING:
        return 8 * np.dtype(object).itemsize
    return int(dt.bitwidth)


def storage_bytes(shape, dtype: int | ir.DataType, *, role: str = "activations",
                  provider: str = "cpu", limit: int | None = None) -> int:
    """Bytes a tensor of ``shape`` and ``dtype`` occupies packed (sub-byte types
    round up to whole bytes). Symbolic (``str``/``None``) dims count as 1.

    Raises:
        OutOfMemoryError: a negative dim, or a byte count that overflows int64.
    """
    n = 1
    for d in shape:
        if isinstance(d, (int, np.integer)):
            if d < 0:
                raise OutOfMemoryError(f"negative dimension {d} in shape {tuple(shape)}",
                                       requested=-1, in_use=0, limit=limit, role=role,
                                       provider=provider)
            n *= int(d)
    nbytes = math.ceil(n * storage_bits(dtype) / 8)
    if nbytes >= 2**63:
        raise OutOfMemoryError(f"byte count of shape {tuple(shape)} overflows int64",
                               requested=nbytes, in_use=0, limit=limit, role=role,
                               provider=provider)
    return nbytes
