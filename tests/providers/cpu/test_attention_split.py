"""The entry split of multi-row attention (:mod:`actorrt.providers.cpu._attention_split`):
each (batch, head) entry's three passes on one thread, the entries over the caller and
its compiled partners. Bit-equal to the one-thread passes (the same kernels a range),
within float32 rounding of numpy's attention, for odd sizes, strided (transposed) keys
and values, every mask broadcast; declines what it cannot read."""

from __future__ import annotations

import numpy as np
import pytest

from actorrt.providers.cpu import _attention_split, _partner, _softmax_numba, _threads
from actorrt.providers.cpu import _sgemm_numba as sg
from actorrt.providers.cpu import attention as cpu_attention

pytestmark = pytest.mark.skipif(not (_attention_split.HAVE_SPLIT and sg.HAVE_SGEMM),
                                reason="no compiled partner threads here")

RNG = np.random.default_rng(11)


def _numpy_attention(q, k, v, mask, scale):
    s = np.matmul(q.astype(np.float64), k.astype(np.float64)) * scale
    if mask is not None:
        s = s + mask
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.matmul(p, v.astype(np.float64))


@pytest.mark.parametrize("b,h,m,t,d,dv,mask", [
    (1, 4, 64, 64, 64, 64, (1, 1, 64, 64)),     # a prompt's causal-style mask
    (1, 4, 128, 128, 64, 64, (1, 1, 1, 128)),   # an encoder's key-padding mask
    (2, 3, 33, 47, 17, 9, None),                # odd sizes, no mask
    (1, 2, 31, 70, 8, 8, (31, 70)),             # a 2-D mask
    (3, 1, 40, 24, 32, 16, (3, 1, 40, 24)),     # a mask per entry
    (1, 5, 25, 33, 16, 16, (1, 5, 1, 33)),      # per head, broadcast over rows
])
@pytest.mark.parametrize("layout", ["contiguous", "transposed_k", "strided_v"])
def test_entries_equal_the_one_thread_passes(b, h, m, t, d, dv, mask, layout):
    _threads.apply(2)
    q = RNG.standard_normal((b, h, m, d)).astype(np.float32)
    if layout == "transposed_k":  # keys (b, h, t, d) read as (b, h, d, t), GPT-2's Transpose
        k = RNG.standard_normal((b, h, t, d)).astype(np.float32).swapaxes(-1, -2)
    else:
        k = RNG.standard_normal((b, h, d, t)).astype(np.float32)
    if layout == "strided_v":  # values a head-interleaved view, as a Split + Transpose leaves them
        v = RNG.standard_normal((b, t, h, dv)).astype(np.float32).transpose(0, 2, 1, 3)
    else:
        v = RNG.standard_normal((b, h, t, dv)).astype(np.float32)
    mk = None if mask is None else np.where(RNG.random(mask) < 0.3, -1e4, 0).astype(np.float32)
    m2 = None if mk is None else _softmax_numba.mask_rows((b, h, m, t), mk)
    got = _attention_split.attend_entries(q, k, v, m2, 0 if m2 is None else m2.shape[0],
                                          0.125, 2)
    assert got is not None and got.shape == (b, h, m, dv) and got.flags.c_contiguous
    one = cpu_attention._sdpa(np.ascontiguousarray(q), k, v, mk, 0.125)  # one thread
    np.testing.assert_array_equal(got, one)
    np.testing.assert_allclose(got, _numpy_attention(q, k, v, mk, 0.125), rtol=1e-5, atol=1e-5)


def test_entries_run_on_the_partners(monkeypatch):
    _threads.apply(2)
    seen = []
    real = _partner.run_items
    monkeypatch.setattr(_partner, "run_items",
                        lambda t, fn, p, items, chunks, *a: (seen.append((fn, items, chunks)),
                                                             real(t, fn, p, items, chunks, *a))[1])
    q = RNG.standard_normal((1, 6, 32, 16)).astype(np.float32)
    k = RNG.standard_normal((1, 6, 16, 40)).astype(np.float32)
    v = RNG.standard_normal((1, 6, 40, 16)).astype(np.float32)
    got = _attention_split.attend_entries(q, k, v, None, 0, 1.0, 2)
    assert seen == [(_attention_split._ADDR, 6, 2)]  # one post: six entries in two ranges
    np.testing.assert_allclose(got, _numpy_attention(q, k, v, None, 1.0), rtol=1e-5, atol=1e-5)


def test_declines_what_it_cannot_take():
    q = RNG.standard_normal((1, 1, 32, 16)).astype(np.float32)
    k = RNG.standard_normal((1, 1, 16, 40)).astype(np.float32)
    v = RNG.standard_normal((1, 1, 40, 16)).astype(np.float32)
    assert _attention_split.attend_entries(q, k, v, None, 0, 1.0, 2) is None  # one entry
    q2, k2, v2 = (np.concatenate([x, x], axis=1) for x in (q, k, v))
    assert _attention_split.attend_entries(q2, k2, v2, None, 0, 1.0, 1) is None  # one thread
    flipped = k2[..., ::-1]  # a negative stride
    assert _attention_split.attend_entries(q2, flipped, v2, None, 0, 1.0, 2) is None


def test_mask_rows_views_or_copies():
    shape = (2, 3, 5, 7)
    m = RNG.standard_normal((1, 1, 5, 7)).astype(np.float32)
    rows = _softmax_numba.mask_rows(shape, m)
    assert rows.shape == (5, 7) and np.shares_memory(rows, m)  # rows repeat every 5
    m = RNG.standard_normal((2, 1, 5, 7)).astype(np.float32)  # differs per batch: one copy
    rows = _softmax_numba.mask_rows(shape, m)
    np.testing.assert_array_equal(rows, np.broadcast_to(m, shape).reshape(-1, 7))
    assert _softmax_numba.mask_rows(shape, m.astype(np.float64)) is None
    assert _softmax_numba.mask_rows(shape, np.zeros((1, 2, 3, 5, 7), np.float32)) is None
    assert _softmax_numba.mask_rows(shape, np.zeros((4, 7), np.float32)) is None
