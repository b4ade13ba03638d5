"""Shared fixtures: GPU tests get CuPy (and torch) or skip with the reason."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cp():
    """The CuPy module when a CUDA device is usable; otherwise the test skips, saying why."""
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install '.[cuda13]' or '.[cuda12]')")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDA driver errors come in many types
        pytest.skip(f"no usable CUDA device ({exc})")
    if count < 1:
        pytest.skip("no CUDA device visible")
    return cupy


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow (minutes each)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow (minutes): run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
