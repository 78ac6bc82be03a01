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

# (problem, templates, pinned parameters, the widths A, B and C are moved in at VEC = 4)
ODD = [
    (Problem(33, 70, 61), ("blocked", "splitk"), {}, (1, 1, 1)),  # K odd: A's rows; N: B's, C's
    (Problem(64, 64, 61), ("blocked",), {"DB": 2}, (1, 4, 4)),  # two workgroup buffers
    (Problem(40, 45, 64), ("blocked",), {"AT": 1}, (4, 1, 1)),  # A staged transposed
    (Problem(66, 30, 99, "f32", "tn", epilogue="bias,gelu"), ("blockedx", "splitk"), {},
     (1, 1, 1)),
    (Problem(40, 45, 64, "f32", "tn"), ("blockedx",), {}, (4, 1, 1)),  # M whole, N odd
    (Problem(37, 44, 128, "f32", "tn", batch=2), ("blockedx", "splitk"), {}, (1, 4, 4)),
    (Problem(40, 45, 64, "f32", "nt", epilogue="alpha,beta,bias"), ("blockedx", "splitk"), {},
     (4, 4, 1)),  # B's rows whole (along K), each of its columns tested against N
    (Problem(17, 45, 131, "f32", "nt", batch=2, epilogue="alpha,beta,relu"), ("blockedx",), {},
     (1, 1, 1)),
    (Problem(40, 52, 77, "f16", "tt", epilogue="beta"), ("blockedx", "splitk"), {}, (4, 1, 4)),
    (Problem(5, 129, 67, "f16", "nt", batch=2, epilogue="bias"), ("blockedx", "splitk"), {},
     (1, 1, 1)),
    (Problem(7, 45, 252, "f32", "nn", batch=2, shared_b=True), ("blockedx", "splitk"), {},
     (4, 1, 1)),
]  # fmt: skip


def misaligned_configs(template, problem, limits, count: int, seed: int, pinned) -> list:
    """Up to `count` valid configs of vector width 4 at `problem` with `pinned` parameters,
    sampled at random (listing the whole space at an odd size takes long)."""
    space, rng, found = load_space(template), random.Random(seed), []
    for _ in range(4000):
        params = {name: rng.choice(list(values)) for name, values in space.params.items()}
        config = Config.make(template, params | {"VEC": 4} | pinned)
        if config not in found and not space.why_invalid(config, problem, limits):
            found.append(config)
            if len(found) == count:
                break
    return found


@pytest.mark.parametrize(
    "problem, template, pinned, widths",
    [(p, t, pinned, widths) for p, templates, pinned, widths in ODD for t in templates],
    ids=str,
)
def test_vector_configs_compute_sizes_they_do_not_divide(gpu, problem, template, pinned, widths):
    if problem.dtype == "f16" and "shader-f16" not in gpu.features:
        pytest.skip("the adapter lacks shader-f16")
    configs = misaligned_configs(template, problem, gpu.limits, 3, len(str(problem)), pinned)
    assert len(configs) == 3, f"too few vector configs of {template} fit {problem}"
    space = load_space(template)
    for config in configs:
        context = space.context(config, problem)
        assert (context["AV"], context["BV"], context["CV"]) == widths
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


BLOCKED = dict(VEC=4, PAD=1, UNROLL=1, DB=1, GROUP=1, WARP=0)
BLOCKEDX = dict(VEC=4, PAD=1, UNROLL=1, DB=1, GROUP=1, SWZ=0, ACC=0)
# How invocations take an operand's scalars depends on the runs' length (BK, or BM or BN
# for a run along M or N) and the invocations per workgroup (THREADS): runs whole per
# 32 invocations (THREADS a multiple of the run) or an invocation per position (the run a
# multiple of THREADS); stored transposed, patches of 4 lines x 8 positions, whose index
# has two forms (THREADS / 32 a multiple of the run's 8-position blocks or not). The cases
# here take each form, with and without two workgroup buffers.
STAGING = [
    (Problem(20, 61, 64), "blocked", dict(BLOCKED, AT=0, BM=16, TM=4, BN=64, TN=8, BK=16)),
    (Problem(70, 64, 61), "blocked", dict(BLOCKED, AT=1, BM=32, TM=4, BN=64, TN=8, BK=32)),
    (Problem(70, 64, 61), "blocked", dict(BLOCKED, AT=1, BM=32, TM=4, BN=64, TN=8, BK=16, DB=2,
                                          PAD=0)),
    (Problem(70, 64, 61), "blocked", dict(BLOCKED, AT=1, BM=32, TM=4, BN=64, TN=8, BK=8)),
    (Problem(70, 64, 61), "blocked", dict(BLOCKED, AT=1, BM=32, TM=8, BN=64, TN=8, BK=16)),
    (Problem(40, 48, 61, "f32", "nt"), "blockedx",
     dict(BLOCKEDX, AT=0, BM=32, TM=4, BN=32, TN=4, BK=32)),
    (Problem(40, 48, 61, "f32", "nt"), "splitk",
     dict(BLOCKEDX, AT=1, BM=32, TM=4, BN=32, TN=4, BK=16, SPLIT=2, RW=64)),
]  # fmt: skip


@pytest.mark.parametrize("problem, template, params", STAGING, ids=str)
def test_scalar_operands_staged_in_each_index_form(gpu, problem, template, params):
    config = Config.make(template, params)
    assert load_space(template).why_invalid(config, problem, gpu.limits) is None
    for checks in (False, True):
        verdict = verify(compile_shader(render(config, problem), gpu, checks=checks), gpu)
        assert verdict.ok, f"{config} checks={checks}: {verdict.reason}"
