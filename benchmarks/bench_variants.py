"""Benchmark the variants: f16 (both accumulations) and transposed B (NT), same run as cuBLAS.

    python benchmarks/bench_variants.py --rows f16 --out benchmarks/results/DATE-h200-f16
    python benchmarks/bench_variants.py --rows nt --tune 30 --out DIR   # tune them first
    python benchmarks/bench_variants.py --join DIR1 DIR2 --out DIR      # one table from two runs

f16 rows: cuBLAS SGEMM (f32, TF32 off) is the reference of every ratio; torch's f16
GEMM (tensor cores) is printed as an upper reference; then autotune's f32 kernel and its
f16 kernels with f16 and with f32 accumulation, each with its error against float64
(the accuracy a user trades). NT rows: autotune's NN and NT (B stored as N x K, the
linear-layer layout) kernels against cuBLAS SGEMM, and NT / NN. Kernels run without
runtime checks; every result is verified first. --tune SECONDS tunes each variant
problem first (`autotune.tune`, checks off) into the cache lookup reads; the plain f32
problem is not tuned again (`bench.py --tune` tunes it, and cache/ ships its entries).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench import SUITE, joined  # noqa: E402
from timing import (  # noqa: E402
    cublas_seconds,
    geomean,
    graph_seconds,
    provenance,
    wgsl_seconds,
)

import autotune  # noqa: E402
from autotune.problem import Problem, parse_shape  # noqa: E402
from autotune.verify import Reference  # noqa: E402

# column -> the problem's variant fields (relative to the plain f32 problem)
COLUMNS = {
    "f16": {
        "f32": {},
        "f16, f16 accumulation": {"dtype": "f16", "accumulate": "f16"},
        "f16, f32 accumulation": {"dtype": "f16", "accumulate": "f32"},
    },
    "nt": {"nn": {}, "nt": {"layout": "nt"}},
}


def torch_f16_seconds(problem: Problem) -> float:
    """Median seconds per torch.matmul in f16 (tensor cores): the upper reference."""
    import torch

    A = (torch.rand(problem.M, problem.K, device="cuda") * 2 - 1).half()
    B = (torch.rand(problem.K, problem.N, device="cuda") * 2 - 1).half()
    C = torch.empty(problem.M, problem.N, device="cuda", dtype=torch.float16)
    return graph_seconds(lambda: torch.matmul(A, B, out=C))


def run(rows: str, shapes, out: Path | None, tune_s: float | None) -> dict:
    gpu = autotune.get_gpu()
    report = {"provenance": provenance(gpu), "rows_of": rows, "rows": []}
    columns = COLUMNS[rows]
    for shape in shapes:
        plain = parse_shape(shape)
        row = {"shape": shape}
        try:
            row["cublas_s"] = cublas_seconds(plain)
            if rows == "f16":
                row["torch_f16_s"] = torch_f16_seconds(plain)
        except ImportError:  # no torch: WGSL columns only
            row["cublas_s"] = math.nan
        for name, fields in columns.items():
            problem = replace(plain, **fields)
            if tune_s and not problem.plain:  # the plain problem's are bench.py's (shipped)
                start = time.perf_counter()
                autotune.tune(
                    **problem.arguments, trials=None, timeout=tune_s, checks=False, gpu=gpu
                )
                row.setdefault("tuning_s", {})[name] = time.perf_counter() - start
            kernel = autotune.lookup(**problem.arguments, checks=False, gpu=gpu)
            result = wgsl_seconds(kernel.config, problem, gpu, False, Reference(problem, seed=0))
            result["source"] = kernel.source
            result["tflops"] = problem.flops / result["seconds"] / 1e12
            result["ratio"] = row["cublas_s"] / result["seconds"]
            row[name] = result
        report["rows"].append(row)
        print(_line(row, columns), flush=True)
        if out:
            _save(report, out, columns)
    return _finish(report, out)


def _finish(report, out: Path | None) -> dict:
    columns = COLUMNS[report["rows_of"]]
    report["geomean"] = {n: geomean([r[n]["ratio"] for r in report["rows"]]) for n in columns}
    if out:
        _save(report, out, columns)
    print(_table(report, columns))
    return report


def _line(row, columns) -> str:
    cells = [f"{n} {row[n]['tflops']:.1f} ({row[n]['ratio']:.2f}x)" for n in columns]
    return f"{row['shape']:>18} | " + " | ".join(cells)


def _table(report, columns) -> str:
    p = report["provenance"]
    f16 = report["rows_of"] == "f16"
    head = ["shape", "cuBLAS SGEMM TFLOP/s"] + (["torch f16 (tensor cores)"] if f16 else [])
    head += [f"autotune {n}" for n in columns] + ([] if f16 else ["NT / NN"])
    lines = [
        f"{p['device']}, driver {p.get('driver')}, wgpu {p['versions']}, {p['date']}, "
        f"commit {p.get('commit')}; runtime checks off; ratios to cuBLAS SGEMM",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in report["rows"]:
        flops = parse_shape(r["shape"]).flops / 1e12
        cells = [r["shape"], f"{flops / r['cublas_s']:.1f}"]
        if f16:
            cells.append(f"{flops / r.get('torch_f16_s', math.nan):.1f}")
        for n in columns:
            cell = f"{r[n]['tflops']:.1f} ({r[n]['ratio']:.2f}x)"
            cells.append(cell + (f", error {r[n]['error']:.1e}" if f16 else ""))
        if not f16:
            cells.append(f"{r['nn']['seconds'] / r['nt']['seconds']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    g = report.get("geomean")
    if g:
        cells = ["geometric mean", "1.00"] + ([""] if f16 else [])
        cells += [f"{g[n]:.2f}x" for n in columns] + ([] if f16 else [""])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _save(report, out: Path, columns) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=1))
    (out / "bench.md").write_text(_table(report, columns) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", choices=sorted(COLUMNS))
    parser.add_argument("--shape", action="append", help="MxNxK (default: the suite)")
    parser.add_argument("--out", type=Path, help="folder for bench.json and bench.md")
    parser.add_argument("--tune", type=float, metavar="SECONDS", help="tune each problem first")
    parser.add_argument("--join", nargs="+", type=Path, metavar="DIR", help="join earlier runs")
    args = parser.parse_args(argv)
    if args.join:
        _finish(joined(args.join), args.out)
    elif args.rows:
        run(args.rows, args.shape or SUITE, args.out, args.tune)
    else:
        parser.error("--rows or --join is required")
    return 0


if __name__ == "__main__":
    sys.exit(main())
