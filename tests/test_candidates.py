"""Candidate sets: `export --candidates K`, the configs chosen and those left out, the
set's selection in headless Chromium (SwiftShader) with the stored choice reused after a
reload, a candidate that fails on the device skipped, and the demo page."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chromium import EXAMPLE, decoded_results, run_bundles, run_in_chromium
from entries import seed_entry

import autotune
from autotune import cache
from autotune.__main__ import main
from autotune.device import versions
from autotune.export import ExportError, bundle_hash, export
from autotune.problem import Problem
from autotune.space import Config, load_space

pytestmark = pytest.mark.gpu
SHAPE = (64, 48, 80)


def other_machine(folder: Path, gpu, device: str, entries) -> Path:
    """A cache file as another machine (device `device`) would have written it."""
    fingerprint = gpu.fingerprint.as_dict() | {"device": device, "device_id": len(device)}
    store = cache.DeviceCache(folder, fingerprint, versions())
    folder.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        assert store.put(entry)
    return store.path


def entry_of(problem: Problem, config: Config, gflops: float) -> cache.Entry:
    entry = seed_entry(problem, gflops=gflops)
    key = cache.Key.of(problem, config, True)
    return cache.Entry(**(vars(entry) | {"key": key, "params": config.as_dict()}))


def chosen_as(data: dict) -> list[str]:
    return [c["provenance"]["chosen_as"] for c in data["candidates"]]


def test_the_exported_kernel_comes_first_then_each_device_s_best(gpu, cache_dir, tmp_path):
    problem = Problem(*SHAPE)
    tiled = load_space("tiled").seed_configs(problem)[0]
    big = Problem(1024, 1024, 1024)
    blocked = load_space("blocked").seed_configs(problem)[-1]
    other = other_machine(tmp_path / "a", gpu, "Other GPU", [entry_of(problem, tiled, 900.0)])
    third = other_machine(tmp_path / "b", gpu, "Third GPU", [entry_of(big, blocked, 5000.0)])
    kernel = autotune.lookup(*SHAPE, cache_dir=cache_dir, gpu=gpu)
    paths = export(
        kernel, tmp_path / "out", "set", candidates=8, cache_dir=cache_dir,
        caches=[other, third.parent],
    )  # fmt: skip
    data = json.loads(paths["json"].read_text())
    assert data["kind"] == "candidates" and data["shape"] == {"M": 64, "N": 48, "K": 80}
    first = data["candidates"][0]
    assert first["config"] == {
        "template": kernel.config.template,
        "params": kernel.config.as_dict(),
    }
    assert chosen_as(data)[0].startswith("exported")
    # a config chosen for several reasons is in the set once, with each reason
    by_reason = {r: c for c in data["candidates"] for r in c["provenance"]["chosen_as"].split("; ")}
    assert by_reason["best on Other GPU"]["config"]["params"] == tiled.as_dict()
    measured = by_reason["best on Third GPU"]["provenance"]["measured"]
    assert measured["shape"] == "1024x1024x1024" and measured["gflops"] == 5000.0
    assert "best on NVIDIA H200" in by_reason  # the shipped cache is read too
    configs = [json.dumps(c["config"], sort_keys=True) for c in data["candidates"]]
    assert len(configs) == len(set(configs)) == 8 and data["left_out"] == []
    texts = [paths[f"c{i}"].read_text() for i in range(8)]
    assert [c["name"] for c in data["candidates"]] == [f"set_c{i}" for i in range(8)]
    assert data["hash"] == bundle_hash(texts)
    module = paths["js"].read_text()
    assert json.dumps(texts[3]) in module and f'"hash": "{data["hash"]}"' in module


def test_a_candidate_that_fails_here_is_left_out_with_why(
    gpu, cache_dir, tmp_path, faulty_templates
):
    """Another machine's cache names a config that computes the wrong product here
    (faulty MODE 2 drops the last k) and one that does not compile (MODE 1)."""
    problem = Problem(*SHAPE)
    caches = []
    for name, mode in (("Wrong GPU", 2), ("Broken GPU", 1)):
        entry = entry_of(problem, Config.make("faulty", {"MODE": mode}), 5000.0)
        caches.append(other_machine(tmp_path / name, gpu, name, [entry]))
    kernel = autotune.lookup(*SHAPE, cache_dir=cache_dir, gpu=gpu)
    paths = export(kernel, tmp_path / "out", "set", candidates=4, caches=caches)
    data = json.loads(paths["json"].read_text())
    left_out = {item["chosen_as"]: item for item in data["left_out"]}
    assert "MODE=2" in left_out["best on Wrong GPU"]["config"]
    assert "wrong" in left_out["best on Wrong GPU"]["why"]
    assert "compile" in left_out["best on Broken GPU"]["why"]
    assert all(c["config"]["template"] != "faulty" for c in data["candidates"])
    assert len(data["candidates"]) == 4  # the places were filled by others


@pytest.mark.parametrize(
    "arguments, field",
    [
        (dict(candidates=0), "candidates"),
        (dict(candidates=17), "candidates"),
        (dict(candidates="3"), "candidates"),
        (dict(candidates=True), "candidates"),
        (dict(candidates=2, caches=["/no/such/cache.json"]), "caches"),
    ],
)
def test_bad_candidate_arguments_are_refused_by_name(gpu, tmp_path, arguments, field):
    kernel = autotune.lookup(*SHAPE, gpu=gpu)
    with pytest.raises(ExportError) as caught:
        export(kernel, tmp_path / "out", **arguments)
    assert caught.value.field == field and not (tmp_path / "out").exists()


def test_a_named_file_that_is_not_a_cache_is_refused(gpu, tmp_path):
    (tmp_path / "notes.json").write_text("{}")
    kernel = autotune.lookup(*SHAPE, gpu=gpu)
    with pytest.raises(ExportError, match="notes.json: not a cache file") as caught:
        export(kernel, tmp_path / "out", candidates=2, caches=[tmp_path / "notes.json"])
    assert caught.value.field == "caches"


def test_cli_exports_a_candidate_set(gpu, tmp_path, cache_dir, capsys):
    other = other_machine(tmp_path / "a", gpu, "Other GPU", [seed_entry(Problem(*SHAPE))])
    out = tmp_path / "out"
    argv = ["export", "--shape", "64x48x80", "--out", str(out), "--candidates", "3"]
    assert main(argv + ["--caches", str(other)]) == 0
    name = "gemm_64x48x80_f32"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{name}.js", f"{name}.json"] + [f"{name}_c{i}.wgsl" for i in range(3)]
    )
    assert main(["export", "--shape", "64x48x80", "--out", str(out), "--caches", str(other)]) == 2
    assert "--caches: only with --candidates" in capsys.readouterr().err
    assert main(argv[:-1] + ["0"]) == 2


def broken_copy(folder: Path, name: str, index: int) -> str:
    """A copy of bundle `name` whose candidate `index` has WGSL no device accepts (and,
    as export would give it, another hash: the original's stored choice is not its)."""
    module = (folder / f"{name}.js").read_text()
    text = (folder / f"{name}_c{index}.wgsl").read_text()
    texts = [(folder / f"{name}_c{i}.wgsl").read_text() for i in range(3)]
    texts[index] += "\nthis is not wgsl;\n"
    broken = module.replace(json.dumps(text), json.dumps(texts[index]))
    broken = broken.replace(
        bundle_hash(texts[:index] + [text] + texts[index + 1 :]), bundle_hash(texts)
    )
    assert broken.count(bundle_hash(texts)) == 1 and json.dumps(texts[index]) in broken
    (folder / f"{name}_broken.js").write_text(broken)
    return f"{name}_broken"


@pytest.mark.slow
def test_a_set_picks_checks_and_reuses_its_choice_in_chromium(gpu, tmp_path, cache_dir):
    kernel = autotune.lookup(*SHAPE, cache_dir=cache_dir, gpu=gpu)
    folder = tmp_path / "bundles"
    export(kernel, folder, "cset", candidates=3, cache_dir=cache_dir)
    broken = broken_copy(folder, "cset", 1)
    shutil.copy(folder / "cset.js", folder / "cset_copy.js")  # the same bundle, another URL
    query = f"&wallclock={broken}&othergpu=cset_copy"
    results = run_bundles(folder, ["cset", broken, "cset_copy"], query)
    first, reloaded = results["cset"], results["cset@reload"]
    assert first["ok"] and first["errors"] == [] and first["skipped"] == [], first
    assert first["selected"]["how"] == "timed"
    timings = first["timings"]
    assert [t["index"] for t in timings] == [0, 1, 2]
    method = "timestamp" if first["timestamps"] else "wall clock"
    assert all(t["method"] == method and 1 <= len(t["ms"]) <= 7 for t in timings)
    fastest = min(timings, key=lambda t: t["median"])
    assert first["selected"]["index"] == fastest["index"]
    assert first["selected"]["config"] == fastest["config"]
    # the reload: the stored choice, with the timings of the first visit, not timed again
    assert reloaded["ok"] and reloaded["selected"] == first["selected"] | {"how": "stored"}
    assert reloaded["timings"] == timings
    # the candidate whose WGSL fails is skipped with the device's reason; the rest run
    skipping = results[broken]
    assert skipping["ok"] and skipping["errors"] == [], skipping
    assert [s["index"] for s in skipping["skipped"]] == [1] and skipping["skipped"][0]["why"]
    assert [t["index"] for t in skipping["timings"]] == [0, 2]
    assert all(t["method"] == "wall clock" for t in skipping["timings"])
    # the reload builds the stored candidate alone: the broken one is not tried again
    assert results[f"{broken}@reload"]["selected"]["how"] == "stored"
    assert results[f"{broken}@reload"]["skipped"] == []
    # the same bundle on the same GPU reuses the choice; on another GPU it times again
    assert results["cset_copy"]["selected"] == first["selected"] | {"how": "stored"}
    again = results["cset_copy@reload"]
    assert again["ok"] and again["selected"]["how"] == "timed", again
    assert all(t["repeats"] >= 1 and t["median"] > 0 for t in again["timings"])


def load_serve():
    spec = importlib.util.spec_from_file_location("serve", EXAMPLE / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_serve_refuses_a_bad_shape(capsys):
    assert load_serve().main(["--shape", "64x48", "--port", "0"]) == 2
    assert "shape '64x48' is not of the form MxNxK" in capsys.readouterr().err


@pytest.mark.slow
def test_the_demo_page_times_shows_and_checks_in_chromium(gpu, tmp_path, cache_dir):
    """The documented command, serve.py, then the page in Chromium."""
    command = [sys.executable, str(EXAMPLE / "serve.py"), "--shape", "40x24x56"]
    command += ["--candidates", "3", "--port", "0", "--out", str(tmp_path / "bundles")]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert "serving http://127.0.0.1:" in line, line
        url = line.split("serving ")[1].split()[0]
        demo = decoded_results(run_in_chromium(url))["demo"]
    finally:
        server.kill()
        server.wait(30)
    assert demo["ok"] and demo["rows"] == 3 and demo["selected"]["how"] == "timed", demo
    assert sorted(t["index"] for t in demo["timings"]) == [0, 1, 2]
