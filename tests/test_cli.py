"""The command line, called as a user would (main(argv) and a real subprocess)."""

import json
import os
import subprocess
import sys

import pytest

from autotune.__main__ import main

# Every bad argument of every command: tests/test_arguments.py (one table for the CLI).


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


@pytest.mark.slow
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
    assert json.loads(capsys.readouterr().out)["source"] == "estimated"  # timed, then kept


def test_lookup_wgsl_writes_the_kernel_alone_to_stdout(gpu, tmp_path):
    """`lookup --wgsl > k.wgsl` is a shader that compiles; what was served goes to stderr;
    a reader that is gone before anything is written (`| true`) ends it with exit code 1
    and no traceback, however stdout is buffered."""
    argv = [sys.executable, "-m", "autotune", "lookup", "--shape", "24x20x16", "--wgsl"]
    argv += ["--cache", str(tmp_path), "--no-estimate"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "source: predicted" in done.stderr and "source" not in done.stdout
    gpu.device.create_shader_module(code=done.stdout)  # raises on anything but WGSL
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    closed = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$@" | true', "bash", *argv],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert closed.returncode == 1 and "Error" not in closed.stderr, closed.stderr


def test_devices_and_demo(gpu, capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "fingerprint" in out and "max-compute-workgroup-storage-size" in out
    assert main(["demo", "--shape", "40x40x40"]) == 0
    out = capsys.readouterr().out
    assert out.count("ok") >= 3 and "WRONG" not in out


@pytest.mark.slow
def test_tune_shapes_from_a_model_file_tunes_each_problem_once(gpu, tmp_path, capsys):
    model = tmp_path / "model.toml"
    model.write_text(
        '[[problems]]\nname = "qkv"\nshape = "24x20x16"\n'
        '[[problems]]\nname = "qkv again"\nM = 24\nN = 20\nK = 16\n'
        '[[problems]]\nname = "out"\nshape = "20x24x16"\n'
        '[[problems]]\nname = "out, weights as stored"\nshape = "20x24x16"\nlayout = "nt"\n'
    )
    argv = ["tune", "--shapes-from", str(model), "--shape", "20x24x16", "--trials", "2"]
    argv += ["--cache", str(tmp_path / "cache")]
    assert main([*argv, "--template", "naive"]) == 2  # naive cannot do the nt problem...
    assert "--template: naive compute only the plain problem" in capsys.readouterr().err
    assert not list((tmp_path / "cache").glob("*.json"))  # ...found before any tuning
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "3/3 shapes" in out  # one display for the whole list
    for shape, layout in (("24x20x16", "nn"), ("20x24x16", "nn"), ("20x24x16", "nt")):
        argv = ["lookup", "--shape", shape, "--layout", layout, "--json"]
        assert main([*argv, "--cache", str(tmp_path / "cache")]) == 0
        assert json.loads(capsys.readouterr().out)["source"] == "exact"


@pytest.mark.slow
def test_tune_model_tunes_representatives_and_lookup_serves_the_rest(gpu, tmp_path, capsys):
    model = tmp_path / "layer.json"
    model.write_text(
        json.dumps(
            [
                {"name": "q", "shape": "32x24x16"},
                {"name": "k", "shape": "32x24x20"},  # 0.22 from q: q's kernel serves it
                {"name": "up", "shape": "32x96x16"},  # 1.39 from q: its own
                {"name": "q in f16", "shape": "32x24x16", "dtype": "f16"},  # another variant
            ]
        )
    )
    cache = tmp_path / "cache"
    argv = ["tune", "--model", str(model), "--trials", "2", "--cache", str(cache)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "3 of 4 problems to tune (radius 1)" in out and "3/3 shapes" in out
    (path,) = cache.glob("*.json")
    tuned = {
        key.split(":")[3] + " " + key.split(":")[6]
        for key in json.loads(path.read_text())["entries"]
    }
    assert tuned == {"f32 32x24x20", "f32 32x96x16", "f16 32x24x16"}  # the largest of a pair
    assert main(["lookup", "--shape", "32x24x16", "--cache", str(cache), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["source"] == "estimated" and info["tuned_for"] == "32x24x16"
    assert main(["lookup", "--shape", "32x24x16", "--cache", str(cache), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)  # served again, not estimated again
    assert again["config"] == info["config"] and again["lookup_s"] < info["lookup_s"] / 4
    assert main([*argv, "--radius", "0"]) == 0  # every problem its own
    assert "4 of 4 problems to tune" in capsys.readouterr().out
    entries = json.loads(path.read_text())["entries"].values()
    assert len([e for e in entries if not e["estimated"]]) == 4  # and the estimate above


@pytest.mark.slow
def test_variant_tune_lookup_export(gpu, tmp_path, capsys):
    """f16, B transposed, a batch of 2, bias and GELU fused: tuned, cached under its own
    key, looked up exactly, nearest for another M, exported with its manifest fields."""
    cache = str(tmp_path / "cache")
    variant = ["--dtype", "f16", "--layout", "nt", "--batch", "2", "--epilogue", "bias,gelu"]
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
    assert json.loads(capsys.readouterr().out)["source"] == "estimated"
    argv = ["lookup", "--shape", "40x48x24", "--dtype", "f16", "--cache", cache, "--no-estimate"]
    assert main(argv) == 0
    assert "source: predicted" in capsys.readouterr().out
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
    assert [b["name"] for b in data["buffers"]] == ["A", "B", "C", "dims", "bias"]
    assert data["passes"][0]["dispatch"][2] == 2 and data["buffers"][1]["shape"] == [2, 48, 24]
    wgsl = manifest.with_suffix(".wgsl").read_text()  # the header after `enable f16;`
    assert wgsl.startswith("enable f16;\n// autotune GEMM kernel, f16, M = 40")
    gpu.create_shader_module(wgsl)  # still valid WGSL
