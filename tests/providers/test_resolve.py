"""Provider lists as onnxruntime takes them (issue #19.1, #19.2): its names,
``(name, options)`` pairs, fallback with a warning past providers this machine
lacks, a typed error when none can run; ``["reference"]`` alone works."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import actorrt
from actorrt import ProviderUnavailableWarning
from actorrt.providers import provider_unavailable, resolve_providers
from tests.models import two_branch

X = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
WANT = np.maximum(X * np.float32([2.0, -1.0, 0.5]), 0) + (X - 1)

no_cuda = pytest.mark.skipif(provider_unavailable("cuda") is None,
                             reason="a GPU is available here: nothing to fall back from")


@pytest.mark.parametrize("providers", [["reference"], ["ReferenceExecutionProvider"],
                                       ["reference", "cpu"], ("reference",), "reference"])
async def test_reference_alone_works(providers):
    async with actorrt.open_session(two_branch(), providers=providers) as s:
        assert s.get_providers()[0] == "reference" and "cpu" in s.get_providers()
        (y,) = await s.run(None, {"x": X})
    np.testing.assert_allclose(y, WANT, rtol=1e-6)


@pytest.mark.parametrize("providers", [None, [], ["cpu"], ["CPUExecutionProvider"], ["CPU"],
                                       [("CPUExecutionProvider", {})]])
def test_cpu_spellings(providers):
    with actorrt.InferenceSession(two_branch(), providers=providers) as sess:
        assert sess.get_providers() == ["cpu"]
        np.testing.assert_allclose(sess.run(None, {"x": X})[0], WANT, rtol=1e-6)


@no_cuda
@pytest.mark.parametrize("providers", [
    ["CUDAExecutionProvider", "CPUExecutionProvider"],
    ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
    [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"],
    ["cuda", "cpu"],
])
def test_unavailable_providers_fall_back_with_a_warning(providers):
    with pytest.warns(ProviderUnavailableWarning) as record:
        sess = actorrt.InferenceSession(two_branch(), providers=providers)
    with sess:
        assert sess.get_providers() == ["cpu"]
        np.testing.assert_allclose(sess.run(None, {"x": X})[0], WANT, rtol=1e-6)
    text = " ".join(str(w.message) for w in record)
    assert "CUDA" in text or "cuda" in text
    assert all(issubclass(w.category, UserWarning) for w in record)


@no_cuda
async def test_async_fallback_warns_at_the_callers_line():
    with pytest.warns(ProviderUnavailableWarning) as record:
        cm = actorrt.open_session(two_branch(), providers=["CUDAExecutionProvider", "cpu"])
    assert record[0].filename == __file__
    async with cm as s:
        assert s.get_providers() == ["cpu"]


@no_cuda
@pytest.mark.parametrize("providers", [["CUDAExecutionProvider"], ["cuda"],
                                       ["TensorrtExecutionProvider", "CUDAExecutionProvider"],
                                       ["DmlExecutionProvider"]])
def test_only_unavailable_providers_is_a_typed_error(providers):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProviderUnavailableWarning)
        with pytest.raises(actorrt.InvalidArgumentError) as info:
            actorrt.InferenceSession(two_branch(), providers=providers)
    assert "none of the requested execution providers can run here" in str(info.value)
    assert info.value.input == "providers"


@pytest.mark.parametrize("providers", [["CPUExecutionProvder"], ["gpu"], [42], [("cpu",)]])
def test_unknown_or_malformed_entries_are_typed_errors(providers):
    with pytest.raises(actorrt.InvalidArgumentError) as info:
        actorrt.InferenceSession(two_branch(), providers=providers)
    assert "CPUExecutionProvider" in str(info.value)  # says what is accepted


def test_provider_options_onnxruntime_style():
    opts = actorrt.SessionOptions()
    (cpu,) = resolve_providers([("CPUExecutionProvider", {"workers": "2"})], opts)
    assert cpu.n_workers == 2
    (cpu,) = resolve_providers([("cpu", {"memory_limit": 1 << 20})], opts)
    assert cpu.memory.limit == 1 << 20
    with pytest.warns(ProviderUnavailableWarning, match="arena_extend_strategy"):
        (cpu,) = resolve_providers(
            [("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})], opts)
    with pytest.raises(actorrt.InvalidArgumentError, match="'bogus'") as info:
        resolve_providers([("cpu", {"bogus": 1})], opts)
    assert "workers" in str(info.value) and "memory_limit" in str(info.value)
    with pytest.raises(actorrt.InvalidArgumentError, match="must be a number"):
        resolve_providers([("cpu", {"workers": "two"})], opts)
    with pytest.raises(actorrt.InvalidArgumentError, match="must be a dict"):
        resolve_providers([("cpu", ["workers", 2])], opts)


def test_sync_provider_options_argument():
    with actorrt.InferenceSession(two_branch(), providers=["CPUExecutionProvider"],
                                  provider_options=[{"workers": 1}]) as sess:
        assert sess.session._providers[0].n_workers == 1
        np.testing.assert_allclose(sess.run(None, {"x": X})[0], WANT, rtol=1e-6)
