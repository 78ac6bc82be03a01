"""The decode template `gemv` (M <= 16): correct for every layout, dtype, batch and
epilogue on odd shapes, with a subgroup or a workgroup-memory reduction, the same bits on
every run; refused where the device lacks subgroups; tuned, cached, looked up, exported."""

import json
import re

import numpy as np
import pytest

import autotune
from autotune.compile import CompileError, compile_shader
from autotune.data import data_path
from autotune.device import Gpu, required_features
from autotune.kernel import Kernel
from autotune.problem import Problem
from autotune.render import Shader, jinja_environment, render
from autotune.space import Config, Space, load_space
from autotune.verify import verify


def gemv(**params) -> Config:
    base = dict(SG=0, WG=64, TK=8, NC=1, VEC=1, U=1, ACC=0, RS=1, H8=0)
    return Config.make("gemv", base | params)


def check(gpu, problem: Problem, config: Config) -> None:
    reason = load_space("gemv").why_invalid(config, problem, gpu.limits)
    assert reason is None, f"{config} at {problem}: {reason}"
    verdict = verify(compile_shader(render(config, problem), gpu), gpu)
    assert verdict.ok, f"{config} at {problem}: {verdict.reason}"


# (problem, config): B stored N x K (subgroups of lavapipe's 8 invocations are whole
# column groups at TK=8, not at TK=16 or 32: both reduction paths run), B stored K x N,
# A stored K x M, ragged N, odd K, the unrolled steps' tail, several columns per invocation.
CASES = [
    (Problem(1, 37, 129, "f32", "nt"), gemv(SG=1, TK=8, U=4)),
    (Problem(3, 37, 129, "f32", "nt"), gemv(SG=1, TK=32, WG=128, U=2, NC=2)),
    (Problem(16, 129, 301, "f32", "nt"), gemv(SG=0, TK=16, WG=128, U=4)),
    (Problem(16, 36, 300, "f32", "nt"), gemv(SG=1, TK=8, VEC=4, U=8)),
    (Problem(3, 40, 260, "f32", "tt"), gemv(SG=1, TK=16, VEC=4, U=2, NC=2)),
    (Problem(1, 37, 129), gemv(TK=8, U=2, NC=2)),
    (Problem(16, 129, 77), gemv(TK=4, WG=128, U=4)),
    (Problem(3, 68, 96, "f32", "tn"), gemv(TK=8, VEC=4, U=2, NC=2)),
    # eight columns per invocation: both reductions; B stored K x N (32 accumulators a row)
    (Problem(16, 44, 132, "f32", "nt"), gemv(SG=1, TK=8, VEC=4, NC=8)),
    (Problem(16, 44, 132, "f32", "nt"), gemv(TK=16, WG=128, VEC=4, NC=8)),
    (Problem(4, 300, 70), gemv(TK=8, VEC=4, NC=8)),
    # rows split between row groups: both reductions, a last group of fewer rows (13 rows
    # in groups of 4 and of 7; 7 rows of A stored K x M in groups of 4)
    (Problem(16, 44, 132, "f32", "nt"), gemv(TK=8, VEC=4, NC=8, RS=2)),
    (Problem(16, 44, 132, "f32", "nt"), gemv(SG=1, TK=8, VEC=4, NC=4, RS=2)),
    (Problem(13, 37, 129, "f32", "nt"), gemv(SG=1, TK=8, WG=128, NC=2, RS=4, U=2)),
    (Problem(13, 37, 129, "f32", "nt"), gemv(TK=16, WG=128, NC=2, RS=2, U=2)),
    (Problem(7, 40, 260, "f32", "tt"), gemv(TK=8, VEC=4, NC=2, RS=2, U=2)),
]


@pytest.mark.parametrize("problem, config", CASES, ids=lambda x: str(x).replace(" ", "_"))
def test_correct_for_layouts_and_odd_shapes(gpu, problem, config):
    check(gpu, problem, config)


