"""``SessionOptions.intra_op_num_threads`` for the CPU kernels.

BLAS pools (OpenBLAS / MKL, through threadpoolctl) are process-wide; numba's
thread count is per calling thread. :func:`apply` runs at the start of every
segment on the worker thread that runs it and changes a setting only when it
differs from the one in effect, so sessions with one count pay nothing per
run, and sessions with different counts switch the pools as they alternate.
"""

from __future__ import annotations

import sys
import threading

__all__ = ["apply", "blas_threads"]

_lock = threading.Lock()
_blas: int | None = None  # BLAS threads last set through here


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
                import threadpoolctl
                threadpoolctl.threadpool_limits(limits=n, user_api="blas")
                _blas = n
    numba = sys.modules.get("numba")
    if numba is not None:  # only once something compiled loaded it
        want = min(n, numba.config.NUMBA_NUM_THREADS)
        if numba.get_num_threads() != want:
            numba.set_num_threads(want)
