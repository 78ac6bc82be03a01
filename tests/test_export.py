"""Export bundles: files, manifest, and a real browser (headless Chromium, WebGPU on
SwiftShader, i.e. Dawn and Tint rather than wgpu and naga) running them unchanged."""

import base64
import functools
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import autotune
from autotune.__main__ import main
from autotune.device import portable_limits
from autotune.kernel import Kernel
from autotune.problem import Problem
from autotune.space import Config, load_space

RUNNER = Path(__file__).parent / "browser"


def blocked(**params):
    base = dict(
        VEC=4, BM=64, TM=4, BN=64, TN=4, BK=16, PAD=0, UNROLL=1, DB=0, AT=0, GROUP=1, WARP=0
    )
    return Config.make("blocked", base | params)


def test_bundle_files_and_manifest(gpu, tmp_path):
    kernel = autotune.lookup(70, 36, 44, portable=True)
    paths = autotune.export(kernel, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gemm_70x36x44_f32.js",
        "gemm_70x36x44_f32.json",
        "gemm_70x36x44_f32.wgsl",
    ]
    manifest = json.loads(paths["json"].read_text())
    assert manifest["shape"] == {"M": 70, "N": 36, "K": 44} and manifest["format"] == 2
    assert [(b["binding"], b["name"], b["kind"]) for b in manifest["buffers"]] == [
        (0, "A", "read-only-storage"),
        (1, "B", "read-only-storage"),
        (2, "C", "storage"),
        (3, "dims", "uniform"),
    ]
    assert [f["name"] for f in manifest["uniform"]["fields"]] == ["M", "N", "K", "pad"]
    assert manifest["required_limits"] == {} and manifest["required_features"] == []
    (step,) = kernel.shader.plan.passes  # one pass: entry point main
    assert manifest["passes"] == [
        {
            "entry_point": "main",
            "workgroup_size": list(step.workgroup_size),
            "dispatch": list(step.grid),
        }
    ]
    provenance = manifest["provenance"]
    assert provenance["fingerprint"] == gpu.fingerprint.as_dict()
    assert provenance["runtime_checks"] is True and provenance["versions"]["wgpu"]
    wgsl = paths["wgsl"].read_text()
    assert wgsl.startswith("// autotune GEMM kernel: C = A * B") and "70x44" in wgsl
    assert not re.search(r"\{\{|\}\}|\{%|%\}|\{#", wgsl)
    module = paths["js"].read_text()
    assert "export async function createGemm(device, " in module
    assert "export const manifest" in module and json.dumps(wgsl) in module


def test_required_limits_are_listed_when_beyond_webgpu_defaults(gpu, tmp_path):
    config = blocked(BM=128, TM=8, BN=128, TN=8, BK=32)  # 32 KiB of workgroup memory
    problem = Problem(128, 128, 64)
    if load_space("blocked").why_invalid(config, problem, gpu.limits):
        pytest.skip("this adapter cannot run the large config")
    paths = autotune.export(Kernel(problem, config, "default", gpu=gpu), tmp_path)
    required = json.loads(paths["json"].read_text())["required_limits"]
    assert required == {"maxComputeWorkgroupStorageSize": 32768}


def test_bad_name_is_refused(gpu, tmp_path):
    with pytest.raises(autotune.ExportError, match="name '../x'"):
        autotune.export(autotune.lookup(4, 4, 4), tmp_path, name="../x")
    assert not list(tmp_path.iterdir())


def test_a_folder_that_cannot_be_written_is_refused_by_name(gpu, tmp_path):
    """The folder check passes a path below a file, or one through a missing folder to a
    file (out/../FILE); making it, or writing a bundle whose name is a folder, fails:
    an ExportError naming out_dir, not a bare OSError, and no bundle file written."""
    kernel = autotune.lookup(4, 4, 4)
    (tmp_path / "FILE").write_text("a file")
    (tmp_path / "taken" / "gemm.wgsl").mkdir(parents=True)
    for out, name in [
        (tmp_path / "FILE" / "below", None),
        (tmp_path / "missing" / ".." / "FILE", None),
        (tmp_path / "taken", "gemm"),
    ]:
        with pytest.raises(
            autotune.ExportError, match="cannot be written|nothing written"
        ) as raised:
            autotune.export(kernel, out, name)
        assert raised.value.field == "out_dir"
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [tmp_path / "FILE"]


