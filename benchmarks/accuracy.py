"""Accuracy of each f16 accumulation mode against float64, so users can choose.

    python benchmarks/accuracy.py --shape 4096x4096x4096 [--layout nt] [--out acc.json]

For each mode (f16 inputs and output accumulated in f32, the same accumulated in f16,
and the f32 kernel on the same f16-rounded inputs as a yardstick) it looks up the best
kernel this device has (tuned, estimated or default; `accumulate` pinned), runs it once on
random inputs in [-1, 1] and prints the relative Frobenius error ||C - R|| / ||R|| and
the largest element error relative to that element's scale sqrt(sum a^2 b^2) (the
measure autotune's verification bounds), R being the float64 product.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import autotune
from autotune.problem import parse_shape
from autotune.verify import random_operands


def errors(C: np.ndarray, A: np.ndarray, B: np.ndarray, layout: str) -> dict[str, float]:
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    A64 = A64.T if layout[0] == "t" else A64
    B64 = B64.T if layout[1] == "t" else B64
    want = A64 @ B64
    scale = np.sqrt((A64 * A64) @ (B64 * B64))
    diff = C.astype(np.float64) - want
    return {
        "relative_frobenius": float(np.linalg.norm(diff) / np.linalg.norm(want)),
        "max_element": float(np.max(np.abs(diff) / np.maximum(scale, 1e-300))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", action="append", required=True, help="MxNxK (repeatable)")
    parser.add_argument("--layout", default="nn", choices=["nn", "nt", "tn", "tt"])
    parser.add_argument("--checks", default="off", choices=["on", "off"])
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    rows = []
    for text in args.shape:
        problem = parse_shape(text, "f16", layout=args.layout)
        A, B = random_operands(problem, np.random.default_rng(0))
        modes = [("f16, f32 accumulation", "f16", "f32"), ("f16, f16 accumulation", "f16", "f16")]
        modes.append(("f32 on the same inputs", "f32", "auto"))
        for label, dtype, accumulate in modes:
            kernel = autotune.lookup(
                problem.M,
                problem.N,
                problem.K,
                dtype,
                layout=args.layout,
                accumulate=accumulate,
                checks=args.checks == "on",
            )
            a, b = (A, B) if dtype == "f16" else (A.astype(np.float32), B.astype(np.float32))
            row = {"shape": problem.shape, "layout": args.layout, "mode": label}
            row |= {"source": kernel.source, "config": str(kernel.config)}
            row |= errors(kernel(a, b), A, B, args.layout)
            rows.append(row)
            print(
                f"{problem.shape} {args.layout} {label:<24} rel. Frobenius "
                f"{row['relative_frobenius']:.2e}  max element {row['max_element']:.2e}  "
                f"({kernel.source}: {kernel.config})"
            )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
