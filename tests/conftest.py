"""Shared fixtures: one GPU for the whole test run, skipped cleanly where no adapter exists.

Property-based tests (tests/test_fuzz.py) run a bounded number of examples by default, as
in CI; HYPOTHESIS_PROFILE=long runs many more for a longer local fuzzing run:

    HYPOTHESIS_PROFILE=long python -m pytest tests/test_fuzz.py
"""

import os
import random
from pathlib import Path

import pytest
import wgpu
from hypothesis import HealthCheck, settings

from autotune import device
from autotune.compile import compile_shader
from autotune.render import render
from autotune.verify import verify

FAULTY = Path(__file__).parent / "faulty"

# deadline=None and too_slow off: on lavapipe with busy cores an example's time varies
# tenfold, and a first GPU example compiles. Fixtures such as tmp_path are shared by a
# test's examples on purpose (each example makes its own folder in it).
_FUZZ = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile("ci", max_examples=100, **_FUZZ)
settings.register_profile("long", max_examples=2000, **_FUZZ)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(items):
    """A test needs a GPU exactly when it uses the `gpu` fixture (directly or through
    another fixture): it is marked `gpu`, and skipped cleanly where no adapter exists."""
    for item in items:
        if "gpu" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session", autouse=True)
def no_writes_into_the_checkout(tmp_path_factory):
    """lookup keeps what it estimates in the default cache folder, which in a checkout is
    the shipped cache/: the tests' lookups keep theirs in a folder of the session's own
    (a test's `cache_dir` replaces it for that test)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("AUTOTUNE_CACHE", str(tmp_path_factory.mktemp("session-cache")))
    yield
    patch.undo()


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


# A kernel that fills workgroup memory with bits of its own.
JUNK = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
var<workgroup> junk: array<u32, 4096>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
  for (var i = lid; i < 4096u; i += 256u) {
    junk[i] = 0x5A5A5A5Au ^ i;
  }
  workgroupBarrier();
  out[lid] = junk[4095u - lid];
}
"""


@pytest.fixture
def junk_in_workgroup_memory(gpu):
    """A call that leaves bits in workgroup memory, as any kernel may: a driver that does
    not zero it (lavapipe does not) hands them to the next kernel's workgroup variables."""
    module = gpu.create_shader_module(JUNK)
    pipeline = gpu.device.create_compute_pipeline(
        layout="auto", compute={"module": module, "entry_point": "main"}
    )
    return lambda: _run_junk(gpu.device, pipeline)


def _run_junk(device, pipeline) -> None:
    out = device.create_buffer(size=1024, usage=wgpu.BufferUsage.STORAGE)
    binding = [{"binding": 0, "resource": {"buffer": out}}]
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=binding)
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    compute.dispatch_workgroups(64)
    compute.end()
    device.queue.submit([encoder.finish()])
