"""The help-first chunk loop of the CPU kernels (``_parallel.run_chunks``)."""

import threading

import pytest

from actorrt.providers.cpu import _parallel


@pytest.mark.parametrize("threads,n", [(1, 5), (2, 1), (2, 7), (4, 64)])
def test_every_chunk_runs_once(threads, n):
    seen = []
    lock = threading.Lock()

    def fn(i):
        with lock:
            seen.append(i)

    _parallel.run_chunks(fn, n, threads)
    assert sorted(seen) == list(range(n))


def test_the_first_error_is_raised_after_the_claimed_chunks_end():
    done = []

    def fn(i):
        if i == 3:
            raise ValueError("chunk 3")
        done.append(i)

    with pytest.raises(ValueError, match="chunk 3"):
        _parallel.run_chunks(fn, 10, 2)
    assert sorted(done) == [i for i in range(10) if i != 3]


def test_busy_helpers_do_not_hold_the_caller_up():
    """Helpers stuck in another job: the caller runs every chunk of its own."""
    release = threading.Event()
    started = threading.Event()

    def blocker(i):
        started.set()
        release.wait(10)

    t = threading.Thread(target=_parallel.run_chunks, args=(blocker, 2, 2))
    t.start()
    try:
        assert started.wait(10)
        seen = []
        _parallel.run_chunks(seen.append, 6, 2)  # the helper is busy with blocker
        assert sorted(seen) == list(range(6))
    finally:
        release.set()
        t.join(10)


def test_a_forked_child_starts_its_own_helpers():
    import os
    import sys

    if not hasattr(os, "fork") or sys.platform == "darwin":
        pytest.skip("fork")
    _parallel.run_chunks(lambda i: None, 4, 2)  # helpers exist in the parent
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the chunks still all run, on fresh helpers
        try:
            seen = []
            lock = threading.Lock()

            def fn(i):
                with lock:
                    seen.append(i)
            _parallel.run_chunks(fn, 8, 2)
            os.write(w, b"ok" if sorted(seen) == list(range(8)) and _parallel._helpers[0].is_alive() else b"no")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 2)
    os.waitpid(pid, 0)
    assert got == b"ok"


def test_the_caller_returns_only_after_a_helper_s_slow_last_chunk():
    """The caller's wait (a lock the last chunk releases) covers a chunk that a
    helper finishes after the caller ran out of chunks; repeated jobs reuse
    the helpers and each waits for its own chunks only."""
    import time

    for _ in range(20):
        ended = []
        lock = threading.Lock()

        def fn(i):
            if threading.current_thread() is not threading.main_thread():
                time.sleep(0.002)  # the helper's chunk ends last
            with lock:
                ended.append(i)

        _parallel.run_chunks(fn, 2, 2)
        assert sorted(ended) == [0, 1]
