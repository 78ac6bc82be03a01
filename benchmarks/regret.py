"""Shape generalisation: how much slower is the nearest tuned shape's kernel than tuning?

    python benchmarks/regret.py --tuned 1024x1024x1024 --tuned 4096x4096x4096 \
        --held 2048x2048x2048 --held 1536x4096x1024 --timeout 30 --out regret.json

The --tuned shapes are tuned into a fresh cache; each --held shape (never tuned with the
others) is then served by `lookup`'s nearest-shape fallback from that cache, and tuned
itself into another fresh cache; both kernels are timed back to back on the same data.
Regret = time of the nearest-shape kernel / time of the kernel tuned for the shape - 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import autotune
from autotune.measure import measure
from autotune.problem import parse_shape
from autotune.verify import Reference


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tuned", action="append", required=True, metavar="MxNxK")
    parser.add_argument("--held", action="append", required=True, metavar="MxNxK")
    parser.add_argument("--timeout", type=float, default=30.0, help="search seconds per tune")
    parser.add_argument("--checks", choices=("on", "off"), default="off")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    gpu = autotune.get_gpu()
    checks = args.checks == "on"
    rows = []
    with tempfile.TemporaryDirectory() as tuned_dir, tempfile.TemporaryDirectory() as own_dir:

        def tune(problem, folder):
            return autotune.tune(
                problem.M, problem.N, problem.K, templates=["blocked"], trials=None,
                timeout=args.timeout, checks=checks, cache_dir=folder, gpu=gpu,
            )  # fmt: skip

        for shape in args.tuned:
            tune(parse_shape(shape), tuned_dir)
        for shape in args.held:
            problem = parse_shape(shape)
            near = autotune.lookup(
                problem.M, problem.N, problem.K, checks=checks, cache_dir=tuned_dir
            )
            own = tune(problem, own_dir)
            mine = autotune.lookup(
                problem.M, problem.N, problem.K, checks=checks, cache_dir=own_dir
            )
            reference = Reference(problem, seed=0)
            operands = (reference.A, reference.B)
            seconds = {}
            for _ in range(2):  # back to back, twice: the faster round of each
                for name, kernel in (("nearest", near), ("tuned", mine)):
                    m = measure(kernel.compiled, gpu, operands=operands)
                    seconds[name] = min(seconds.get(name, m.median_s), m.median_s)
            row = {
                "shape": shape,
                "nearest_source": near.source,
                "nearest_config": str(near.config),
                "tuned_config": str(mine.config),
                "nearest_s": seconds["nearest"],
                "tuned_s": seconds["tuned"],
                "regret": seconds["nearest"] / seconds["tuned"] - 1,
                "tuning_s": own.search.seconds,
            }
            rows.append(row)
            print(
                f"{shape:>18}: nearest ({near.source}) {seconds['nearest'] * 1e3:.3f} ms, "
                f"tuned {seconds['tuned'] * 1e3:.3f} ms, regret {row['regret']:+.1%}",
                flush=True,
            )
    report = {"device": gpu.summary, "tuned": args.tuned, "timeout_s": args.timeout, "rows": rows}
    if rows:
        mean = sum(r["regret"] for r in rows) / len(rows)
        report["mean_regret"] = mean
        print(f"mean regret {mean:+.1%}, worst {max(r['regret'] for r in rows):+.1%}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
