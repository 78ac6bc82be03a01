"""Candidates per minute of a search, compiling one at a time vs ahead of timing.

    python benchmarks/throughput.py --shape 4096x4096x4096 --timeout 30 --ahead 0 1

Each setting searches the blocked template for the same time, in a fresh in-memory study
with the same seed (checks off), and reports how many candidates it measured per minute
and the mean compile time per candidate.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import optuna

import autotune
from autotune.evaluate import reference_seed
from autotune.problem import parse_shape
from autotune.search import search
from autotune.worker import Worker


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--ahead", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--checks", choices=("on", "off"), default="off")
    args = parser.parse_args(argv)
    gpu = autotune.get_gpu()
    problem = parse_shape(args.shape)
    checks = args.checks == "on"
    print(f"{gpu.summary}; {problem}; {args.timeout:g} s of search per setting")
    for ahead in args.ahead:
        compile_s = []
        with Worker(gpu.fingerprint.as_dict(), index=gpu.index) as worker:
            worker.prepare(problem, reference_seed(0), checks)
            result = search(
                problem,
                gpu,
                templates=["blocked"],
                trials=None,
                timeout=args.timeout,
                checks=checks,
                seed=0,
                storage=optuna.storages.InMemoryStorage(),
                evaluator=worker,
                compile_ahead=ahead,
                on_trial=lambda event, seen=compile_s: seen.append(event["outcome"].compile_s),
            )
        best = result.best.measurement.gflops(problem.flops) if result.best else float("nan")
        print(
            f"compile_ahead={ahead}: {result.measured} candidates in {result.seconds:.1f} s = "
            f"{60 * result.measured / result.seconds:.0f}/min; compile "
            f"{1e3 * statistics.mean(compile_s or [0]):.0f} ms/candidate; best {best:.1f} GFLOP/s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