def test_portable_lookup_stays_within_webgpu_defaults(gpu, cache_dir):
    limits = portable_limits(gpu.limits)
    for shape in [(256, 256, 256), (1, 512, 64), (1000, 17, 999)]:
        kernel = autotune.lookup(*shape, portable=True)
        assert (
            load_space(kernel.config.template).why_invalid(kernel.config, kernel.problem, limits)
            is None
        )


@pytest.mark.slow
def test_cli_export(gpu, tmp_path, cache_dir):
    out = tmp_path / "out"
    assert (
        main(
            [
                "export",
                "--shape",
                "20x12x8",
                "--shape",
                "1x16x5",
                "--out",
                str(out),
                "--portable",
                "--trials",
                "3",
            ]
        )
        == 0
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        f"gemm_{s}_f32.{e}" for s in ("20x12x8", "1x16x5") for e in ("js", "json", "wgsl")
    )
    assert main(["export", "--shape", "0x1x1", "--out", str(out)]) == 2


# --- the browser ----------------------------------------------------------------------

BROWSER_CASES = [
    (Problem(64, 48, 40), None),  # whatever lookup(portable=True) gives
    (Problem(1, 33, 17), None),  # a vector times a matrix
    (Problem(130, 68, 36), blocked(DB=1)),  # ragged tiles, double buffered
    (Problem(300, 72, 36), blocked(AT=1, GROUP=4, DB=1)),  # A transposed, banded order
    (Problem(130, 68, 36), blocked(AT=1, DB=2, WARP=1)),  # two workgroup buffers, 3 slices
    (Problem(128, 64, 64), blocked(DB=1, UNROLL=0)),  # whole tiles: no edge tests
    (Problem(67, 45, 37), blocked(VEC=1, BM=32, TM=2, BN=32, TN=2, BK=8, PAD=1)),
    (Problem(67, 45, 37), Config.make("tiled", dict(TX=16, TY=16, TK=16, PAD=1))),
    (Problem(67, 45, 37), Config.make("naive", dict(WX=16, WY=8))),
    # decoding, the plain problem's 16-byte uniform block
    (Problem(1, 37, 129), Config.make("gemv", dict(SG=0, WG=64, TK=8, NC=2, VEC=1, U=2, ACC=0))),
]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def served(tmp_path):
    """tmp_path served over http://127.0.0.1:PORT/ (module scripts need http, not file)."""
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def run_in_chromium(url: str, timeout: float = 240) -> list[str]:
    """Console lines of `url` in headless Chromium with WebGPU on SwiftShader."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("chromium is not installed (.ci/setup installs it)")
    # Chromium's helper processes may still write the profile while they exit.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        command = [
            browser,
            "--headless=new",
            "--no-sandbox",
            "--enable-unsafe-webgpu",
            "--use-webgpu-adapter=swiftshader",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            url,
        ]
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: killed whole below
        )
        lines, deadline = [], time.monotonic() + timeout
        try:
            for line in process.stderr:
                if "CONSOLE" in line or "AUTOTUNE" in line:
                    lines.append(line)
                if "AUTOTUNE_DONE" in line or time.monotonic() > deadline:
                    break
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    return lines


def decoded_results(lines: list[str]) -> dict[str, dict]:
    """The runner's result per bundle name, after checking it ran to the end on
    SwiftShader."""
    assert any("AUTOTUNE_DONE" in line for line in lines), "".join(lines[-20:])
    messages = [re.search(r"(AUTOTUNE_\w+) ([A-Za-z0-9+/=]+)", line) for line in lines]
    decoded = [(m[1], json.loads(base64.b64decode(m[2]))) for m in messages if m]
    adapter = next(value for tag, value in decoded if tag == "AUTOTUNE_ADAPTER")
    assert adapter["architecture"] == "swiftshader", adapter
    return {value["name"]: value for tag, value in decoded if tag == "AUTOTUNE_RESULT"}


@pytest.mark.slow
def test_exported_bundles_run_unchanged_in_chromium(gpu, served):
    folder, base = served
    names = []
    for i, (problem, config) in enumerate(BROWSER_CASES):
        kernel = (
            autotune.lookup(problem.M, problem.N, problem.K, portable=True, gpu=gpu)
            if config is None
            else Kernel(problem, config, "default", gpu=gpu)
        )
        name = f"case{i}_{problem.M}x{problem.N}x{problem.K}"
        autotune.export(kernel, folder, name=name)
        names.append(name)
    for file in ("runner.html", "runner.js"):
        shutil.copy(RUNNER / file, folder / file)
    results = decoded_results(run_in_chromium(f"{base}/runner.html?bundles={','.join(names)}"))
    assert sorted(results) == sorted(names)
    for name, result in results.items():  # each module parsed (loaded), each kernel right
        assert result["loaded"] and result["ok"], f"{name}: {result}"
        assert result["errors"] == []


def variant(**params):
    base = dict(VEC=4, BM=32, TM=4, BN=32, TN=4, BK=16, PAD=0, UNROLL=1, DB=1, AT=1, GROUP=1)
    return Config.make("blockedx", base | dict(ACC=0, SWZ=0) | params)


# One f16 kernel per accumulation type, and transposed, batched, fused ones (ragged M).
F16_CASES = {
    "f16acc": (Problem(36, 44, 40, "f16"), variant(ACC=1)),
    "f16f32": (Problem(37, 44, 40, "f16", "nt"), variant(BK=8, DB=0, SWZ=1)),
}
FUSED_CASES = {
    "nt_batch_gelu": (Problem(37, 44, 28, "f32", "nt", 3, False, "alpha,beta,bias,gelu"), None),
    "tn_shared_relu": (Problem(36, 20, 24, "f32", "tn", 2, True, "bias,relu"), variant()),
    # two passes and a workspace: K cut into ranges, summed with the epilogue
    "splitk_plain": (
        Problem(24, 20, 300),
        load_space("splitk").seed_configs(Problem(24, 20, 300))[-1],
    ),
    "splitk_nt_batch_gelu": (
        Problem(20, 24, 200, "f32", "nt", 2, False, "alpha,beta,bias,gelu"),
        Config.make(
            "splitk", load_space("splitk").seeds[0] | dict(VEC=4, BM=16, TM=4, BN=32, TN=4, SPLIT=4)
        ),
    ),
    # decoding (M <= 16), reduced through workgroup memory: ragged N, odd K
    "decode_workgroup": (
        Problem(3, 37, 129, "f32", "nt", 2, False, "bias,gelu"),
        Config.make("gemv", dict(SG=0, WG=128, TK=16, NC=1, VEC=1, U=4, ACC=0)),
    ),
}
# decoding reduced with subgroupAdd: needs the device feature "subgroups"
SUBGROUP_CASES = {
    "decode_subgroups": (
        Problem(4, 36, 64, "f32", "nt", 1, False, "alpha,bias"),
        Config.make("gemv", dict(SG=1, WG=64, TK=8, NC=1, VEC=4, U=2, ACC=0)),
    ),
}


@pytest.fixture(scope="module")
def variant_results(gpu, tmp_path_factory):
    """The variant bundles, run once in Chromium: name -> the runner's result."""
    folder = tmp_path_factory.mktemp("variants")
    for name, (problem, config) in (F16_CASES | FUSED_CASES | SUBGROUP_CASES).items():
        kernel = (
            Kernel(problem, config, "default", gpu=gpu)
            if config
            else autotune.lookup(**problem.arguments, portable=True, gpu=gpu)
        )
        autotune.export(kernel, folder, name=name)
    for file in ("runner.html", "runner.js"):
        shutil.copy(RUNNER / file, folder / file)
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/runner.html?bundles="
        lines = run_in_chromium(url + ",".join(F16_CASES | FUSED_CASES | SUBGROUP_CASES))
    finally:
        server.shutdown()
        server.server_close()
    messages = [re.search(r"AUTOTUNE_RESULT ([A-Za-z0-9+/=]+)", line) for line in lines]
    return {r["name"]: r for r in (json.loads(base64.b64decode(m[1])) for m in messages if m)}


