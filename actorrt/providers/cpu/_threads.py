"""``SessionOptions.intra_op_num_threads`` for the CPU kernels.

BLAS pools (OpenBLAS / MKL, through threadpoolctl) are process-wide; numba's
thread count is per calling thread. :func:`apply` runs at the start of every
segment on the worker thread that runs it and changes a setting only when it
differs from the one in effect, so sessions with one count pay nothing per
run, and sessions with different counts switch the pools as they alternate.
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["apply", "blas_threads", "current", "numba_threads_set", "serial_blas"]

_lock = threading.Lock()
_blas: int | None = None  # BLAS threads last set through here
_local = threading.local()  # .numba: the count this thread's numba was last set to here


def blas_threads() -> int | None:
    """The BLAS thread count last set by :func:`apply` (``None``: never)."""
    return _blas


def apply(n: int | None) -> None:
    """Make the calling thread's kernels use ``n`` threads (``None``: leave as is).

    Raises:
        ValueError: ``n`` below 1.
    """
    global _blas
    if n is None:
        return
    if n < 1:
        raise ValueError(f"intra_op_num_threads must be >= 1, got {n}")
    if _blas != n:
        with _lock:
            if _blas != n:
                with _serial_lock:
                    if _serial_depth:  # a serial_blas section is open: it restores n
                        _serial_prev[:] = [n] * len(_blas_controllers())
                    else:  # the C entry points: threadpoolctl's own setter does
                        # nothing from a thread other than the first that set it
                        for _, set_ in _raw_blas():
                            set_(n)
                _blas = n
    if getattr(_local, "numba", None) == n:
        return  # this thread's numba count was set to n here (numba's own is per thread)
    numba = sys.modules.get("numba")
    # only once something compiled loaded it, and only once that import has
    # finished: another segment's thread may be importing numba right now (a
    # partially initialised module has no ``config`` yet)
    if numba is not None and hasattr(numba, "config") and hasattr(numba, "set_num_threads"):
        want = min(n, numba.config.NUMBA_NUM_THREADS)
        if numba.get_num_threads() != want:  # (~0.5 us: asked once a thread and count)
            numba.set_num_threads(want)
        _local.numba = n


def numba_threads_set() -> None:
    """Tell :func:`apply` that code other than it changed the calling
    thread's numba thread count (``numba.set_num_threads``): its next call
    on this thread asks numba again."""
    _local.numba = None


_serial_lock = threading.Lock()
_serial_depth = 0
_serial_prev: list = []
_blas_libs: list | None = None


def _blas_controllers() -> list:
    global _blas_libs
    if _blas_libs is None:
        import threadpoolctl
        _blas_libs = [lc for lc in threadpoolctl.ThreadpoolController().lib_controllers
                      if lc.user_api == "blas"]
    return _blas_libs


_raw_fns: list | None = None


def _raw_blas() -> list:
    """``(get, set)`` per BLAS library: the libraries' own C entry points
    where threadpoolctl exposes them (OpenBLAS: ``openblas_get_num_threads``
    / ``openblas_set_num_threads``, ~1 µs a call), else the controller's
    methods (~3-9 µs: threadpoolctl re-resolves the symbol per call)."""
    global _raw_fns
    if _raw_fns is None:
        fns = []
        for lc in _blas_controllers():
            get = set_ = None
            if getattr(lc, "internal_api", None) == "openblas" and hasattr(lc, "_get_symbol"):
                get = lc._get_symbol("openblas_get_num_threads")
                set_ = lc._get_symbol("openblas_set_num_threads")
            if get is None or set_ is None:
                get, set_ = lc.get_num_threads, lc.set_num_threads
            fns.append((get, set_))
        _raw_fns = fns
    return _raw_fns


_default: int | None = None


def current() -> int:
    """Threads the CPU kernels may use now: the count :func:`apply` last set,
    else (``intra_op_num_threads`` unset: every core) the BLAS pool's own size
    when first asked."""
    global _default
    if _blas is not None:
        return _blas
    if _default is None:
        counts = [lc.get_num_threads() for lc in _blas_controllers()]
        _default = max([c for c in counts if c] or [os.cpu_count() or 1])
    return _default


class serial_blas:
    """Context manager: BLAS calls made inside run on one thread.

    For GEMMs too small to pay a thread pool's wake-up and barrier (the many
    small products of a CNN's convolutions: at 2 threads on a busy 2-core
    machine each threaded call waited milliseconds for a descheduled worker).
    A no-op when :func:`current` is one thread. The
    pools are process-wide: while any thread is inside, other threads' BLAS
    calls also run on one thread (slower, never wrong); the count in effect
    before the first entrant is restored when the last one leaves.
    """

    __slots__ = ("_on",)

    def __enter__(self):
        global _serial_depth
        self._on = current() > 1
        if self._on:
            with _serial_lock:
                if _serial_depth == 0:
                    libs = _raw_blas()
                    _serial_prev[:] = [get() for get, _ in libs]
                    for (_, set_), n in zip(libs, _serial_prev):
                        if n != 1:
                            set_(1)
                _serial_depth += 1
        return self

    def __exit__(self, *exc):
        global _serial_depth
        if self._on:
            with _serial_lock:
                _serial_depth -= 1
                if _serial_depth == 0:
                    for (_, set_), n in zip(_raw_blas(), _serial_prev):
                        if n != 1:
                            set_(n)
        return False
