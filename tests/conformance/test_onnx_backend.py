"""The ONNX backend test suite (onnx.backend.test.BackendTest) over
``actorrt.backend``: node tests (built in memory from the onnx wheel's case
generators), simple, PyTorch-converted/-operator and light model tests.

Every excluded test carries a one-line reason. Marked slow: run it with
``python -m pytest -q -m slow tests/conformance``.
"""

import onnx.backend.test
import pytest

from actorrt.backend import ActorRTBackend

#: test-name regex -> why it is excluded
EXCLUDED = {
    # expected values come from numpy's global random generator
    r"^test_bernoulli": "expected values drawn from numpy's global RNG; ours is seeded per node",
    # no image codec in numpy
    r"^test_image_decoder": "ImageDecoder needs a JPEG/PNG/BMP/TIFF/WebP codec; declined with reason",
    # real model-zoo models are downloaded from the internet
    r"^test_(bvlc_alexnet|densenet121|inception_v1|inception_v2|resnet50|shufflenet|squeezenet|"
    r"vgg19|zfnet512)_cpu$": "model-zoo download (no network); the light_* variants run instead",
    r"_cuda$": "CPU provider only",
}

pytestmark = pytest.mark.slow

backend_test = onnx.backend.test.BackendTest(ActorRTBackend, __name__)
for pattern in EXCLUDED:
    backend_test.exclude(pattern)

globals().update(backend_test.test_cases)
