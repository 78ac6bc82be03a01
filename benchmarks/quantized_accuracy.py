"""Accuracy of each quantized weight format against float64 of the unquantized product.

    python benchmarks/quantized_accuracy.py --shape 16x4096x4096 --out DIR

For each format (q8, q4g32, q4g64, q4g128, with and without zero points; q8.a8: q8 with
the activations quantized to int8 by the kernel too, likewise q4g128.a8) and two kinds of
weight (uniform in [-1, 1], and Gaussian, whose outliers widen the groups' ranges), a
weight W (N x K) is quantized with autotune.quantize, the layer y = x W'^T is computed
by the kernel `autotune.matmul` serves on this adapter (any adapter: the rounding is the
arithmetic's, not the device's), and compared with R = x W^T in float64, x Gaussian:

- relative_frobenius: ||y - R|| / ||R||, what the format costs a layer's output;
- kernel_frobenius: ||y - x W'^T|| / ||R||, the kernel's own rounding against the
  dequantized weight (and quantized activations: what verification bounds), for scale.

Writes DIR/quantized_accuracy.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent))  # this checkout's autotune

import autotune  # noqa: E402
from autotune.problem import parse_shape  # noqa: E402
from autotune.quantize import parse_format, quantize_activations  # noqa: E402

FORMATS = (
    "q8", "q8.a8", "q4g32", "q4g64", "q4g128", "q4g32z", "q4g64z", "q4g128z", "q4g128.a8",
)  # fmt: skip
WEIGHTS = {
    "uniform": lambda rng, shape: rng.uniform(-1, 1, shape),
    "gaussian": lambda rng, shape: rng.standard_normal(shape),
}


def row(M: int, N: int, K: int, fmt: str, kind: str) -> dict:
    """One format on one kind of weight: the errors of the module doc."""
    rng = np.random.default_rng(0)
    W = WEIGHTS[kind](rng, (N, K)).astype(np.float32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    weights, _, int8 = fmt.partition(".")
    bits, group, zero_points = parse_format(weights)
    qw = autotune.quantize(W, bits=bits, group=group, zero_points=zero_points)
    activations = "q8" if int8 else "none"
    y = autotune.matmul(x, qw, activations=activations, checks=False).astype(np.float64)
    x64 = x.astype(np.float64)
    exact = x64 @ W.astype(np.float64).T
    if int8:  # what the kernel claims: x's codes times their scales
        codes, scales = quantize_activations(x)
        x64 = codes.astype(np.float64) * scales[:, None]
    claimed = x64 @ qw.dequantize().astype(np.float64).T
    norm = np.linalg.norm(exact)
    return {
        "format": fmt,
        "weights": kind,
        "shape": f"{M}x{N}x{K}",
        "bytes_per_weight": qw.nbytes / (N * K),
        "relative_frobenius": float(np.linalg.norm(y - exact) / norm),
        "kernel_frobenius": float(np.linalg.norm(y - claimed) / norm),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| format | bytes per weight | uniform W: error | Gaussian W: error | kernel's own |",
        "|---|---|---|---|---|",
    ]
    for fmt in dict.fromkeys(r["format"] for r in rows):
        by = {r["weights"]: r for r in rows if r["format"] == fmt}
        own = max(r["kernel_frobenius"] for r in by.values())
        lines.append(
            f"| {fmt} | {by['uniform']['bytes_per_weight']:.3f} | "
            f"{by['uniform']['relative_frobenius']:.2e} | "
            f"{by['gaussian']['relative_frobenius']:.2e} | {own:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="16x4096x4096", help="MxNxK (M <= 16: decode)")
    parser.add_argument("--format", action="append", choices=FORMATS, help="default: all")
    parser.add_argument("--out", type=Path, help="folder for the .json and .md")
    args = parser.parse_args(argv)
    problem = parse_shape(args.shape)
    rows = [
        row(problem.M, problem.N, problem.K, fmt, kind)
        for fmt in args.format or FORMATS
        for kind in WEIGHTS
    ]
    text = f"Relative Frobenius error of y = x W'^T against x W^T (float64), {args.shape}\n\n"
    text += table(rows)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "quantized_accuracy.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "quantized_accuracy.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
