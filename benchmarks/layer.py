"""A model layer as users run it: every GEMM of a model file served by `autotune.lookup`,
each timed beside cuBLAS SGEMM (f32, TF32 off, from a CUDA graph), and the layer's totals.

    python -m autotune tune --model benchmarks/models/llama-7b-layer.toml --timeout 20
    python benchmarks/layer.py --model benchmarks/models/llama-7b-layer.toml --out DIR
    python benchmarks/layer.py --model FILE --dtype f16 --out DIR

Nothing is tuned here: the kernels are whatever the cache serves (tune the model first,
as above). The file's rows are timed in its order, a problem listed twice (gate and up)
timed once and counted twice. Totals: the sum of our GEMM times against the sum of
cuBLAS's, separately for the rows named "prefill: ..." and "decode: ...", each ratio
cuBLAS total / ours. Writes layer.json and layer.md under --out. Without torch the cuBLAS
columns are NaN (a dry run on any adapter).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))  # this checkout's autotune

from shapes import quick, shrunk  # noqa: E402
from timing import (  # noqa: E402
    BOUNDS,
    CHECKS_CHOICES,
    MODE_TITLES,
    cublas_cell,
    heading,
    provenance,
    result_cell,
    time_problem,
)

import autotune  # noqa: E402
from autotune.problem import ProblemError, named_problems_from_file  # noqa: E402

PHASES = ("prefill", "decode")  # the prefixes of the rows' names in models/*.toml


def phase(name: str) -> str:
    """ "prefill: MLP up" -> "prefill"; a name of neither phase -> "other"."""
    head = name.split(":", 1)[0].strip()
    return head if ":" in name and head in PHASES else "other"


def run(model: Path, named, dtype: str, modes, rounds: int, out: Path | None) -> dict:
    """Time the (name, problem) rows `named` of the model file `model`."""
    gpu = autotune.get_gpu()
    report = {"provenance": provenance(gpu), "model": str(model), "dtype": dtype, "rows": []}
    timed = {}  # each problem once, however many rows list it
    for name, problem in named:
        if problem not in timed:
            timed[problem] = time_problem(problem, gpu, modes, rounds)
        row = {"name": name, "phase": phase(name)} | timed[problem]
        report["rows"].append(row)
        print(f"{name:>28} {row['problem']} cuBLAS {cublas_cell(row)} | ours " + _cells(row, modes))
    report["totals"] = totals(report["rows"], modes)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "layer.json").write_text(json.dumps(report, indent=1))
        (out / "layer.md").write_text(table(report, modes) + "\n")
    print(table(report, modes))
    return report


def totals(rows, modes) -> dict:
    """Per phase present: cuBLAS's summed seconds, ours per mode, and the ratios."""
    result = {}
    for name in dict.fromkeys(r["phase"] for r in rows):
        part = [r for r in rows if r["phase"] == name]
        total = {"gemms": len(part), "cublas_s": sum(r["cublas_s"] for r in part)}
        for mode in modes:
            ours = sum(r[mode]["seconds"] for r in part)
            total[mode] = {"seconds": ours, "ratio": total["cublas_s"] / ours}
        result[name] = total
    return result


def _cells(row, modes) -> str:
    return " | ".join(f"{MODE_TITLES[m]} {result_cell(row[m])}" for m in modes)


def table(report, modes) -> str:
    head = ["GEMM", "problem", "cuBLAS µs", "cuBLAS TFLOP/s (TB/s)"]
    head += [f"{MODE_TITLES[m]}: µs" for m in modes] + [MODE_TITLES[m] for m in modes]
    lines = [
        heading(report["provenance"]),
        f"{report['model']}, {report['dtype']}; {BOUNDS}",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in report["rows"]:
        cells = [r["name"], r["problem"], f"{r['cublas_s'] * 1e6:.1f}", cublas_cell(r)]
        cells += [f"{r[m]['seconds'] * 1e6:.1f}" for m in modes]
        cells += [result_cell(r[m]) for m in modes]
        lines.append("| " + " | ".join(cells) + " |")
    for name, total in report["totals"].items():
        cells = [f"{name} total ({total['gemms']} GEMMs)", "", f"{total['cublas_s'] * 1e6:.1f}", ""]
        cells += [f"{total[m]['seconds'] * 1e6:.1f} ({total[m]['ratio']:.2f}x)" for m in modes]
        lines.append("| " + " | ".join(cells + [""] * len(modes)) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a model file (models/*.toml)")
    parser.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    parser.add_argument(
        "--checks", choices=sorted(CHECKS_CHOICES), default="off", help="wgpu's runtime checks"
    )
    parser.add_argument("--rounds", type=int, default=1, help="cuBLAS and ours, alternating")
    parser.add_argument("--out", type=Path, help="folder for layer.json and layer.md")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        named = named_problems_from_file(args.model, args.dtype)
    except ProblemError as error:
        parser.error(f"argument --model: {error}")
    if quick():
        named = [(name, shrunk(problem)) for name, problem in named]
    run(args.model, named, args.dtype, CHECKS_CHOICES[args.checks], args.rounds, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
