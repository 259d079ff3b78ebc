"""``_threads.apply`` / ``serial_blas`` set the BLAS pool through the
library's own entry points: from any thread (threadpoolctl's setter ignores
every thread but the first one that used it), and restored after a
``serial_blas`` section opened from another thread."""

from __future__ import annotations

import threading

import threadpoolctl

from actorrt.providers.cpu import _threads


def _counts():
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


def test_apply_from_several_threads_sets_the_pool():
    before = _counts()
    try:
        threadpoolctl.threadpool_limits(limits=1, user_api="blas")  # this thread now "controls"
        _threads.apply(1)  # apply changes the pool only when the count differs from its last
        seen = []

        def other(n):
            _threads.apply(n)
            seen.append(_counts())
        for n in (2, 1, 2):
            t = threading.Thread(target=other, args=(n,))
            t.start()
            t.join()
            assert seen[-1] and all(c == n for c in seen[-1])
            assert _threads.current() == n
    finally:
        if before:
            _threads.apply(before[0])


def test_serial_blas_from_another_thread_restores():
    before = _counts()
    try:
        _threads.apply(2)
        inside = []

        def worker():
            with _threads.serial_blas():
                inside.append(_counts())
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert inside and all(c == 1 for c in inside[0])
        assert all(c == 2 for c in _counts())
    finally:
        if before:
            _threads.apply(before[0])


def test_apply_sets_numba_per_thread_and_hears_other_setters():
    numba = __import__("pytest").importorskip("numba")
    if numba.config.NUMBA_NUM_THREADS < 2:
        __import__("pytest").skip("numba has one thread")
    got = []

    def worker():
        _threads.apply(2)
        got.append(numba.get_num_threads())
        _threads.apply(1)
        got.append(numba.get_num_threads())
        numba.set_num_threads(2)  # someone else on this thread (the LLM kernels' launcher)
        _threads.numba_threads_set()
        _threads.apply(1)
        got.append(numba.get_num_threads())
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert got == [2, 1, 1]
