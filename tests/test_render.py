import random

import jinja2
import pytest

from autotune.__main__ import main
from autotune.data import data_path
from autotune.problem import Problem
from autotune.render import render, template_hash
from autotune.space import Config, load_space


@pytest.mark.parametrize("template", ["naive", "tiled", "blocked"])
def test_render_sampled_configs_leaves_no_jinja(template):
    problem = Problem(130, 68, 36)
    configs = load_space(template).configs(problem)
    for config in random.Random(0).sample(configs, min(25, len(configs))):
        shader = render(config, problem)
        assert "{{" not in shader.wgsl and "{%" not in shader.wgsl and "}}" not in shader.wgsl
        assert "@compute" in shader.wgsl and "fn main" in shader.wgsl
        (step,) = shader.plan.passes
        assert step.entry_point == "main" and min(step.grid + step.workgroup_size) >= 1


def test_blocked_register_tile_is_unrolled_into_variables():
    config = Config.make(
        "blocked",
        dict(VEC=4, BM=64, TM=4, BN=64, TN=8, BK=16, PAD=0, UNROLL=1, DB=0, AT=0, GROUP=1, WARP=0),
    )
    wgsl = render(config, Problem(256, 256, 256)).wgsl
    assert "var acc3_1 = vec4<f32>(0.0);" in wgsl  # 4 rows x 2 vec4 = 8 accumulators
    assert "acc4_" not in wgsl and "array<vec4<f32>, 8>" not in wgsl
    rolled = render(
        Config.make("blocked", dict(config.as_dict(), UNROLL=0)), Problem(256, 256, 256)
    )
    assert "for (var kv = 0u; kv < BKV; kv++)" in rolled.wgsl and len(rolled.wgsl) < len(wgsl)


def test_invalid_config_is_refused_before_rendering():
    config = Config.make(
        "blocked",
        dict(VEC=4, BM=64, TM=4, BN=64, TN=8, BK=16, PAD=0, UNROLL=1, DB=0, AT=1, GROUP=1, WARP=0),
    )
    with pytest.raises(ValueError, match="group_fits"):
        render(Config.make("blocked", dict(config.as_dict(), GROUP=4)), Problem(64, 64, 64))


def test_missing_parameter_fails_loudly(tmp_path, monkeypatch):
    (tmp_path / "partial.wgsl.j2").write_text("const X = {{ NOT_DEFINED }};\n")
    (tmp_path / "partial.toml").write_text(
        "[params]\nX = [1]\n[derived]\ninvocations='1'\nworkgroup_size_x='1'\n"
        "workgroup_size_y='1'\nworkgroup_storage='0'\ngrid_x='1'\ngrid_y='1'\n"
    )
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    with pytest.raises(jinja2.UndefinedError, match="NOT_DEFINED"):
        render(Config.make("partial", {"X": 1}), Problem(1, 1, 1))


def test_template_hash_changes_with_the_template(tmp_path, monkeypatch):
    (tmp_path / "mine.wgsl.j2").write_text("// one\n")
    (tmp_path / "mine.toml").write_text("[params]\nX = [1]\n")
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    before = template_hash("mine")
    (tmp_path / "mine.wgsl.j2").write_text("// two\n")
    assert template_hash("mine") != before


def test_edge_tests_only_where_tiles_are_ragged():
    config = Config.make(
        "blocked",
        dict(VEC=4, BM=64, TM=4, BN=64, TN=8, BK=16, PAD=0, UNROLL=1, DB=1, AT=0, GROUP=1, WARP=0),
    )
    whole = render(config, Problem(128, 128, 64)).wgsl
    ragged = render(config, Problem(130, 132, 68)).wgsl
    for test in ("row0 + ar0 < M", "colv0 + bc0 < NV", "kn + br0 < K", "r < M"):
        assert test not in whole and test in ragged


def test_template_hash_ignores_files_the_template_does_not_include(tmp_path, monkeypatch):
    (tmp_path / "mine.wgsl.j2").write_text('{% include "_bindings.wgsl.j2" %}\n')
    (tmp_path / "mine.toml").write_text("[params]\nX = [1]\n")
    (tmp_path / "_unrelated.wgsl.j2").write_text("// one\n")
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    before = template_hash("mine")
    (tmp_path / "_unrelated.wgsl.j2").write_text("// two\n")
    assert template_hash("mine") == before


@pytest.mark.parametrize("broken", ["no kernel file", "a Jinja error", "a TOML error"])
def test_a_broken_template_named_to_tune_is_refused_in_one_line(
    tmp_path, monkeypatch, capsys, broken
):
    """Its name is listed (a .toml on the template path), but it cannot be read, hashed or
    parsed: tune refuses it naming --template before any work, not as a traceback."""
    naive = (data_path("search_spaces") / "naive.toml").read_text()
    (tmp_path / "mine.toml").write_text(naive if broken != "a TOML error" else "[params\n")
    if broken != "no kernel file":
        wgsl = (data_path("templates") / "naive.wgsl.j2").read_text()
        (tmp_path / "mine.wgsl.j2").write_text(wgsl if broken != "a Jinja error" else "{% if %}")
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    argv = ["tune", "--shape", "8x8x8", "--template", "mine", "--cache", str(tmp_path / "c")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "argument --template: template 'mine' cannot be used" in err and err.count("\n") == 1


def test_a_template_of_one_s_own_left_out_is_said(tmp_path, monkeypatch):
    """One that shadows a built-in, or whose name is no identifier, is ignored with a
    warning naming its file and why; the built-in stays the one served."""
    from autotune.data import template_sources

    for name in ("blocked", "my-tile", "mine"):
        (tmp_path / f"{name}.toml").write_text("")
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    with pytest.warns(UserWarning) as warned:
        sources = template_sources()
    said = sorted(str(w.message) for w in warned)
    assert len(said) == 2
    assert f"{tmp_path / 'blocked.toml'} is ignored: it shadows" in said[0]
    assert f"{tmp_path / 'my-tile.toml'} is ignored: its name is not" in said[1]
    assert sources["blocked"][1] == data_path("search_spaces") / "blocked.toml"
    assert sources["mine"][1] == tmp_path / "mine.toml" and "my-tile" not in sources