@pytest.mark.parametrize(
    "problem, config",
    [
        (Problem(4, 48, 200, "f16", "nt"), gemv(SG=1, TK=8, VEC=4, U=2, NC=2)),
        (Problem(3, 36, 64, "f16", "nt", accumulate="f16"), gemv(TK=16, VEC=4, ACC=1)),
        (Problem(7, 44, 70, "f16"), gemv(TK=4, VEC=2, U=4)),
        (Problem(16, 52, 200, "f16", "nt"), gemv(TK=16, VEC=4, NC=8)),
        (Problem(16, 52, 200, "f16", "nt"), gemv(TK=16, WG=128, VEC=4, NC=8, RS=2)),
        (
            Problem(16, 52, 200, "f16", "nt", accumulate="f16"),
            gemv(TK=16, VEC=4, NC=4, RS=4, ACC=1),
        ),
        # A and B read as words, eight halves a load (K = 200: 25 loads a row, the last
        # steps past K for some invocations); C stored by scalar where 4 does not divide N
        (Problem(16, 52, 200, "f16", "nt"), gemv(TK=8, VEC=4, NC=4, U=2, H8=1)),
        (Problem(16, 52, 200, "f16", "nt"), gemv(SG=1, TK=8, VEC=4, NC=4, H8=1)),
        (Problem(13, 37, 136, "f16", "nt"), gemv(TK=16, WG=128, NC=2, RS=2, U=2, H8=1)),
        (Problem(13, 36, 136, "f16", "nt"), gemv(SG=1, TK=8, WG=128, VEC=4, NC=2, RS=4, H8=1)),
        (Problem(1, 37, 1032, "f16", "nt"), gemv(SG=1, TK=32, WG=128, U=4, H8=1)),
        (
            Problem(3, 40, 64, "f16", "nt", 2, False, "alpha,beta,bias,gelu"),
            gemv(TK=8, VEC=4, NC=2, H8=1),
        ),
        (Problem(4, 40, 64, "f16", "nt", 2, True, "bias,relu"), gemv(SG=1, VEC=4, H8=1)),
    ],
    ids=[
        "f32_acc_subgroups",
        "f16_acc",
        "nn",
        "f32_acc_eight_columns",
        "rows_split",
        "f16_acc_rows_split",
        "halves_unrolled_tail",
        "halves_subgroups",
        "halves_rows_split_ragged_n",
        "halves_rows_split_subgroups",
        "halves_one_row",
        "halves_batch_epilogue",
        "halves_shared_b_subgroups",
    ],
)
def test_f16(gpu, problem, config):
    if "shader-f16" not in gpu.features:
        pytest.skip("the adapter has no shader-f16")
    check(gpu, problem, config)


@pytest.mark.parametrize(
    "problem, config",
    [
        (Problem(3, 37, 51, "f32", "nt", 3, False, "alpha,beta,bias,gelu"), gemv(SG=1)),
        (Problem(4, 40, 64, "f32", "nn", 2, True, "bias,relu"), gemv(VEC=4, U=2, TK=4)),
        (Problem(1, 129, 257, "f32", "nt", 2, True, "alpha,bias"), gemv(SG=1, TK=32, WG=256)),
        (Problem(16, 33, 40, "f32", "tn", 2, False, "beta,gelu"), gemv(WG=128, TK=16)),
        (Problem(9, 37, 51, "f32", "nt", 3, False, "alpha,beta,bias,gelu"), gemv(SG=1, RS=2)),
    ],
    ids=[
        "batch_epilogue_subgroups",
        "shared_b_relu",
        "shared_b_fallback",
        "tn_beta_gelu",
        "rows_split_batch_epilogue",
    ],
)
def test_batch_and_epilogue(gpu, problem, config):
    check(gpu, problem, config)


