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
    "provider_class", "provider_unavailable",
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
    if key in ORT_ONLY_PROVIDERS:
        raise InvalidArgumentError(f"provider {name!r} is an onnxruntime provider actorrt does "
                                   "not implement", expected=_PROVIDER_NAMES, got=repr(name))
    raise InvalidArgumentError(f"unknown execution provider {name!r}",
                               expected=_PROVIDER_NAMES, got=repr(name))


#: onnxruntime's execution providers actorrt does not implement: named in a
#: provider list they are skipped with a warning, as onnxruntime skips those
#: it was not built with
ORT_ONLY_PROVIDERS = frozenset(n.lower() for n in (
    "Tensorrt", "NvTensorRTRTX", "MIGraphX", "ROCM", "OpenVINO", "Dnnl", "Tvm", "VitisAI",
    "QNN", "Nnapi", "VSINPU", "Js", "CoreML", "ArmNN", "ACL", "Dml", "Rknpu", "WebNN",
    "WebGpu", "Xnnpack", "CANN", "Azure", "SNPE"))

#: onnxruntime provider options that tune onnxruntime's own allocators and
#: kernels: accepted and ignored (with a warning), so option dicts written for
#: onnxruntime work unchanged
ORT_TUNING_OPTIONS = frozenset((
    "arena_extend_strategy", "cudnn_conv_algo_search", "do_copy_in_default_stream",
    "cudnn_conv_use_max_workspace", "cudnn_conv1d_pad_to_nc1d", "enable_cuda_graph",
    "enable_skip_layer_norm_strict_mode", "prefer_nhwc", "use_tf32", "tunable_op_enable",
    "tunable_op_tuning_enable", "tunable_op_max_tuning_duration_ms",
    "use_ep_level_unified_stream", "gpu_external_alloc", "gpu_external_free",
    "gpu_external_empty_cache", "has_user_compute_stream", "user_compute_stream",
    "sdpa_kernel", "fuse_conv_bias"))

#: onnxruntime's names for options actorrt's providers take under their own
ORT_OPTION_ALIASES = {"gpu_mem_limit": "memory_limit"}

_PROVIDER_NAMES = ("'cpu'/'CPUExecutionProvider', 'reference'/'ReferenceExecutionProvider', "
                   "'cuda'/'CUDAExecutionProvider'")


def _key(name: str) -> str:
    return name.lower().removesuffix("executionprovider")


def provider_unavailable(name: str) -> str | None:
    """Why provider ``name`` cannot run on this machine, or ``None`` when it
    can (its package imports and, for ``cuda``, a GPU is visible).

    Raises:
        InvalidArgumentError: ``name`` is no provider actorrt or onnxruntime knows.
    """
    key = _key(name)
    if key in ("cpu", "reference", "ref"):
        return None
    if key in ORT_ONLY_PROVIDERS:
        return f"{name} is an onnxruntime provider actorrt does not implement"
    if key == "cuda":
        try:
            import cupy
        except Exception as e:  # noqa: BLE001 - any import failure means unavailable
            return f"{name} needs cupy (pip install 'actorrt[cuda]'): {e}"
        try:
            n = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as e:  # noqa: BLE001 - a CUDA runtime error: no usable GPU
            return f"{name} found no usable GPU: {e}"
        return None if n > 0 else f"{name} found no GPU"
    raise InvalidArgumentError(f"unknown execution provider {name!r}",
                               expected=_PROVIDER_NAMES, got=repr(name))


def _provider_kwargs(cls: type, name: str, options: Any) -> dict:
    """``options`` (a provider-options mapping, as onnxruntime's) as keyword
    arguments of ``cls``: onnxruntime's names mapped to ours, numeric strings
    to numbers, onnxruntime-only tuning options dropped with a warning.

    Raises:
        InvalidArgumentError: not a mapping, or an option ``cls`` does not take.
    """
    import inspect
    import warnings

    from .._errors import ProviderUnavailableWarning

    if options is None:
        return {}
    if not hasattr(options, "items"):
        raise InvalidArgumentError(f"provider options for {name!r} must be a dict",
                                   input=name, expected="a dict of option -> value",
                                   got=type(options).__name__)
    params = {p.name: p for p in inspect.signature(cls.__init__).parameters.values()
              if p.kind == p.KEYWORD_ONLY}
    out: dict = {}
    ignored = []
    for k, v in options.items():
        k = ORT_OPTION_ALIASES.get(k, k)
        if k not in params:
            if k in ORT_TUNING_OPTIONS:
                ignored.append(k)
                continue
            raise InvalidArgumentError(
                f"unknown option {k!r} for provider {name!r}", input=k,
                expected=f"one of {sorted(params)} (or an onnxruntime tuning option)",
                got=repr(k))
        if isinstance(v, str):  # onnxruntime's options are strings
            try:
                v = int(v)
            except ValueError as e:
                raise InvalidArgumentError(f"option {k!r} for provider {name!r} must be a "
                                           "number", input=k, expected="an int",
                                           got=repr(v)) from e
        if isinstance(v, bool) or (v is not None and not isinstance(v, int)):
            raise InvalidArgumentError(f"option {k!r} for provider {name!r} must be an int",
                                       input=k, expected="an int", got=repr(v))
        out[k] = v
    if ignored:
        warnings.warn(f"provider {name!r}: onnxruntime options {ignored} have no effect in "
                      "actorrt", ProviderUnavailableWarning, stacklevel=4)
    return out


