"""SessionOptions are checked when made, and only SessionOptions are taken
(issue #19.5): a bad field or a foreign options object is an
InvalidArgumentError naming the field and what is allowed."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import actorrt
from tests.models import two_branch

BAD_FIELDS = [
    ("trace", "bogus", "one of ['off', 'ops', 'full']"),
    ("trace", None, "one of ['off', 'ops', 'full']"),
    ("fuse_kernels", "yes", "True or False"),
    ("fuse_kernels", 1, "True or False"),
    ("parallel_execution", "false", "True or False"),
    ("fold_constants", None, "True or False"),
    ("enable_fallback", "no", "True or False"),
    ("track_memory", 0, "True or False"),
    ("output_views", "1", "True or False"),
    ("workers", 0, "None or an int >= 1"),
    ("workers", 2.5, "None or an int >= 1"),
    ("workers", True, "None or an int >= 1"),
    ("memory_limit", -1, "None or an int >= 0"),
    ("memory_limit", "1GB", "None or an int >= 0"),
    ("segment_threshold_us", float("nan"), "finite number"),
    ("segment_threshold_us", -1.0, "finite number"),
    ("segment_threshold_us", "fast", "finite number"),
    ("trace_path", 3, "file path"),
]


@pytest.mark.parametrize("field,value,allowed", BAD_FIELDS,
                         ids=[f"{f}={v!r}" for f, v, _ in BAD_FIELDS])
def test_bad_fields_are_refused_naming_field_and_allowed_values(field, value, allowed):
    with pytest.raises(actorrt.InvalidArgumentError) as info:
        actorrt.SessionOptions(**{field: value})
    e = info.value
    assert e.input == field
    assert f"SessionOptions.{field}" in str(e) and allowed in str(e)
    assert repr(value) in str(e)


def test_good_values_are_kept():
    o = actorrt.SessionOptions(workers=2, memory_limit=0, trace="full",
                               trace_path=pathlib.Path("/tmp/t.json"), fuse_kernels=False,
                               segment_threshold_us=0, output_views=np.bool_(True))
    assert o.trace_path == "/tmp/t.json" and o.workers == 2 and o.trace == "full"


def test_evolve_is_checked_too():
    import attrs
    with pytest.raises(actorrt.InvalidArgumentError, match="trace"):
        attrs.evolve(actorrt.SessionOptions(), trace="loud")


class _Foreign:
    pass


FOREIGN = {"dict": {"trace": "ops"}, "dict_unknown": {"graph_optimization_level": 99},
           "object": _Foreign()}


@pytest.mark.parametrize("kind", sorted(FOREIGN))
async def test_foreign_options_are_refused_by_open_session(kind):
    with pytest.raises(actorrt.InvalidArgumentError) as info:
        async with actorrt.open_session(two_branch(), options=FOREIGN[kind]):
            pass  # pragma: no cover
    e = info.value
    assert e.input == "options" and "actorrt.SessionOptions" in str(e)
    assert "trace" in str(e) and "memory_limit" in str(e)  # the fields it may set
    if kind == "dict_unknown":
        assert "graph_optimization_level" in str(e)


def test_onnxruntime_options_are_refused_by_the_sync_session():
    ort = pytest.importorskip("onnxruntime")
    with pytest.raises(actorrt.InvalidArgumentError, match="onnxruntime's options"):
        actorrt.InferenceSession(two_branch(), ort.SessionOptions())
    with pytest.raises(actorrt.InvalidArgumentError, match="SessionOptions"):
        actorrt.InferenceSession(two_branch(), options={"trace": "ops"})


def test_open_engine_refuses_foreign_options_before_loading_anything():
    from actorrt.genai import open_engine
    with pytest.raises(actorrt.InvalidArgumentError, match="SessionOptions"):
        open_engine("/nonexistent/model", options={"workers": 2})
