"""Every template computes C = A @ B correctly on every kind of shape, on the real adapter."""

import random

import numpy as np
import pytest

from autotune.compile import CompileError, compile_shader, create_pipeline
from autotune.kernel import dispatch
from autotune.problem import Problem
from autotune.render import render
from autotune.space import load_space
from autotune.verify import verify

SHAPES = [
    Problem(1, 1, 1),
    Problem(367, 367, 367),  # prime: no tile divides it
    Problem(127, 129, 63),  # one less / one more than common tiles
    Problem(65, 31, 33),
    Problem(1, 333, 257),  # a vector times a matrix
    Problem(8, 12, 3001),  # K much larger than M and N
    Problem(200, 40, 64),  # non-square
    Problem(1000, 17, 999),
    Problem(96, 128, 260),  # multiples of 4: vector loads
]


@pytest.mark.parametrize("problem", SHAPES, ids=str)
@pytest.mark.parametrize("template", ["naive", "tiled", "blocked"])
def test_seed_configs_are_correct_in_both_check_modes(gpu, template, problem):
    configs = load_space(template).seed_configs(problem, gpu.limits)
    assert configs, f"no seed of {template} fits {problem}"
    for config in configs:
        for checks in (True, False):
            verdict = verify(compile_shader(render(config, problem), gpu, checks=checks), gpu)
            assert verdict.ok, f"{config} checks={checks}: {verdict.reason}"


@pytest.mark.parametrize(
    "problem",
    [Problem(130, 68, 36), Problem(67, 45, 37), Problem(3, 260, 8), Problem(128, 64, 64)],
    ids=str,
)
@pytest.mark.parametrize("template", ["naive", "tiled", "blocked"])
def test_sampled_valid_configs_compile_and_are_correct(
    gpu, assert_sample_is_correct, template, problem
):
    """The search space's promise: whatever it calls valid compiles and computes right."""
    configs = load_space(template).configs(problem, gpu.limits)
    assert_sample_is_correct(problem, configs, seed=1, count=12, checks=False)


@pytest.mark.parametrize("problem", [Problem(130, 68, 36), Problem(67, 44, 40)], ids=str)
@pytest.mark.parametrize("checks", [True, False], ids=["checks", "nochecks"])
def test_transposed_a_and_banded_order_are_correct(gpu, assert_sample_is_correct, problem, checks):
    """AT (A staged transposed, 4x4 blocks) and GROUP (tiles taken in bands) change the
    indexing most; ragged shapes exercise every edge test and a partial last band."""
    configs = [
        c
        for c in load_space("blocked").configs(problem, gpu.limits)
        if c["AT"] == 1 or c["GROUP"] > 1
    ]
    assert any(c["AT"] and c["GROUP"] > 1 for c in configs)
    assert_sample_is_correct(problem, configs, seed=4, count=6, checks=checks)


@pytest.mark.parametrize("problem", [Problem(130, 68, 36), Problem(67, 44, 64)], ids=str)
@pytest.mark.parametrize("checks", [True, False], ids=["checks", "nochecks"])
def test_two_workgroup_buffers_and_warp_layout_are_correct(
    gpu, assert_sample_is_correct, problem, checks
):
    """DB=2 takes two K slices per loop iteration, so an odd count of slices ends mid-way
    (K=36: 3 slices of 16, 5 of 8; K=64: even counts) and WARP=1 renumbers the
    invocations; both on ragged tiles."""
    configs = [
        c
        for c in load_space("blocked").configs(problem, gpu.limits)
        if c["DB"] == 2 or c["WARP"] == 1
    ]
    assert any(c["DB"] == 2 and c["WARP"] for c in configs)
    assert_sample_is_correct(problem, configs, seed=5, count=6, checks=checks)


@pytest.mark.slow
def test_configs_declared_invalid_by_limits_are_refused(gpu):
    """Configs outside the device's limits never run: wgpu refuses too many invocations
    itself; workgroup storage over the limit it accepts (wgpu-native 29 does not check
    it, browsers do), so there our own check is what refuses them."""
    space = load_space("blocked")
    problem = Problem(256, 256, 256)
    inside = set(space.configs(problem, gpu.limits))
    outside = [c for c in space.configs(problem, None) if c not in inside]
    by_limit = {}
    for config in outside:
        by_limit.setdefault(
            space.why_invalid(config, problem, gpu.limits).split(":")[0], []
        ).append(config)
    assert set(by_limit) == {
        "limit max-compute-invocations-per-workgroup",
        "limit max-compute-workgroup-storage-size",
    }
    for config in random.Random(2).sample(
        by_limit["limit max-compute-invocations-per-workgroup"], 4
    ):
        with pytest.raises(CompileError):
            create_pipeline(render(config, problem), gpu)
    for config in random.Random(2).sample(sorted(outside), 8):
        with pytest.raises(CompileError) as refused:
            compile_shader(render(config, problem), gpu)
        assert refused.value.reason == "limits"
    for config in random.Random(3).sample(sorted(inside), 4):
        assert verify(create_pipeline(render(config, problem), gpu), gpu).ok


def test_output_is_fully_overwritten(gpu):
    """C starts as NaN in verification; here as garbage: the result must not depend on it."""
    problem = Problem(45, 37, 29)
    config = load_space("blocked").seed_configs(problem, gpu.limits)[0]
    compiled = compile_shader(render(config, problem), gpu)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((45, 29)).astype(np.float32)
    B = rng.standard_normal((29, 37)).astype(np.float32)
    np.testing.assert_allclose(
        dispatch(compiled, gpu, A, B, fill=1e30), A @ B, rtol=1e-4, atol=1e-4
    )
