"""Execution providers and the kernel contract.

* :mod:`actorrt.providers.cpu` — numpy kernels on host memory (default).
* :mod:`actorrt.providers.reference` — a slow, always-correct fallback on
  ``onnx.reference`` ops; off by default, takes only nodes others decline.
* :mod:`actorrt.providers.cuda` — cupy kernels on an NVIDIA GPU (``[cuda]`` extra).
"""

from __future__ import annotations

from typing import Any, Sequence

from .._errors import InvalidArgumentError
from ._contract import (CaptureSupport, Cost, Decline, DeviceProfile, Kernel, KernelMatch,
                        KernelSizedOutput, NodeSpec, Supported, Unsupported, ValueType,
                        WorkspaceRequest, capture_supported, capture_unsupported, deny,
                        estimate_bytes, require)
from ._registry import KernelRegistry
from .base import ExecutionProvider

__all__ = [
    "CaptureSupport", "Cost", "Decline", "DeviceProfile", "Kernel", "KernelMatch",
    "KernelSizedOutput", "NodeSpec", "Supported", "Unsupported", "ValueType",
    "WorkspaceRequest", "capture_supported", "capture_unsupported", "deny", "require",
    "estimate_bytes", "KernelRegistry", "ExecutionProvider", "resolve_providers",
    "provider_class",
]


def provider_class(name: str) -> type[ExecutionProvider]:
    """The provider class for ``name`` (short name or onnxruntime-style alias).

    Raises:
        InvalidArgumentError: unknown name, or a provider whose package is missing.
    """
    key = name.lower().removesuffix("executionprovider")
    if key == "cpu":
        from .cpu import CPUExecutionProvider
        return CPUExecutionProvider
    if key in ("reference", "ref"):
        from .reference import ReferenceExecutionProvider
        return ReferenceExecutionProvider
    if key == "cuda":
        try:
            from .cuda import CUDAExecutionProvider
        except ImportError as e:
            raise InvalidArgumentError(
                f"provider {name!r} needs cupy (pip install 'actorrt[cuda]'): {e}",
                expected="an importable cupy", got="ImportError") from e
        return CUDAExecutionProvider
    raise InvalidArgumentError(f"unknown execution provider {name!r}",
                               expected="'cpu'/'CPUExecutionProvider', 'reference' or 'cuda'",
                               got=repr(name))


def resolve_providers(providers: Sequence[Any] | None, options: Any) -> list[ExecutionProvider]:
    """Provider instances for ``providers`` (names, ``(name, dict)`` pairs or
    instances). The CPU provider is always present (it hosts weights and folds
    constants); the reference fallback is added last when
    ``options.enable_fallback`` is set or it is named.

    Raises:
        InvalidArgumentError: unknown provider name or bad entry.
    """
    threads = getattr(options, "intra_op_num_threads", None)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
        raise InvalidArgumentError("intra_op_num_threads must be an int >= 0 (0: every core)",
                                   expected="int >= 0", got=repr(threads))
    if providers is None:
        providers = ["cpu"]
    if isinstance(providers, str):
        providers = [providers]
    out: list[ExecutionProvider] = []
    for p in providers:
        if isinstance(p, ExecutionProvider):
            out.append(p)
            continue
        kwargs: dict = {}
        if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
            p, kwargs = p[0], dict(p[1])
        if not isinstance(p, str):
            raise InvalidArgumentError("a provider must be a name or a provider instance",
                                       expected="str", got=type(p).__name__)
        cls = provider_class(p)
        if any(type(o) is cls for o in out):
            continue
        kwargs.setdefault("memory_limit", getattr(options, "memory_limit", None))
        if getattr(options, "workers", None):
            kwargs.setdefault("workers", options.workers)
        if cls.name == "cpu" and getattr(options, "intra_op_num_threads", None):
            kwargs.setdefault("threads", options.intra_op_num_threads)
        out.append(cls(**kwargs))
    from .cpu import CPUExecutionProvider
    if not any(isinstance(p, CPUExecutionProvider) for p in out):
        out.append(CPUExecutionProvider(memory_limit=getattr(options, "memory_limit", None),
                                        workers=getattr(options, "workers", None),
                                        threads=getattr(options, "intra_op_num_threads", None) or None))
    if getattr(options, "enable_fallback", False):
        from .reference import ReferenceExecutionProvider
        if not any(isinstance(p, ReferenceExecutionProvider) for p in out):
            out.append(ReferenceExecutionProvider())
    return out