def test_transposed_batched_fused_bundles_run_in_chromium(variant_results):
    for name in FUSED_CASES:
        result = variant_results[name]
        assert result.get("ok") and result["errors"] == [], f"{name}: {result}"


def test_f16_bundles_run_in_chromium(variant_results):
    skipped = [variant_results[n]["skipped"] for n in F16_CASES if "skipped" in variant_results[n]]
    for name in F16_CASES:  # where it cannot run, createGemm refuses, naming the feature
        refused = variant_results[name].get("refused")
        assert "skipped" not in variant_results[name] or "needs the device feature shader-f16" in (
            refused or ""
        ), variant_results[name]
    if skipped:  # said out loud, never a silent pass
        pytest.skip(f"f16 in the browser: {skipped[0]}")
    for name in F16_CASES:
        result = variant_results[name]
        assert result.get("ok") and result["errors"] == [], f"{name}: {result}"


def test_subgroup_bundles_run_in_chromium(variant_results):
    """Where the browser's adapter has "subgroups" the bundle runs right; where it lacks
    it, createGemm refuses, naming the feature, and the test says so."""
    for name in SUBGROUP_CASES:
        result = variant_results[name]
        if "skipped" in result:
            assert "needs the device feature subgroups" in (result.get("refused") or ""), result
            pytest.skip(f"subgroups in the browser: {result['skipped']}")
        assert result.get("ok") and result["errors"] == [], f"{name}: {result}"


