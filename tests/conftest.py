"""Shared fixtures: one GPU for the whole test run, skipped cleanly where no adapter exists."""

import random
from pathlib import Path

import pytest

from autotune import device
from autotune.compile import compile_shader
from autotune.render import render
from autotune.verify import verify

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


@pytest.fixture
def assert_sample_is_correct(gpu):
    """`assert_sample_is_correct(problem, configs, seed, count, checks)`: a seeded sample of
    `configs` (at most `count`) compiles and computes `problem` right, each on fresh data."""

    def check(problem, configs, seed: int, count: int, checks: bool = True) -> None:
        for config in random.Random(seed).sample(configs, min(count, len(configs))):
            compiled = compile_shader(render(config, problem), gpu, checks=checks)
            verdict = verify(compiled, gpu)
            assert verdict.ok, f"{config}: {verdict.reason}"

    return check
