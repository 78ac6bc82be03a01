"""Does the measurement see the GPU at full clocks? Time one config after the GPU sat idle.

    python benchmarks/warmup.py --shape 4096x4096x4096 \
        --config "VEC=4 BM=128 TM=8 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 DB=1 AT=1 GROUP=1 WARP=0"

Each setting is timed after `--idle` seconds without GPU work, as a candidate is after
its compile and verification: the tuner's settings with the old fixed 50 ms warm-up, the
tuner's settings with the adaptive warm-up, and the benchmark's long passes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from variants import parse_params  # noqa: E402

import autotune  # noqa: E402
from autotune.compile import compile_shader  # noqa: E402
from autotune.measure import measure  # noqa: E402
from autotune.problem import parse_shape  # noqa: E402
from autotune.render import render  # noqa: E402
from autotune.space import Config  # noqa: E402
from autotune.verify import Reference  # noqa: E402

SETTINGS = {
    "tuner, fixed 50 ms warm-up": dict(max_warmup_s=0.05),
    "tuner, adaptive warm-up": {},
    "benchmark (10 passes of 20 ms)": dict(min_pass_s=0.02, passes=10, budget_s=4.0),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--checks", choices=("on", "off"), default="off")
    parser.add_argument("--idle", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    gpu = autotune.get_gpu()
    problem = parse_shape(args.shape)
    config = Config.make("blocked", parse_params(args.config))
    compiled = compile_shader(render(config, problem), gpu, checks=args.checks == "on")
    reference = Reference(problem, seed=0)
    for round_ in range(args.rounds):
        for name, settings in SETTINGS.items():
            time.sleep(args.idle)
            m = measure(compiled, gpu, operands=(reference.A, reference.B), **settings)
            tflops = problem.flops / m.median_s / 1e12
            print(f"round {round_} {name:>32}: {tflops:5.1f} TFLOP/s (p20-p80 {m.spread:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
