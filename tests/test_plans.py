"""Launch plans: a kernel of two passes and a workspace, a template of the tests' own
(tests/twopass, through AUTOTUNE_TEMPLATE_PATH), goes through the whole pipeline with no
change in autotune/: verified, tuned, cached, looked up, exported, run in Chromium."""

import json
from pathlib import Path

import numpy as np
import pytest
from chromium import run_bundles

import autotune
from autotune.compile import compile_shader
from autotune.kernel import Kernel
from autotune.plan import FIRST_WORKSPACE_BINDING, Plan, PlanError
from autotune.problem import Problem
from autotune.render import render
from autotune.space import Config, Space, SpaceError, load_space
from autotune.verify import GUARD, guarded_workspace, verify

TWOPASS = Path(__file__).parent / "twopass"
PROBLEM = Problem(37, 29, 53)  # odd sizes: the halves of K differ (27 and 26)


@pytest.fixture
def halves(monkeypatch):
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(TWOPASS))
    return load_space("halves")


def test_the_plan_is_read_from_the_space_file(halves):
    config = halves.seed_configs(PROBLEM)[0]
    plan = render(config, PROBLEM).plan
    assert isinstance(plan, Plan)
    assert [(p.entry_point, p.workgroup_size, p.grid) for p in plan.passes] == [
        ("partial", (64, 1, 1), (17, 2, 1)),  # cdiv(37 * 29, 64) = 17
        ("reduce", (64, 1, 1), (17, 1, 1)),
    ]
    (workspace,) = plan.workspaces
    assert (workspace.number, workspace.name, workspace.size) == (
        FIRST_WORKSPACE_BINDING,
        "partials",
        2 * 37 * 29 * 4,
    )
    assert plan.needs()["max-compute-workgroups-per-dimension"] == 17


def test_two_passes_compute_the_product(gpu, halves):
    A = np.random.default_rng(1).uniform(-1, 1, (37, 53)).astype(np.float32)
    B = np.random.default_rng(2).uniform(-1, 1, (53, 29)).astype(np.float32)
    for config in halves.configs(PROBLEM):
        kernel = Kernel(PROBLEM, config, "default", gpu=gpu)
        np.testing.assert_allclose(kernel(A, B), A @ B, rtol=1e-5, atol=1e-5)


def test_a_workspace_too_small_for_its_writes_is_caught(gpu, halves, tmp_path, monkeypatch):
    """The guard after each workspace: a plan declaring half the bytes its pass writes."""
    for name in ("halves.toml", "halves.wgsl.j2"):
        text = (TWOPASS / name).read_text()
        (tmp_path / name.replace("halves", "short")).write_text(
            text.replace('"2 * elements * 4"', '"elements * 4"')
        )
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    config = Config.make("short", {"WG": 64, "ORDER": 0})
    verdict = verify(compile_shader(render(config, PROBLEM), gpu), gpu)
    assert not verdict.ok and "workspace" in verdict.reason


@pytest.mark.slow
def test_tuned_cached_looked_up_and_exported(gpu, halves, tmp_path):
    cache = tmp_path / "cache"
    result = autotune.tune(37, 29, 53, templates=["halves"], trials=3, cache_dir=cache, gpu=gpu)
    assert result.entry is not None and result.entry.config.template == "halves"
    kernel = autotune.lookup(37, 29, 53, cache_dir=cache, gpu=gpu)
    assert kernel.source == "exact" and kernel.config == result.entry.config
    paths = autotune.export(kernel, tmp_path / "bundles", name="halves")
    manifest = json.loads(paths["json"].read_text())
    assert [p["entry_point"] for p in manifest["passes"]] == ["partial", "reduce"]
    assert [b["name"] for b in manifest["buffers"] if b["role"] == "workspace"] == ["partials"]
    results = run_bundles(tmp_path / "bundles", ["halves"])
    assert results["halves"]["ok"] and results["halves"]["errors"] == [], results


def test_a_workspace_may_not_take_a_buffer_s_name(halves):
    text = (TWOPASS / "halves.toml").read_text()
    for name in ("C", "dims", "bias", "partials"):  # an operand's, or a second "partials"
        extra = f'\n[[workspaces]]\nname = "{name}"\nbytes = "4"\n'
        with pytest.raises(SpaceError, match="already a buffer's"):
            Space.from_toml(text + extra, "halves")


def test_workspace_guards_stay_within_the_buffer_limit():
    """A workspace at the buffer limit gets no guard beyond it (a bigger buffer would be
    refused by the device, failing a correct kernel)."""
    assert len(guarded_workspace(4096, 4096 + 64)) == 1024 + 16
    assert len(guarded_workspace(4096, 4096)) == 1024
    assert len(guarded_workspace(4096, 2**30)) == 1024 + GUARD


def _with_conditional_steps(text: str) -> Space:
    """halves with a pass and a workspace (declared first) that only ORDER = 1 has; the
    pass is wider than any device allows."""
    text = text.replace(
        "[[workspaces]]",
        '[[workspaces]]\nname = "scratch"\nbytes = "4"\nwhen = "ORDER == 1"\n\n[[workspaces]]',
        1,
    )
    extra = (
        '\n[[passes]]\nentry_point = "wide"\nwhen = "ORDER == 1"\n'
        'workgroup_size = ["WG * 1000", "1", "1"]\ngrid = ["1", "1", "1"]\n'
    )
    return Space.from_toml(text + extra, "halves")


def test_a_pass_or_workspace_with_when_is_in_the_plan_only_where_it_holds():
    """A config without the pass and the workspace has neither, needs nothing of a limit
    for them, and its other workspaces keep their binding numbers."""
    space = _with_conditional_steps((TWOPASS / "halves.toml").read_text())
    limits = {"max-compute-invocations-per-workgroup": 256}
    without = Config.make("halves", {"WG": 64, "ORDER": 0})
    plan = space.plan(without, PROBLEM)
    assert [p.entry_point for p in plan.passes] == ["partial", "reduce"]
    assert [(w.number, w.name) for w in plan.workspaces] == [
        (FIRST_WORKSPACE_BINDING + 1, "partials")
    ]
    assert space.why_invalid(without, PROBLEM, limits) is None
    holds = Config.make("halves", {"WG": 64, "ORDER": 1})
    plan = space.plan(holds, PROBLEM)
    assert [p.entry_point for p in plan.passes] == ["partial", "reduce", "wide"]
    assert [w.name for w in plan.workspaces] == ["scratch", "partials"]
    assert "limit max-compute-invocations-per-workgroup" in space.why_invalid(
        holds, PROBLEM, limits
    )


def test_a_when_is_an_expression_of_known_names_and_a_plan_keeps_a_pass():
    text = (TWOPASS / "halves.toml").read_text()
    with pytest.raises(SpaceError, match="reads"):
        Space.from_toml(
            text.replace('entry_point = "reduce"', 'entry_point = "reduce"\nwhen = "NOPE"'),
            "halves",
        )
    with pytest.raises(SpaceError, match="expression in a string"):
        Space.from_toml(
            text.replace('entry_point = "reduce"', 'entry_point = "reduce"\nwhen = 1'), "halves"
        )
    never = text.replace(
        'grid = ["cdiv(elements, WG)", "', 'when = "ORDER == 2"\ngrid = ["cdiv(elements, WG)", "'
    )
    space = Space.from_toml(never, "halves")
    config = Config.make("halves", {"WG": 64, "ORDER": 0})
    assert space.why_invalid(config, PROBLEM).startswith("a_pass_runs")
    assert space.configs(PROBLEM) == []
    with pytest.raises(PlanError, match="no pass"):
        space.plan(config, PROBLEM)
