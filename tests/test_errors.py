"""What leaves ``async with open_session(...)`` is the exception itself, never
an ExceptionGroup around it (issue #19.1); every OutOfMemoryError names the
model and, where one runs, the node (issue #19.5)."""

from __future__ import annotations

import traceback
from contextlib import asynccontextmanager

import numpy as np
import pytest
import trio
from onnx import TensorProto as TP
from onnx import helper

import actorrt
from actorrt._errors import BaseExceptionGroup, UnwrapGroups, single_exception
from tests.models import add_chain, two_branch


def _raise_key_error():
    raise KeyError("mine")


async def test_the_bodys_own_exception_passes_through_unchanged():
    with pytest.raises(KeyError) as info:
        async with actorrt.open_session(two_branch()):
            _raise_key_error()
    e = info.value
    assert type(e) is KeyError and e.args == ("mine",)
    names = [f.name for f in traceback.extract_tb(e.__traceback__)]
    assert "_raise_key_error" in names  # the traceback still reaches the raise
    assert not isinstance(e.__context__, BaseExceptionGroup)


async def test_same_object_comes_out():
    mine = ValueError("the caller's")
    try:
        async with actorrt.open_session(two_branch()):
            raise mine
    except ValueError as e:
        assert e is mine
    else:  # pragma: no cover
        pytest.fail("nothing raised")


async def test_a_session_error_in_the_body_is_caught_as_actorrt_error():
    try:
        async with actorrt.open_session(two_branch()) as s:
            await s.run(None, {"nope": np.ones((1, 3), np.float32)})
    except actorrt.ActorRTError as e:
        assert isinstance(e, actorrt.InvalidArgumentError)
        assert "nope" in str(e)
    else:  # pragma: no cover
        pytest.fail("nothing raised")


async def test_setup_failures_are_typed_not_groups():
    opts = actorrt.SessionOptions(memory_limit=4)
    with pytest.raises(actorrt.OutOfMemoryError) as info:
        async with actorrt.open_session(two_branch(), options=opts):
            pass  # pragma: no cover
    assert info.value.model == "two_branch" and "two_branch" in str(info.value)
    assert not isinstance(info.value.__context__, BaseExceptionGroup)
    with pytest.raises(actorrt.ModelLoadError):
        async with actorrt.open_session(b"not a model"):
            pass  # pragma: no cover


async def test_cancelling_the_block_still_works():
    with trio.move_on_after(0.2) as scope:
        async with actorrt.open_session(two_branch()) as s:
            await s.run(None, {"x": np.ones((1, 3), np.float32)})
            await trio.sleep(30)
    assert scope.cancelled_caught


def test_sync_constructor_raises_the_error_itself():
    with pytest.raises(actorrt.OutOfMemoryError) as info:
        actorrt.InferenceSession(add_chain(3), options=actorrt.SessionOptions(memory_limit=8))
    assert "add_chain_3" in str(info.value)


def test_single_exception_collapses_only_one_failure():
    k = KeyError("k")
    assert single_exception(BaseExceptionGroup("g", [k])) is k
    assert single_exception(BaseExceptionGroup("g", [BaseExceptionGroup("h", [k])])) is k
    assert single_exception(BaseExceptionGroup("g", [k, k])) is k  # one failure, seen twice
    two = BaseExceptionGroup("g", [KeyError("a"), ValueError("b")])
    assert single_exception(two) is None


async def test_a_cancellation_beside_one_failure_gives_that_failure():
    caught = []

    async def fail():
        await trio.sleep(0)
        raise LookupError("the failure")

    try:
        async with trio.open_nursery() as n:
            n.start_soon(trio.sleep_forever)
            n.start_soon(fail)
    except BaseExceptionGroup as eg:
        caught.append(single_exception(eg))
    assert isinstance(caught[0], LookupError)


async def test_several_distinct_failures_stay_a_group():
    @asynccontextmanager
    async def two_failures():
        async with trio.open_nursery() as n:
            async def boom(e):
                raise e
            n.start_soon(boom, KeyError("a"))
            n.start_soon(boom, ValueError("b"))
            yield

    with pytest.raises(BaseExceptionGroup) as info:
        async with UnwrapGroups(two_failures()):
            await trio.sleep(1)
    assert {type(e) for e in info.value.exceptions} == {KeyError, ValueError}


def test_late_context_appears_in_the_message():
    e = actorrt.KernelError("boom", op_type="Add")
    assert str(e) == "boom"
    e.add_context(model="m", node="n")
    assert str(e) == "[model 'm', node 'n'] boom"
    e.add_context(model="other")  # kept once set
    assert e.model == "m"


# ---------------------------------------------------------------- memory errors

async def test_run_out_of_memory_names_model_and_node():
    x = np.ones((1000, 3), np.float32)
    opts = actorrt.SessionOptions(memory_limit=20_000)
    async with actorrt.open_session(two_branch(), options=opts) as s:
        with pytest.raises(actorrt.OutOfMemoryError) as info:
            await s.run(None, {"x": x})
        e = info.value
        assert e.model == "two_branch" and e.node in {"mul", "relu", "sub", "join"}
        assert f"model 'two_branch', node '{e.node}'" in str(e)
        with pytest.raises(actorrt.OutOfMemoryError) as info:
            await s.run_many(lambda outs: {"x": x} if outs is None else None)
        assert info.value.model == "two_branch" and info.value.node is not None
        with pytest.raises(actorrt.OutOfMemoryError) as info:
            await s.bind_device("x", np.float32, (4000, 3))
        assert info.value.model == "two_branch" and "two_branch" in str(info.value)


async def test_data_sized_output_past_the_machine_names_model_and_node():
    g = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"], name="huge")], "sized",
        [helper.make_tensor_value_info("shape", TP.INT64, [2])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    async with actorrt.open_session(model) as s:
        with pytest.raises(actorrt.OutOfMemoryError) as info:
            await s.run(None, {"shape": np.array([1 << 31, 1 << 31], np.int64)})
    assert (info.value.model, info.value.node) == ("sized", "huge")
    assert "model 'sized', node 'huge'" in str(info.value)


def test_sync_run_out_of_memory_names_model_and_node():
    opts = actorrt.SessionOptions(memory_limit=20_000)
    with actorrt.InferenceSession(two_branch(), options=opts) as sess:
        with pytest.raises(actorrt.OutOfMemoryError, match=r"model 'two_branch', node '\w+'"):
            sess.run(None, {"x": np.ones((1000, 3), np.float32)})


def test_errors_pickle_with_their_fields_and_context():
    import pickle

    e = actorrt.OutOfMemoryError("over", requested=10, in_use=2, limit=8, role="weights",
                                 provider="cpu", model="m")
    e.add_context(node="n")
    f = pickle.loads(pickle.dumps(e))
    assert type(f) is actorrt.OutOfMemoryError and str(f) == str(e)
    assert (f.requested, f.limit, f.model, f.node) == (10, 8, "m", "n")
    g = pickle.loads(pickle.dumps(actorrt.InvalidArgumentError("bad", input="x", expected="a",
                                                               got="b")))
    assert (g.input, g.expected, str(g)) == ("x", "a", "bad (expected a, got b)")
