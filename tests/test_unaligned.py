"""Vector configs at sizes their vector width does not divide: the operands whose rows are
not whole vectors are moved as scalars, the rest of the kernel (workgroup memory, the
register tile) keeps its vectors. Every layout, f16, batch and epilogue, each checked
against float64 on the real adapter."""

import random

import pytest

from autotune.compile import compile_shader
from autotune.problem import Problem
from autotune.render import render
from autotune.space import Config, load_space
from autotune.verify import verify

ODD = [  # (problem, templates): each misaligns other operands
    (Problem(33, 70, 61), ("blocked", "splitk")),  # K odd: A's rows; N: B's and C's
    (Problem(66, 30, 99, "f32", "tn", epilogue="bias,gelu"), ("blockedx", "splitk")),
    (Problem(17, 45, 131, "f32", "nt", batch=2, epilogue="alpha,beta,relu"), ("blockedx",)),
    (Problem(40, 52, 77, "f16", "tt", epilogue="beta"), ("blockedx", "splitk")),
    (Problem(5, 129, 67, "f16", "nt", batch=2, epilogue="bias"), ("blockedx", "splitk")),
    (Problem(7, 45, 250, "f32", "nn", batch=2, shared_b=True), ("blockedx", "splitk")),
]


def misaligned_configs(template: str, problem: Problem, limits, count: int, seed: int):
    """Up to `count` valid configs of vector width 2 or 4 at `problem`, sampled at random
    (listing the whole space at an odd size takes long), each with at least one operand
    moved as scalars."""
    space, rng, found = load_space(template), random.Random(seed), []
    for _ in range(4000):
        params = {name: rng.choice(list(values)) for name, values in space.params.items()}
        params["VEC"] = rng.choice([2, 4, 4])
        config = Config.make(template, params)
        if config in found or space.why_invalid(config, problem, limits):
            continue
        context = space.context(config, problem)
        if min(context["AV"], context["BV"], context["CV"]) < config["VEC"]:
            found.append(config)
            if len(found) == count:
                break
    return found


@pytest.mark.parametrize(
    "problem, template",
    [(problem, template) for problem, templates in ODD for template in templates],
    ids=str,
)
def test_vector_configs_compute_sizes_they_do_not_divide(gpu, problem, template):
    if problem.dtype == "f16" and "shader-f16" not in gpu.features:
        pytest.skip("the adapter lacks shader-f16")
    configs = misaligned_configs(template, problem, gpu.limits, count=3, seed=len(str(problem)))
    assert configs, f"no vector config of {template} fits {problem}"
    for config in configs:
        for checks in (False, True):
            compiled = compile_shader(render(config, problem), gpu, checks=checks)
            verdict = verify(compiled, gpu)
            assert verdict.ok, f"{config} checks={checks}: {verdict.reason}"


def test_aligned_operands_keep_their_vector_loads():
    """Only the misaligned operand changes: at K odd a plain problem's B and C stay vec4."""
    config = load_space("blocked").seed_configs(Problem(64, 64, 64))[0]
    assert config["VEC"] == 4
    wgsl = render(config, Problem(64, 64, 61)).wgsl
    assert "var<storage, read> A: array<f32>;" in wgsl
    assert "var<storage, read> B: array<vec4<f32>>;" in wgsl
    assert "var<storage, read_write> C: array<vec4<f32>>;" in wgsl
    aligned = render(config, Problem(64, 64, 64)).wgsl
    assert "var<storage, read> A: array<vec4<f32>>;" in aligned
