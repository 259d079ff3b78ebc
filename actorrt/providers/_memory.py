"""Per-provider memory accounting by role, with an optional limit."""

from __future__ import annotations

import threading
from typing import Any

import attrs

from .._errors import OutOfMemoryError

ROLES = ("weights", "activations", "kv-cache", "workspace", "bindings", "tensors")

__all__ = ["HEAP_MMAP_THRESHOLD", "HEAP_TRIM_THRESHOLD", "MemoryAccountant", "MemoryStatistics",
           "ROLES", "check_output_bytes", "huge_page_arrays", "keep_freed_heap_memory",
           "running_on"]

#: transparent huge page size (x86-64, arm64 with 4 KiB base pages)
HUGE_PAGE = 2 << 20

_current = threading.local()


def running_on(accountant: "MemoryAccountant | None") -> None:
    """Mark the calling thread as running kernels for ``accountant``'s provider."""
    _current.acc = accountant


def _physical_bytes() -> int:
    import os
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 1 << 62


#: glibc ``M_MMAP_THRESHOLD`` set by :func:`keep_freed_heap_memory` (bytes;
#: glibc's largest on 64-bit): allocations under it come from the heap
HEAP_MMAP_THRESHOLD = 32 << 20
#: glibc ``M_TRIM_THRESHOLD`` set by :func:`keep_freed_heap_memory` (bytes):
#: free memory at the heap's top kept before it is given back to the system
HEAP_TRIM_THRESHOLD = 1 << 30
_heap_kept: bool | None = None
_heap_lock = threading.Lock()


def keep_freed_heap_memory() -> bool:
    """Ask glibc's allocator to keep the memory freed between runs
    (``mallopt``: :data:`HEAP_MMAP_THRESHOLD`, :data:`HEAP_TRIM_THRESHOLD`),
    the CPU memory arena of ``SessionOptions(enable_cpu_mem_arena=True)``.

    numpy takes every array from ``malloc``. With glibc's dynamic thresholds,
    a freed block at the heap's top past a few MB is given back to the system
    and the next run's outputs fault their pages in again, zero-filled: in
    densenet121 2,030 page faults a run, 42.7 -> 38.3 ms with the memory kept
    (1 thread; docs/speed.md round 11). onnxruntime's arena likewise keeps its
    peak. Process-wide and once: later calls do nothing. The process's
    resident size then does not fall when large arrays are freed.

    Returns:
        Whether glibc took both settings (False elsewhere: musl, macOS,
        Windows, or a ``mallopt`` that refused).
    """
    global _heap_kept
    with _heap_lock:
        if _heap_kept is None:
            _heap_kept = False
            try:
                import ctypes
                import ctypes.util
                import platform
                if platform.libc_ver()[0] == "glibc":
                    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                    m_trim_threshold, m_mmap_threshold = -1, -3
                    _heap_kept = bool(libc.mallopt(m_mmap_threshold, HEAP_MMAP_THRESHOLD)) and \
                        bool(libc.mallopt(m_trim_threshold, HEAP_TRIM_THRESHOLD))
            except (OSError, AttributeError):  # pragma: no cover - no libc / no mallopt
                _heap_kept = False
        return _heap_kept


