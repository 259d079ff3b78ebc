"""Shared pytest configuration: the built SmolLM2 folder as a session fixture; GPU tests skip cleanly without cupy and a GPU."""

import pytest


@pytest.fixture(scope="session")
def model_dir():
    """The built SmolLM2-135M folder (fetched and built once into the model
    cache); the tests that need it skip on an offline machine without it."""
    pytest.importorskip("tokenizers")
    import actorrt
    from actorrt.genai import prepare_model
    try:
        return prepare_model("smollm2", progress=False)
    except actorrt.ModelLoadError as exc:  # offline machine
        pytest.skip(f"SmolLM2 unavailable: {exc}")


def _have_gpu() -> bool:
    try:
        import cupy  # noqa: F401
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _have_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with cupy installed")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
