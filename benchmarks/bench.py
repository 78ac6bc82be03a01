"""Benchmark: autotune's WGSL GEMM kernels against cuBLAS SGEMM on the same GPU, same run.

    python benchmarks/bench.py --out DIR                         # the f32 suite
    python benchmarks/bench.py --shape 4096x4096x4096            # one shape
    python benchmarks/bench.py --set decode --dtype f16 --checks off --out DIR
    python benchmarks/bench.py --set decode --weights q4g128 --checks off --out DIR
    AUTOTUNE_CACHE=/tmp/fresh python benchmarks/bench.py --tune 30 --out DIR  # from scratch
    python benchmarks/bench.py --join DIR1 DIR2 --out DIR        # one table from two runs

DIR: a new folder, by convention benchmarks/results/DATE-DEVICE-CONTENT/ (e.g.
benchmarks/results/2026-11-30-h200-suite/). benchmarks/all.sh runs every set.

Rows: the named sets of shapes.py (--set suite, decode, longk, outofbox, odd; repeatable) and
--shape MxNxK (with --layout); --dtype f32 or f16 for all of them; without either, the
suite. For each row: cuBLAS SGEMM through PyTorch, f32 with TF32 off whatever --dtype
says, in the row's layout, replayed from a CUDA graph (timing.py); the tutorial 16x16
`tiled` kernel (--no-tiled: not); and the kernel `autotune.lookup` serves, with wgpu's
runtime checks on and off (--checks on|off|both), timed with device timestamps
(autotune.measure) in passes of >= 20 ms; every WGSL result is verified against float64
NumPy first. Each cell: TFLOP/s, the ratio to cuBLAS, the TB/s of the bytes the GEMM
must move (A, B and C once; memory-bound rows are judged against timing.BOUNDS), and
lookup's source (exact, estimated, ...) and template. Per set: the geometric mean and the
minimum of the ratios. Writes bench.json (with provenance), bench.md and bench.png.

With --tune SECONDS, every row's problem is first tuned in each mode (`autotune.tune`,
the API behind `python -m autotune tune`, the --template templates, default blocked,
SECONDS of search each) into the cache that lookup then reads, and the wall time of each
tune (search, worker start, float64 reference, baseline, re-timing of the finalists) is
reported with its row. Without torch the cuBLAS column is NaN (a dry run on any
adapter). With --rounds N, cuBLAS and autotune's kernels are timed N times in turn and
each ratio is the median of the rounds' ratios (cuBLAS's own time moves by about 1%
between runs).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))  # this checkout's autotune

from shapes import SETS, SUITE, quick, set_problems, shrunk  # noqa: E402
from timing import (  # noqa: E402
    BOUNDS,
    CHECKS_CHOICES,
    MODE_TITLES,
    cublas_cell,
    geomean,
    heading,
    provenance,
    result_cell,
    time_problem,
    wgsl_seconds,
    with_rates,
)

import autotune  # noqa: E402
from autotune.problem import LAYOUTS, parse_shape  # noqa: E402
from autotune.space import load_space  # noqa: E402
from autotune.verify import Reference  # noqa: E402


def tune_suite(problems, seconds: float, gpu, modes, templates) -> dict[tuple[str, str], float]:
    """Tune each problem in each mode; wall seconds of each tune, by (problem, mode)."""
    spent = {}
    for problem in problems:
        for mode in modes:
            start = time.perf_counter()
            result = autotune.tune(
                **problem.arguments,
                templates=templates,
                trials=None,
                timeout=seconds,
                checks=mode == "checks",
                gpu=gpu,
            )
            spent[str(problem), mode] = time.perf_counter() - start
            print(
                f"tuned {problem} {MODE_TITLES[mode]} in {spent[str(problem), mode]:.0f} s:"
                f" {result.entry.config if result.entry else 'nothing'}",
                flush=True,
            )
    return spent


def run(rows, out: Path | None, args) -> dict:
    """Time each (set name, problem) of `rows`; see the module doc."""
    gpu = autotune.get_gpu()
    report = {"provenance": provenance(gpu), "rows": []}
    modes = CHECKS_CHOICES[args.checks]
    problems = list(dict.fromkeys(p for _, p in rows))
    spent = tune_suite(problems, args.tune, gpu, modes, args.template) if args.tune else {}
    for set_name, problem in rows:
        reference = Reference(problem, seed=0)  # one set of operands for every column
        row = {"set": set_name} | time_problem(problem, gpu, modes, args.rounds, reference)
        for mode in modes:
            if (str(problem), mode) in spent:
                row[mode]["tuning_s"] = spent[str(problem), mode]
        tiled = args.tiled and load_space("tiled").seed_configs(problem, gpu.limits)
        if tiled:  # the tutorial kernel, timed once
            result = wgsl_seconds(tiled[0], problem, gpu, True, reference)
            result["ratio"] = row["cublas_s"] / result["seconds"]
            row["tiled"] = with_rates(result, problem)
        report["rows"].append(row)
        print(_line(row), flush=True)
        if out:
            _save(report, out)
    return _finish(report, out)


def joined(parts: list[Path]) -> dict:
    """One report from the bench.json of several runs (each on a share of the suite, when
    one run cannot hold the whole of it): rows in suite order, a later run's row
    of a problem replacing an earlier one (e.g. after a longer tune), each keeping the
    cuBLAS time of its own run; the provenance of every run."""
    reports = [json.loads((part / "bench.json").read_text()) for part in parts]
    if len({r.get("rows_of") for r in reports}) != 1:
        raise SystemExit("--join: the runs benchmark different rows")
    latest = {
        (row.get("set"), row.get("problem", row["shape"])): row
        for report in reports
        for row in report["rows"]
    }
    order = {shape: i for i, shape in enumerate(SUITE)}
    rows = sorted(latest.values(), key=lambda row: order.get(row["shape"], len(order)))
    provenance = reports[0]["provenance"] | {"runs": [r["provenance"] for r in reports]}
    return reports[0] | {"provenance": provenance, "rows": rows}


def join(parts: list[Path], out: Path | None) -> dict:
    return _finish(joined(parts), out)


def _columns(rows) -> list[str]:
    """The results every row has: tiled, checks, nochecks."""
    return [name for name in MODE_TITLES if rows and all(name in r for r in rows)]


def _summary(rows, columns) -> dict:
    """Per column: geometric mean and minimum of the ratios to cuBLAS."""
    ratios = {name: [r[name]["ratio"] for r in rows] for name in columns}
    return {n: {"geomean": geomean(v), "min": min(v, default=None)} for n, v in ratios.items()}


def _finish(report, out: Path | None) -> dict:
    rows = report["rows"]
    columns = _columns(rows)
    report["geomean"] = {name: s["geomean"] for name, s in _summary(rows, columns).items()}
    sets = dict.fromkeys(r.get("set", "") for r in rows)
    report["sets"] = {
        name: _summary([r for r in rows if r.get("set", "") == name], columns) for name in sets
    }
    if out:
        _save(report, out)
        _chart(report, out / "bench.png")
    print(_table(report))
    return report


def _line(row) -> str:
    cells = [f"{MODE_TITLES[n]} {result_cell(row[n])}" for n in _columns([row])]
    return f"{row['problem']:>24} cuBLAS {cublas_cell(row)} | " + " | ".join(cells)


def _table(report) -> str:
    rows = report["rows"]
    columns = _columns(rows)
    tuned = any("tuning_s" in r[n] for r in rows for n in columns)
    head = ["set", "problem", "MB moved", "cuBLAS TFLOP/s (TB/s)"]
    head += [MODE_TITLES[n] for n in columns] + (["tuned in"] if tuned else [])
    lines = [
        heading(report["provenance"]),
        BOUNDS + "; each cell: TFLOP/s (ratio to cuBLAS SGEMM; TB/s; lookup's source, template)",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells = [r.get("set", ""), r.get("problem", r["shape"])]
        cells += [f"{r['bytes'] / 1e6:.3g}" if "bytes" in r else "", cublas_cell(r)]
        cells += [result_cell(r[n]) for n in columns]
        if tuned:
            cells.append(" / ".join(f"{r[n].get('tuning_s', math.nan):.0f} s" for n in columns))
        lines.append("| " + " | ".join(cells) + " |")
    for name, summary in report.get("sets", {}).items():
        cells = [name, "geometric mean (min) of ratios", "", "1.00"]
        cells += [f"{s['geomean']:.2f}x ({s['min']:.2f}x)" for s in summary.values()]
        lines.append("| " + " | ".join(cells + ([""] if tuned else [])) + " |")
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
    names = [r.get("problem", r["shape"]) for r in rows]
    series = [("cuBLAS SGEMM", [r["cublas_tflops"] for r in rows])]
    series += [
        (f"autotune, {MODE_TITLES[n]}", [r[n]["tflops"] for r in rows]) for n in _columns(rows)
    ]
    fig, ax = plt.subplots(figsize=(max(12, len(rows) * 0.6), 5))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        offset = (i - (len(series) - 1) / 2) * width
        ax.bar([x + offset for x in range(len(rows))], values, width, label=label)
    ax.set_xticks(range(len(rows)), names, rotation=30, ha="right")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"GEMM on {report['provenance']['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _rows(args, parser) -> list:
    """(set name, problem) for each --set, then each --shape (set name "shape")."""
    rows = []
    for name in args.set or []:
        rows += [(name, problem) for problem in set_problems(name, args.dtype)]
    try:
        shapes = args.shape or ([] if args.set else SUITE)
        given = [parse_shape(s, args.dtype, layout=args.layout) for s in shapes]
        rows += [("shape", shrunk(p) if quick() else p) for p in given]  # quick: tiny
    except ValueError as error:
        parser.error(f"argument --shape: {error}")
    try:
        quantized = dict(weights=args.weights, activations=args.activations)
        return [(name, replace(problem, **quantized)) for name, problem in rows]
    except ValueError as error:
        parser.error(f"argument --weights: {error}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", action="append", help="MxNxK (default: the suite)")
    parser.add_argument("--set", action="append", choices=SETS, help="a named shape set")
    parser.add_argument("--layout", choices=LAYOUTS, default="nn", help="of the --shape rows")
    parser.add_argument("--dtype", choices=("f32", "f16"), default="f32", help="of every row")
    parser.add_argument(
        "--weights",
        default="none",
        help="every row's B quantized (q8, q4g128...; rows of layout nt): cuBLAS runs the "
        "unquantized f32 weight",
    )
    parser.add_argument(
        "--activations", default="none", choices=("none", "q8"), help="with --weights"
    )
    parser.add_argument(
        "--checks", choices=sorted(CHECKS_CHOICES), default="both", help="wgpu's runtime checks"
    )
    parser.add_argument(
        "--tiled",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time the tutorial 16x16 kernel too",
    )
    parser.add_argument("--out", type=Path, help="folder for bench.json, bench.md, bench.png")
    parser.add_argument(
        "--tune", type=float, metavar="SECONDS", help="tune each shape first (search seconds)"
    )
    parser.add_argument(
        "--template", action="append", default=None, help="with --tune (default: blocked)"
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
    args.template = args.template or ["blocked"]
    if args.join:
        join(args.join, args.out)
    else:
        run(_rows(args, parser), args.out, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
