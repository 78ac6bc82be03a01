"""Timing: device timestamps and the wall clock agree; the method is recorded."""

import pytest

from autotune.compile import compile_shader
from autotune.measure import TooSlow, measure
from autotune.problem import Problem
from autotune.render import render
from autotune.space import load_space

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def known_kernel(gpu):
    problem = Problem(128, 128, 128)
    config = load_space("tiled").seed_configs(problem, gpu.limits)[0]
    return compile_shader(render(config, problem), gpu)


def test_timestamps_agree_with_wall_clock(gpu, known_kernel):
    if not gpu.has_timestamps:
        pytest.skip("adapter has no timestamp-query")
    m = measure(known_kernel, gpu, min_pass_s=0.02, passes=5)
    assert m.method == "timestamp"
    assert m.repeats * m.median_s >= 0.015  # the pass was sized to >= min_pass_s
    # The stated bound: per dispatch, the wall clock (submit to done, including
    # submission overhead) is within 0.8x-1.5x of the GPU's own timestamps.
    assert 0.8 * m.median_s <= m.wall_median_s <= 1.5 * m.median_s, m
    assert m.p20_s <= m.median_s <= m.p80_s


def test_wall_clock_fallback_is_recorded(gpu, known_kernel):
    m = measure(known_kernel, gpu, use_timestamps=False, min_pass_s=0.01, passes=3)
    assert m.method == "wall" and m.median_s > 0 and m.median_s == m.wall_median_s


def test_too_slow_candidate_is_cut_short(gpu, known_kernel):
    with pytest.raises(TooSlow):
        measure(known_kernel, gpu, max_dispatch_s=1e-9)
