"""actorrt.aio: sessions and engines under asyncio.run (plain test functions
that call asyncio.run; the suite's trio mode does not apply to them)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import actorrt
from actorrt import aio


def _add_model() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n"])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "y"], ["t"]),
                               helper.make_node("Add", ["t", "x"], ["z"])], "g", [x, y], [z])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def test_session_runs_concurrently_under_asyncio():
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal(64).astype(np.float32),
              "y": rng.standard_normal(64).astype(np.float32)} for _ in range(8)]

    async def main():
        async with aio.open_session(_add_model()) as session:
            assert [i.name for i in session.get_inputs()] == ["x", "y"]
            outs = await asyncio.gather(*(session.run(None, f) for f in feeds))
            with pytest.raises(actorrt.InvalidArgumentError):
                await session.run(None, {"x": feeds[0]["x"]})  # y missing
            return outs

    outs = asyncio.run(main())
    for f, (z,) in zip(feeds, outs):
        np.testing.assert_allclose(z, f["x"] * f["y"] + f["x"], rtol=1e-6)


def test_a_bad_model_raises_the_error_itself():
    async def main():
        async with aio.open_session(b"not a model"):
            pass

    with pytest.raises(actorrt.ModelLoadError):
        asyncio.run(main())


@pytest.fixture(scope="module")
def model_dir():
    pytest.importorskip("tokenizers")
    from actorrt.genai import prepare_model
    try:
        return prepare_model("smollm2", progress=False)
    except actorrt.ModelLoadError as exc:  # offline machine
        pytest.skip(f"SmolLM2 unavailable: {exc}")


def test_engine_streams_generates_and_cancels_under_asyncio(model_dir):
    from actorrt.genai import SamplingParams

    params = SamplingParams(max_new_tokens=8)

    async def main():
        out = {}
        async with aio.open_engine(model_dir) as engine:
            out["once"] = await engine.generate("The capital of France is", params)
            stream = engine.stream("The capital of France is", params)
            out["pieces"] = [p async for p in stream]
            out["result"] = stream.result
            # two streams at once
            a, b = engine.stream("Once upon a time", params), engine.stream("Water boils at",
                                                                            params)

            async def read(s):
                return "".join([p async for p in s])

            out["two"] = await asyncio.gather(read(a), read(b))
            out["solo"] = [(await engine.generate(p, params)).text
                           for p in ("Once upon a time", "Water boils at")]

            # cancelling the asyncio task cancels the engine request
            long = SamplingParams(max_new_tokens=400, ignore_eos=True)
            first = asyncio.Event()

            async def reader():
                async for _ in engine.stream("Once upon a time", long):
                    first.set()

            task = asyncio.create_task(reader())
            await first.wait()
            assert (await engine.statistics()).active == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # and a generate() cut by a timeout
            with pytest.raises((asyncio.TimeoutError, TimeoutError)):
                await asyncio.wait_for(engine.generate("Once upon a time", long), 0.5)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                st = await engine.statistics()
                if st.active == 0 and st.waiting == 0 and st.kv_bytes == 0:
                    break
                await asyncio.sleep(0.05)
            out["after"] = st
            with pytest.raises(actorrt.InvalidArgumentError):
                await engine.generate(3.5, params)  # not a prompt
        return out

    out = asyncio.run(main())
    assert "".join(out["pieces"]) == out["once"].text == out["result"].text
    assert "Paris" in out["once"].text
    assert out["result"].token_ids == out["once"].token_ids
    assert out["two"] == out["solo"]
    st = out["after"]
    assert st.active == 0 and st.waiting == 0 and st.kv_bytes == 0
