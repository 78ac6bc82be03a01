"""The variant problems (f16, transposed operands, batches, fused epilogue): each
rendered, compiled, verified against float64 NumPy on odd shapes, run through the API,
keyed in the cache; and the checks must be able to fail."""

import json
import random

import numpy as np
import pytest

import autotune
from autotune import cache
from autotune.compile import compile_shader
from autotune.data import data_path
from autotune.kernel import check_features
from autotune.key import Key
from autotune.measure import measure
from autotune.problem import Problem, ProblemError
from autotune.render import render
from autotune.space import load_space
from autotune.verify import Reference, tolerance, verify

# Odd and prime sizes: ragged tiles everywhere; the vector widths the sizes allow.
PROBLEMS = [
    Problem(37, 41, 29, "f16"),
    Problem(36, 44, 40, "f16", "nt"),
    Problem(37, 44, 28, "f32", "nt"),
    Problem(36, 44, 28, "f32", "tn"),
    Problem(36, 41, 28, "f16", "tt", 2),
    Problem(33, 20, 19, "f32", "nn", 3),
    Problem(33, 20, 24, "f32", "nt", 3, True),
    Problem(33, 20, 19, "f32", "nn", 1, False, "alpha,beta,bias,gelu"),
    Problem(36, 44, 28, "f16", "tt", 2, False, "bias,relu"),
    Problem(68, 72, 40, "f16", "nt", 2, False, "alpha,beta,bias,gelu"),
    Problem(67, 72, 40, "f32", "tn", 3, True, "beta"),
]


def test_plain_problem_keeps_the_blocked_template_and_its_shipped_entries():
    """The blocked template serves the plain problem only, and every shipped cache entry
    is current: its config still renders the kernel it was tuned as (a template change
    that renders other WGSL for a shipped entry needs that entry tuned again)."""
    templates = set()
    for path in data_path("cache").glob("*.json"):
        for text, value in json.loads(path.read_text())["entries"].items():
            entry = cache.Entry.from_json(text, value)
            assert cache.is_current(entry), f"{path.name}: {text} is stale"
            templates.add(entry.key.template)
    assert {"blocked", "blockedx"} <= templates
    variant = Problem(64, 64, 64, "f16")
    for template in ("blocked", "tiled", "naive"):
        space = load_space(template)
        assert space.first_config(variant) is None
        reason = space.why_invalid(space.first_config(Problem(64, 64, 64)), variant)
        assert reason.startswith("plain_problem_only")
    blockedx = load_space("blockedx")
    assert blockedx.first_config(Problem(64, 64, 64)) is None
    assert blockedx.why_invalid(blockedx.seed_configs(variant)[0], Problem(64, 64, 64)).startswith(
        "variant_problems_only"
    )


def test_operands_are_moved_in_vectors_along_their_contiguous_dimension():
    """A vector config is valid at any size: an operand whose rows are not whole vectors
    (along m for a column-major A, k for a row-major A or a column-major B, n for C) is
    bound as scalars, the others keep vector loads."""
    space = load_space("blockedx")
    vec4 = next(c for c in space.seed_configs(Problem(64, 64, 64, "f16", "nt")) if c["VEC"] == 4)

    def widths(problem):
        assert space.why_invalid(vec4, problem) is None
        context = space.context(vec4, problem)
        return context["AV"], context["BV"], context["CV"]

    assert widths(Problem(64, 64, 30, "f32", "nt")) == (1, 1, 4)  # K: A's and B's rows
    assert widths(Problem(66, 64, 64, "f32", "tn")) == (1, 4, 4)  # M: a column-major A's
    assert widths(Problem(66, 64, 64, "f32", "nt")) == (4, 4, 4)  # M is free otherwise
    assert widths(Problem(64, 66, 64, "f32", "nn", batch=2)) == (4, 1, 1)  # N: B's, C's
    assert widths(Problem(64, 66, 64, "f32", "nt")) == (4, 4, 1)
    wgsl = render(vec4, Problem(64, 66, 30, "f32", "nt", epilogue="bias")).wgsl
    for operand in ("A", "B", "C", "bias"):
        assert f"var<storage, read> {operand}: array<f32>" in wgsl or (
            f"var<storage, read_write> {operand}: array<f32>" in wgsl
        ), operand
    acc16 = dict(vec4.as_dict(), ACC=1)
    config = type(vec4).make("blockedx", acc16)
    assert space.why_invalid(config, Problem(64, 64, 64, "f32", "nt")).startswith("acc_f16")


