"""The command line, called as a user would (main(argv) and a real subprocess)."""

import json
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
def test_tune_shapes_from_a_model_file_tunes_each_problem_once(gpu, tmp_path, capsys):
    model = tmp_path / "model.toml"
    model.write_text(
        '[[problems]]\nname = "qkv"\nshape = "24x20x16"\n'
        '[[problems]]\nname = "qkv again"\nM = 24\nN = 20\nK = 16\n'
        '[[problems]]\nname = "out"\nshape = "20x24x16"\n'
    )
    argv = ["tune", "--shapes-from", str(model), "--shape", "20x24x16", "--trials", "2"]
    argv += ["--template", "naive", "--cache", str(tmp_path / "cache")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2/2 shapes" in out  # one display for the whole list
    summary = out[out.index("best kernel per shape") :]
    assert summary.count("24x20x16") == 2 and summary.count("20x24x16") == 2  # table + config
    for shape in ("24x20x16", "20x24x16"):
        assert main(["lookup", "--shape", shape, "--json", "--cache", str(tmp_path / "cache")]) == 0
        assert json.loads(capsys.readouterr().out)["source"] == "exact"
