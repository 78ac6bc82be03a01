"""Measure one template idea at a time: given configs, flip parameters and time each variant.

    python benchmarks/variants.py --shape 4096x4096x4096 \
        --config "VEC=4 BM=128 TM=8 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 DB=1 AT=0 GROUP=1 WARP=0" \
        --vary AT=0,1 --vary GROUP=1,16 --out variants.json

--dtype, --layout, --accumulate and --epilogue pick a variant problem (with --template blockedx);
--weights and --activations a quantized one (e.g. --template qgemv --layout nt --weights q4g128);
--checks on/off times one mode only. Each config is taken with every combination of the
--vary values (combinations that are invalid for the shape or this device are listed as
such), verified, and timed with and without runtime checks, next to cuBLAS SGEMM
measured in the same run: this is how the "measured" column of NOTES.md is filled in.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from timing import cublas_seconds, provenance, wgsl_seconds  # noqa: E402

import autotune  # noqa: E402
from autotune.compile import CompileError  # noqa: E402
from autotune.problem import parse_shape  # noqa: E402
from autotune.space import Config, load_space  # noqa: E402
from autotune.verify import Reference  # noqa: E402


def parse_params(text: str) -> dict[str, int]:
    pairs = (item.split("=") for item in text.replace(",", " ").split())
    return {name: int(value) for name, value in pairs}


def variants(base: dict[str, int], vary: list[tuple[str, list[int]]]):
    names = [name for name, _ in vary]
    for values in itertools.product(*(values for _, values in vary)):
        yield base | dict(zip(names, values, strict=True))


def run(shapes, configs, vary, template: str, out: Path | None, modes=(False, True), **variant):
    gpu = autotune.get_gpu()
    space = load_space(template)
    report = {"provenance": provenance(gpu), "rows": []}
    for shape in shapes:
        problem = parse_shape(shape, **variant)
        reference = Reference(problem, seed=0)
        try:
            cublas_s = cublas_seconds(problem)
        except ImportError:  # no torch here: ratios come out as NaN
            cublas_s = float("nan")
        print(f"{shape}: cuBLAS {problem.flops / cublas_s / 1e12:.1f} TFLOP/s", flush=True)
        for base in configs:
            for params in variants(base, vary):
                config = Config.make(template, params)
                row = {"shape": shape, "config": str(config), "cublas_s": cublas_s}
                why = space.why_invalid(config, problem, gpu.limits)
                if why:
                    row["invalid"] = why
                else:
                    for checks in modes:
                        name = "checks" if checks else "nochecks"
                        try:
                            result = wgsl_seconds(config, problem, gpu, checks, reference)
                        except (CompileError, AssertionError) as error:
                            row[name] = {"failed": str(error)[:300]}
                            continue
                        result["ratio"] = cublas_s / result["seconds"]
                        result["tflops"] = problem.flops / result["seconds"] / 1e12
                        row[name] = result
                report["rows"].append(row)
                print(_line(row), flush=True)
                if out:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(report, indent=1))
    return report


def _line(row) -> str:
    if "invalid" in row:
        return f"  {row['config']}: invalid ({row['invalid']})"
    cells = []
    for name in ("nochecks", "checks"):
        if name not in row:
            continue
        r = row[name]
        cells.append(
            f"{name} failed" if "failed" in r else f"{name} {r['tflops']:5.1f} ({r['ratio']:.2f}x)"
        )
    return f"  {row['config']}: " + " | ".join(cells)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", action="append", required=True, help="MxNxK")
    parser.add_argument("--config", action="append", required=True, help="'NAME=V ...'")
    parser.add_argument("--vary", action="append", default=[], help="NAME=V1,V2,...")
    parser.add_argument("--template", default="blocked")
    parser.add_argument("--out", type=Path, help="JSON file for the results")
    parser.add_argument("--checks", choices=("on", "off", "both"), default="both")
    parser.add_argument("--dtype", default="f32")
    parser.add_argument("--layout", default="nn")
    parser.add_argument("--accumulate", default="auto")
    parser.add_argument("--epilogue", default="none", help="e.g. alpha: a variant problem")
    parser.add_argument("--weights", default="none", help="e.g. q4g128: quantized weights")
    parser.add_argument("--activations", default="none", choices=("none", "q8"))
    args = parser.parse_args(argv)
    modes = {"on": (True,), "off": (False,), "both": (False, True)}[args.checks]
    vary = [
        (item.split("=")[0], [int(v) for v in item.split("=")[1].split(",")]) for item in args.vary
    ]
    configs = [parse_params(c) for c in args.config]
    run(
        args.shape, configs, vary, args.template, args.out, modes,
        dtype=args.dtype, layout=args.layout, accumulate=args.accumulate,
        epilogue=args.epilogue, weights=args.weights, activations=args.activations,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
