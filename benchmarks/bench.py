"""Benchmark: autotune's tuned WGSL GEMM against cuBLAS SGEMM on the same GPU, same run.

    python benchmarks/bench.py --out DIR                         # the whole suite
    python benchmarks/bench.py --shape 4096x4096x4096            # one shape
    AUTOTUNE_CACHE=/tmp/fresh python benchmarks/bench.py --tune 30 --out DIR  # from scratch
    python benchmarks/bench.py --join DIR1 DIR2 --out DIR        # one table from two runs

DIR: a new folder, by convention benchmarks/results/DATE-DEVICE-CONTENT/ (e.g.
benchmarks/results/2026-11-30-h200-suite/).

For each shape: cuBLAS SGEMM through PyTorch with TF32 off (CUDA events), the tutorial
16x16 `tiled` kernel, and autotune's best cached kernel with wgpu's runtime checks on and
off (device timestamps, autotune.measure); every WGSL result is verified against float64
NumPy first. All timings: warm-up, then the median of several passes, each pass long
enough (>= 20 ms) that launch overhead does not count. Prints a table (TFLOP/s and ratio
to cuBLAS, geometric mean) and writes bench.json (with provenance) and bench.png.

With --tune SECONDS, every shape is first tuned in both modes (`autotune.tune`, the API
behind `python -m autotune tune`, blocked template, SECONDS of search each) into the
cache that lookup then reads, and the wall time of each tune (search, worker start,
float64 reference, baseline, re-timing of the finalists) is reported with its row.
Without torch the cuBLAS column is NaN (a dry run on any adapter). With --rounds N, cuBLAS
and autotune's two kernels are timed N times in turn and each ratio is the median of the
rounds' ratios (cuBLAS's own time moves by about 1% between runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import autotune
from autotune.compile import compile_shader
from autotune.device import versions
from autotune.measure import measure
from autotune.problem import parse_shape
from autotune.render import render
from autotune.space import load_space
from autotune.verify import Reference, verify

SUITE = [
    "1024x1024x1024",
    "2048x2048x2048",
    "4096x4096x4096",
    "8192x8192x8192",
    "2048x12288x4096",
    "2048x11008x4096",
    "2048x4096x11008",
    "512x32000x4096",
    "16x4096x4096",
    "64x11008x4096",
]


def cublas_seconds(problem, passes: int = 10, min_pass_s: float = 0.02) -> float:
    """Median seconds per torch.matmul (cuBLAS SGEMM, TF32 off) over timed passes."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    A = torch.rand(problem.M, problem.K, device="cuda") * 2 - 1
    B = torch.rand(problem.K, problem.N, device="cuda") * 2 - 1
    C = torch.empty(problem.M, problem.N, device="cuda")
    return cuda_seconds(lambda: torch.matmul(A, B, out=C), passes, min_pass_s)


def cuda_seconds(run, passes: int = 10, min_pass_s: float = 0.02) -> float:
    """Median seconds per call of `run` (CUDA work), timed with CUDA events: warm-up,
    then passes of enough calls to last `min_pass_s`."""
    import torch

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    repeats = max(1, math.ceil(min_pass_s / (start.elapsed_time(end) / 1e3)))
    samples = []
    for _ in range(passes):
        start.record()
        for _ in range(repeats):
            run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / repeats)
    return statistics.median(samples)


def wgsl_seconds(config, problem, gpu, checks: bool, reference: Reference) -> dict:
    compiled = compile_shader(render(config, problem), gpu, checks=checks)
    verdict = verify(compiled, gpu, reference=reference)
    if not verdict.ok:
        raise AssertionError(f"{config} checks={checks} is WRONG at {problem}: {verdict.reason}")
    m = measure(
        compiled, gpu, min_pass_s=0.02, passes=10, budget_s=4.0, operands=(reference.A, reference.B)
    )
    return {
        "config": str(config),
        "seconds": m.median_s,
        "p20_s": m.p20_s,
        "p80_s": m.p80_s,
        "method": m.method,
        "error": verdict.error,
    }