def test_same_bits_on_every_run(gpu):
    """Fixed-order reductions: two runs on the same data give the same bits, on both
    reduction paths (the subgroup one, and the workgroup-memory one), rows split or not."""
    rng = np.random.default_rng(3)
    runs = [
        (5, gemv(SG=1, TK=8, U=4)),
        (5, gemv(SG=1, TK=32, WG=128)),
        (5, gemv(TK=64, WG=256)),
        (13, gemv(SG=1, TK=8, WG=128, NC=2, RS=4)),
        (13, gemv(TK=16, WG=128, NC=2, RS=2)),
    ]
    for m, config in runs:
        A = rng.standard_normal((m, 1001)).astype(np.float32)
        B = rng.standard_normal((37, 1001)).astype(np.float32)
        kernel = Kernel(Problem(m, 37, 1001, "f32", "nt"), config, "default", gpu=gpu)
        first, second = kernel(A, B), kernel(A, B)
        assert first.tobytes() == second.tobytes(), config
        np.testing.assert_allclose(first, A.astype(np.float64) @ B.T, rtol=1e-4, atol=1e-3)


def test_subgroups_straddling_column_groups_take_the_workgroup_path(gpu):
    """Column groups of 4 invocations under subgroups of 8 (lavapipe's): a subgroupAdd
    would mix two groups' columns. The run-time check sends such a workgroup through
    workgroup memory. (The space prunes TK = 4 for B stored N x K as uncoalesced: the
    config is rendered from the space without that rule.)"""
    text = (data_path("search_spaces") / "gemv.toml").read_text()
    space = Space.from_toml(re.sub(r"\ncoalesced = [^\n]*", '\ncoalesced = "1"', text), "gemv")
    problem = Problem(3, 37, 129, "f32", "nt")
    for sg in (1, 0):
        config = gemv(SG=sg, TK=4, U=2)
        assert load_space("gemv").why_invalid(config, problem).startswith("coalesced")
        assert space.why_invalid(config, problem, gpu.limits) is None
        values = space.context(config, problem)
        wgsl = jinja_environment().get_template("gemv.wgsl.j2").render(elem="f32", **values)
        shader = Shader(config, problem, wgsl, space.plan(config, problem))
        verdict = verify(compile_shader(shader, gpu), gpu)
        assert verdict.ok, f"{config}: {verdict.reason}"


@pytest.mark.parametrize(
    "old, new, paths",
    [
        ("min(r * {{ MR }}u + {{ m }}u,", "min({{ m }}u,", (1, 0)),  # every group reads rows 0..
        ("gq % {{ RS }}u * {{ MR }}u +", "gq % {{ RS }}u * {{ MR - 1 }}u +", (0,)),
        ("+ gq / {{ RS }}u * {{ NC }}u", "+ gq % {{ RS }}u * {{ NC }}u", (0,)),
        ("&& r * {{ MR }}u + {{ m }}u < M) {", "&& r * {{ MR }}u + {{ m }}u < M - 1u) {", (1,)),
    ],
    ids=["rows-of-group-0", "rows-stored-shifted", "columns-of-row-group", "last-row-dropped"],
)  # fmt: skip
def test_verification_refuses_a_wrong_row_split(gpu, tmp_path, monkeypatch, old, new, paths):
    """A copy of the template with one fault in the row split fails verification (13
    rows in groups of 4) on the reduction paths it is on: SG = 1 sums in subgroups
    (lavapipe's 8 invocations, one group of TK = 8), SG = 0 in workgroup memory."""
    text = (data_path("templates") / "gemv.wgsl.j2").read_text()
    assert text.count(old) == 1, old
    (tmp_path / "rowsbad.wgsl.j2").write_text(text.replace(old, new))
    (tmp_path / "rowsbad.toml").write_text((data_path("search_spaces") / "gemv.toml").read_text())
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    problem = Problem(13, 37, 129, "f32", "nt")
    for sg in paths:
        params = gemv(SG=sg, TK=8, WG=128, NC=2, RS=4, U=2).as_dict()
        verdict = verify(compile_shader(render(Config.make("rowsbad", params), problem), gpu), gpu)
        assert not verdict.ok, sg


def test_only_decode_shapes():
    space = load_space("gemv")
    assert space.first_config(Problem(17, 64, 64, "f32", "nt")) is None
    assert space.why_invalid(gemv(), Problem(17, 64, 64)) == "decode_shapes: M <= 16"
    assert space.first_config(Problem(16, 64, 64)) is not None  # the plain problem too


