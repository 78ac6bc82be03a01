"""Split-K with quantized weights (`qsplitk`): qgemm's tile over ranges of K, whose partial
products a second pass sums in a fixed order, then scales and puts through the epilogue.
For a few dozen rows, where qgemm's tile grid alone leaves most of the GPU idle."""

import json

import numpy as np
import pytest

import autotune
from autotune.compile import compile_shader
from autotune.kernel import Kernel
from autotune.problem import Problem
from autotune.render import render
from autotune.space import Config, load_space
from autotune.verify import Reference, verify

QSPLITK = load_space("qsplitk")


def _verified(gpu, problem, configs):
    reference = Reference(problem)
    assert configs, f"no config at {problem}"
    for config in configs:
        compiled = compile_shader(render(config, problem), gpu, checks=False)
        verdict = verify(compiled, gpu, reference=reference)
        assert verdict.ok, (str(problem), str(config), verdict.reason)


# Every format; ragged M, N and K (the last range shorter, a word past the row's end);
# a q8 row scale applied once after the sum; f16 with alpha, beta and ReLU (beta * C
# added once, not once per range); a batch sharing one weight, with a bias.
PROBLEMS = [
    Problem(37, 29, 531, "f32", "nt", weights="q4g32"),
    Problem(40, 66, 600, "f32", "nt", epilogue="bias,gelu", weights="q8"),
    Problem(33, 70, 520, "f16", "nt", epilogue="alpha,beta,relu", weights="q4g128z"),
    Problem(20, 36, 256, "f32", "nt", 2, True, "bias", weights="q4g64"),
    Problem(40, 37, 595, "f32", "nt", weights="q4g32z"),  # 19 groups: 3 words of zeros
]


@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_the_known_good_configs_compute_every_format_and_variant(gpu, problem):
    if problem.dtype == "f16" and "shader-f16" not in gpu.features:
        pytest.skip("the adapter has no shader-f16")
    _verified(gpu, problem, QSPLITK.seed_configs(problem, gpu.limits))


def test_each_range_is_whole_slices_and_none_is_empty():
    problem = Problem(64, 64, 100, "f32", "nt", weights="q4g32")
    config = QSPLITK.seed_configs(problem)[-1]  # BK = 16
    split = lambda s: Config.make("qsplitk", config.as_dict() | {"SPLIT": s})  # noqa: E731
    values = QSPLITK.context(split(2), problem)
    assert values["KC"] == 64 and values["KC"] % values["BK"] == 0  # 64 + 36
    assert "every_range_has_k" in QSPLITK.why_invalid(split(8), problem)  # 7 x 16 >= 100


def test_the_plan_is_a_split_pass_then_a_reduction():
    problem = Problem(40, 48, 512, "f32", "nt", 2, True, "bias", weights="q4g128")
    config = QSPLITK.seed_configs(problem)[0]
    plan = render(config, problem).plan
    main, reduce = plan.passes
    split = config["SPLIT"]
    assert (main.entry_point, reduce.entry_point) == ("main", "reduce")
    assert main.grid[2] == 2 * split and reduce.grid[1:] == (40, 2)
    (workspace,) = plan.workspaces
    assert workspace.size == 4 * 2 * split * 40 * 48  # f32 partial products


def test_the_template_renders_qgemm_with_the_k_range_cut():
    """qsplitk extends qgemm (one blocking, one space): its kernel is qgemm's with the
    range, the partial write and the reduction; qgemm's own renders no range."""
    problem = Problem(64, 64, 4096, "f32", "nt", weights="q4g128")
    config = QSPLITK.seed_configs(problem)[0]
    wgsl = render(config, problem).wgsl
    assert "fn reduce(" in wgsl and "partials[pbase" in wgsl and "k0 < ke" in wgsl
    assert set(load_space("qgemm").params) < set(QSPLITK.params)
    plain = Config.make(
        "qgemm", {k: v for k, v in config.as_dict().items() if k not in ("SPLIT", "RW")}
    )
    assert "partials" not in render(plain, problem).wgsl


def test_results_are_the_same_bits_every_run(gpu):
    problem = Problem(24, 32, 777, "f32", "nt", weights="q4g32")
    config = QSPLITK.seed_configs(problem, gpu.limits)[0]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((24, 777)).astype(np.float32)
    qw = autotune.quantize(rng.standard_normal((32, 777)).astype(np.float32), bits=4, group=32)
    kernel = Kernel(problem, config, "default", gpu=gpu)
    first = kernel(x, qw)
    assert config["SPLIT"] > 1 and all(np.array_equal(first, kernel(x, qw)) for _ in range(3))


def test_it_computes_only_quantized_weights():
    assert QSPLITK.configs(Problem(64, 64, 256, "f32", "nt")) == []
    assert QSPLITK.configs(Problem(64, 64, 256, "f32", "nt", weights="q8"))


@pytest.mark.slow
def test_tuned_cached_looked_up_and_exported(gpu, tmp_path):
    result = autotune.tune(
        40, 64, 1024, layout="nt", weights="q4g128", templates=["qsplitk"], trials=3,
        cache_dir=tmp_path, gpu=gpu,
    )  # fmt: skip
    assert result.entry is not None and result.entry.config.template == "qsplitk"
    kernel = autotune.lookup(
        40, 64, 1024, layout="nt", weights="q4g128", cache_dir=tmp_path, gpu=gpu
    )
    assert kernel.source == "exact" and kernel.config == result.entry.config
    paths = autotune.export(kernel, tmp_path / "out", name="qsplitk")
    manifest = json.loads(paths["json"].read_text())
    assert [p["entry_point"] for p in manifest["passes"]] == ["main", "reduce"]


@pytest.mark.parametrize(
    "old, new",
    [
        ("for (var s = 1u;", "for (var s = 2u;"),  # the sum leaves a range out
        ("let ke = min(kb + {{ KC }}u,", "let ke = min(kb + {{ KC - BK }}u,"),  # a slice short
        ("let z = wg.z / {{ SPLIT }}u;", "let z = 0u;"),  # every batch item reads item 0
    ],
    ids=["range-left-out", "slice-short", "one-item"],
)
def test_verification_refuses_a_wrong_split(gpu, tmp_path, monkeypatch, old, new):
    """A copy of the template with one fault (qgemm's own file included unchanged) fails
    verification at a batch of two sharing the weight."""
    from autotune.data import data_path

    text = (data_path("templates") / "qsplitk.wgsl.j2").read_text()
    assert text.count(old) == 1, old
    (tmp_path / "qsplitbad.wgsl.j2").write_text(text.replace(old, new))
    space = (data_path("search_spaces") / "qsplitk.toml").read_text()
    (tmp_path / "qsplitbad.toml").write_text(space)
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    problem = Problem(20, 36, 256, "f32", "nt", 2, True, weights="q4g64")
    config = Config.make("qsplitbad", load_space("qsplitk").seed_configs(problem)[-1].as_dict())
    verdict = verify(compile_shader(render(config, problem), gpu), gpu)
    assert not verdict.ok
