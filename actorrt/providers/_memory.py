"""Per-provider memory accounting by role, with an optional limit."""

from __future__ import annotations

import threading

import attrs

from .._errors import OutOfMemoryError

ROLES = ("weights", "activations", "kv-cache", "workspace", "bindings", "tensors")

__all__ = ["MemoryAccountant", "MemoryStatistics", "ROLES"]


@attrs.frozen
class MemoryStatistics:
    """A provider's memory, in bytes.

    Attributes:
        provider: provider name.
        live_bytes: bytes held now (all roles).
        peak_bytes: most bytes held at once since the provider started.
        live_by_role / peak_by_role: the same per role.
        limit_bytes: the limit, or ``None`` when unlimited.
        allocations: allocations made; frees: allocations returned.
    """

    provider: str
    live_bytes: int
    peak_bytes: int
    live_by_role: dict[str, int]
    peak_by_role: dict[str, int]
    limit_bytes: int | None
    allocations: int
    frees: int


class MemoryAccountant:
    """Counts live/peak bytes per role and enforces a limit *before* allocating.

    Thread-safe: kernels running in worker threads may reserve workspace.
    """

    def __init__(self, provider: str, limit: int | None = None):
        self.provider = provider
        self.limit = limit
        self._lock = threading.Lock()
        self._live = {r: 0 for r in ROLES}
        self._peak = {r: 0 for r in ROLES}
        self._total = 0
        self._peak_total = 0
        self._allocs = 0
        self._frees = 0

    def reserve(self, nbytes: int, role: str, *, what: str = "") -> None:
        """Account ``nbytes`` for ``role``.

        Raises:
            OutOfMemoryError: ``nbytes`` is negative or overflows, or the limit
                would be exceeded. Nothing is accounted then.
        """
        if role not in self._live:
            raise ValueError(f"unknown memory role {role!r}; one of {ROLES}")
        with self._lock:
            if nbytes < 0 or nbytes >= 2**63:
                raise OutOfMemoryError(f"invalid allocation size{(' for ' + what) if what else ''}",
                                       requested=nbytes, in_use=self._total, limit=self.limit,
                                       role=role, provider=self.provider)
            if self.limit is not None and self._total + nbytes > self.limit:
                raise OutOfMemoryError(f"allocation over the memory limit"
                                       f"{(' for ' + what) if what else ''}",
                                       requested=nbytes, in_use=self._total, limit=self.limit,
                                       role=role, provider=self.provider)
            self._live[role] += nbytes
            self._total += nbytes
            self._allocs += 1
            if self._live[role] > self._peak[role]:
                self._peak[role] = self._live[role]
            if self._total > self._peak_total:
                self._peak_total = self._total

    def release(self, nbytes: int, role: str) -> None:
        """Return ``nbytes`` of ``role``."""
        with self._lock:
            self._live[role] -= nbytes
            self._total -= nbytes
            self._frees += 1

    def statistics(self) -> MemoryStatistics:
        with self._lock:
            return MemoryStatistics(self.provider, self._total, self._peak_total,
                                    dict(self._live), dict(self._peak), self.limit,
                                    self._allocs, self._frees)
