"""Tensors, DLPack, device IO bindings, transfer counters, memory governor."""

import numpy as np
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt import Tensor
from tests.models import add_chain


def _increment_model():
    one = numpy_helper.from_array(np.float32([1.0]), "one")
    g = helper.make_graph([helper.make_node("Add", ["state", "one"], ["next"], name="inc")], "inc",
                          [helper.make_tensor_value_info("state", TP.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("next", TP.FLOAT, [4, 8])], [one])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


async def test_dlpack_export_shares_memory_and_import_is_zero_copy():
    async with actorrt.open_session(add_chain(1)) as s:
        cpu = s._providers[0]
        t = await Tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3), cpu)
        view = np.from_dlpack(t)
        view[0, 0] = 42.0
        assert t.numpy()[0, 0] == 42.0
        t.numpy()[1, 2] = -1.0
        assert view[1, 2] == -1.0
        src = np.zeros(5, np.float32)
        imported = await Tensor.from_dlpack(src, cpu)
        assert imported.device_ptr() == src.ctypes.data
        src[3] = 7
        assert imported.numpy()[3] == 7
        t.close()
        imported.close()


async def test_import_guard_runs_exactly_once_after_release():
    calls = []
    async with actorrt.open_session(add_chain(1)) as s:
        cpu = s._providers[0]
        t = await Tensor.from_dlpack(np.ones(3, np.float32), cpu, on_release=lambda: calls.append(1))
        assert calls == []
        t.close()
        await cpu.ref.ask(actorrt.providers.base.Sync())  # the Free message was handled
        assert calls == [1]
        t.close()
    assert calls == [1]
    # a tensor still open when its session ends is released by the provider, once
    calls2 = []
    async with actorrt.open_session(add_chain(1)) as s:
        t2 = await Tensor.from_dlpack(np.ones(3, np.float32), s._providers[0],
                                      on_release=lambda: calls2.append(1))
    assert calls2 == [1]
    t2.close()
    assert calls2 == [1]


async def test_aliased_binding_updates_in_place_for_100_runs_without_growth():
    async with actorrt.open_session(_increment_model()) as s:
        b = await s.bind_device("state", np.float32, (4, 8), output_name="next")
        ptr = b.tensor.device_ptr()
        cpu = s._providers[0]
        await s.run(None, {})
        live = cpu.statistics().memory.live_bytes
        for _ in range(99):
            await s.run(None, {})
        assert cpu.statistics().memory.live_bytes == live
        assert b.tensor.device_ptr() == ptr
        np.testing.assert_array_equal(b.tensor.numpy(), np.full((4, 8), 100, np.float32))
        assert cpu.statistics().memory.live_by_role["bindings"] == 4 * 8 * 4


async def test_transfer_stats_count_exact_bytes_and_logical_shape():
    async with actorrt.open_session(_increment_model()) as s:
        b = await s.bind_device("state", np.float32, (4, 8), logical_shape=(2, 8))
        await b.write_bytes(0, np.arange(8, dtype=np.float32).tobytes())
        await b.write_bytes(32, b"\0" * 8)
        data = await b.read_bytes()
        assert len(data) == 2 * 8 * 4
        buf = bytearray(100)
        assert await b.read_bytes_into(buf) == 64
        st = b.transfer_stats()
        assert (st.upload_calls, st.upload_bytes, st.download_calls, st.download_bytes) == \
            (2, 40, 2, 128)
        assert b.logical_differs
        with pytest.raises(actorrt.InvalidArgumentError, match="exceeds its capacity"):
            b.set_logical_shape((5, 8))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
async def test_device_argmax_matches_numpy(dtype):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 50)).astype(dtype)
    async with actorrt.open_session(_increment_model()) as s:
        cpu = s._providers[0]
        t = await Tensor.from_numpy(logits, cpu)
        np.testing.assert_array_equal(await t.argmax(), np.argmax(logits, -1).astype(np.uint32))
        np.testing.assert_array_equal(await t.argmax(10), np.argmax(logits[:, :10], -1))


