"""The benchmark scripts, run as a user runs them, on this machine's adapter. The README's
performance figures come from them on an H200, so they must keep working on any adapter
in between. Without PyTorch their cuBLAS columns are NaN."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
pytestmark = pytest.mark.slow


def run_script(name: str, *args: str, cwd: Path, status: int = 0) -> str:
    """A script of benchmarks/ as a user runs it (Python ones with this interpreter, the
    shell ones with bash and PYTHON naming it), expected to exit with status; its stdout,
    or its stderr where status is not 0."""
    runner = "bash" if name.endswith(".sh") else sys.executable
    done = subprocess.run(
        [runner, str(BENCHMARKS / name), *args],
        cwd=cwd,
        env=os.environ | {"PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == status, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout if status == 0 else done.stderr


def test_bench_times_verified_kernels_in_rounds_and_joins_runs(gpu, cache_dir, tmp_path):
    shapes = ["--shape", "40x24x16", "--shape", "32x32x32"]
    run_script("bench.py", *shapes, "--rounds", "2", "--out", "first", cwd=tmp_path)
    first = json.loads((tmp_path / "first" / "bench.json").read_text())
    assert [row["shape"] for row in first["rows"]] == ["40x24x16", "32x32x32"]
    for row in first["rows"]:
        assert row["tiled"]["seconds"] > 0
        for mode in ("checks", "nochecks"):
            result = row[mode]
            assert len(result["rounds_s"]) == 2 and all(s > 0 for s in result["rounds_s"])
            assert result["seconds"] in result["rounds_s"]  # the median round is kept
            assert result["source"] in ("exact", "estimated", "default")
            assert result["error"] < 1e-4  # verified against float64 before timing
    provenance = first["provenance"]
    assert provenance["device"] == gpu.summary
    assert re.fullmatch(r"[0-9a-f]{7,40}", provenance["commit"])  # the checkout's, not cwd's
    assert "40x24x16" in (tmp_path / "first" / "bench.md").read_text()

    # A later run of a shape replaces the earlier row; the other shapes keep their place.
    run_script("bench.py", "--shape", "32x32x32", "--out", "second", cwd=tmp_path)
    run_script("bench.py", "--join", "first", "second", "--out", "joined", cwd=tmp_path)
    joined = json.loads((tmp_path / "joined" / "bench.json").read_text())
    assert [row["shape"] for row in joined["rows"]] == ["40x24x16", "32x32x32"]
    assert len(joined["rows"][0]["nochecks"]["rounds_s"]) == 2
    assert len(joined["rows"][1]["nochecks"]["rounds_s"]) == 1
    assert len(joined["provenance"]["runs"]) == 2


def test_variants_times_each_combination_and_names_invalid_ones(gpu, cache_dir, tmp_path):
    config = "VEC=4 BM=32 TM=4 BN=32 TN=4 BK=8 PAD=0 UNROLL=1 DB=2 AT=1 GROUP=1 WARP=0"
    vary = ["--vary", "DB=0,2", "--vary", "BM=32,128"]
    args = ["--shape", "40x24x16", "--config", config, *vary, "--checks", "off"]
    run_script("variants.py", *args, "--out", "v.json", cwd=tmp_path)
    rows = json.loads((tmp_path / "v.json").read_text())["rows"]
    assert len(rows) == 4
    for row in rows:
        if "BM=128" in row["config"]:  # taller than twice M: pruned, with the reason
            assert "tile_fits_m" in row["invalid"]
        else:
            assert row["nochecks"]["seconds"] > 0 and "checks" not in row


def test_peak_times_every_width_and_form(gpu, tmp_path):
    if "shader-f16" not in gpu.features:
        pytest.skip("the adapter has no shader-f16")
    out = run_script("peak.py", "1", cwd=tmp_path)
    ratios = re.findall(r"^(scalar|vec2|vec4) (fma|mul-add): .* f16 / f32 ([0-9.]+)$", out, re.M)
    assert len(ratios) == 6
    assert all(math.isfinite(float(r)) and float(r) > 0 for *_, r in ratios)


def test_all_tables_in_one_command_quick(gpu, cache_dir, tmp_path):
    """all.sh --quick: every table of the GPU run, on tiny shapes, and the summary last."""
    stdout = run_script("all.sh", "--quick", "out", cwd=tmp_path)
    out = tmp_path / "out"
    runs = {"suite-f32", "decode-f32", "decode-f16", "longk-f32", "outofbox-f32", "odd-f32"}
    for name in runs:
        report = json.loads((out / name / "bench.json").read_text())
        assert report["provenance"]["quick"] and report["rows"]
        for row in report["rows"]:
            assert math.isnan(row["cublas_s"])  # no torch here
            assert row["bytes"] > 0 and row["problem"].startswith(row["shape"])
            for mode in ("checks", "nochecks") if name == "suite-f32" else ("nochecks",):
                result = row[mode]
                assert result["tbs"] == pytest.approx(row["bytes"] / result["seconds"] / 1e12)
                assert result["source"] in ("exact", "predicted", "default")  # quick: untimed
                assert result["config"].startswith(result["template"] + " ")
        assert set(report["sets"]) == {name.split("-")[0]}
    decode = json.loads((out / "decode-f16" / "bench.json").read_text())["rows"]
    assert {(r["dtype"], r["layout"]) for r in decode} == {("f16", "nt")}
    for model in ("llama-7b", "llama3-8b"):
        for dtype in ("f32", "f16"):
            name = f"layer-{model}-{dtype}"
            runs.add(name)
            report = json.loads((out / name / "layer.json").read_text())
            rows, totals = report["rows"], report["totals"]
            assert set(totals) == {"prefill", "decode"} and {r["dtype"] for r in rows} == {dtype}
            for phase, total in totals.items():
                ours = [r["nochecks"]["seconds"] for r in rows if r["phase"] == phase]
                assert total["gemms"] == len(ours) == 5  # gate and up both counted
                assert total["nochecks"]["seconds"] == pytest.approx(sum(ours))
    summary = stdout[stdout.rindex("Summary") :]
    assert all(f"| {name} |" in summary for name in runs)


def test_table_scripts_name_their_usage_without_one_out_dir(tmp_path):
    """all.sh and quantized.sh share their argument handling: each names itself."""
    for name in ("all.sh", "quantized.sh"):
        for args in ((), ("--quick",), ("a", "b")):
            err = run_script(name, *args, cwd=tmp_path, status=2)
            assert err == f"usage: benchmarks/{name} [--quick] OUT_DIR\n"
    assert not list(tmp_path.iterdir())  # nothing made


def test_quantized_tables_in_one_command_quick(gpu, cache_dir, tmp_path):
    """quantized.sh --quick: each quantized table, its rows of the format it names, the
    bytes moved those of the packed weight (well below the f32 weight's), served by the
    families that compute it."""
    stdout = run_script("quantized.sh", "--quick", "out", cwd=tmp_path)
    int8 = {"qdotv", "qdot", "qdotsplitk"}
    families = {"q4g128": {"qgemv", "qgemm", "qsplitk"}, "q4g128.a8": int8, "q8.a8": int8}
    for name in ("decode-q4g128", "decode-q4g128-a8", "int8-gemm", "q4-prefill", "q4-prefill-a8"):
        rows = json.loads((tmp_path / "out" / name / "bench.json").read_text())["rows"]
        assert rows
        for row in rows:
            fmt = row["problem"].split()[1].split(".", 1)[1]
            assert row["nochecks"]["template"] in families[fmt], row
            M, N, K = (int(n) for n in row["shape"].split("x"))
            weight = row["bytes"] - 4 * (M * K + M * N)  # A and C in f32
            assert 0 < weight < 4 * N * K // 3
        assert f"| {name} |" in stdout


def test_regret_serves_each_held_out_shape_from_the_others(gpu, tmp_path):
    """Leave-one-out over a cache of two tuned shapes: each is served by lookup's
    fallback from the other (timed at the shape) and timed against its own entry."""
    from entries import seed_entry

    from autotune import cache
    from autotune.device import versions
    from autotune.problem import Problem

    store = cache.DeviceCache(tmp_path / "tuned", gpu.fingerprint.as_dict(), versions())
    for shape in ((32, 24, 20), (40, 32, 24)):
        store.put(seed_entry(Problem(*shape), "blocked", checks=False))
    run_script("regret.py", "--leave-one-out", str(tmp_path / "tuned"), "--out", "r.json",
               cwd=tmp_path)  # fmt: skip
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert sorted(r["shape"] for r in rows) == ["32x24x20", "40x32x24"]
    assert all(r["nearest_source"] == "estimated" and r["nearest_s"] > 0 for r in rows)


def test_short_against_long_tune_resumes_the_long_one_across_runs(gpu, cache_dir, tmp_path):
    """A long tune split over two runs (its study kept in the folder), then both kernels
    timed: the row appears only once the long tune has had all its seconds."""
    args = ["--shape", "24x20x16", "--short", "1", "--long", "2", "--chunk", "1", "--out", "d"]
    first = run_script("short_vs_long.py", *args, cwd=tmp_path)
    assert "not finished" in first and not (tmp_path / "d" / "rows.json").exists()
    assert json.loads((tmp_path / "d" / "state.json").read_text())["24x20x16"]["long_s"] == 1
    second = run_script("short_vs_long.py", *args, cwd=tmp_path)
    (row,) = json.loads((tmp_path / "d" / "rows.json").read_text())
    assert row["tuning"]["long_s"] == 2 and row["short_kernel_s"] > 0 and row["long_kernel_s"] > 0
    assert "| 24x20x16 f32 nn |" in second and "not finished" not in second


def test_short_tune_is_timed_against_an_earlier_runs_long_config(gpu, cache_dir, tmp_path):
    """--long-from: the long tune is not run again (however long it searched); its config,
    read from the earlier row of the same problem, is timed beside the new short tune, and
    the row names the configs measured at other shapes that the short tune started from.
    The same folder resumed with another sampler is refused, and so is an earlier long
    config that today's space would not render."""
    from entries import seed_entry

    from autotune import cache
    from autotune.device import versions
    from autotune.problem import Problem

    long_config, nearby = "naive WX=16 WY=4", Problem(24, 20, 12)
    earlier = [{"shape": "24x20x16", "problem": "24x20x16 f32 nn", "long_config": long_config,
                "tuning": {"long_s": 300.0, "wall_s": {"long": 312.0}}}]  # fmt: skip
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    folder = tmp_path / "d" / "short-24x20x16"  # the short tune's cache: a measured neighbour
    store = cache.DeviceCache(folder, gpu.fingerprint.as_dict(), versions())
    store.put(seed_entry(nearby, "blocked", checks=False))
    (neighbour,) = [e.config for e in store.entries().values()]
    out = run_script("short_vs_long.py", "--shape", "24x20x16", "--short", "1",
                     "--sampler", "climb", "--long-from", "earlier.json", "--out", "d",
                     cwd=tmp_path)  # fmt: skip
    (row,) = json.loads((tmp_path / "d" / "rows.json").read_text())
    assert row["long_config"] == long_config and row["long_kernel_s"] > 0
    assert row["tuning"]["long_s"] == 300.0 and row["tuning"]["long_from_earlier_run"]
    assert row["tuning"]["seeded_with"] == [str(neighbour)]
    assert row["tuning"]["short_sampler"] == "climb"
    assert not (tmp_path / "d" / "long-24x20x16").exists()  # nothing searched for it
    assert "| 24x20x16 f32 nn |" in out and "not finished" not in out
    resumed = run_script("short_vs_long.py", "--shape", "24x20x16", "--short", "1",
                         "--sampler", "tpe", "--long-from", "earlier.json", "--out", "d",
                         cwd=tmp_path, status=2)  # fmt: skip
    assert "holds short tunes of other settings (24x20x16: climb, 1 s)" in resumed, resumed
    earlier[0]["long_config"] = "naive WX=16"  # tuned before the space gained WY
    (tmp_path / "older.json").write_text(json.dumps(earlier))
    refused = run_script("short_vs_long.py", "--shape", "24x20x16", "--long-from", "older.json",
                         "--out", "e", cwd=tmp_path, status=2)  # fmt: skip
    assert "--long-from's long configs are not valid today: 24x20x16 f32 nn:" in refused
    assert not (tmp_path / "e").exists()  # refused before any tune
    for unreadable in ("nosuch WX=16", "naive WX", ""):  # a template gone, a text cut short
        earlier[0]["long_config"] = unreadable
        (tmp_path / "older.json").write_text(json.dumps(earlier))
        refused = run_script("short_vs_long.py", "--shape", "24x20x16", "--long-from",
                             "older.json", "--out", "e", cwd=tmp_path, status=2)  # fmt: skip
        assert "24x20x16 f32 nn: not a config of today's spaces" in refused, refused
    for other in (["--shape", "8x8x8"], ["--shape", "24x20x16", "--layout", "nt"]):
        refused = run_script("short_vs_long.py", *other, "--long-from", "earlier.json",
                             "--out", "e", cwd=tmp_path, status=2)  # fmt: skip
        assert "--long-from has no long tune of" in refused


def test_mlp_runs_chained_on_its_own_device_and_checks_the_result(gpu, cache_dir, tmp_path):
    run_script("mlp.py", "--quick", "--out", "mlp", cwd=tmp_path)
    report = json.loads((tmp_path / "mlp" / "mlp.json").read_text())
    assert set(report["errors"]) == {"chained", "round_trips"}
    assert all(error < 1e-3 for error in report["errors"].values())  # checked before timing
    assert len(report["sources"]) == 3  # one kernel per layer
    assert report["seconds"]["chained"] > 0 and report["seconds"]["round_trips"] > 0
    assert "round trips" in (tmp_path / "mlp" / "mlp.md").read_text()


def test_gpus_compares_one_gpu_with_two_quick(gpu, cache_dir, tmp_path):
    out = run_script("gpus.py", "--quick", cwd=tmp_path)
    rates = re.findall(r"= (\d+)/min", out)
    assert len(rates) == 2 and all(int(rate) > 0 for rate in rates), out
    assert re.search(r"ratio: \d+\.\d\dx", out) and re.search(r"model \(3 problems", out), out


def test_no_shape_of_the_sample_is_estimated_from_seeds_alone_on_the_h200(tmp_path):
    """Every sampled LLM shape, dense or quantized, gets a measured config of the shipped
    H200 cache in its shortlist; the same file without its quantized entries leaves the
    quantized shapes to seeds."""
    shipped = BENCHMARKS.parent / "cache" / "nvidia-h200-vulkan-0c11ccbbcb01.json"
    out = run_script("shortlists.py", "--cache", str(shipped), cwd=tmp_path)
    assert json.loads(out.splitlines()[-1]) == {"problems": 252, "seeds_only": 0}, out
    data = json.loads(shipped.read_text())
    data["entries"] = {k: v for k, v in data["entries"].items() if ".q" not in k.split(":")[3]}
    dense = tmp_path / shipped.name
    dense.write_text(json.dumps(data))
    out = run_script("shortlists.py", "--cache", str(dense), cwd=tmp_path)
    starved = [line for line in out.splitlines() if line.startswith("seeds only: ")]
    assert len(starved) == json.loads(out.splitlines()[-1])["seeds_only"] == 7 * 3 * 2 * 4


def test_search_efficiency_replays_a_recorded_table_and_refuses_a_stale_one(gpu, tmp_path):
    """A table of every naive config, recorded here, replays the real search loop per
    sampler to the best within 5%; a table that lacks a valid config of today's space
    (an interrupted record) or holds one it would not render (recorded before the space
    changed) is refused by name and reason, not a KeyError."""
    table = tmp_path / "table-here-16x16x64.json"
    run_script("search_efficiency.py", "record", "--shape", "16x16x64", "--out", str(table),
               "--template", "naive", cwd=tmp_path)  # fmt: skip
    run_script("search_efficiency.py", "replay", str(table), "--runs", "2", "--budget", "40",
               cwd=tmp_path)  # fmt: skip
    report = json.loads((tmp_path / "replay-here-16x16x64.json").read_text())
    assert report["templates"] == ["naive"] and report["configs"] > 1
    reached = {name: s["reached"] for name, s in report["samplers"].items()}
    assert reached == {"climb": 2, "tpe": 2, "random": 2, "grid": 1}  # grid: one run
    data = json.loads(table.read_text())
    text, row = data["results"].popitem()
    table.write_text(json.dumps(data))
    err = run_script("search_efficiency.py", "replay", str(table), cwd=tmp_path, status=1)
    valid = report["configs"]
    assert f"naive: incomplete, {valid - 1} of {valid} valid configs measured" in err, err
    data["results"][text] = row
    data["results"][text + " UNROLL=3"] = row  # a parameter the space does not have
    table.write_text(json.dumps(data))
    err = run_script("search_efficiency.py", "replay", str(table), cwd=tmp_path, status=1)
    assert "naive: not the valid configs of its space now" in err, err
