"""Shared fixtures: one GPU for the session, skipped cleanly where no adapter exists."""

from pathlib import Path

import pytest

from autotune import device

FAULTY = Path(__file__).parent / "faulty"


@pytest.fixture(scope="session")
def gpu():
    if not device.has_adapter():
        pytest.skip("no wgpu adapter on this machine")
    return device.get_gpu()


@pytest.fixture
def faulty_templates(monkeypatch):
    """Adds the test-only `faulty` template (tests/faulty) for this test."""
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(FAULTY))
    return "faulty"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty cache folder, also set as $AUTOTUNE_CACHE for code that reads the default."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("AUTOTUNE_CACHE", str(folder))
    return folder
