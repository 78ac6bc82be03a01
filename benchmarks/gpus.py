"""Several GPUs on one study: candidates measured per minute with 1 GPU and with N.

    python benchmarks/gpus.py --shape 4096x4096x4096 --seconds 120 --gpus 8
    python benchmarks/gpus.py --shape 4096x4096x4096 --seconds 120 --gpus 2 \
        --model benchmarks/models/llama-7b-layer.toml --trials 40
    python benchmarks/gpus.py --quick      # lavapipe: one adapter twice, seconds

The shape is tuned for --seconds (no trial budget) with `gpus=1`, then with `--gpus`,
each time into a fresh cache folder and a fresh in-memory study (the same seed): the
candidates measured per minute of search, and their ratio (N GPUs' over one's). With
--model, the model's representatives (`tune --model`, radius 1) are then tuned with
--trials each, with 1 GPU and with N, and the wall time of each whole `tune_many` is
compared (worker starts, references, baselines and re-timing included).

--quick tunes 64x64x64 for 3 s and three small problems for 2 trials on lavapipe's one
adapter twice (`gpus=[0, 0]`, `repeat_gpus`: a stand-in for two GPUs, whose two timings
at once share the CPU's cores, so its ratio says nothing of a real host's).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))  # this checkout's autotune

import autotune  # noqa: E402
from autotune.problem import Problem, parse_shape, problems_from_file  # noqa: E402

QUICK_PROBLEMS = [Problem(64, 64, 64), Problem(32, 64, 48), Problem(48, 32, 32)]


def per_minute(problem: Problem, seconds: float, gpus, repeat: bool, templates) -> tuple:
    """(candidates measured per minute of search, measured, search seconds)."""
    with tempfile.TemporaryDirectory() as cache_dir:
        result = autotune.tune(
            **problem.arguments, trials=None, timeout=seconds, cache_dir=cache_dir, seed=0,
            gpus=gpus, repeat_gpus=repeat, templates=templates,
        )  # fmt: skip
    measured, spent = result.search.measured, result.search.seconds
    return 60 * measured / spent, measured, spent


def model_wall(problems, trials: int, gpus, repeat: bool, templates) -> float:
    """Seconds of tune_many over a model's representatives."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as cache_dir:
        autotune.tune_many(
            problems, radius=1.0, trials=trials, cache_dir=cache_dir, seed=0, gpus=gpus,
            repeat_gpus=repeat, templates=templates,
        )  # fmt: skip
    return time.monotonic() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="4096x4096x4096", help="MxNxK (default 4096³)")
    parser.add_argument("--seconds", type=float, default=120.0, help="of search per run")
    parser.add_argument("--gpus", default="all", help="the N-GPU run's --gpus (default all)")
    parser.add_argument("--model", help="a model file: its tune_many wall time too")
    parser.add_argument("--trials", type=int, default=30, help="per problem, with --model")
    parser.add_argument("--template", action="append", help="template(s) (default all)")
    parser.add_argument("--quick", action="store_true", help="seconds, on lavapipe twice")
    args = parser.parse_args(argv)
    gpus, repeat, templates = args.gpus, False, args.template
    problem, seconds, problems = parse_shape(args.shape), args.seconds, None
    if args.model:
        problems = problems_from_file(args.model)
    if args.quick:
        gpus, repeat, templates = [0, 0], True, templates or ["tiled"]
        problem, seconds, problems, args.trials = Problem(64, 64, 64), 3.0, QUICK_PROBLEMS, 2
    print(f"{autotune.get_gpu().summary}; {problem}; {seconds:g} s of search per run")
    one = per_minute(problem, seconds, 1, False, templates)
    many = per_minute(problem, seconds, gpus, repeat, templates)
    for name, (rate, measured, spent) in (("1 GPU", one), (f"gpus {gpus}", many)):
        print(f"{name}: {measured} candidates in {spent:.1f} s = {rate:.0f}/min", flush=True)
    print(f"ratio: {many[0] / one[0]:.2f}x candidates per minute")
    if problems:
        runs = ((1, False), (gpus, repeat))
        walls = [model_wall(problems, args.trials, g, r, templates) for g, r in runs]
        print(
            f"model ({len(problems)} problems, {args.trials} trials each): 1 GPU {walls[0]:.1f} s, "
            f"gpus {gpus} {walls[1]:.1f} s: {walls[0] / walls[1]:.2f}x faster"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
