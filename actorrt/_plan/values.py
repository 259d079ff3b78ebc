"""Value types, graph inputs and outputs, and feed checks of a plan.

:class:`IOSpec` is a graph input or output as a session reports it;
:func:`check_value` / :func:`fast_checks` validate a run's feeds against
them (typed :class:`~actorrt.InvalidArgumentError`); :func:`value_type_of`,
:func:`type_string`, :func:`tensor_to_numpy` and :func:`attr_value` turn
onnx-ir types, tensors and attributes into the plan's own.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import numpy as np
import onnx_ir as ir

from .. import _dtypes
from .._errors import InvalidArgumentError
from ..providers._contract import ValueType

__all__ = ["IOSpec", "attr_value", "check_value", "fast_checks", "tensor_to_numpy", "to_host",
           "type_string", "value_type_of"]


@attrs.frozen
class IOSpec:
    """A graph input or output as a session reports it."""

    name: str
    slot: int
    type: ValueType
    default: Any = None  # initializer value for overridable inputs
    has_default: bool = False

    @property
    def shape(self) -> list[int | str | None]:
        return list(self.type.shape) if self.type.shape is not None else []

    @property
    def type_str(self) -> str:
        return type_string(self.type)

def type_string(vt: ValueType) -> str:
    """onnxruntime-style type string, e.g. ``'tensor(float)'``, ``'seq(tensor(int64))'``."""
    if vt.kind == "tensor":
        return f"tensor({_dtypes.type_string(vt.dtype)})" if vt.dtype else "tensor(undefined)"
    if vt.kind == "sequence":
        return f"seq({type_string(vt.elem)})" if vt.elem else "seq(undefined)"
    if vt.kind == "optional":
        return f"optional({type_string(vt.elem)})" if vt.elem else "optional(undefined)"
    return vt.kind


def value_type_of(t: ir.TypeProtocol | None, shape: ir.Shape | None) -> ValueType:
    """The :class:`ValueType` of an onnx-ir type and shape."""
    if t is None:
        return ValueType(kind="unknown")
    if isinstance(t, ir.TensorType):
        dims = None
        if shape is not None:
            dims = tuple(d if isinstance(d, int) else (d.value if d.value is not None else None)
                         for d in shape.dims)
        return ValueType("tensor", int(t.dtype), dims)
    if isinstance(t, ir.SequenceType):
        return ValueType("sequence", int(t.dtype) if t.dtype is not None else None, None,
                         value_type_of(t.elem_type, None))
    if isinstance(t, ir.OptionalType):
        return ValueType("optional", int(t.dtype) if t.dtype is not None else None, None,
                         value_type_of(t.elem_type, None))
    if isinstance(t, ir.SparseTensorType):
        return ValueType("sparse", int(t.dtype), None)
    return ValueType(kind="unknown")


def tensor_to_numpy(t: ir.TensorProtocol) -> np.ndarray:
    """An onnx-ir tensor as numpy (strings as an object array of ``str``)."""
    arr = t.numpy()
    if t.dtype == ir.DataType.STRING:
        flat = [x.decode("utf-8") if isinstance(x, bytes) else x for x in arr.reshape(-1)]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(arr.shape)
    return _dtypes.native(arr)  # numpy's own dtype object (identity tests on hot paths)


def attr_value(a: ir.Attr) -> Any:
    """Python value of an onnx-ir attribute."""
    T = ir.AttributeType
    v = a.value
    if a.type == T.TENSOR:
        return tensor_to_numpy(v)
    if a.type == T.TENSORS:
        return [tensor_to_numpy(x) for x in v]
    if a.type in (T.INTS, T.FLOATS):
        return list(v)
    if a.type == T.STRINGS:
        return [x.decode("utf-8") if isinstance(x, bytes) else x for x in v]
    if a.type == T.STRING:
        return v.decode("utf-8") if isinstance(v, bytes) else v
    if a.type == T.GRAPHS:
        return list(v)
    return v


def to_host(v: Any) -> Any:
    """A device array (cupy) as numpy; anything else unchanged."""
    if isinstance(v, list):
        return [to_host(x) for x in v]
    if not isinstance(v, np.ndarray) and hasattr(v, "__cuda_array_interface__"):
        return v.get()
    return v

def fast_checks(inputs: Sequence[IOSpec]) -> dict[str, tuple]:
    """name -> (slot, numpy dtype, rank, ((axis, static dim), ...)) of the
    tensor inputs with a known dtype and rank (:meth:`Plan.bind_feeds`'s
    fast path; anything else takes :func:`check_value`)."""
    out = {}
    for spec in inputs:
        vt = spec.type
        if vt.kind != "tensor" or vt.dtype is None or vt.shape is None:
            continue
        want = _dtypes.to_numpy_dtype(vt.dtype)
        if want == np.dtype(object):
            continue
        static = tuple((a, d) for a, d in enumerate(vt.shape) if isinstance(d, int))
        out[spec.name] = (spec.slot, want, len(vt.shape), static)
    return out


def check_value(spec: IOSpec, value: Any, model: str) -> Any:
    vt = spec.type
    if vt.kind == "tensor":
        if not isinstance(value, np.ndarray):
            if isinstance(value, (np.generic, int, float, bool, list, tuple)):
                value = np.asarray(value)
            elif hasattr(value, "__array__"):
                value = np.asarray(value)
            else:
                raise InvalidArgumentError(
                    f"input {spec.name!r} must be a numpy array", input=spec.name,
                    expected=type_string(vt), got=type(value).__name__, model=model)
        if vt.dtype is not None:
            want = _dtypes.to_numpy_dtype(vt.dtype)
            # a stand-in (a paged KV pool) names the element type it is fed as
            got = getattr(value, "feed_dtype", value.dtype)
            if got != want and not (want == np.dtype(object) and got.kind in "OUS"):
                raise InvalidArgumentError(
                    f"input {spec.name!r} has the wrong element type", input=spec.name,
                    expected=type_string(vt), got=f"tensor({_np_name(got)})", model=model)
            if want == np.dtype(object) and got.kind in "US":
                value = value.astype(object)
        if vt.shape is not None:
            if value.ndim != len(vt.shape):
                raise InvalidArgumentError(
                    f"input {spec.name!r} has the wrong rank", input=spec.name,
                    expected=f"rank {len(vt.shape)} {list(vt.shape)}",
                    got=f"rank {value.ndim} {list(value.shape)}", model=model)
            for axis, (d, g) in enumerate(zip(vt.shape, value.shape)):
                if isinstance(d, int) and d != g:
                    raise InvalidArgumentError(
                        f"input {spec.name!r} has an incompatible dimension {axis}",
                        input=spec.name, expected=f"shape {list(vt.shape)}",
                        got=f"shape {list(value.shape)}", model=model)
        return value
    if vt.kind == "sequence":
        if not isinstance(value, (list, tuple)):
            raise InvalidArgumentError(f"input {spec.name!r} must be a list (an ONNX sequence)",
                                       input=spec.name, expected=type_string(vt),
                                       got=type(value).__name__, model=model)
        return list(value)
    return value


def _np_name(dt: np.dtype) -> str:
    try:
        return _dtypes.type_string(_dtypes.from_numpy_dtype(dt))
    except Exception:
        return str(dt)
