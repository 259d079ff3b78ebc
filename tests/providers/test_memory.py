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
