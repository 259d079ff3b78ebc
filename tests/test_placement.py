"""Cost-model placement across providers and the reference fallback."""

import numpy as np
import pytest

import actorrt
from actorrt.providers import Unsupported
from actorrt.providers.cpu import CPUExecutionProvider
from tests.models import two_branch


class PickyCPU(CPUExecutionProvider):
    """A CPU provider that declines Relu, to make placement observable."""

    def supports_op(self, node):
        if node.op_type == "Relu":
            return Unsupported("Relu declined for this test")
        return super().supports_op(node)


def test_fallback_takes_only_declined_nodes_and_placement_says_why():
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    with actorrt.InferenceSession(two_branch(), providers=[PickyCPU(), "reference"]) as s:
        place = {p.node: p for p in s.placement()}
        assert place["relu"].provider == "reference"
        assert place["relu"].candidates["cpu"] == "Relu declined for this test"
        for name in ("mul", "sub", "join"):
            assert place[name].provider == "cpu"
            cands = place[name].candidates
            assert cands["cpu"] < cands["reference"]
        (y,) = s.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x * np.float32([2, -1, .5]), 0) + x - 1, rtol=1e-6)


def test_without_fallback_the_decline_reason_reaches_the_error():
    with pytest.raises(actorrt.UnsupportedOperatorError) as ei:
        actorrt.InferenceSession(two_branch(), providers=[PickyCPU()])
    assert ei.value.reasons == {"cpu": "Relu declined for this test"}
    assert ei.value.node == "relu"
