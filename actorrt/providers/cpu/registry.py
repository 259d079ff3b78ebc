"""The CPU execution provider's kernel registry.

Kernel modules in this package register themselves with :func:`cpu_kernel`::

    @cpu_kernel("Relu", since=(6, 13, 14))
    def Relu(x):
        return np.maximum(x, x.dtype.type(0))

    @cpu_kernel("Softmax", since=13)
    def Softmax(x, *, axis=-1): ...

or with a :class:`~actorrt.providers.Kernel` subclass for kernels that prepack,
need workspace or have several outputs.
"""

from __future__ import annotations

from .._registry import KernelRegistry

CPU_KERNELS = KernelRegistry("cpu")
cpu_kernel = CPU_KERNELS.kernel

__all__ = ["CPU_KERNELS", "cpu_kernel"]