def test_render_variants():
    space = load_space("blockedx")
    f16 = Problem(64, 64, 64, "f16", "nt", 4, True, "bias,gelu")
    shader = render(space.seed_configs(f16)[0], f16)
    assert shader.wgsl.startswith("enable f16;\n")
    assert (
        shader.plan.passes[0].grid[2] == 4 and "fn gelu" in shader.wgsl and "bias[c]" in shader.wgsl
    )
    assert "@binding(4) var<storage, read> bias" in shader.wgsl
    plain_f32 = Problem(64, 64, 64, "f32", "tn")
    assert "enable f16" not in render(space.seed_configs(plain_f32)[0], plain_f32).wgsl


def test_shader_f16_missing_is_named():
    with pytest.raises(ProblemError, match="needs the feature shader-f16") as raised:
        check_features(Problem(8, 8, 8, "f16"), frozenset({"timestamp-query"}), "some GPU")
    assert raised.value.field == "dtype"
    check_features(Problem(8, 8, 8, "f16"), frozenset({"shader-f16"}))
    check_features(Problem(8, 8, 8), frozenset())


def test_tolerance_per_dtype_and_accumulation():
    assert tolerance(Problem(4, 4, 4096, "f16"), "f16") == pytest.approx(0.25, rel=0.05)
    assert tolerance(Problem(4, 4, 64, "f16"), "f16") == pytest.approx(0.039, rel=0.01)
    # f16 inputs accumulated in f32: the f32 bound (the output's rounding is added apart)
    assert tolerance(Problem(4, 4, 64, "f16")) == tolerance(Problem(4, 4, 64))


def test_cache_keys_of_variants():
    plain_problem = Problem(8, 16, 32)
    plain = Key.of(plain_problem, load_space("blocked").seed_configs(plain_problem)[0], True)
    assert str(plain).endswith(":checks:f32:nn:device:8x16x32:b1:none")
    problem = Problem(8, 16, 32, "f16", "nt", 8, True, "bias,gelu")
    key = Key.of(problem, load_space("blockedx").first_config(problem), False)
    assert str(key).endswith(":nochecks:f16:nt:device:8x16x32:b8s:bias,gelu")
    assert Key.parse(str(key)) == key and key.problem == problem
    for bad in (":b0:none", ":b2:tanh", ":b2:gelu,bias", ":b1s:none", ":x:none"):
        with pytest.raises(ValueError):
            Key.parse(str(key).rsplit(":", 2)[0] + bad)
    pinned_problem = Problem(8, 16, 32, "f16", accumulate="f32")
    pinned = Key.of(pinned_problem, load_space("blockedx").first_config(pinned_problem), True)
    assert ":f16-acc32:nn:" in str(pinned) and Key.parse(str(pinned)).problem.accumulate == "f32"
    for bad in ("f32-acc32", "f16-acc64", "f16-acc"):
        with pytest.raises(ValueError):
            Key.parse(str(pinned).replace("f16-acc32", bad))


@pytest.mark.slow
def test_accumulation_can_be_pinned():
    space = load_space("blockedx")
    for accumulate, values in (("auto", {0, 1}), ("f32", {0}), ("f16", {1})):
        configs = space.configs(Problem(64, 64, 64, "f16", "nt", accumulate=accumulate))
        assert {c["ACC"] for c in configs} == values
    assert Problem(8, 8, 8, accumulate="f32") == Problem(8, 8, 8)  # f32 always is
    with pytest.raises(ProblemError, match="accumulate f16 needs dtype f16"):
        Problem(8, 8, 8, accumulate="f16")


