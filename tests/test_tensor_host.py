"""OrtValue-like tensors from plain sync code (issue #19.2):
``Tensor.from_numpy(array, device="cpu")``, ``Tensor.from_dlpack(obj)`` and
friends need no session, provider or event loop (the process-wide CPU
allocator), as ``onnxruntime.OrtValue.ortvalue_from_numpy``; with a provider
they stay awaitable."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import actorrt
from actorrt import Tensor
from actorrt._tensor import host_allocator
from tests.models import two_branch


def _live():
    return host_allocator().statistics().live_buffers


def test_from_numpy_without_a_session_copies():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for t in (Tensor.from_numpy(a), Tensor.from_numpy(a, device="cpu"),
              Tensor.from_numpy(a, "cpu")):
        assert isinstance(t, Tensor) and t.device == "cpu" and t.device_name() == "cpu"
        assert t.shape == (2, 3) and t.data_type() == "tensor(float)"
        np.testing.assert_array_equal(t.numpy(), a)
        assert not np.shares_memory(t.numpy(), a)
        t.close()
        assert t.closed and not t.has_value()


def test_ortvalue_from_numpy_borrows_like_onnxruntime():
    a = np.arange(4, dtype=np.int64)
    t = Tensor.ortvalue_from_numpy(a, "cpu", 0)
    a[1] = 40
    assert t.numpy()[1] == 40 and t.device_ptr() == a.ctypes.data
    t.close()
    ro = np.arange(3.0)
    ro.flags.writeable = False
    t = Tensor.ortvalue_from_numpy(ro)  # not borrowable: copied
    assert not np.shares_memory(t.numpy(), ro)
    t.close()


def test_from_dlpack_without_a_session_is_zero_copy_and_releases_once():
    src = np.zeros(5, np.float32)
    calls = []
    t = Tensor.from_dlpack(src, on_release=lambda: calls.append(1))
    assert t.device_ptr() == src.ctypes.data
    src[2] = 3
    assert t.numpy()[2] == 3
    t.close()
    t.close()
    assert calls == [1]
    with pytest.raises(actorrt.InvalidArgumentError, match="DLPack"):
        Tensor.from_dlpack(object())


def test_empty_and_from_bytes_without_a_session():
    t = Tensor.empty(actorrt.Tensor.from_numpy(np.zeros(1, np.float32)).dtype, (2, 2))
    assert t.shape == (2, 2) and t.numpy().dtype == np.float32
    b = Tensor.from_bytes(np.float32([1, 2]).tobytes(), t.dtype, (2,))
    np.testing.assert_array_equal(b.numpy(), [1, 2])
    with pytest.raises(actorrt.InvalidArgumentError, match="do not match"):
        Tensor.from_bytes(b"123", t.dtype, (2,))
    t.close()
    b.close()


def test_works_from_any_thread_and_dropped_tensors_are_returned():
    gc.collect()
    before = _live()
    made = []

    def work():
        for i in range(50):
            made.append(Tensor.from_numpy(np.full(10, i, np.float32)).numpy().sum())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(made) == 200
    gc.collect()
    assert _live() == before  # dropped without close(): returned when collected


def test_other_devices_need_a_provider():
    with pytest.raises(actorrt.InvalidArgumentError, match="needs that device's provider"):
        Tensor.from_numpy(np.zeros(2), device="cuda")
    with pytest.raises(actorrt.InvalidArgumentError):
        Tensor.ortvalue_from_numpy(np.zeros(2), "cuda", 0)


async def test_host_tensors_feed_a_session_and_async_methods_work():
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    t = Tensor.from_numpy(x)
    np.testing.assert_array_equal(await t.to_numpy(), x)
    np.testing.assert_array_equal(await t.argmax(), np.argmax(x, -1))
    c = await t.clone()
    assert c.device == "cpu" and not np.shares_memory(c.numpy(), t.numpy())
    async with actorrt.open_session(two_branch()) as s:
        (y,) = await s.run_with_tensors(None, {"x": t})
        np.testing.assert_allclose(y.numpy(),
                                   np.maximum(x * np.float32([2, -1, 0.5]), 0) + (x - 1),
                                   rtol=1e-6)
        y.close()
        # the async forms with a provider are still awaitables
        pt = await Tensor.from_numpy(x, s._providers[0])
        assert pt.device == "cpu"
        pt.close()
    t.close()
    c.close()