def huge_page_arrays(count: int, shape: tuple[int, ...], dtype: Any) -> list:
    """``count`` zeroed C-contiguous numpy arrays of ``shape`` and ``dtype``,
    carved (64-byte aligned) from one anonymous mapping whose start is 2 MiB
    aligned and which the kernel is asked to back with transparent huge pages
    (``madvise(MADV_HUGEPAGE)``; where that is missing, plain pages).

    For buffers read again and again in short runs, as a KV cache is each
    decode step: in 4 KiB pages each page costs a TLB walk and restarts the
    hardware prefetcher. SmolLM2's 60 KV buffers (1 x 3 x 256 x 64 float32
    each), decoder stack at 128-192 cached positions, interleaved: 4-5 %
    faster. The mapping lives as long as one of the arrays.

    Raises:
        MemoryError: the mapping could not be made.
    """
    import mmap

    import numpy as np

    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    per = (nbytes + 63) // 64 * 64
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if advise is None or count * per == 0:
        return [np.zeros(shape, dt) for _ in range(count)]
    try:
        # private: a shared anonymous mapping is shmem, whose huge pages
        # follow another setting (shmem_enabled, usually "never")
        m = mmap.mmap(-1, count * per + HUGE_PAGE,
                      flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # zero-filled
    except OSError as exc:
        raise MemoryError(f"could not map {count * per} bytes: {exc}") from exc
    buf = np.frombuffer(m, np.uint8)
    off = (-buf.ctypes.data) % HUGE_PAGE
    try:
        m.madvise(advise, 0, len(m))
    except OSError:  # THP turned off ("never"): plain pages
        pass
    return [buf[off + i * per:off + i * per + nbytes].view(dt).reshape(shape)
            for i in range(count)]


def check_output_bytes(shape, dtype, *, what: str) -> None:
    """Refuse, before allocating, an output whose shape came from data and can
    never fit: over the running provider's memory limit or over the machine's
    physical memory (numpy's own failure would depend on overcommit and may
    kill the process instead of raising).

    Raises:
        OutOfMemoryError: naming requested bytes, bytes in use and the limit.
    """
    import math

    import numpy as np

    n = 1
    for d in shape:
        n *= int(d)
    nbytes = n * np.dtype(dtype).itemsize
    acc = getattr(_current, "acc", None)
    in_use = acc.statistics().live_bytes if acc is not None else 0
    provider = acc.provider if acc is not None else "cpu"
    model = acc.model if acc is not None else None
    # the node is named by the plan, which knows which one is running
    if acc is not None and acc.limit is not None and in_use + nbytes > acc.limit:
        raise OutOfMemoryError(f"{what} of shape {tuple(shape)} would pass the memory limit",
                               requested=nbytes, in_use=in_use, limit=acc.limit,
                               role="activations", provider=provider, model=model)
    phys = _physical_bytes()
    if nbytes > phys or not math.isfinite(float(nbytes)):
        raise OutOfMemoryError(f"{what} of shape {tuple(shape)} exceeds this machine's "
                               f"{phys} bytes of memory", requested=nbytes, in_use=in_use,
                               limit=phys, role="activations", provider=provider, model=model)


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

    def __init__(self, provider: str, limit: int | None = None, model: str | None = None):
        self.provider = provider
        self.limit = limit
        #: the model whose session owns the provider (named in OutOfMemoryError)
        self.model = model
        self._lock = threading.Lock()
        self._live = {r: 0 for r in ROLES}
        self._peak = {r: 0 for r in ROLES}
        self._total = 0
        self._peak_total = 0
        self._allocs = 0
        self._frees = 0

    def reserve(self, nbytes: int, role: str, *, what: str = "", node: str | None = None) -> None:
        """Account ``nbytes`` for ``role``.

        Args:
            nbytes: bytes.
            role: one of :data:`ROLES`.
            what: what the memory is for (named in the error).
            node: the node asking, where one is (named in the error; the plan
                names the running node otherwise).

        Raises:
            OutOfMemoryError: ``nbytes`` is negative or overflows, or the limit
                would be exceeded (naming the model and node). Nothing is
                accounted then.
        """
        if role not in self._live:
            raise ValueError(f"unknown memory role {role!r}; one of {ROLES}")
        with self._lock:
            if nbytes < 0 or nbytes >= 2**63:
                raise OutOfMemoryError(f"invalid allocation size{(' for ' + what) if what else ''}",
                                       requested=nbytes, in_use=self._total, limit=self.limit,
                                       role=role, provider=self.provider, model=self.model,
                                       node=node)
            if self.limit is not None and self._total + nbytes > self.limit:
                raise OutOfMemoryError(f"allocation over the memory limit"
                                       f"{(' for ' + what) if what else ''}",
                                       requested=nbytes, in_use=self._total, limit=self.limit,
                                       role=role, provider=self.provider, model=self.model,
                                       node=node)
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


class _ThreadBuffer:
    """One thread's step buffer of a :class:`WorkspaceArena`, held in the
    arena's thread-local: when the thread ends (its thread-locals are
    dropped) the buffer goes back to the arena and out of its accounting, so
    callers' threads that come and go (``Session.run_blocking``) hold nothing
    after they end."""

    __slots__ = ("arena", "buf")

    def __init__(self, arena: "WorkspaceArena", buf: Any):
        self.arena = arena
        self.buf = buf

    def __del__(self) -> None:
        arena, self.arena = self.arena, None
        if arena is not None:
            arena._drop(self.buf)


class WorkspaceArena:
    """Scratch memory the executor hands to kernels (``Kernel.workspace``).

    Step-scoped requests are carved, aligned, from one buffer per worker
    thread that grows to the largest step seen and is then reused; requests
    with ``lifetime="session"`` get a buffer per (node, index) kept until the
    provider stops. All of it is accounted as ``workspace``.
    """

    def __init__(self, accountant: MemoryAccountant):
        self.acc = accountant
        self._local = threading.local()
        self._persistent: dict[tuple, tuple[Any, int]] = {}  # key -> (view, bytes held)
        self._lock = threading.Lock()
        self._thread_buffers: dict[int, Any] = {}  # id -> each thread's step buffer

    def buffers(self, key: Any, requests: list) -> list:
        """One uint8 array per request: exactly ``nbytes`` long, aligned.

        Raises:
            OutOfMemoryError: growing the arena would pass the provider's limit.
        """
        import numpy as np

        out: list = [None] * len(requests)
        step_total = 0
        for r in requests:
            if r.lifetime != "session":
                step_total += r.nbytes + r.alignment
        if step_total:
            holder = getattr(self._local, "holder", None)
            buf = None if holder is None else holder.buf
            if buf is None or buf.nbytes < step_total:
                self.acc.reserve(step_total, "workspace", what="step workspace")
                new = np.empty(step_total, np.uint8)
                with self._lock:
                    self._thread_buffers[id(new)] = new
                if holder is not None:
                    holder.arena = None  # released here, not again by its finalizer
                    self._drop(buf)
                self._local.holder = _ThreadBuffer(self, new)  # outside the lock: frees the old
                buf = new
            base = buf.ctypes.data
            off = 0
        for i, r in enumerate(requests):
            if r.lifetime == "session":
                k = (key, i)
                with self._lock:
                    held = self._persistent.get(k)
                    if held is None or held[0].nbytes != r.nbytes:
                        size = r.nbytes + r.alignment
                        self.acc.reserve(size, "workspace", what="persistent workspace")
                        if held is not None:
                            self.acc.release(held[1], "workspace")
                        raw = np.empty(size, np.uint8)
                        start = (-raw.ctypes.data) % r.alignment
                        held = self._persistent[k] = (raw[start:start + r.nbytes], size)
                out[i] = held[0]
                continue
            start = off + (-(base + off)) % r.alignment
            out[i] = buf[start:start + r.nbytes]
            off = start + r.nbytes
        return out

    def _drop(self, buf: Any) -> None:
        """Return a thread's step buffer (its thread ended or it grew)."""
        with self._lock:
            if self._thread_buffers.pop(id(buf), None) is None:
                return  # released already (release_all)
        self.acc.release(buf.nbytes, "workspace")

    def release_all(self) -> None:
        with self._lock:
            for b in self._thread_buffers.values():
                self.acc.release(b.nbytes, "workspace")
            self._thread_buffers.clear()
            for _, size in self._persistent.values():
                self.acc.release(size, "workspace")
            self._persistent.clear()
        self._local = threading.local()
