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


# ---------------------------------------------------------------- the other job kinds
from actorrt.providers.cpu import _layernorm_numba as ln, _softmax_numba as sm  # noqa: E402


@pytest.mark.parametrize("bt,m,k,n", [(16, 128, 64, 128), (3, 30, 17, 33), (5, 24, 1, 65),
                                      (2, 97, 129, 31)])
@pytest.mark.parametrize("chunks", [2, 4, 7])
@pytest.mark.parametrize("transposed", [False, True])
def test_bmm_entries_equal_numpy_float64_and_one_thread(bt, m, k, n, chunks, transposed):
    a = RNG.standard_normal((bt, m, k)).astype(np.float32)
    if transposed:  # attention's key as the graph transposes it: a strided view
        b = RNG.standard_normal((bt, n, k)).astype(np.float32).transpose(0, 2, 1)
    else:
        b = RNG.standard_normal((bt, k, n)).astype(np.float32)
    one, two = np.empty((bt, m, n), np.float32), np.empty((bt, m, n), np.float32)
    sg._bmm(a, b, one, 64)
    assert _partner.bmm_entries(_partner.team(2), a, b, two, 64, chunks)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(two, a.astype(np.float64) @ b.astype(np.float64), rtol=2e-5, atol=2e-5)


def test_bmm_entries_decline_negative_strides():
    a = RNG.standard_normal((3, 30, 8)).astype(np.float32)
    b = RNG.standard_normal((3, 8, 40)).astype(np.float32)[:, ::-1]
    out = np.empty((3, 30, 40), np.float32)
    assert not _partner.bmm_entries(_partner.team(2), a, b, out, 64, 2)