@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_variant_configs_verify(gpu, problem):
    """The seeds and a few random configs (vector widths, AT, DB, GROUP, accumulation)."""
    space = load_space("blockedx")
    configs = space.configs(problem, gpu.limits)
    sample = random.Random(str(problem)).sample(configs, 3) + space.seed_configs(problem)[:2]
    reference = Reference(problem, seed=1)
    for config in dict.fromkeys(sample):
        verdict = verify(compile_shader(render(config, problem), gpu), gpu, reference=reference)
        assert verdict.ok, f"{config}: {verdict.reason}"


def test_f16_accumulation_verifies(gpu):
    problem = Problem(64, 72, 96, "f16", "nt", 1, False, "bias")
    configs = [c for c in load_space("blockedx").configs(problem, gpu.limits) if c["ACC"]]
    reference = Reference(problem, seed=2)
    for config in random.Random(5).sample(configs, 3):
        verdict = verify(compile_shader(render(config, problem), gpu), gpu, reference=reference)
        assert verdict.ok and verdict.tolerance > 0.01, f"{config}: {verdict}"


@pytest.mark.parametrize(
    "problem", [Problem(70, 72, 40, "f32", "nt", 2), Problem(37, 64, 72, "f16", "nn")], ids=str
)
def test_swizzled_staging_verifies(gpu, assert_sample_is_correct, problem):
    """SWZ re-maps which invocation stages which block of A (staged transposed) and of a
    column-major B; ragged M puts some of those blocks past the edge."""
    configs = [c for c in load_space("blockedx").configs(problem, gpu.limits) if c["SWZ"]]
    assert any(c["AT"] for c in configs)
    assert_sample_is_correct(problem, configs, seed=6, count=4)


@pytest.mark.parametrize(
    "right, wrong",
    [
        (
            Problem(40, 40, 40, "f32", "nn", 1, False, "alpha,beta"),
            Problem(40, 40, 40, "f32", "nn", 1, False, "alpha"),
        ),
        (
            Problem(40, 40, 40, "f32", "nt", 1, False, "bias"),
            Problem(40, 40, 40, "f32", "nn", 1, False, "bias"),
        ),
        (Problem(40, 40, 40, "f32", "nt", 1, False, "relu"), Problem(40, 40, 40, "f32", "tn")),
        (Problem(40, 40, 40, "f32", "nt", 3), Problem(40, 40, 40, "f32", "nt", 3, True)),
        (
            Problem(40, 40, 40, "f32", "nt", 1, False, "alpha,gelu"),
            Problem(40, 40, 40, "f32", "nt", 1, False, "alpha,relu"),
        ),
    ],
    ids=["ignores C", "transposes B", "transposes A", "one B for all", "wrong activation"],
)
def test_verification_catches_a_kernel_of_another_variant(gpu, right, wrong):
    """A kernel for `wrong` checked as one for `right` (same buffer sizes) must fail."""
    space = load_space("blockedx")
    config = next(c for c in space.seed_configs(right) if not space.why_invalid(c, wrong))
    reference = Reference(right, seed=3)
    assert verify(compile_shader(render(config, right), gpu), gpu, reference=reference).ok
    assert not verify(compile_shader(render(config, wrong), gpu), gpu, reference=reference).ok


def test_matmul_variants_match_numpy(gpu):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 37, 40)).astype(np.float32)  # a batch of activations
    W = rng.standard_normal((44, 40)).astype(np.float32)  # a linear layer: [N, K]
    b = rng.standard_normal(44).astype(np.float32)
    y = autotune.matmul(x, W, bias=b, activation="relu", trans_b=True)
    np.testing.assert_allclose(y, np.maximum(x @ W.T + b, 0), rtol=1e-4, atol=1e-4)
    A = rng.uniform(-1, 1, (33, 29)).astype(np.float16)
    B = rng.uniform(-1, 1, (29, 31)).astype(np.float16)
    C = autotune.matmul(A, B)
    assert C.dtype == np.float16
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=2e-3, atol=2e-3)
    C0 = rng.standard_normal((33, 31)).astype(np.float32)
    A32, B32 = A.astype(np.float32), B.astype(np.float32)
    got = autotune.matmul(A32.T.copy(), B32, C0, alpha=2.0, beta=0.5, trans_a=True)
    np.testing.assert_allclose(got, 2 * A32 @ B32 + 0.5 * C0, rtol=1e-4, atol=1e-4)
    kernel = autotune.lookup(33, 31, 29, layout="tn", epilogue="alpha,beta")
    again = kernel(A32.T.copy(), B32, C0, alpha=-1.0, beta=0.0)  # other scalars, same kernel
    np.testing.assert_allclose(again, -(A32 @ B32), rtol=1e-4, atol=1e-4)
    with pytest.raises(ProblemError, match="this kernel computes"):
        kernel(A32.T.copy(), B32, C0, bias=np.zeros(31, np.float32))  # another problem


