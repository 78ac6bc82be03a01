"""The command line, called as a user would (main(argv) and a real subprocess)."""

import json
import subprocess
import sys

import pytest

from autotune.__main__ import main

BAD = [
    (["tune", "--shape", "0x4x4"], "--shape: M must be >= 1, got 0"),
    (["tune", "--shape", "4x-4x4"], "--shape: N must be >= 1, got -4"),
    (["tune", "--shape", "4x4"], "--shape: shape '4x4' is not of the form MxNxK"),
    (["tune", "--shape", "big"], "--shape: shape 'big' is not of the form MxNxK"),
    (["tune", "--shape", "4x4x4", "--dtype", "f64"], "--dtype: invalid choice: 'f64'"),
    (["tune", "--shape", "4x4x4", "--template", "nope"], "--template: invalid choice: 'nope'"),
    (["tune", "--shape", "4x4x4", "--sampler", "magic"], "--sampler: invalid choice: 'magic'"),
    (["tune", "--shape", "4x4x4", "--trials", "0"], "--trials: must be an integer >= 1, got 0"),
    (["tune", "--shape", "4x4x4", "--trials", "x"], "--trials: must be an integer >= 1, got 'x'"),
    (["tune", "--shape", "4x4x4", "--timeout", "-3"], "--timeout: must be a number of seconds"),
    (["tune", "--shape", "4x4x4", "--checks", "maybe"], "--checks: invalid choice: 'maybe'"),
    (["tune", "--shape", "4x4x4", "--storage", "nosuchdb://x"], "--storage: storage 'nosuchdb"),
    (["tune", "--shape", "4x4x4", "--storage", "sqlite:////nonexistent/dir/x.db"], "--storage:"),
    (["tune"], "the following arguments are required: --shape"),
    (["lookup", "--shape", "1x1x0"], "--shape: K must be >= 1, got 0"),
    (["frobnicate"], "argument command: invalid choice: 'frobnicate'"),
    ([], "the following arguments are required: command"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) or "nothing" for a, _ in BAD])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("autotune: error: argument ") or "required" in err
    assert message in err


def test_bad_argument_in_a_real_process():
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "tune", "--shape", "0x1x1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_help_documents_every_command():
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "--help"], capture_output=True, text=True, timeout=60
    )
    for command in ("tune", "lookup", "devices", "demo"):
        assert command in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "tune", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    for option in (
        "--shape",
        "--dtype",
        "--trials",
        "--timeout",
        "--template",
        "--checks",
        "--sampler",
        "--storage",
        "--cache",
        "--layout",
        "--batch",
        "--shared-b",
        "--epilogue",
        "--accumulate",
    ):
        assert option in done.stdout


@pytest.mark.gpu
def test_tune_then_lookup_exact(gpu, tmp_path, capsys):
    cache = str(tmp_path / "cache")
    assert (
        main(["tune", "--shape", "48x40x24", "--trials", "6", "--cache", cache, "--seed", "1"]) == 0
    )
    out = capsys.readouterr().out
    assert "48x40x24" in out and "GFLOP/s" in out and "tiled 16x16" in out and "speed-up" in out
    assert main(["lookup", "--shape", "48x40x24", "--cache", cache, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["source"] == "exact" and info["tuned_for"] == "48x40x24" and info["gflops"] > 0
    assert main(["lookup", "--shape", "47x40x24", "--cache", cache, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] in ("nearest", "default")


@pytest.mark.gpu
def test_devices_and_demo(gpu, capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "fingerprint" in out and "max-compute-workgroup-storage-size" in out
    assert main(["demo", "--shape", "40x40x40"]) == 0
    out = capsys.readouterr().out
    assert out.count("ok") >= 3 and "WRONG" not in out


@pytest.mark.gpu
def test_variant_tune_lookup_export(gpu, tmp_path, capsys):
    """f16, B transposed, a batch of 2, bias and GELU fused: tuned, cached under its own
    key, looked up exactly, nearest for another M, exported with its manifest fields."""
    cache = str(tmp_path / "cache")
    variant = ["--dtype", "f16", "--layout", "nt", "--batch", "2", "--epilogue", "gelu,bias"]
    argv = ["tune", "--shape", "40x48x24", *variant, "--trials", "3", "--cache", cache]
    assert main([*argv, "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "blockedx" in out and "epilogue bias,gelu" in out
    (path,) = (tmp_path / "cache").glob("*.json")
    (key,) = json.loads(path.read_text())["entries"]
    assert key.startswith("blockedx:") and key.endswith(":f16:nt:device:40x48x24:b2:bias,gelu")
    assert main(["lookup", "--shape", "40x48x24", *variant, "--cache", cache, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["source"] == "exact" and info["template"] == "blockedx"
    assert (info["layout"], info["batch"], info["epilogue"]) == ("nt", 2, "bias,gelu")
    assert main(["lookup", "--shape", "44x48x24", *variant, "--cache", cache, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "nearest"
    assert main(["lookup", "--shape", "40x48x24", "--dtype", "f16", "--cache", cache]) == 0
    assert "source: default" in capsys.readouterr().out
    out_dir = tmp_path / "out"
    assert (
        main(["export", "--shape", "40x48x24", *variant, "--cache", cache, "--out", str(out_dir)])
        == 0
    )
    (manifest,) = out_dir.glob("*.json")
    data = json.loads(manifest.read_text())
    assert manifest.name == "gemm_40x48x24_f16_nt_b2_bias_gelu.json"
    assert data["required_features"] == ["shader-f16"] and data["layout"] == "nt"
    assert data["batch"] == 2 and data["epilogue"]["ops"] == ["bias", "gelu"]
    assert [b["name"] for b in data["bindings"]] == ["A", "B", "C", "dims", "bias"]
    assert data["dispatch"][2] == 2 and data["bindings"][1]["shape"] == [2, 48, 24]
    wgsl = manifest.with_suffix(".wgsl").read_text()  # the header after `enable f16;`
    assert wgsl.startswith("enable f16;\n// autotune GEMM kernel, f16, M = 40")
    gpu.create_shader_module(wgsl)  # still valid WGSL
