import itertools
import random

import pytest

from autotune.device import WEBGPU_DEFAULT_LIMITS
from autotune.problem import Problem
from autotune.space import (
    DEFAULT_PASS_NEEDS,
    Config,
    Space,
    SpaceError,
    compile_expression,
    load_space,
    template_names,
)


def brute_force(space: Space, problem, limits):
    """Every raw combination that why_invalid accepts: the slow, obvious definition."""
    names = list(space.params)
    found = []
    for values in itertools.product(*space.params.values()):
        config = Config.make(space.template, dict(zip(names, values, strict=True)))
        if space.why_invalid(config, problem, limits) is None:
            found.append(config)
    return sorted(found)


PROBLEMS = [
    Problem(1024, 1024, 1024), Problem(1, 17, 999), Problem(367, 367, 367), Problem(64, 4096, 6)
]  # fmt: skip


@pytest.mark.parametrize("template", ["naive", "tiled"])
@pytest.mark.parametrize("problem", PROBLEMS)
def test_enumeration_is_exactly_the_valid_set(template, problem):
    space = load_space(template)
    assert sorted(space.configs(problem, WEBGPU_DEFAULT_LIMITS)) == brute_force(
        space, problem, WEBGPU_DEFAULT_LIMITS
    )


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.slow
def test_enumeration_of_a_large_space_is_the_valid_set(problem):
    """blocked has 810,000 raw combinations (over a minute per problem to classify them
    all), so: every enumerated config is valid, and every valid one among 20,000 drawn at
    random is enumerated."""
    space = load_space("blocked")
    enumerated = set(space.configs(problem, WEBGPU_DEFAULT_LIMITS))
    assert all(space.why_invalid(c, problem, WEBGPU_DEFAULT_LIMITS) is None for c in enumerated)
    rng = random.Random(0)
    drawn = [
        Config.make("blocked", {name: rng.choice(values) for name, values in space.params.items()})
        for _ in range(20_000)
    ]
    valid = [c for c in drawn if space.why_invalid(c, problem, WEBGPU_DEFAULT_LIMITS) is None]
    assert len(valid) > 10  # the draw reaches the valid set (1,368 configs for 1x17x999)
    assert all(c in enumerated for c in valid)


def test_space_sizes_for_1024_cubed():
    problem = Problem(1024, 1024, 1024)
    sizes = {
        t: len(load_space(t).configs(problem, WEBGPU_DEFAULT_LIMITS)) for t in template_names()
    }
    assert sizes["naive"] > 10 and sizes["tiled"] > 20 and sizes["blocked"] > 1000


def test_limits_shrink_the_space_and_are_named():
    space = load_space("blocked")
    problem = Problem(1024, 1024, 1024)
    small = dict(WEBGPU_DEFAULT_LIMITS, **{"max-compute-workgroup-storage-size": 4096})
    assert len(space.configs(problem, small)) < len(space.configs(problem, WEBGPU_DEFAULT_LIMITS))
    big = Config.make(
        "blocked",
        dict(
            VEC=4, BM=128, TM=8, BN=128, TN=8, BK=32, PAD=0, UNROLL=1, DB=0, AT=0, GROUP=1, WARP=0
        ),
    )
    assert "max-compute-workgroup-storage-size" in space.why_invalid(big, problem, small)


def test_needs_are_derived_per_config():
    space = load_space("tiled")
    config = Config.make("tiled", dict(TX=16, TY=16, TK=16, PAD=1))
    values = space.context(config, Problem(100, 100, 100))
    assert values["invocations"] == 256
    assert values["workgroup_storage"] == 4 * (16 * 17 + 16 * 17)
    assert (values["grid_x"], values["grid_y"]) == (7, 7)


