"""Choosing a model's representatives (no GPU: pure selection)."""

import math
from pathlib import Path

import pytest

from autotune.model import DEFAULT_RADIUS, choose_representatives
from autotune.problem import Problem, ProblemError, problems_from_file, shape_distance


def test_the_largest_problem_of_a_group_is_tuned_for_the_others():
    small, large = Problem(16, 4096, 4096), Problem(32, 4096, 4096)
    (a, b) = choose_representatives([small, large])
    assert a.representative == large and math.isclose(a.distance, math.log(2))
    assert b.representative == large and b.distance == 0


def test_every_problem_lies_within_the_radius_of_its_representative():
    problems = [Problem(64 * 3**i // 2**i, 512, 512) for i in range(6)]  # steps of 1.5x in M
    assignments = choose_representatives(problems, radius=0.5)
    reps = {a.representative for a in assignments}
    assert 1 < len(reps) < len(problems)  # some share, not all
    for a in assignments:
        assert math.isclose(a.distance, shape_distance(a.problem, a.representative))
        assert a.distance <= 0.5
        assert a.representative in reps and a.representative.flops >= a.problem.flops


def test_variants_never_share_and_radius_zero_tunes_everything():
    plain, f16, nt = (
        Problem(64, 64, 64),
        Problem(64, 64, 64, "f16"),
        Problem(64, 64, 80, "f32", "nt"),
    )
    near = Problem(64, 64, 80)
    assignments = choose_representatives([plain, f16, nt, near, plain])
    assert [a.problem for a in assignments] == [plain, f16, nt, near]  # duplicates once
    assert [a.representative for a in assignments] == [near, f16, nt, near]
    assert all(a.representative == a.problem for a in choose_representatives([plain, near], 0))
    assert DEFAULT_RADIUS == 1.0


@pytest.mark.parametrize("radius", [-1, math.nan, math.inf, "1", True, None])
def test_a_bad_radius_is_refused_by_name(radius):
    with pytest.raises(ProblemError, match="radius must be a number") as caught:
        choose_representatives([Problem(8, 8, 8)], radius)
    assert caught.value.field == "radius"


def test_the_example_model_file_tunes_half_its_gemms():
    path = Path(__file__).parent.parent / "benchmarks" / "models" / "llama-7b-layer.toml"
    assignments = choose_representatives(problems_from_file(path))
    assert len(assignments) == 8 and all(p.layout == "nt" for p in (a.problem for a in assignments))
    tuned = {a.representative.shape for a in assignments}
    assert tuned == {"2048x12288x4096", "2048x4096x11008", "16x12288x4096", "16x4096x11008"}
