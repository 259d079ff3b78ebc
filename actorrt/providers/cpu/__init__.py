"""The CPU execution provider: numpy kernels run by trio worker actors.

Every module in this package registers its kernels on import; they are all
imported here so the registry is complete once the package is loaded.
"""

from __future__ import annotations

import importlib
import pkgutil

from .registry import CPU_KERNELS, cpu_kernel

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_") and _m.name not in ("registry", "provider"):
        importlib.import_module(f"{__name__}.{_m.name}")

from .provider import CPUExecutionProvider  # noqa: E402

__all__ = ["CPU_KERNELS", "cpu_kernel", "CPUExecutionProvider"]
