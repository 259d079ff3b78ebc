"""Type conversion: Cast, CastLike and BitCast.

Spec: ONNX Cast (opsets 1, 6, 9, 13, 19, 21, 23, 24, 25, 28), CastLike (15, 19,
21, 23, 24, 25), BitCast (26). Every tensor element type numpy or ml_dtypes
holds: strings, bool, integers, float16/32/64, bfloat16, float8 (e4m3fn,
e4m3fnuz, e5m2, e5m2fnuz, e8m0), float4e2m1, float6, int4/uint4, int2/uint2.
``saturate`` (from opset 19) clamps float8 targets to their finite range;
``round_mode`` (from opset 24) picks the FLOAT8E8M0 rounding. A cast whose
source dtype is known at plan time and needs no spec fix-ups compiles to a bare
``x.astype(to)``; a cast to the input's own dtype returns the input itself.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_ir as ir

from ..._dtypes import from_numpy_dtype, storage_bits, to_numpy_dtype
from .._contract import Kernel, NodeSpec, deny, require
from ._cast_util import make_caster
from .elementwise import input_dtype
from .registry import cpu_kernel

__all__: list[str] = []


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)




def _target(node: NodeSpec) -> np.dtype:
    """The numpy dtype of Cast's ``to`` (an ONNX DataType; a name such as
    'FLOAT' in opsets 1-5)."""
    to = node.attr("to")
    if isinstance(to, (str, bytes)):
        to = int(ir.DataType[_str(to).upper()])
    return to_numpy_dtype(to)


def _options(node: NodeSpec) -> tuple[bool, str]:
    saturate = bool(node.attr("saturate", 1)) if node.opset >= 19 else True
    round_mode = _str(node.attr("round_mode", "up")) if node.opset >= 24 else "up"
    return saturate, round_mode


@cpu_kernel("Cast", since=(1, 6, 9, 13, 19, 21, 23, 24, 25, 28))
class Cast(Kernel):
    """ONNX Cast (opsets 1-28): X converted to element type ``to`` (an ONNX
    DataType; opsets 1-5 may name it as a string such as 'FLOAT')."""

    view_outputs = True  # a no-op cast hands back its input

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        require(node.attr("to") is not None, "Cast needs the 'to' attribute")
        try:
            _target(node)
        except (KeyError, ValueError, TypeError):
            deny("Cast to element type %r is not supported", node.attr("to"))

    def compile(self) -> Callable:
        saturate, round_mode = _options(self.node)
        return make_caster(input_dtype(self.node, 0), _target(self.node), saturate, round_mode)

    def run(self, x):
        return self.compile()(x)


@cpu_kernel("CastLike", since=(15, 19, 21, 23, 24, 25))
class CastLike(Kernel):
    """ONNX CastLike (opsets 15-25): X converted to the element type of
    ``target_type`` (whose values are ignored)."""

    view_outputs = True

    def compile(self) -> Callable:
        saturate, round_mode = _options(self.node)
        src, dst = input_dtype(self.node, 0), input_dtype(self.node, 1)
        if dst is not None:
            cast = make_caster(src, dst, saturate, round_mode)
            return lambda x, target_type: cast(x)
        cache: dict[np.dtype, Callable] = {}

        def run(x, target_type):
            dt = target_type.dtype
            fn = cache.get(dt)
            if fn is None:
                fn = cache[dt] = make_caster(src, dt, saturate, round_mode)
            return fn(x)
        return run

    def run(self, x, target_type):
        return self.compile()(x, target_type)


@cpu_kernel("BitCast", since=26)
def BitCast(x, *, to):
    """ONNX BitCast (opset 26): X's bits reinterpreted as type ``to`` of the same
    bit width (a view of the input; bool results are ``byte != 0``)."""
    dt = to_numpy_dtype(to)
    src_bits = storage_bits(from_numpy_dtype(x.dtype))
    if dt == np.dtype(object) or x.dtype == np.dtype(object):
        raise TypeError("BitCast does not take strings")
    if storage_bits(to) != src_bits:
        raise TypeError(f"BitCast from {x.dtype} ({src_bits} bits) to {dt} "
                        f"({storage_bits(to)} bits): the bit widths differ")
    if dt == np.bool_ and x.dtype != np.bool_:
        return x.view(np.uint8) != 0
    return x.view(dt)