async def test_device_argmax_refuses_other_dtypes():
    async with actorrt.open_session(_increment_model()) as s:
        t = await Tensor.from_numpy(np.arange(4, dtype=np.int64), s._providers[0])
        with pytest.raises(actorrt.InvalidArgumentError, match="float32 or float16"):
            await t.argmax()


async def test_binding_device_argmax_into_result_binding():
    async with actorrt.open_session(_increment_model()) as s:
        logits = await s.bind_device("state", np.float32, (4, 8))
        logits.tensor.numpy()[:] = np.random.default_rng(1).standard_normal((4, 8))
        cpu = s._providers[0]
        res_t = await Tensor.empty(actorrt.providers.base.ir.DataType.UINT32 if False else 12, (4,), cpu)
        from actorrt._tensor import DeviceIoBinding
        res = DeviceIoBinding(res_t, "result", None, (4,), False, s)
        await logits.device_argmax(0, res)
        np.testing.assert_array_equal(res_t.numpy(), np.argmax(logits.tensor.numpy(), -1))


async def test_run_with_tensors_hands_over_kernel_buffers():
    async with actorrt.open_session(_increment_model()) as s:
        cpu = s._providers[0]
        x = await Tensor.from_numpy(np.zeros((4, 8), np.float32), cpu)
        (y,) = await s.run_with_tensors(None, {"state": x})
        assert isinstance(y, Tensor) and y.device == "cpu"
        np.testing.assert_array_equal(y.numpy(), np.ones((4, 8), np.float32))
        assert cpu.statistics().memory.live_by_role["tensors"] == 2 * 4 * 8 * 4
        y.close()
        x.close()
        await cpu.ref.ask(actorrt.providers.base.Sync())
        assert cpu.statistics().memory.live_by_role["tensors"] == 0


async def test_memory_limit_raises_before_allocating():
    opts = actorrt.SessionOptions(memory_limit=1 << 20)
    async with actorrt.open_session(_increment_model(), options=opts) as s:
        cpu = s._providers[0]
        before = cpu.statistics().memory
        with pytest.raises(actorrt.OutOfMemoryError) as ei:
            await Tensor.empty(1, (1024, 1024), cpu)
        e = ei.value
        assert (e.requested, e.limit, e.role, e.provider) == (4 << 20, 1 << 20, "tensors", "cpu")
        assert cpu.statistics().memory.live_bytes == before.live_bytes
        with pytest.raises(actorrt.OutOfMemoryError, match="overflows"):
            await Tensor.empty(1, (1 << 40, 1 << 40), cpu)


def test_model_needing_1e13_elements_raises_out_of_memory():
    shape = numpy_helper.from_array(np.int64([10**13]), "shape")
    g = helper.make_graph([helper.make_node("ConstantOfShape", ["s"], ["big"], name="huge"),
                           helper.make_node("Add", ["big", "x"], ["y"], name="add")], "huge",
                          [helper.make_tensor_value_info("s", TP.INT64, [1]),
                           helper.make_tensor_value_info("x", TP.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with actorrt.InferenceSession(m) as sess:
        with pytest.raises(actorrt.OutOfMemoryError) as ei:
            sess.run(None, {"s": np.int64([10**13]), "x": np.float32([1])})
        assert ei.value.node == "huge"
        assert ei.value.requested == 4 * 10**13
        assert "exceeds this machine" in str(ei.value)  # refused before numpy allocates
        # still usable
        (y,) = sess.run(None, {"s": np.int64([2]), "x": np.float32([1])})
        assert y.tolist() == [1.0, 1.0]


async def test_provider_live_bytes_zero_after_close_with_open_tensors():
    async with actorrt.open_session(_increment_model()) as s:
        cpu = s._providers[0]
        await s.bind_device("state", np.float32, (4, 8), output_name="next")
        await Tensor.from_numpy(np.ones(100, np.float32), cpu)
        await s.run(None, {})
        assert cpu.statistics().memory.live_bytes > 0
    assert cpu.statistics().memory.live_bytes == 0
    assert cpu.statistics().live_buffers == 0
