"""The stage barriers' spin-wait backoff (actorrt/providers/cpu/llm/_spin.py)."""

import sys
import threading
import time

import numpy as np
import pytest

from actorrt.providers.cpu.llm import _contrib_numba as _nb
from actorrt.providers.cpu.llm import _spin

pytestmark = pytest.mark.skipif(not _nb.HAVE_NUMBA, reason="needs numba")

if _nb.HAVE_NUMBA:
    from numba import njit

    @njit(nogil=True)
    def _rounds(n):
        s = 0
        for _ in range(n):
            s = _spin.backoff(s)
        return s

    @njit(nogil=True)
    def _wait_for(flag):
        # spin (then yield) until flag[0] is set; the rounds it took
        s = 0
        while flag[0] == 0:
            s = _spin.backoff(s)
        return s


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libc sched_yield")
def test_yield_symbol_registered_on_linux():
    assert _spin.HAVE_YIELD


def test_backoff_counts_rounds_past_the_spin_limit():
    # the pause rounds, then the sched_yield rounds: every round counted,
    # the yield path callable from compiled code
    n = _spin.SPIN_PAUSES + 64
    assert _rounds(n) == n
    assert _rounds(0) == 0


def test_a_long_wait_ends_when_its_partner_writes():
    # a waiter past the spin limit (yielding) still sees its partner's write
    assert _wait_for(np.ones(1, np.int64)) == 0  # compiled before the clock starts
    flag = np.zeros(1, np.int64)
    got = []
    t = threading.Thread(target=lambda: got.append(_wait_for(flag)))
    t.start()
    time.sleep(0.2)  # far past SPIN_PAUSES pause rounds
    flag[0] = 1
    t.join(10)
    assert not t.is_alive() and got and got[0] > _spin.SPIN_PAUSES
