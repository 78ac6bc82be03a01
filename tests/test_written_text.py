"""Text that autotune validates or writes: names and fields match in full (Python's `$`
also matches before a final newline), nothing in an export's comments has a line break,
and the exact text of an export, header included, is compiled and verified before any
file is written."""

import dataclasses
import json
import shutil
import subprocess

import pytest
from entries import seed_entry

import autotune
from autotune import cache
from autotune.arguments import ArgumentError
from autotune.compile import compile_shader
from autotune.device import one_line, versions
from autotune.export import _verify_text
from autotune.kernel import Kernel
from autotune.problem import Problem
from autotune.space import load_space
from autotune.verify import verify

PROBLEM = Problem(64, 64, 64)


@pytest.mark.parametrize("name", ["gemm\n", "gemm\r\n", "\ngemm", "gemm\u2028", "ge\nmm"])
def test_export_refuses_a_name_with_a_line_break(gpu, tmp_path, name):
    with pytest.raises(autotune.ExportError, match="name") as raised:
        autotune.export(autotune.lookup(4, 4, 4, gpu=gpu), tmp_path, name=name)
    assert raised.value.field == "name"
    assert list(tmp_path.iterdir()) == []


def tuned_entry(gpu, date):
    return seed_entry(PROBLEM, date=date)


def test_an_entry_dated_with_a_trailing_newline_never_reaches_an_export(gpu, tmp_path):
    folder = tmp_path / "cache"
    store = cache.DeviceCache(folder, gpu.fingerprint.as_dict(), versions())
    store.put(tuned_entry(gpu, cache.today()))
    data = json.loads(store.path.read_text())
    for value in data["entries"].values():
        value["date"] += "\n"
    store.path.write_text(json.dumps(data))
    with pytest.warns(cache.CacheWarning, match="ignored"):
        kernel = autotune.lookup(64, 64, 64, cache_dir=folder, gpu=gpu)
    assert kernel.source != "exact"
    paths = autotune.export(kernel, tmp_path / "out")
    gpu.device.create_shader_module(code=paths["wgsl"].read_text())  # wgpu takes it


@pytest.mark.parametrize("date", ["2026-01-02T03:04:05Z\n", "2026-01-02\u2028@compute"])
def test_export_refuses_a_header_field_with_a_line_break(gpu, tmp_path, date):
    """An entry made in Python, never read from a file: the header's check refuses it."""
    entry = tuned_entry(gpu, date)
    kernel = Kernel(PROBLEM, entry.config, "exact", gpu=gpu, entry=entry)
    with pytest.raises(autotune.ExportError, match="date .* has a line break"):
        autotune.export(kernel, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_written_wgsl_is_the_verified_text(gpu, tmp_path):
    entry = tuned_entry(gpu, cache.today())
    kernel = Kernel(PROBLEM, entry.config, "exact", gpu=gpu, entry=entry)
    paths = autotune.export(kernel, tmp_path)
    text = paths["wgsl"].read_text()
    header = text[: text.index(kernel.wgsl[:40])]
    assert header and all(line.startswith("// ") for line in header.splitlines())
    assert "tuned on" in header and entry.date in header
    shader = dataclasses.replace(kernel.shader, wgsl=text)
    assert verify(compile_shader(shader, gpu), gpu).ok


def test_text_that_does_not_compile_is_refused_before_any_file(gpu):
    kernel = autotune.lookup(4, 4, 4, gpu=gpu)
    with pytest.raises(autotune.ExportError, match="does not compile") as raised:
        _verify_text(kernel, kernel.wgsl + "\nthis is not WGSL\n")
    assert raised.value.field == "kernel"


def test_kernel_source_is_one_of_three_words(gpu):
    config = load_space("naive").seed_configs(PROBLEM)[0]
    with pytest.raises(ArgumentError, match="source") as raised:
        Kernel(PROBLEM, config, "exact\n// injected", gpu=gpu)
    assert raised.value.field == "source"


def test_adapter_summary_is_one_line(gpu):
    assert gpu.summary == one_line(gpu.adapter.summary) and gpu.summary.splitlines() == [
        gpu.summary
    ]
    assert one_line(" Mesa\n22\r\x0b\x0c\x85\u2028\u2029x\x00 \t") == "Mesa 22 x"


# --- the written .js, parsed by Node where Node is installed (Chromium parses it in
# tests/test_export.py, everywhere) ---------------------------------------------------


def node_check(path) -> subprocess.CompletedProcess:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (Chromium parses the module in test_export.py)")
    module = path.with_suffix(".mjs")  # parsed as an ES module, as a browser imports it
    shutil.copy(path, module)
    return subprocess.run([node, "--check", str(module)], capture_output=True, text=True)


def test_written_module_parses_as_javascript(gpu, tmp_path):
    problem = Problem(37, 44, 28, "f32", "nt", 3, False, "alpha,beta,bias,gelu")
    for kernel in (
        autotune.lookup(70, 36, 44, gpu=gpu),
        autotune.lookup(**problem.arguments, gpu=gpu),
    ):
        paths = autotune.export(kernel, tmp_path)
        result = node_check(paths["js"])
        assert result.returncode == 0, result.stderr


def test_node_check_sees_a_broken_comment(gpu, tmp_path):
    paths = autotune.export(autotune.lookup(4, 4, 4, gpu=gpu), tmp_path, name="broken")
    text = paths["js"].read_text()
    paths["js"].write_text(text.replace("// Usage:", "// Usage\n:", 1))
    result = node_check(paths["js"])
    assert result.returncode != 0 and "SyntaxError" in result.stderr