def test_the_browser_check_catches_broken_bundles(gpu, served):
    """The harness must be able to fail: a bundle that skips most of C, one whose
    manifest binds C read-only (a WebGPU validation error), and one whose module does not
    parse (a line break in a comment)."""
    folder, base = served
    kernel = Kernel(Problem(40, 36, 24), blocked(BM=16, TM=2, BN=16, TN=4), "default", gpu=gpu)
    for name in ("short", "readonly", "syntax"):
        autotune.export(kernel, folder, name=name)
    short = folder / "short.js"
    short.write_text(
        short.read_text().replace('"dispatch": [\n    3,\n    3,', '"dispatch": [\n    1,\n    1,')
    )
    readonly = folder / "readonly.js"
    readonly.write_text(
        readonly.read_text().replace('"kind": "storage"', '"kind": "read-only-storage"')
    )
    syntax = folder / "syntax.js"
    syntax.write_text(syntax.read_text().replace("// Usage:", "// Usage\n:", 1))
    for file in ("runner.html", "runner.js"):
        shutil.copy(RUNNER / file, folder / file)
    lines = run_in_chromium(f"{base}/runner.html?bundles=short,readonly,syntax")
    messages = [re.search(r"AUTOTUNE_RESULT ([A-Za-z0-9+/=]+)", line) for line in lines]
    results = {r["name"]: r for r in (json.loads(base64.b64decode(m[1])) for m in messages if m)}
    assert not results["short"]["ok"] and results["short"]["errors"] == []
    assert not results["readonly"]["ok"] and results["readonly"]["errors"]
    assert results["short"]["loaded"] and results["readonly"]["loaded"]
    assert not results["syntax"]["ok"] and results["syntax"]["loaded"] is False
    assert "SyntaxError" in results["syntax"]["errors"][0], results["syntax"]
