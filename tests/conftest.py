"""Shared pytest configuration: GPU tests skip cleanly without cupy and a GPU."""

import pytest


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
