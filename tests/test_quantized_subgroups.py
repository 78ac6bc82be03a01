"""The quantized decode families' partial sums reduced by subgroupAdd (SG = 1): verified
at every format, batch and epilogue; the subgroup path taken where each subgroup is a run
of a column group's slots and the workgroup-memory path where it is not (both shown by a
planted fault in the other); faults in the subgroup path refused; the same bits on every
run."""

import re

import numpy as np
import pytest

import autotune
from autotune.compile import compile_shader
from autotune.data import data_path
from autotune.kernel import Kernel
from autotune.problem import Problem
from autotune.render import Shader, jinja_environment, render
from autotune.space import Config, Space, load_space
from autotune.verify import Reference, verify

QGEMV = dict(SG=1, WG=64, TK=8, NC=1, U=1, AV=4, BW=1, DQ=1)
QDOTV = dict(SG=1, WG=64, TK=8, NC=2, U=1, QWG=64, QS=1, AV=1)

CASES = [
    ("qgemv", Problem(1, 37, 512, "f32", "nt", weights="q4g128"), {}),
    ("qgemv", Problem(3, 45, 1024, "f32", "nt", weights="q8"),
     dict(WG=128, TK=32, NC=2, U=2, DQ=0)),
    ("qgemv", Problem(16, 40, 640, "f32", "nt", weights="q4g32z"), dict(WG=128, TK=16, NC=2)),
    ("qgemv", Problem(2, 40, 1024, "f16", "nt", 3, True, "bias,relu", weights="q4g64"),
     dict(WG=128, TK=64, NC=2, BW=4)),
    ("qdotv", Problem(1, 37, 4096, "f32", "nt", weights="q4g128", activations="q8"),
     dict(WG=128, TK=64, NC=4, QS=4)),
    ("qdotv", Problem(5, 40, 2050, "f32", "nt", weights="q4g32z", activations="q8"), {}),
    ("qdotv", Problem(16, 45, 1990, "f32", "nt", weights="q8", activations="q8"),
     dict(WG=128, TK=32, U=2)),
    ("qdotv", Problem(2, 40, 1024, "f32", "nt", 3, True, "bias,relu", weights="q4g64",
                      activations="q8"), dict(WG=256, TK=16, NC=1)),
    # one pass: each workgroup quantizes its rows, then sums by subgroupAdd
    ("qdotv", Problem(3, 37, 2048, "f32", "nt", weights="q4g128", activations="q8"),
     dict(WG=128, TK=64, NC=4, QS=0, AV=4)),
]  # fmt: skip


@pytest.fixture
def subgroups(gpu):
    if "subgroup" not in gpu.features:
        pytest.skip("the adapter has no subgroup feature")
    return gpu


def config(template: str, **params) -> Config:
    return Config.make(template, (QGEMV if template == "qgemv" else QDOTV) | params)


@pytest.mark.parametrize(("template", "problem", "params"), CASES, ids=str)
def test_subgroup_reductions_verify(subgroups, template, problem, params):
    kernel = config(template, **params)
    assert load_space(template).why_invalid(kernel, problem, subgroups.limits) is None
    compiled = compile_shader(render(kernel, problem), subgroups, checks=True)
    verdict = verify(compiled, subgroups, reference=Reference(problem, seed=2))
    assert verdict.ok, verdict.reason


def test_subgroup_kernels_declare_the_feature():
    problem = Problem(1, 37, 512, "f32", "nt", weights="q4g128")
    assert render(config("qgemv"), problem).wgsl.startswith("enable subgroups;\n")
    assert "subgroup" not in render(config("qgemv", SG=0), problem).wgsl


# The stride over the slots each path sums: the workgroup-memory path's 1 (made TK: only
# the first slot), or the runs' (made twice theirs); a run's sum stored in its second slot.
STRIDE = "let stride = select(1u, runs,"
FALLBACK = (STRIDE, "let stride = select(TK, runs,")
FAULTS = {
    "fallback_reads_one_slot": FALLBACK,
    "subgroup_path_skips_runs": (STRIDE, "let stride = select(1u, 2u * runs,"),
    "sum_in_the_second_slot": (
        "select(%s, subgroupAdd(%s), t == t0)",
        "select(%s, subgroupAdd(%s), t == t0 + 1u)",
    ),
}


