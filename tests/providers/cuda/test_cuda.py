"""The CUDA provider (cupy) on a real GPU: placement by cost, transfers at
provider boundaries, device memory accounting, tensors, argmax, DLPack.
Skipped without cupy and a GPU."""

import numpy as np
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from tests.models import add_chain

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


def _mlp(width=1024, batch=64):
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    nodes.append(helper.make_node("ReduceSum", [prev], ["y"], keepdims=0, name="sum"))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TP.FLOAT,
                                                                        [batch, width])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_heavy_matmuls_go_to_cuda_and_results_match_cpu():
    m = _mlp()
    x = np.random.default_rng(1).standard_normal((64, 1024)).astype(np.float32)
    with actorrt.InferenceSession(m, providers=["cpu"]) as cpu:
        want = cpu.run(None, {"x": x})[0]
    with actorrt.InferenceSession(m, providers=["CUDAExecutionProvider", "cpu"]) as s:
        place = {p.node: p for p in s.placement()}
        for i in range(3):
            assert place[f"mm{i}"].provider == "cuda"
        # ReduceSum has no cuda kernel: the reason is reported and it runs on the CPU
        assert place["sum"].provider == "cpu"
        assert "no kernel" in place["sum"].candidates["cuda"]
        got = s.run(None, {"x": x})[0]
        st = s.statistics()
        assert st["cuda"].memory.live_by_role["weights"] == 0  # weights are counted on cpu
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_tiny_ops_stay_on_cpu_with_costs_reported():
    with actorrt.InferenceSession(add_chain(5), providers=["cuda", "cpu"]) as s:
        for p in s.placement():
            assert p.provider == "cpu"
            assert p.candidates["cuda"] > p.candidates["cpu"]


async def test_cuda_tensor_argmax_dlpack_and_memory():
    async with actorrt.open_session(_mlp(64, 4), providers=["cuda", "cpu"]) as s:
        gpu = next(p for p in s._providers if p.name == "cuda")
        logits = np.random.default_rng(2).standard_normal((3, 500)).astype(np.float32)
        t = await actorrt.Tensor.from_numpy(logits, gpu)
        assert t.device == "cuda"
        assert gpu.statistics().memory.live_by_role["tensors"] == logits.nbytes
        np.testing.assert_array_equal(await t.argmax(), np.argmax(logits, -1))
        view = cp.from_dlpack(t)
        view[0, 0] = 1234.0
        host = await t.to_numpy()
        assert host[0, 0] == 1234.0
        with pytest.raises(actorrt.InvalidArgumentError):
            t.numpy()
        t.close()
        await gpu.ref.ask(actorrt.providers.base.Sync())
        assert gpu.statistics().memory.live_by_role["tensors"] == 0
    assert gpu.statistics().memory.live_bytes == 0
