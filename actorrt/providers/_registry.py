"""Kernel registries: one per execution provider, keyed by
(domain, op type, since-opset)."""

from __future__ import annotations

import bisect
from typing import Callable

import numpy as np

from ._contract import FunctionKernel, Kernel, function_kernel_class

__all__ = ["KernelRegistry"]

_DOMAIN_ALIASES = {"ai.onnx": ""}


def normalize_domain(domain: str) -> str:
    return _DOMAIN_ALIASES.get(domain, domain)


class KernelRegistry:
    """Maps (domain, op_type, since_version) to a :class:`Kernel` class.

    A lookup for opset ``v`` returns the kernel with the highest since-version
    ``<= v`` (the ONNX versioning rule), unless that version was registered as
    ended (``until``).
    """

    def __init__(self, provider: str):
        self.provider = provider
        self._table: dict[tuple[str, str], list[tuple[int, type[Kernel]]]] = {}

    def add(self, domain: str, op_type: str, since: int, kernel: type[Kernel]) -> None:
        """Register ``kernel`` for ``op_type`` in ``domain`` from opset ``since`` on.

        Raises:
            ValueError: the same (domain, op_type, since) is registered twice.
        """
        key = (normalize_domain(domain), op_type)
        versions = self._table.setdefault(key, [])
        if any(v == since for v, _ in versions):
            raise ValueError(f"{self.provider}: kernel {domain!r}:{op_type} since {since} "
                             f"registered twice")
        bisect.insort(versions, (since, kernel), key=lambda t: t[0])

    def kernel(self, op_type: str, *, since: int | tuple[int, ...] = 1, domain: str = "",
               multi_output: bool = False, check: Callable | None = None,
               flops: Callable | None = None, **flags) -> Callable:
        """Decorator registering a :class:`Kernel` subclass or a plain function.

        A function is named like the op; positional parameters are the inputs
        (``None`` for an omitted optional input), keyword-only parameters are the
        attributes with the spec's defaults, and a keyword ``node`` receives the
        :class:`~actorrt.providers.NodeSpec`. ``since`` may be a tuple to register
        one implementation for several opset versions (it can branch on
        ``node.opset``).
        """
        sinces = since if isinstance(since, tuple) else (since,)

        def deco(obj):
            if isinstance(obj, type) and issubclass(obj, Kernel):
                cls = obj
            elif isinstance(obj, np.ufunc):
                # a bare ufunc: the plan calls it directly, no wrapper frame
                cls = type(op_type, (FunctionKernel,), {
                    "fn": obj, "attr_names": (), "multi_output": False, "pass_node": False,
                    "__doc__": f"{op_type} as numpy.{obj.__name__} (broadcasting)",
                    "__module__": __name__, **flags})
            else:
                cls = function_kernel_class(obj, multi_output=multi_output, check=check,
                                            flops=flops, **flags)
            for s in sinces:
                self.add(domain, op_type, s, cls)
            return obj

        return deco

    def lookup(self, domain: str, op_type: str, opset: int) -> type[Kernel] | None:
        """The kernel class for ``op_type`` at ``opset``, or ``None``."""
        versions = self._table.get((normalize_domain(domain), op_type))
        if not versions:
            return None
        best = None
        for since, cls in versions:
            if since <= opset:
                best = cls
        return best

    def versions(self, domain: str, op_type: str) -> list[int]:
        """Since-versions registered for ``op_type`` (for decline reasons)."""
        return [v for v, _ in self._table.get((normalize_domain(domain), op_type), [])]

    def miss_reason(self, domain: str, op_type: str, opset: int) -> str:
        """Why :meth:`lookup` found nothing, naming op, domain, opset and provider."""
        vs = self.versions(domain, op_type)
        dom = domain or "ai.onnx"
        if not vs:
            return f"provider {self.provider} has no kernel for {dom}:{op_type}"
        return (f"provider {self.provider} has no kernel for {dom}:{op_type} at opset "
                f"{opset} (kernels registered since opsets {vs})")

    def ops(self) -> list[tuple[str, str, int]]:
        """Every registered (domain, op_type, since)."""
        return sorted((d, o, v) for (d, o), vs in self._table.items() for v, _ in vs)
