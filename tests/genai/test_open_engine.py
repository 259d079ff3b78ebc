"""``async with open_engine(...)``: what leaves the block is the exception
itself, never an ExceptionGroup around it (issue #19.1)."""

from __future__ import annotations

import traceback

import pytest

import actorrt
from actorrt._errors import BaseExceptionGroup
from actorrt.genai import SamplingParams, open_engine

pytest.importorskip("tokenizers")


def _raise_key_error():
    raise KeyError("mine")


async def test_engine_errors_and_the_bodys_own_pass_through(model_dir):
    with pytest.raises(KeyError) as info:
        async with open_engine(model_dir):
            _raise_key_error()
    assert info.value.args == ("mine",)
    assert "_raise_key_error" in [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert not isinstance(info.value.__context__, BaseExceptionGroup)
    try:
        async with open_engine(model_dir) as engine:
            await engine.generate("", SamplingParams(max_new_tokens=2))
    except actorrt.ActorRTError as e:  # the engine's typed error, outside the block
        assert isinstance(e, actorrt.GenerationError)
    else:  # pragma: no cover
        pytest.fail("nothing raised")


async def test_engine_setup_failure_is_typed(tmp_path):
    with pytest.raises(actorrt.ActorRTError):
        async with open_engine(tmp_path / "missing.gguf"):
            pass  # pragma: no cover