@pytest.mark.parametrize("epilogue", ["alpha,beta,bias", "bias,gelu"])
def test_large_variants_are_checked_by_sampling(gpu, epilogue):
    """Above FULL_CHECK_FLOPS the check samples batch items, rows, columns (and, for a
    linear epilogue, Freivalds' test): a right kernel passes, one ignoring C or the bias
    fails, as does one that skips a batch item (one B where there are two)."""
    problem = Problem(520, 516, 512, "f32", "nt", 2, False, epilogue)
    reference = Reference(problem, seed=4)
    assert not reference.full
    config = load_space("blockedx").seed_configs(problem, gpu.limits)[0]
    compiled = compile_shader(render(config, problem), gpu)
    assert verify(compiled, gpu, reference=reference).ok
    assert measure(compiled, gpu, passes=3, budget_s=0.5).median_s > 0
    without = {"alpha,beta,bias": "alpha", "bias,gelu": "gelu"}[epilogue]  # C, bias ignored
    for wrong in (
        Problem(520, 516, 512, "f32", "nt", 2, False, without),
        Problem(520, 516, 512, "f32", "nt", 2, True, epilogue),
    ):
        bad = compile_shader(render(config, wrong), gpu)
        assert not verify(bad, gpu, reference=reference).ok, wrong


def test_f16_manifest_sizes_are_whole_words(gpu):
    from autotune.export import manifest
    from autotune.kernel import Kernel

    problem = Problem(37, 41, 29, "f16", "tn", 1, False, "bias")
    config = load_space("blockedx").seed_configs(problem)[0]
    data = manifest(Kernel(problem, config, "default", gpu=gpu), "odd")
    sizes = {b["name"]: b.get("size_bytes") for b in data["buffers"]}
    assert sizes == {"A": 29 * 37 * 2 + 2, "B": 29 * 41 * 2 + 2, "C": 37 * 41 * 2 + 2,
                     "dims": 32, "bias": 41 * 2 + 2}  # fmt: skip
    assert data["required_features"] == ["shader-f16"] and data["accumulation"] == "f32"


@pytest.mark.slow
def test_pinned_f16_entries_answer_auto_accumulation(gpu, tmp_path):
    """Tuned with f16 accumulation pinned, the entry serves "auto" (the tuner's choice)
    but not a problem that pins f32 accumulation."""
    tuned = autotune.tune(
        24, 32, 40, "f16", accumulate="f16", trials=2, cache_dir=tmp_path, gpu=gpu
    )
    assert tuned.entry is not None and tuned.entry.params["ACC"] == 1
    auto = autotune.lookup(24, 32, 40, "f16", cache_dir=tmp_path, gpu=gpu)
    assert auto.source == "exact" and auto.config["ACC"] == 1
    f32 = autotune.lookup(24, 32, 40, "f16", accumulate="f32", cache_dir=tmp_path, gpu=gpu)
    assert f32.source != "exact" and f32.config["ACC"] == 0
    A, B = (
        np.random.default_rng(4).uniform(-1, 1, s).astype(np.float16) for s in ((24, 40), (40, 32))
    )
    np.testing.assert_allclose(auto(A, B), A.astype(np.float64) @ B, rtol=2e-2, atol=2e-2)
