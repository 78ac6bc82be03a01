"""Split-K: K cut into ranges whose partial products a second pass sums in a fixed order.
For small M x N with long K, where one tile grid leaves most of the GPU idle."""

import json
import random

import numpy as np
import pytest

import autotune
from autotune.compile import compile_shader
from autotune.kernel import Kernel
from autotune.problem import Problem
from autotune.render import render
from autotune.space import Config, load_space
from autotune.verify import verify

SPLITK = load_space("splitk")


def _verified(gpu, problem, configs):
    for config in configs:
        verdict = verify(compile_shader(render(config, problem), gpu, checks=False), gpu)
        assert verdict.ok, (str(problem), str(config), verdict.reason)


@pytest.mark.parametrize(
    "problem",
    [
        Problem(37, 29, 531),  # the plain problem, odd sizes: the last range is shorter
        Problem(40, 48, 100, "f32", "tn", batch=2, epilogue="bias,gelu"),
    ],
    ids=str,
)
def test_the_known_good_configs_compute_the_product(gpu, problem):
    configs = SPLITK.seed_configs(problem, gpu.limits)
    assert configs
    _verified(gpu, problem, configs)


@pytest.mark.parametrize(
    "problem",
    [
        Problem(20, 24, 328, "f32", "nn", 2, False, "alpha,beta"),
        Problem(20, 24, 328, "f32", "nt", 2, True, "bias"),
        Problem(16, 32, 256, "f32", "tt", 2, False, "relu"),
        Problem(16, 32, 256, "f32", "tn", 2, True),
    ],
    ids=str,
)
def test_each_layout_and_batch_gets_its_range_of_k(gpu, problem):
    """The K-range offsets differ per layout (a row of A or B, or a step along its
    rows) and per batch item: the smallest known-good config of each, at two items."""
    _verified(gpu, problem, SPLITK.seed_configs(problem, gpu.limits)[-1:])


@pytest.mark.slow
@pytest.mark.parametrize(
    "problem",
    [
        Problem(64, 64, 4096),
        Problem(32, 64, 256, "f16", "nt", epilogue="alpha,beta,relu"),
        Problem(33, 20, 200, "f16", "tt", 3, True, "alpha,beta,relu", "f16"),
        Problem(16, 16, 1000, "f32", "nt", batch=2),
    ],
    ids=str,
)
def test_sampled_configs_compute_every_variant(gpu, problem):
    """Layouts, f16 (and f16 accumulation), batches and a shared B, the epilogue applied
    once after the sum (beta * C and the bias added once, not once per range)."""
    configs = SPLITK.configs(problem, gpu.limits)
    _verified(gpu, problem, random.Random(str(problem)).sample(configs, 4))


def test_each_range_is_whole_slices_and_none_is_empty():
    problem = Problem(64, 64, 100)
    config = SPLITK.seed_configs(problem)[-1]  # BK = 8
    split = lambda s: Config.make("splitk", config.as_dict() | {"SPLIT": s})  # noqa: E731
    values = SPLITK.context(split(2), problem)
    assert values["KC"] == 56 and values["KC"] % values["BK"] == 0  # 56 + 44
    # 64 ranges of 8 would leave the last 50 empty
    assert "every_range_has_k" in SPLITK.why_invalid(split(64), problem)


def test_the_plan_is_a_split_pass_then_a_reduction():
    problem = Problem(40, 48, 100, "f32", "tn", batch=2, epilogue="bias")
    config = SPLITK.seed_configs(problem)[0]
    plan = render(config, problem).plan
    main, reduce = plan.passes
    split = config["SPLIT"]
    assert (main.entry_point, reduce.entry_point) == ("main", "reduce")
    assert main.grid[2] == 2 * split and reduce.grid[1:] == (40, 2)
    (workspace,) = plan.workspaces
    assert workspace.size == 4 * 2 * split * 40 * 48  # f32 partial products


def test_results_are_the_same_bits_every_run(gpu):
    problem = Problem(24, 32, 777)
    config = SPLITK.seed_configs(problem, gpu.limits)[0]
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((24, 777), np.float32), rng.standard_normal((777, 32), np.float32)
    kernel = Kernel(problem, config, "default", gpu=gpu)
    first = kernel(A, B)
    assert config["SPLIT"] > 1 and all(np.array_equal(first, kernel(A, B)) for _ in range(3))


def test_the_template_renders_blockedx_with_the_k_range_cut():
    """split-K extends blockedx (one blocking, one space): its kernel is blockedx's with
    the range arithmetic, the partial write and the reduction."""
    problem = Problem(64, 64, 4096)
    config = SPLITK.seed_configs(problem)[0]
    wgsl = render(config, problem).wgsl
    assert "fn reduce(" in wgsl and "partials[pbase" in wgsl and "k0 < KL" in wgsl
    assert set(load_space("blockedx").params) < set(SPLITK.params)


@pytest.mark.slow
def test_tuned_cached_looked_up_and_exported(gpu, tmp_path):
    result = autotune.tune(
        32, 32, 2048, templates=["splitk"], trials=3, cache_dir=tmp_path, gpu=gpu
    )
    assert result.entry is not None and result.entry.config.template == "splitk"
    kernel = autotune.lookup(32, 32, 2048, cache_dir=tmp_path, gpu=gpu)
    assert kernel.source == "exact" and kernel.config == result.entry.config
    paths = autotune.export(kernel, tmp_path / "out", name="splitk")
    manifest = json.loads(paths["json"].read_text())
    assert [p["entry_point"] for p in manifest["passes"]] == ["main", "reduce"]
