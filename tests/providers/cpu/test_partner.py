"""Compiled partner threads (``_partner``): the compiled sgemm split over a
calling thread's team with no Python hand-off, against numpy float64 — odd
sizes, every activation, partners parked between calls, a team whose
partners have stopped (the caller runs every chunk: help-first), and one team
per calling thread (two threads posting at once)."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from actorrt.providers.cpu import _partner, _sgemm_numba as sg

pytestmark = pytest.mark.skipif(not _partner.AVAILABLE, reason="needs the compiled sgemm")
RNG = np.random.default_rng(4242)
_erf = np.vectorize(math.erf)


def _ref(a, b, bias, act):
    y = a.astype(np.float64) @ b.astype(np.float64) + bias
    if act == "Relu":
        y = np.maximum(y, 0)
    elif act == "Gelu":
        y = 0.5 * y * (1 + _erf(y / np.sqrt(2)))
    return y


def _case(m, k, n):
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    return a, b, RNG.standard_normal(n).astype(np.float32)


@pytest.fixture
def forced(monkeypatch):
    monkeypatch.setattr(sg, "PARTNER_MIN_FLOPS", 0)
    monkeypatch.setattr(sg, "USE_PARTNERS", True)


@pytest.mark.parametrize("act", ["", "Relu", "Gelu"])
@pytest.mark.parametrize("m,k,n", [(1, 256, 768), (1, 1031, 259), (7, 33, 65), (64, 300, 1000),
                                   (3, 1, 33), (130, 64, 96)])
def test_split_equals_numpy_float64(m, k, n, act, forced):
    a, b, bias = _case(m, k, n)
    p = sg.PackedB(b)
    for _ in range(3):  # the team is reused across calls
        got = sg.gemm(a, p, bias, act, 2)
        np.testing.assert_allclose(got, _ref(a, b, bias, act), rtol=2e-5, atol=2e-5)


def test_parked_partners_wake_and_stay_right(forced, monkeypatch):
    monkeypatch.setattr(_partner, "IDLE_CYCLES", 1000)  # park almost at once
    a, b, bias = _case(5, 200, 300)
    p = sg.PackedB(b)
    want = _ref(a, b, bias, "")
    for _ in range(20):
        np.testing.assert_allclose(sg.gemm(a, p, bias, "", 2), want, rtol=2e-5, atol=2e-5)
        time.sleep(0.001)


def test_caller_alone_when_partners_have_stopped():
    t = _partner._Team(1)
    t.stop()
    t.threads[0].join(5)
    assert not t.threads[0].is_alive()
    a, b, bias = _case(9, 100, 200)
    p = sg.PackedB(b)
    out = np.empty((9, 200), np.float32)
    _partner.gemm_panels(t, a, p.panels, p.bias_row(bias), out, 0, 8, 4)
    np.testing.assert_allclose(out, _ref(a, b, bias, ""), rtol=2e-5, atol=2e-5)


def test_one_team_per_calling_thread(forced):
    a, b, bias = _case(3, 128, 512)
    p = sg.PackedB(b)
    want = _ref(a, b, bias, "Relu")
    errors, teams = [], []

    def worker():
        try:
            teams.append(_partner.team(2))
            for _ in range(200):
                np.testing.assert_allclose(sg.gemm(a, p, bias, "Relu", 2), want, rtol=2e-5, atol=2e-5)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    ws = [threading.Thread(target=worker) for _ in range(2)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    assert not errors
    assert teams[0] is not teams[1]


def test_no_team_below_two_threads():
    assert _partner.team(1) is None


def test_team_stops_when_its_thread_ends(forced):
    teams = []

    def worker():
        teams.append(_partner.team(2))
    w = threading.Thread(target=worker)
    w.start()
    w.join()
    teams[0].threads[0].join(5)
    assert not teams[0].threads[0].is_alive()
