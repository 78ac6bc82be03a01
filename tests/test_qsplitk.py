"""Split-K with quantized weights: `qsplitk` (qgemm's tile, the weight dequantized) and
`qdotsplitk` (qdot's, int8 dot products after a quantize pass) over ranges of K, whose
partial sums a last pass adds in a fixed order, then scales and puts through the
epilogue. For a few dozen rows, where the tile grid alone leaves most of the GPU idle."""

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
QDOTSPLITK = load_space("qdotsplitk")
# each family, and the activations of the problems it computes
FAMILIES = [("qsplitk", "none"), ("qdotsplitk", "q8")]


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
    (37, 45, 531, "f32", "nt", 1, False, "none", "q4g32"),
    (40, 66, 600, "f32", "nt", 1, False, "bias,gelu", "q8"),
    (33, 70, 1000, "f16", "nt", 1, False, "alpha,beta,relu", "q4g128z"),
    (20, 36, 256, "f32", "nt", 2, True, "bias", "q4g64"),
    (40, 37, 595, "f32", "nt", 1, False, "none", "q4g32z"),  # 19 groups: 3 words of zeros
]


@pytest.mark.parametrize(("template", "activations"), FAMILIES)
@pytest.mark.parametrize("shape", PROBLEMS, ids=lambda s: "-".join(map(str, s)))
def test_the_known_good_configs_compute_every_format_and_variant(gpu, template, activations, shape):
    *dims, weights = shape
    problem = Problem(*dims, weights=weights, activations=activations)
    if problem.dtype == "f16" and "shader-f16" not in gpu.features:
        pytest.skip("the adapter has no shader-f16")
    _verified(gpu, problem, load_space(template).seed_configs(problem, gpu.limits))


def test_each_range_is_whole_slices_and_none_is_empty():
    problem = Problem(64, 64, 100, "f32", "nt", weights="q4g32")
    config = QSPLITK.seed_configs(problem)[-1]  # BK = 16
    split = lambda s: Config.make("qsplitk", config.as_dict() | {"SPLIT": s})  # noqa: E731
    values = QSPLITK.context(split(2), problem)
    assert values["KC"] == 64 and values["KC"] % values["BK"] == 0  # 64 + 36
    assert "every_range_has_k" in QSPLITK.why_invalid(split(8), problem)  # 7 x 16 >= 100


def test_int8_ranges_are_whole_steps_and_groups():
    """qdotsplitk's ranges are whole steps of x' words, and for 4-bit weights whole
    groups: each group's sum is scaled where the group ends, inside one range."""
    q4 = Problem(64, 64, 1000, "f32", "nt", weights="q4g128", activations="q8")
    config = Config.make("qdotsplitk", QDOTSPLITK.seed_configs(q4)[-1].as_dict() | {"SPLIT": 4})
    values = QDOTSPLITK.context(config, q4)  # 256 words of x' (K padded to 1024)
    assert (values["XW"], values["UNIT"], values["KCW"]) == (256, 32, 64)
    q8 = Problem(64, 64, 1000, "f32", "nt", weights="q8", activations="q8")
    values = QDOTSPLITK.context(config, q8)  # 250 words; steps of 16 codes, 4 words
    assert (values["XW"], values["UNIT"], values["KCW"]) == (250, 4, 64)
    many = Config.make("qdotsplitk", config.as_dict() | {"SPLIT": 16})  # 16 of 32 words
    assert "every_range_has_k" in QDOTSPLITK.why_invalid(many, q4)  # 15 x 32 >= 256


@pytest.mark.parametrize(("template", "activations"), FAMILIES)
def test_the_plan_is_a_split_pass_then_a_reduction(template, activations):
    problem = Problem(40, 48, 512, "f32", "nt", 2, True, "bias", weights="q4g128",
                      activations=activations)  # fmt: skip
    config = load_space(template).seed_configs(problem)[0]
    plan = render(config, problem).plan
    *first, main, reduce = plan.passes
    split = config["SPLIT"]
    assert [p.entry_point for p in first] == (["quantize"] if activations == "q8" else [])
    assert main.grid[2] == 2 * split and reduce.grid[1:] == (40, 2)
    assert reduce.entry_point == "reduce"
    partials = plan.binding("partials")
    assert partials.size == 4 * 2 * split * 40 * 48  # 4-byte partial sums
    assert [w.name for w in plan.workspaces][-1] == "partials"


def test_the_templates_render_their_tile_with_the_k_range_cut():
    """Each extends its unsplit family (one blocking, one space): its kernel is the
    family's with the range, the partial write and the reduction; the family's own
    renders none of them."""
    for template, base, activations in (("qsplitk", "qgemm", "none"), ("qdotsplitk", "qdot", "q8")):
        problem = Problem(64, 64, 4096, "f32", "nt", weights="q4g128", activations=activations)
        config = load_space(template).seed_configs(problem)[0]
        wgsl = render(config, problem).wgsl
        assert "fn reduce(" in wgsl and "partials[pbase" in wgsl and "k0 < ke" in wgsl
        assert set(load_space(base).params) < set(load_space(template).params)
        params = {k: v for k, v in config.as_dict().items() if k not in ("SPLIT", "RW")}
        assert "partials" not in render(Config.make(base, params), problem).wgsl