def provenance(gpu) -> dict:
    info = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": gpu.summary,
        "fingerprint": gpu.fingerprint.as_dict(),
        "versions": versions(),
        "commit": os.environ.get("AUTOTUNE_COMMIT") or _git_commit(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        info["cuda_device"] = torch.cuda.get_device_name()
    except Exception as error:  # no torch: WGSL rows only
        info["torch"] = f"unavailable: {error}"
    try:
        info["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["driver"] = gpu.fingerprint.description
    return info


def _git_commit() -> str:
    """The commit of the checkout this script is in, wherever it is run from."""
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                cwd=Path(__file__).parent,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def tune_suite(shapes, seconds: float, gpu) -> dict[tuple[str, bool], float]:
    """Tune each shape in both check modes; wall seconds of each tune."""
    spent = {}
    for shape in shapes:
        problem = parse_shape(shape)
        for checks in (False, True):
            start = time.perf_counter()
            result = autotune.tune(
                **problem.arguments,
                templates=["blocked"],
                trials=None,
                timeout=seconds,
                checks=checks,
                gpu=gpu,
            )
            spent[shape, checks] = time.perf_counter() - start
            print(
                f"tuned {shape} checks={'on' if checks else 'off'} in {spent[shape, checks]:.0f} s:"
                f" {result.entry.config if result.entry else 'nothing'}",
                flush=True,
            )
    return spent


def run(shapes, out: Path | None, tune_s: float | None = None, rounds: int = 1) -> dict:
    gpu = autotune.get_gpu()
    report = {"provenance": provenance(gpu), "rows": []}
    spent = tune_suite(shapes, tune_s, gpu) if tune_s else {}
    for shape in shapes:
        problem = parse_shape(shape)
        tflop = problem.flops / 1e12
        reference = Reference(problem, seed=0)
        kernels = {
            checks: autotune.lookup(**problem.arguments, checks=checks, gpu=gpu)
            for checks in (True, False)
        }
        tutorial = load_space("tiled").seed_configs(problem, gpu.limits)[0]
        row = {"shape": shape, "tiled": wgsl_seconds(tutorial, problem, gpu, True, reference)}
        # Rounds alternate cuBLAS and our kernels, so that a drift of the GPU's clocks
        # between rounds moves both sides of a ratio; the row keeps the medians.
        cublas, timed = [], {True: [], False: []}
        for _ in range(rounds):
            try:
                cublas.append(cublas_seconds(problem))
            except ImportError:  # no torch: WGSL rows only
                cublas.append(math.nan)
            for checks, kernel in kernels.items():
                timed[checks].append(wgsl_seconds(kernel.config, problem, gpu, checks, reference))
        row["cublas_s"] = statistics.median(cublas)
        row["cublas_rounds_s"] = cublas
        row["tiled"]["ratio"] = row["cublas_s"] / row["tiled"]["seconds"]
        for checks, results in timed.items():
            result = sorted(results, key=lambda r: r["seconds"])[len(results) // 2]
            result["source"] = kernels[checks].source
            result["rounds_s"] = [r["seconds"] for r in results]
            result["ratio"] = statistics.median(
                c / r["seconds"] for c, r in zip(cublas, results, strict=True)
            )
            if (shape, checks) in spent:
                result["tuning_s"] = spent[shape, checks]
            row["checks" if checks else "nochecks"] = result
        for name in ("tiled", "checks", "nochecks"):
            row[name]["tflops"] = tflop / row[name]["seconds"]
        row["cublas_tflops"] = tflop / row["cublas_s"]
        report["rows"].append(row)
        print(_line(row), flush=True)
        if out:
            _save(report, out)
    return _finish(report, out)


def joined(parts: list[Path]) -> dict:
    """One report from the bench.json of several runs (each on a share of the suite, when
    one run cannot hold the whole of it): rows in suite order, a later run's row
    of a shape replacing an earlier one (e.g. after a longer tune), each keeping the cuBLAS
    time of its own run; the provenance of every run."""
    reports = [json.loads((part / "bench.json").read_text()) for part in parts]
    if len({r.get("rows_of") for r in reports}) != 1:
        raise SystemExit("--join: the runs benchmark different rows")
    latest = {row["shape"]: row for report in reports for row in report["rows"]}
    order = {shape: i for i, shape in enumerate(SUITE)}
    rows = sorted(latest.values(), key=lambda row: order.get(row["shape"], len(order)))
    provenance = reports[0]["provenance"] | {"runs": [r["provenance"] for r in reports]}
    return reports[0] | {"provenance": provenance, "rows": rows}


def join(parts: list[Path], out: Path | None) -> dict:
    return _finish(joined(parts), out)


def _finish(report, out: Path | None) -> dict:
    report["geomean"] = {
        name: geomean([r[name]["ratio"] for r in report["rows"]])
        for name in ("tiled", "checks", "nochecks")
    }
    if out:
        _save(report, out)
        _chart(report, out / "bench.png")
    print(_table(report))
    return report


def _line(row) -> str:
    return (
        f"{row['shape']:>18} cuBLAS {row['cublas_tflops']:6.1f} TF/s | tiled "
        f"{row['tiled']['ratio']:.2f} | checks {row['checks']['tflops']:6.1f} "
        f"({row['checks']['ratio']:.2f}, {row['checks']['source']}) | no checks "
        f"{row['nochecks']['tflops']:6.1f} ({row['nochecks']['ratio']:.2f}, "
        f"{row['nochecks']['source']})"
    )


def _table(report) -> str:
    p = report["provenance"]
    tuned = any("tuning_s" in r["checks"] for r in report["rows"])
    lines = [
        f"{p['device']}, driver {p.get('driver')}, wgpu {p['versions']}, {p['date']}",
        "| shape | cuBLAS TFLOP/s | tiled 16x16 | autotune, checks on | autotune, checks off |"
        + (" tuned in (on / off) |" if tuned else ""),
        "|---|---|---|---|---|" + ("---|" if tuned else ""),
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['shape']} | {r['cublas_tflops']:.1f} | {r['tiled']['tflops']:.1f} "
            f"({r['tiled']['ratio']:.2f}x) | {r['checks']['tflops']:.1f} "
            f"({r['checks']['ratio']:.2f}x) | {r['nochecks']['tflops']:.1f} "
            f"({r['nochecks']['ratio']:.2f}x) |"
            + (
                f" {r['checks'].get('tuning_s', math.nan):.0f} s / "
                f"{r['nochecks'].get('tuning_s', math.nan):.0f} s |"
                if tuned
                else ""
            )
        )
    g = report.get("geomean", {})
    if g:
        lines.append(
            f"| geometric mean of ratios | 1.00 | {g['tiled']:.2f}x | {g['checks']:.2f}x "
            f"| {g['nochecks']:.2f}x |" + (" |" if tuned else "")
        )
    return "\n".join(lines)


def _save(report, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=1))
    (out / "bench.md").write_text(_table(report) + "\n")


def _chart(report, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = report["rows"]
    names = [r["shape"] for r in rows]
    series = [
        ("cuBLAS SGEMM", [r["cublas_tflops"] for r in rows]),
        ("autotune, checks off", [r["nochecks"]["tflops"] for r in rows]),
        ("autotune, checks on", [r["checks"]["tflops"] for r in rows]),
        ("tiled 16x16 tutorial", [r["tiled"]["tflops"] for r in rows]),
    ]
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.2
    for i, (label, values) in enumerate(series):
        ax.bar([x + (i - 1.5) * width for x in range(len(rows))], values, width, label=label)
    ax.set_xticks(range(len(rows)), names, rotation=30, ha="right")
    ax.set_ylabel("TFLOP/s (f32)")
    ax.set_title(f"f32 GEMM on {report['provenance']['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", action="append", help="MxNxK (default: the whole suite)")
    parser.add_argument("--out", type=Path, help="folder for bench.json, bench.md, bench.png")
    parser.add_argument(
        "--tune", type=float, metavar="SECONDS", help="tune each shape first (search seconds)"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="time cuBLAS and ours this many times, alternating"
    )
    parser.add_argument(
        "--join", type=Path, nargs="+", metavar="DIR", help="combine earlier runs' bench.json"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.join:
        join(args.join, args.out)
    else:
        run(args.shape or SUITE, args.out, args.tune, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