def test_seeds_come_first_and_serve_every_shape():
    space = load_space("gemv")
    linear = Problem(1, 4096, 4096, "f32", "nt")
    first, second = space.seed_configs(linear)[:2]
    assert (first["SG"], second["SG"]) == (1, 0)
    for problem in (Problem(1, 37, 129), Problem(16, 1, 1, "f16", "tt", 3, True, "beta,gelu")):
        assert space.seed_configs(problem), problem
    assert space.seed_configs(Problem(3, 5, 7, "f16", accumulate="f16"))
    assert 50 < len(space.configs(linear)) <= 400  # a short tune covers it


def test_subgroups_are_declared_by_the_enable_directive(gpu):
    problem = Problem(2, 40, 64, "f16", "nt")
    with_sg = render(gemv(SG=1, VEC=4), problem).wgsl
    assert with_sg.startswith("enable f16;\nenable subgroups;\n")
    assert required_features(with_sg) == ("shader-f16", "subgroups")
    assert required_features(render(gemv(), Problem(2, 40, 64)).wgsl) == ()


def test_compile_refuses_subgroups_without_the_feature(gpu):
    """A device without the subgroup feature: compile refuses an SG=1 kernel as a limit,
    naming the feature, before naga does (an SG=0 kernel compiles)."""
    if "subgroup" not in gpu.features:
        pytest.skip("the adapter has no subgroup feature")
    bare = Gpu(gpu.adapter)
    bare.features = bare.features - {"subgroup"}  # the feature set compile consults
    problem = Problem(3, 37, 129, "f32", "nt")
    with pytest.raises(CompileError, match="needs the subgroups feature") as refused:
        compile_shader(render(gemv(SG=1), problem), bare)
    assert refused.value.reason == "limits"
    compile_shader(render(gemv(SG=0), problem), bare)


@pytest.mark.slow
def test_tune_caches_gemv_and_lookup_serves_it(gpu, cache_dir):
    result = autotune.tune(
        4, 36, 96, layout="nt", trials=4, templates=["gemv"], cache_dir=cache_dir, seed=1, gpu=gpu
    )
    assert result.entry is not None and result.entry.config.template == "gemv"
    kernel = autotune.lookup(4, 36, 96, layout="nt", cache_dir=cache_dir, gpu=gpu)
    assert kernel.source == "exact" and kernel.config == result.entry.config
    A = np.random.default_rng(0).standard_normal((4, 96)).astype(np.float32)
    B = np.random.default_rng(1).standard_normal((36, 96)).astype(np.float32)
    np.testing.assert_allclose(kernel(A, B), A.astype(np.float64) @ B.T, rtol=1e-4, atol=1e-3)


def test_export_of_a_subgroup_kernel(gpu, tmp_path):
    """The bundle carries `enable subgroups;` (browsers require it) and lists the
    feature by WebGPU's name; export compiled and verified that very text."""
    problem = Problem(3, 36, 64, "f32", "nt", 2, False, "bias,gelu")
    kernel = Kernel(problem, gemv(SG=1, VEC=4, U=2), "default", gpu=gpu)
    paths = autotune.export(kernel, tmp_path)
    wgsl = paths["wgsl"].read_text()
    assert wgsl.startswith("enable subgroups;\n// autotune GEMM kernel")
    assert json.loads(paths["json"].read_text())["required_features"] == ["subgroups"]
    assert wgsl.count("enable subgroups;") == 1


def test_the_subgroup_path_runs_whatever_workgroup_memory_held(gpu, junk_in_workgroup_memory):
    """Column groups of 8 under lavapipe's subgroups of 8: the subgroup path serves, even
    after a kernel left its bits in workgroup memory (the kernel clears its flag): with
    the workgroup-memory path's sums broken, the kernel still verifies."""
    if "subgroup" not in gpu.features:
        pytest.skip("the adapter has no subgroup feature")
    text = (data_path("templates") / "gemv.wgsl.j2").read_text()
    summed = 's += red[o * WG + {{ "gq * TK + u" if TB else "u * CG + gq" }}];'
    assert text.count(summed) == 1
    broken = jinja_environment().from_string(text.replace(summed, "s += 0.0;"))
    problem = Problem(3, 37, 256, "f32", "nt")
    for sg, works in ((1, True), (0, False)):
        config = gemv(SG=sg, TK=8, U=2)
        values = load_space("gemv").context(config, problem)
        wgsl = broken.render(elem="f32", **values)
        shader = Shader(config, problem, wgsl, load_space("gemv").plan(config, problem))
        compiled = compile_shader(shader, gpu)
        junk_in_workgroup_memory()
        assert verify(compiled, gpu).ok == works, config