@pytest.mark.parametrize(("template", "activations"), FAMILIES)
def test_results_are_the_same_bits_every_run(gpu, template, activations):
    problem = Problem(24, 32, 777, "f32", "nt", weights="q4g32", activations=activations)
    config = load_space(template).seed_configs(problem, gpu.limits)[0]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((24, 777)).astype(np.float32)
    qw = autotune.quantize(rng.standard_normal((32, 777)).astype(np.float32), bits=4, group=32)
    kernel = Kernel(problem, config, "default", gpu=gpu)
    first = kernel(x, qw)
    assert config["SPLIT"] > 1 and all(np.array_equal(first, kernel(x, qw)) for _ in range(3))


def test_int8_split_sums_of_q8_weights_are_qdot_s_to_the_bit(gpu):
    """With q8 weights the ranges' sums are integers, added exactly: the split kernel's C
    is its unsplit tile's, bit for bit."""
    problem = Problem(40, 48, 1000, "f32", "nt", weights="q8", activations="q8")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 1000)).astype(np.float32)
    qw = autotune.quantize(rng.standard_normal((48, 1000)).astype(np.float32), bits=8)
    split = QDOTSPLITK.seed_configs(problem, gpu.limits)[-1]
    params = {k: v for k, v in split.as_dict().items() if k not in ("SPLIT", "RW")}
    kernels = [Kernel(problem, c, "default", gpu=gpu) for c in (split, Config.make("qdot", params))]
    assert np.array_equal(kernels[0](x, qw), kernels[1](x, qw))


def test_they_compute_only_quantized_weights_with_their_activations():
    assert QSPLITK.configs(Problem(64, 64, 256, "f32", "nt")) == []
    assert QSPLITK.configs(Problem(64, 64, 256, "f32", "nt", weights="q8"))
    assert QSPLITK.configs(Problem(64, 64, 256, "f32", "nt", weights="q8", activations="q8")) == []
    assert QDOTSPLITK.configs(Problem(64, 64, 256, "f32", "nt", weights="q8")) == []
    assert QDOTSPLITK.configs(Problem(64, 64, 256, "f32", "nt", weights="q8", activations="q8"))


@pytest.mark.slow
@pytest.mark.parametrize(("template", "activations"), FAMILIES)
def test_tuned_cached_looked_up_and_exported(gpu, tmp_path, template, activations):
    shape = dict(layout="nt", weights="q4g128", activations=activations)
    result = autotune.tune(
        40, 64, 1024, **shape, templates=[template], trials=3, cache_dir=tmp_path, gpu=gpu
    )
    assert result.entry is not None and result.entry.config.template == template
    kernel = autotune.lookup(40, 64, 1024, **shape, cache_dir=tmp_path, gpu=gpu)
    assert kernel.source == "exact" and kernel.config == result.entry.config
    paths = autotune.export(kernel, tmp_path / "out", name=template)
    manifest = json.loads(paths["json"].read_text())
    passes = ["quantize", "dot", "reduce"] if activations == "q8" else ["main", "reduce"]
    assert [p["entry_point"] for p in manifest["passes"]] == passes


@pytest.mark.parametrize(
    "template, old, new",
    [
        ("qsplitk", "for (var s = 1u;", "for (var s = 2u;"),  # the sum leaves a range out
        ("qsplitk", "let ke = min(kb + {{ KC }}u,", "let ke = min(kb + {{ KC - BK }}u,"),
        ("qsplitk", "let z = wg.z / {{ SPLIT }}u;", "let z = 0u;"),  # every item reads item 0
        ("qdotsplitk", "for (var s = 1u;", "for (var s = 2u;"),
        ("qdotsplitk", "let ke = min(kb + {{ KCW }}u,", "let ke = min(kb + {{ KCW - UNIT }}u,"),
        ("qdotsplitk", "let z = wg.z / {{ SPLIT }}u;", "let z = 0u;"),
    ],
    ids=["range-left-out", "slice-short", "one-item", "int8-range-left-out",
         "int8-unit-short", "int8-one-item"],
)  # fmt: skip
def test_verification_refuses_a_wrong_split(gpu, tmp_path, monkeypatch, template, old, new):
    """A copy of the template with one fault (the unsplit family's file included
    unchanged) fails verification at a batch of two sharing the weight."""
    from autotune.data import data_path

    text = (data_path("templates") / f"{template}.wgsl.j2").read_text()
    assert text.count(old) == 1, old
    (tmp_path / "splitbad.wgsl.j2").write_text(text.replace(old, new))
    space = (data_path("search_spaces") / f"{template}.toml").read_text()
    (tmp_path / "splitbad.toml").write_text(space)
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    activations = "q8" if template == "qdotsplitk" else "none"
    problem = Problem(20, 36, 256, "f32", "nt", 2, True, weights="q4g64", activations=activations)
    config = Config.make("splitbad", load_space(template).seed_configs(problem)[-1].as_dict())
    verdict = verify(compile_shader(render(config, problem), gpu), gpu)
    assert not verdict.ok
