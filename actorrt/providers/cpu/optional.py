"""Optional values. An empty optional is ``None``; an optional holding a value
is the value itself (a tensor or a sequence).

Spec: ONNX Optional (15, 28), OptionalHasElement (15, 18, 28),
OptionalGetElement (15, 18, 28).
"""

from __future__ import annotations

import numpy as np

from .registry import cpu_kernel


@cpu_kernel("Optional", since=(15, 28))
def Optional(input=None, *, type=None):
    """ONNX Optional (15, 28): an optional holding ``input``, empty (``None``)
    when the input is omitted."""
    return input


@cpu_kernel("OptionalHasElement", since=(15, 18, 28))
def OptionalHasElement(input=None):
    """ONNX OptionalHasElement (15, 18, 28): a bool scalar, true when ``input``
    is present and not empty."""
    return np.array(input is not None)


@cpu_kernel("OptionalGetElement", since=(15, 18, 28))
def OptionalGetElement(input):
    """ONNX OptionalGetElement (15, 18, 28): the value an optional holds (a
    plain tensor or sequence is returned as is).

    Raises:
        ValueError: the optional is empty.
    """
    if input is None:
        raise ValueError("OptionalGetElement on an empty optional")
    return input
