"""Host memory helpers (actorrt.providers._memory)."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from actorrt.providers._memory import HUGE_PAGE, huge_page_arrays


@pytest.mark.parametrize("count, shape, dtype", [(60, (1, 3, 186, 64), np.float32),
                                                 (3, (5, 7), np.int64), (4, (0, 3), np.float32),
                                                 (2, (), np.float32)])
def test_huge_page_arrays_are_separate_zeroed_buffers(count, shape, dtype):
    arrs = huge_page_arrays(count, shape, dtype)
    assert len(arrs) == count
    for i, a in enumerate(arrs):
        assert a.shape == shape and a.dtype == np.dtype(dtype)
        assert a.flags.c_contiguous and a.flags.writeable
        assert not a.any()
        a[...] = i + 1
    for i, a in enumerate(arrs):  # no array overlaps another
        assert (a == i + 1).all()
        for b in arrs[i + 1:]:
            assert not np.shares_memory(a, b)
    if hasattr(mmap, "MADV_HUGEPAGE") and arrs[0].size:
        # one mapping, its start 2 MiB aligned, each array 64-byte aligned
        assert arrs[0].ctypes.data % HUGE_PAGE == 0
        assert all(a.ctypes.data % 64 == 0 for a in arrs)
        assert all(a.base is not None for a in arrs)


def test_huge_page_arrays_outlive_their_siblings():
    # the mapping lives as long as any one of the arrays
    first, *rest = huge_page_arrays(3, (1024,), np.float32)
    del rest
    first[:] = 2.0
    assert first.sum() == 2048.0


def test_workspace_of_a_finished_thread_is_released_and_growth_is_accounted_once():
    import gc
    import threading

    from actorrt.providers import WorkspaceRequest
    from actorrt.providers._memory import MemoryAccountant, WorkspaceArena

    acc = MemoryAccountant("cpu", None)
    arena = WorkspaceArena(acc)

    def ws() -> int:
        return acc.statistics().live_by_role.get("workspace", 0)

    (a,) = arena.buffers("n", [WorkspaceRequest(1000)])
    assert a.nbytes == 1000 and ws() == 1064
    (b,) = arena.buffers("n", [WorkspaceRequest(5000)])  # grows: the old buffer is released
    assert b.nbytes == 5000 and ws() == 5064

    def work(n):
        for _ in range(3):
            arena.buffers("n", [WorkspaceRequest(n)])

    for n in (100, 20000, 300):
        t = threading.Thread(target=work, args=(n,))
        t.start()
        t.join()
    gc.collect()
    assert ws() == 5064  # only this thread's buffer is left
    arena.release_all()
    assert ws() == 0
    t = threading.Thread(target=work, args=(700,))
    t.start()
    t.join()
    gc.collect()
    assert ws() == 0


_ARENA_PROBE = r"""
import ctypes, sys
import numpy as np
import actorrt
from tests.models import add_chain

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
opts = actorrt.SessionOptions(enable_cpu_mem_arena=sys.argv[1] == "on")
with actorrt.InferenceSession(add_chain(3), opts) as s:
    s.run(None, {"x": np.ones((1, 16), np.float32)})
a = np.ones(8 << 18, np.float32)  # 8 MiB, written
mapped = libc.mallinfo2().hblkhd  # bytes in mmap'd blocks while it lives
del a
print(mapped, libc.mallinfo2().keepcost)
"""


@pytest.mark.parametrize("arena", ["on", "off"])
def test_cpu_mem_arena_keeps_freed_memory_for_the_next_run(arena):
    """With SessionOptions(enable_cpu_mem_arena=True) (the default) an 8 MiB
    array comes from glibc's heap and, freed, stays at its top for the next
    run (no page faults then); with False the allocator keeps its own dynamic
    thresholds: the array is a fresh mapping, unmapped when freed. A fresh
    process each (the setting is process-wide)."""
    import platform
    import subprocess
    import sys
    from pathlib import Path
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("the arena is glibc's mallopt")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _ARENA_PROBE, arena], cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    mapped, keep = (int(v) for v in out.stdout.split()[-2:])
    if arena == "on":
        assert mapped < 8 << 20 and keep >= 8 << 20, (mapped, keep)
    else:
        assert mapped >= 8 << 20 and keep < 8 << 20, (mapped, keep)