def test_rows_split_only_where_it_serves():
    """RS > 1: B stored N x K only, and only where each row group holds 4 rows or more."""
    space = load_space("gemv")
    split = gemv(TK=16, WG=128, VEC=4, NC=4, RS=2)
    assert space.why_invalid(split, Problem(16, 64, 64, "f32", "nt")) is None
    assert space.why_invalid(split, Problem(16, 64, 64, "f32", "nn")).startswith("rows_split_along")
    assert space.why_invalid(split, Problem(6, 64, 64, "f32", "nt")).startswith("rows_split_at")
    four = gemv(TK=16, WG=128, VEC=4, NC=4, RS=4)
    assert space.why_invalid(four, Problem(13, 64, 64, "f32", "nt")) is None
    assert space.why_invalid(four, Problem(12, 64, 64, "f32", "nt")).startswith("rows_split_at")


def test_eight_halves_only_where_they_serve():
    """H8 = 1: f16 data, B stored N x K, A stored M x K, f32 accumulation, whole loads of
    eight along K."""
    space = load_space("gemv")
    halves = gemv(TK=8, VEC=4, NC=4, H8=1)
    assert space.why_invalid(halves, Problem(16, 64, 64, "f16", "nt")) is None
    for problem, rule in [
        (Problem(16, 64, 64, "f32", "nt"), "eight_halves_of_rows"),
        (Problem(16, 64, 64, "f16", "nn"), "eight_halves_of_rows"),
        (Problem(16, 64, 64, "f16", "tt"), "eight_halves_of_rows"),
        (Problem(16, 64, 60, "f16", "nt"), "eight_halves_whole"),
    ]:
        assert space.why_invalid(halves, problem).startswith(rule), problem
    pinned = Problem(16, 64, 64, "f16", "nt", accumulate="f16")
    assert space.why_invalid(gemv(TK=8, VEC=4, ACC=1, H8=1), pinned).startswith("eight_halves")
    assert space.seed_configs(Problem(16, 4096, 4096, "f16", "nt"))[-1]["H8"] == 1


@pytest.mark.parametrize(
    "old, new",
    [
        ("unpack2x16float(w.w)", "unpack2x16float(w.z)"),  # a half read twice, one never
        (" + dot(a{{ j }}_{{ m }}[1], b{{ j }}_{{ c }}[1])", ""),  # the high four dropped
        ("halves(B[brow{{ c }} + {{ k }}])", "halves(B[brow{{ c }} + {{ k }} / 2u])"),
    ],
    ids=["half-repeated", "high-four-dropped", "wrong-word"],
)
def test_verification_refuses_wrong_halves(gpu, tmp_path, monkeypatch, old, new):
    """A copy of the template with one fault in the eight-halves path fails verification."""
    if "shader-f16" not in gpu.features:
        pytest.skip("the adapter has no shader-f16")
    text = (data_path("templates") / "gemv.wgsl.j2").read_text()
    assert text.count(old) == 1, old
    (tmp_path / "halvesbad.wgsl.j2").write_text(text.replace(old, new))
    (tmp_path / "halvesbad.toml").write_text((data_path("search_spaces") / "gemv.toml").read_text())
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    params = gemv(TK=8, VEC=4, NC=4, U=2, H8=1).as_dict()
    problem = Problem(16, 52, 200, "f16", "nt")
    verdict = verify(compile_shader(render(Config.make("halvesbad", params), problem), gpu), gpu)
    assert not verdict.ok
