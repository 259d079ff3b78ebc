"""Elementwise arithmetic with numpy broadcasting (ONNX multidirectional
broadcasting equals numpy's).

Spec: ONNX Add/Sub/Mul/Div (opsets 7, 13, 14), Relu (6, 13, 14), Identity.
"""

from __future__ import annotations

import numpy as np

from .registry import cpu_kernel


@cpu_kernel("Add", since=(7, 13, 14))
def Add(a, b):
    return np.add(a, b)


@cpu_kernel("Sub", since=(7, 13, 14))
def Sub(a, b):
    return np.subtract(a, b)


@cpu_kernel("Mul", since=(7, 13, 14))
def Mul(a, b):
    return np.multiply(a, b)


@cpu_kernel("Relu", since=(6, 13, 14))
def Relu(x):
    return np.maximum(x, x.dtype.type(0))