def test_bmm_split_through_the_public_entry(forced):
    a = RNG.standard_normal((2, 3, 40, 17)).astype(np.float32)
    b = RNG.standard_normal((2, 3, 17, 23)).astype(np.float32)
    got = sg.bmm(a, b, threads=2)
    np.testing.assert_array_equal(got, sg.bmm(a, b, threads=1))
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("rows,d", [(513, 257), (3, 7000), (2, 1), (64, 256)])
@pytest.mark.parametrize("flags", [0, 1, 3, 4, 7])
def test_layer_norm_rows_equal_one_thread_and_float64(rows, d, flags):
    x = (RNG.standard_normal((rows, d)) * 2 + 0.5).astype(np.float32)
    g, b, bi = (RNG.standard_normal(d).astype(np.float32) for _ in range(3))
    sk = RNG.standard_normal((rows, d)).astype(np.float32)
    none2, none1 = np.zeros((1, 1), np.float32), np.zeros(1, np.float32)
    skp = sk if flags & 1 else none2
    bia = bi if flags & 2 else none1
    bet = b if flags & 4 else none1
    res = []
    for split in (False, True):
        y = np.empty((rows, d), np.float32)
        s = np.empty((rows, d), np.float32) if flags & 3 else skp
        mean, inv = np.empty(rows, np.float32), np.empty(rows, np.float32)
        if split:
            _partner.layer_norm_rows(_partner.team(2), x, skp, bia, g, bet, 1e-5, y, s, mean, inv,
                                     flags, min(rows, 4))
        else:
            ln._rows_serial(x, skp, bia, g, bet, 1e-5, y, s, mean, inv, flags)
        res.append((y, s, mean, inv))
    for u, w in zip(*res):
        np.testing.assert_array_equal(u, w)
    s64 = x.astype(np.float64) + (sk if flags & 1 else 0) + (bi if flags & 2 else 0)
    mu = s64.mean(-1, keepdims=True)
    want = (s64 - mu) / np.sqrt(((s64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + \
        (b if flags & 4 else 0)
    np.testing.assert_allclose(res[1][0], want, rtol=1e-4, atol=1e-4)


def _same_softmax(got, want):
    # The row kernel's sum is reassociated (fastmath, _softmax_numba's
    # docstring), so each compiled copy of it (the one-thread entry, the
    # caller's and the partners' job loops) vectorizes the sum as LLVM chose
    # when that copy compiled: copies compiled in different processes (one
    # loaded from numba's disk cache, one compiled fresh) differ by an ulp or
    # a few (relative 1e-7 .. 6e-7 measured). A row not computed at all, or
    # computed with another scale or mask, is off by far more than 2e-6.
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=0)
    assert np.array_equal(got == 0, want == 0)


@pytest.mark.parametrize("rows,t,mrows", [(513, 130, 1), (512, 128, 128), (7, 9, 7), (2, 1, 1)])
@pytest.mark.parametrize("chunks", [2, 5])
def test_softmax_rows_equal_one_thread_and_float64(rows, t, mrows, chunks):
    s0 = (RNG.standard_normal((rows, t)) * 4).astype(np.float32)
    mask = np.where(RNG.random((mrows, t)) < 0.2, -1e4, 0).astype(np.float32)
    one, two = s0.copy(), s0.copy()
    sm._rows(one, np.float32(0.125), mask, mrows, True)
    _partner.softmax_rows(_partner.team(2), two, np.float32(0.125), mask, mrows, True, chunks)
    _same_softmax(two, one)
    x = s0.astype(np.float64) * 0.125 + np.tile(mask, (rows // mrows + 1, 1))[:rows]
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(two, e / e.sum(-1, keepdims=True), rtol=2e-6, atol=1e-7)


def test_other_kinds_run_on_the_caller_when_partners_have_stopped():
    t = _partner._Team(1)
    t.stop()
    t.threads[0].join(5)
    x = RNG.standard_normal((9, 100)).astype(np.float32)
    want = x.copy()
    sm._rows(want, np.float32(1.0), np.zeros((1, 1), np.float32), 1, False)
    _partner.softmax_rows(t, x, np.float32(1.0), np.zeros((1, 1), np.float32), 1, False, 4)
    _same_softmax(x, want)


def test_kinds_interleave_on_one_team(forced):
    # a GEMM, a softmax and a LayerNorm posted one after the other to one
    # team (the partners spinning between them): every result right
    a, b, bias = _case(37, 64, 96)
    p = sg.PackedB(b)
    t = _partner.team(2)
    for _ in range(30):
        y = sg.gemm(a, p, bias, "", 2)
        np.testing.assert_allclose(y, _ref(a, b, bias, ""), rtol=2e-5, atol=2e-5)
        s = y.copy()
        one = y.copy()
        sm._rows(one, np.float32(1.0), np.zeros((1, 1), np.float32), 1, False)
        _partner.softmax_rows(t, s, np.float32(1.0), np.zeros((1, 1), np.float32), 1, False, 4)
        _same_softmax(s, one)


# ---------------------------------------------------------------- the public hook
if _partner.AVAILABLE:
    from llvmlite import ir as _ir
    from numba import carray, cfunc, types as nbt
    from numba.extending import intrinsic

    @intrinsic
    def _ptr(typingctx, addr, like):
        # the pointer to like's dtype at integer address addr
        sig = nbt.CPointer(like.dtype)(nbt.int64, like)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(sig.return_type))
        return sig, codegen

    _I64 = np.zeros(1, np.int64)
    _F64 = np.zeros(1, np.float64)

    @cfunc(nbt.void(nbt.int64, nbt.int64, nbt.int64), nogil=True)
    def _axpy_items(params, i0, i1):
        # params -> int64 [x address, y address, n]; y[i] = 2 x[i] + 1 for i0 <= i < i1
        p = carray(_ptr(params, _I64), (3,))
        x = carray(_ptr(p[0], _F64), (p[2],))
        y = carray(_ptr(p[1], _F64), (p[2],))
        for i in range(i0, i1):
            y[i] = 2.0 * x[i] + 1.0


@pytest.mark.parametrize("n,chunks", [(1, 1), (7, 4), (1000, 3), (4097, 64)])
def test_run_items_calls_a_compiled_kernel_over_every_item(n, chunks):
    x = RNG.standard_normal(n)
    y = np.full(n, np.nan)
    params = np.array([x.ctypes.data, y.ctypes.data, n], np.int64)
    _partner.run_items(_partner.team(2), _axpy_items.address, params.ctypes.data, n, chunks)
    np.testing.assert_array_equal(y, 2 * x + 1)
    z = np.full(n, np.nan)
    params[1] = z.ctypes.data
    _partner.call_items(_axpy_items.address, params.ctypes.data, 0, n)
    np.testing.assert_array_equal(z, y)


def test_run_items_linger_keeps_the_partners_spinning():
    # past the idle limit the partners park, but not before a linger deadline
    import time
    t = _partner.team(2)
    x = RNG.standard_normal(64)
    y = np.empty(64)
    params = np.array([x.ctypes.data, y.ctypes.data, 64], np.int64)
    _partner.run_items(t, _axpy_items.address, params.ctypes.data, 64, 4, linger=1 << 62)
    np.testing.assert_array_equal(y, 2 * x + 1)
    time.sleep(0.05)  # ~650x the idle limit
    assert t.awake == [True]
    _partner.run_items(t, _axpy_items.address, params.ctypes.data, 64, 4, linger=1)
    t.ctrl[_partner._LINGER] = 0  # (the first job's far deadline lifted)
    deadline = time.monotonic() + 20
    while t.awake[0] and time.monotonic() < deadline:
        time.sleep(0.005)
    assert t.awake == [False]  # parked once the deadline passed
    _partner.run_items(_partner.team(2), _axpy_items.address, params.ctypes.data, 64, 4)
    np.testing.assert_array_equal(y, 2 * x + 1)


def test_run_items_checks_its_counts():
    with pytest.raises(ValueError):
        _partner.run_items(_partner.team(2), _axpy_items.address, 0, 5, 2, linger=-1)
    with pytest.raises(ValueError):
        _partner.run_items(_partner.team(2), _axpy_items.address, 0, 5, 0)
    with pytest.raises(ValueError):
        _partner.run_items(_partner.team(2), _axpy_items.address, 0, -1, 2)
    _partner.run_items(_partner.team(2), _axpy_items.address, 0, 0, 2)  # no items: no call


def test_a_forked_child_gets_its_own_team():
    # the parent's partner threads do not come along; the child's team() is new and works
    import os
    import sys

    if not hasattr(os, "fork") or sys.platform == "darwin":
        pytest.skip("fork")
    parent = _partner.team(2)
    x = RNG.standard_normal(257)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            t = _partner.team(2)
            y = np.full(257, np.nan)
            params = np.array([x.ctypes.data, y.ctypes.data, 257], np.int64)
            _partner.run_items(t, _axpy_items.address, params.ctypes.data, 257, 8)
            ok = t is not parent and t.threads[0].is_alive() and np.array_equal(y, 2 * x + 1)
            os.write(w, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 2)
    os.waitpid(pid, 0)
    assert got == b"ok"
    assert _partner.team(2) is parent  # the parent keeps its own


@pytest.mark.parametrize("n,chunks", [(1, 1), (9, 4), (4097, 4096)])
def test_post_items_from_a_compiled_caller(n, chunks):
    # the compiled form of run_items: a compiled caller fills the block and posts it
    from numba import njit

    @njit(nogil=True)
    def fill_and_post(ctrl, params, x, y, fn, items, chunks):
        params[0], params[1], params[2] = x.ctypes.data, y.ctypes.data, x.size
        return _partner.post_items(ctrl, fn, params.ctypes.data, items, chunks, 0)

    x = RNG.standard_normal(n)
    y = np.full(n, np.nan)
    t = _partner.team(2)
    mine = fill_and_post(t.ctrl, np.zeros(3, np.int64), x, y, _axpy_items.address, n, chunks)
    assert 0 <= mine <= chunks
    np.testing.assert_array_equal(y, 2 * x + 1)
