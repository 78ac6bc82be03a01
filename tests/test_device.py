import pytest

from autotune import device
from autotune.compile import compile_shader
from autotune.problem import Problem
from autotune.render import render
from autotune.space import load_space
from autotune.verify import verify


def test_fingerprint_is_stable_and_complete(gpu):
    first = device.Fingerprint.of(gpu.adapter)
    assert first == device.Fingerprint.of(gpu.adapter)
    for field in ("backend", "vendor", "device", "description"):
        assert getattr(first, field), field
    assert first.slug and "/" not in first.slug


def test_device_has_the_adapters_real_limits(gpu):
    for name in device.COMPUTE_LIMITS:
        assert gpu.limits[name] == gpu.adapter.limits[name]
        assert gpu.device.limits[name] == gpu.adapter.limits[name]
    if "timestamp-query" in gpu.adapter.features:
        assert gpu.has_timestamps and "timestamp-query" in gpu.device.features


def test_trusted_and_checked_modules_both_compute(gpu):
    problem = Problem(33, 35, 37)
    config = load_space("tiled").seed_configs(problem, gpu.limits)[0]
    for checks in (True, False):
        compiled = compile_shader(render(config, problem), gpu, checks=checks)
        assert compiled.checks is checks
        assert verify(compiled, gpu).ok


def test_trusted_module_reports_bad_wgsl(gpu):
    with pytest.raises(Exception, match="(?i)error|invalid|parse"):
        gpu.create_shader_module("fn main( {", checks=False)


def test_adapter_chosen_by_environment(gpu, monkeypatch):
    monkeypatch.setenv(device.ADAPTER_ENV, gpu.fingerprint.backend.lower())
    assert device.get_gpu().fingerprint.backend == gpu.fingerprint.backend
    monkeypatch.setenv(device.ADAPTER_ENV, "no-such-gpu-anywhere")
    with pytest.raises(device.NoAdapterError, match="no-such-gpu-anywhere"):
        device.get_gpu()