def _faulty(tmp_path, monkeypatch, template: str, fault: tuple[str, str], space_text=None):
    """`template` as `sgbad`, its shared macros with the fault's line changed (the space
    `space_text`, else the template's own)."""
    old, new = fault
    folder = data_path("templates")
    common = (folder / "_quantized_common.wgsl.j2").read_text()
    assert common.count(old) == 1, old  # the fault changes the line it names
    (tmp_path / "_sgbad_common.wgsl.j2").write_text(common.replace(old, new))
    text = (folder / f"{template}.wgsl.j2").read_text()
    text = text.replace('"_quantized_common.wgsl.j2"', '"_sgbad_common.wgsl.j2"')
    (tmp_path / "sgbad.wgsl.j2").write_text(text)
    space = space_text or (data_path("search_spaces") / f"{template}.toml").read_text()
    (tmp_path / "sgbad.toml").write_text(space)
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))


def _verdict(gpu, problem: Problem, params: dict, junk=None):
    """Verification of sgbad at `params`, after a kernel that leaves junk in workgroup
    memory where `junk` is given."""
    if junk:
        junk()
    compiled = compile_shader(render(Config.make("sgbad", params), problem), gpu, checks=True)
    return verify(compiled, gpu, reference=Reference(problem, seed=4))


PROBLEMS = {
    "qgemv": Problem(4, 40, 1024, "f32", "nt", weights="q4g32z"),
    "qdotv": Problem(4, 40, 1024, "f32", "nt", weights="q4g64", activations="q8"),
}


@pytest.mark.parametrize("template", ["qgemv", "qdotv"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_verification_refuses_a_wrong_subgroup_path(
    subgroups, junk_in_workgroup_memory, tmp_path, monkeypatch, template, fault
):
    """Column groups of 64 invocations, so subgroups of 8 to 64 lanes are runs: a fault
    in the subgroup path fails; a fault in the workgroup-memory path passes, since that
    path does not run, whatever bits the workgroup memory held before (the kernel clears
    what it reads)."""
    _faulty(tmp_path, monkeypatch, template, FAULTS[fault])
    params = config(template, TK=64, WG=128).as_dict()
    verdict = _verdict(subgroups, PROBLEMS[template], params, junk_in_workgroup_memory)
    if FAULTS[fault] == FALLBACK:
        assert verdict.ok, verdict.reason
    else:
        assert not verdict.ok and "relative error" in verdict.reason, verdict.reason


@pytest.mark.parametrize("template", ["qgemv", "qdotv"])
def test_subgroups_straddling_column_groups_take_the_workgroup_path(
    subgroups, tmp_path, monkeypatch, template
):
    """Column groups of 4 invocations under subgroups of 8 (lavapipe's): a subgroupAdd
    would mix two groups' columns. The run-time check sends such a workgroup through
    workgroup memory: it verifies, and the same kernel with the workgroup path's
    stride broken does not. (The space prunes TK = 4 as uncoalesced: the config is
    rendered from the space without that rule.)"""
    text = (data_path("search_spaces") / f"{template}.toml").read_text()
    text = re.sub(r"\ncoalesced = [^\n]*", '\ncoalesced = "1"', text)
    problem = PROBLEMS[template]
    params = config(template, TK=4, WG=64).as_dict()
    space = Space.from_toml(text, template)
    assert load_space(template).why_invalid(config(template, TK=4), problem).startswith("coalesced")
    assert space.why_invalid(config(template, TK=4), problem, subgroups.limits) is None
    values = space.context(config(template, TK=4), problem)
    wgsl = jinja_environment().get_template(f"{template}.wgsl.j2").render(elem="f32", **values)
    shader = Shader(
        config(template, TK=4), problem, wgsl, space.plan(config(template, TK=4), problem)
    )
    verdict = verify(
        compile_shader(shader, subgroups), subgroups, reference=Reference(problem, seed=4)
    )
    assert verdict.ok, verdict.reason
    _faulty(tmp_path, monkeypatch, template, FALLBACK, text)
    assert not _verdict(subgroups, problem, params).ok


def test_same_bits_on_every_run(subgroups):
    problem = Problem(3, 37, 1000, "f32", "nt", weights="q4g32z", activations="q8")
    rng = np.random.default_rng(3)
    A = rng.standard_normal((3, 1000)).astype(np.float32)
    qw = autotune.quantize(rng.standard_normal((37, 1000)).astype(np.float32), bits=4, group=32,
                           zero_points=True)  # fmt: skip
    for template, params in (("qdotv", dict(TK=16)), ("qgemv", dict(TK=32, WG=128))):
        p = problem if template == "qdotv" else Problem(3, 37, 1000, "f32", "nt", weights="q4g32z")
        kernel = Kernel(p, config(template, **params), "default", gpu=subgroups)
        first, second = kernel(A, qw), kernel(A, qw)
        assert first.tobytes() == second.tobytes(), template