def resolve_providers(providers: Sequence[Any] | None, options: Any) -> list[ExecutionProvider]:
    """Provider instances for ``providers``, in priority order: names
    (actorrt's or onnxruntime's, e.g. ``"CUDAExecutionProvider"``),
    ``(name, options dict)`` pairs or instances. A provider that cannot run
    here (no GPU, cupy missing, an onnxruntime provider actorrt lacks) is
    skipped with a :class:`~actorrt.ProviderUnavailableWarning`, as
    onnxruntime falls back to the next one. The CPU provider is always present
    (it hosts weights and folds constants); the reference fallback is added
    last when ``options.enable_fallback`` is set or it is named.

    Raises:
        InvalidArgumentError: an unknown provider name, a bad entry or option,
            or a list none of whose providers can run here.
    """
    import warnings

    from .._errors import ProviderUnavailableWarning

    threads = getattr(options, "intra_op_num_threads", None)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
        raise InvalidArgumentError("intra_op_num_threads must be an int >= 0 (0: every core)",
                                   expected="int >= 0", got=repr(threads))
    if providers is None or (not isinstance(providers, str) and len(providers) == 0):
        providers = ["cpu"]
    if isinstance(providers, (str, ExecutionProvider)) or (
            isinstance(providers, tuple) and len(providers) == 2
            and isinstance(providers[0], str) and isinstance(providers[1], dict)):
        providers = [providers]
    out: list[ExecutionProvider] = []
    skipped: list[str] = []
    for p in providers:
        if isinstance(p, ExecutionProvider):
            out.append(p)
            continue
        opts: Any = None
        if isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str):
            p, opts = p
        if not isinstance(p, str):
            raise InvalidArgumentError("a provider must be a name, a (name, options) pair or "
                                       "a provider instance", input=repr(p),
                                       expected=f"str such as {_PROVIDER_NAMES}",
                                       got=type(p).__name__)
        why = provider_unavailable(p)
        if why is not None:
            skipped.append(why)
            rest = [x for x in providers if x is not p]
            warnings.warn(f"{why}; falling back to the next provider of {list(rest) or ['cpu']}",
                          ProviderUnavailableWarning, stacklevel=3)
            continue
        cls = provider_class(p)
        if any(type(o) is cls for o in out):
            continue
        kwargs = _provider_kwargs(cls, p, opts)
        kwargs.setdefault("memory_limit", getattr(options, "memory_limit", None))
        if getattr(options, "workers", None):
            kwargs.setdefault("workers", options.workers)
        if cls.name == "cpu" and getattr(options, "intra_op_num_threads", None):
            kwargs.setdefault("threads", options.intra_op_num_threads)
        out.append(cls(**kwargs))
    if not out:
        raise InvalidArgumentError("none of the requested execution providers can run here: "
                                   + "; ".join(skipped), input="providers",
                                   expected=f"at least one available provider ({_PROVIDER_NAMES})",
                                   got=repr(list(providers)))
    from .cpu import CPUExecutionProvider
    if not any(p.name == "cpu" for p in out):
        # the host of weights and folded constants, found by its name (the
        # reference provider, a CPU subclass, is no substitute: nodes it
        # declines need a home)
        out.append(CPUExecutionProvider(memory_limit=getattr(options, "memory_limit", None),
                                        workers=getattr(options, "workers", None),
                                        threads=getattr(options, "intra_op_num_threads", None) or None))
    if getattr(options, "enable_fallback", False):
        from .reference import ReferenceExecutionProvider
        if not any(isinstance(p, ReferenceExecutionProvider) for p in out):
            out.append(ReferenceExecutionProvider())
    return out
