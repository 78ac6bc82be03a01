"""One short table of every run under a folder (what benchmarks/all.sh prints last).

    python benchmarks/summary.py OUT_DIR

Per bench.py run (each folder with a bench.json): per set and mode, the geometric mean
and the minimum of the ratios to cuBLAS SGEMM. Per layer.py run (layer.json): the
prefill and decode totals, ours against cuBLAS's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))  # this checkout's autotune

from timing import MODE_TITLES  # noqa: E402


def bench_lines(folder: Path, report: dict) -> list[str]:
    lines = []
    for name, summary in report["sets"].items():
        dtype = "/".join(dict.fromkeys(r["dtype"] for r in report["rows"] if r["set"] == name))
        cells = [
            f"{MODE_TITLES[m]} {s['geomean']:.2f}x (min {s['min']:.2f}x)"
            for m, s in summary.items()
        ]
        lines.append(f"| {folder.name} | {name} {dtype} | " + "; ".join(cells) + " |")
    return lines


def layer_lines(folder: Path, report: dict) -> list[str]:
    cells = []
    for name, total in report["totals"].items():
        ours = [
            f"{MODE_TITLES[m]} {t['seconds'] * 1e6:.0f} µs ({t['ratio']:.2f}x)"
            for m, t in total.items()
            if isinstance(t, dict)
        ]
        cells.append(f"{name}: cuBLAS {total['cublas_s'] * 1e6:.0f} µs, " + ", ".join(ours))
    model = Path(report["model"]).stem
    return [f"| {folder.name} | {model} {report['dtype']} | " + "; ".join(cells) + " |"]


def summary(root: Path) -> str:
    lines = [
        "| run | rows | ratio to cuBLAS SGEMM: geometric mean (min), or totals |",
        "|---|---|---|",
    ]
    for path in sorted(root.glob("*/*.json"), key=lambda p: p.stat().st_mtime):  # run order
        report = json.loads(path.read_text())
        if path.name == "bench.json":
            lines += bench_lines(path.parent, report)
        elif path.name == "layer.json":
            lines += layer_lines(path.parent, report)
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python benchmarks/summary.py OUT_DIR")
    print(summary(Path(sys.argv[1])))