@pytest.mark.slow
def test_every_vector_width_is_valid_and_moves_only_whole_vectors():
    """At N or K that VEC does not divide, vector configs stay valid, and the operands
    whose rows are not whole vectors are moved as scalars (AV for A, BV and CV for B, C)."""
    space = load_space("blocked")
    for problem in (Problem(64, 63, 64), Problem(64, 64, 66)):
        configs = space.configs(problem)
        assert {c["VEC"] for c in configs} == {1, 2, 4}
        for config in configs[:: max(1, len(configs) // 500)]:
            context, vec = space.context(config, problem), config["VEC"]
            assert context["AV"] == (vec if problem.K % vec == 0 else 1)
            assert context["BV"] == context["CV"] == (vec if problem.N % vec == 0 else 1)


def test_every_space_has_a_valid_seed_for_tiny_and_ragged_shapes():
    for problem in (Problem(1, 1, 1), Problem(1, 4097, 3), Problem(999, 1, 1)):
        assert load_space("blocked").seed_configs(problem, WEBGPU_DEFAULT_LIMITS)
        assert load_space("naive").seed_configs(problem, WEBGPU_DEFAULT_LIMITS)


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",
        "M.real",
        "open('x')",
        "[M]",
        "M if N else K",
        "lambda: 1",
        "M ** 2",
        "'text'",
        "x" * 600,
    ],
)
def test_expressions_refuse_anything_but_integer_arithmetic(text):
    with pytest.raises(SpaceError):
        compile_expression(text)


def test_expressions_compute():
    function, reads = compile_expression("cdiv(M, 16) * 2 + max(N, 3) % 5 - (K >= 2 and not 0)")
    assert reads == {"M", "N", "K"}
    assert function({"M": 17, "N": 9, "K": 2}) == 2 * 2 + 9 % 5 - 1


def test_a_division_by_zero_names_the_expression_and_its_values():
    """A divisor some problem makes 0 (a derived value of a weight format the space
    refuses later, say) is the space's fault: said as such, not a ZeroDivisionError."""
    function, _ = compile_expression("cdiv(K, QG // 4) + M % QW")
    with pytest.raises(SpaceError, match=r"divides by zero at K=64, M=3, QG=0, QW=8"):
        function({"K": 64, "M": 3, "QG": 0, "QW": 8})
    assert function({"K": 64, "M": 3, "QG": 32, "QW": 8}) == 11


@pytest.mark.parametrize(
    "text, words",
    [
        ("[params]\nX = [1]\n", "must derive"),
        ("[params]\nM = [1]\n", "bad parameter name"),
        ("[params]\nX = ['a']\n", "must list integers"),
        (
            "[params]\nX = [1]\n[derived]\n"
            + "\n".join(f"{n} = '1'" for n in DEFAULT_PASS_NEEDS)
            + "\n[constraints]\nc = 'Y > 1'\n",
            "reads",
        ),
        ("not toml = = 1", "search space"),
    ],
)
def test_malformed_space_files_are_refused(text, words):
    with pytest.raises(SpaceError, match=words):
        Space.from_toml(text, "bad")


def test_unknown_template():
    with pytest.raises(SpaceError, match="known: blocked, blockedx, .*naive, .*tiled"):
        load_space("../etc/passwd")


@pytest.mark.parametrize(
    "table, why",
    [
        ('drop = ["x"]', "drop without extends"),
        ('extends = "blockedx"\ndrop = ["no_such_rule"]', "drop must list constraints"),
        ('extends = "blockedx"\ndrop = 5', "drop must list constraints"),
        ('extends = "blockedx"\ndrop = [{a = 1}]', "drop must list constraints"),
        ('extends = "splitk"', "extends another"),
        ('extends = "mine"', "extends 'mine'"),
    ],
)
def test_an_extension_is_checked(table, why):
    text = f"{table}\n[params]\nX = [1]\n"
    with pytest.raises(SpaceError, match=why):
        Space.from_toml(text, "mine")


def test_an_extension_takes_the_base_s_rules_and_drops_what_it_names():
    text = 'extends = "blockedx"\ndrop = ["variant_problems_only"]\nvariants = true\n'
    text += "[params]\nX = [1, 2]\n"
    space = Space.from_toml(text, "mine")
    assert set(space.params) == set(load_space("blockedx").params) | {"X"}
    assert "variant_problems_only" not in {c.name for c in space.constraints}
    assert space.first_config(Problem(64, 64, 64)) is not None  # the plain problem too
