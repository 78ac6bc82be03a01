"""Every config of the quantized-weight GEMM family `qgemm` timed at a prefill shape.

    python benchmarks/qgemm_sweep.py [SECONDS]    # default 300, split between the problems

At 2048x4096x4096 (q4g128 with f32 and f16 activations, q8 with f32), without runtime
checks: the seeds first, then the space's configs with vec4 A, each compiled and timed
(three passes), until the problem's share of SECONDS is spent. Prints each config's
TFLOP/s, the five fastest per problem, the fastest's verdict (against the dequantized
weight), and the first blockedx seed on the unquantized f32 or f16 weight for scale.
"""

from __future__ import annotations

import sys
import time

from autotune.compile import compile_shader
from autotune.device import get_gpu
from autotune.measure import measure
from autotune.problem import Problem
from autotune.render import render
from autotune.space import load_space
from autotune.verify import verify

PROBLEMS = [
    Problem(2048, 4096, 4096, "f32", "nt", weights="q4g128"),
    Problem(2048, 4096, 4096, "f16", "nt", weights="q4g128"),
    Problem(2048, 4096, 4096, "f32", "nt", weights="q8"),
]


def timed(config, problem, gpu):
    compiled = compile_shader(render(config, problem), gpu, checks=False)
    seconds = measure(compiled, gpu, min_pass_s=0.002, passes=3, budget_s=0.3).median_s
    return seconds, compiled


def sweep(problem, gpu, budget_s):
    space = load_space("qgemm")
    seeds = space.seed_configs(problem, gpu.limits)
    rest = [c for c in space.configs(problem, gpu.limits) if c not in seeds and c["AV"] == 4]
    results, stop = [], time.monotonic() + budget_s
    for config in seeds + rest:
        if time.monotonic() > stop:
            break
        seconds, compiled = timed(config, problem, gpu)
        results.append((seconds, config, compiled))
        print(f"{problem}  {config}: {problem.flops / seconds / 1e12:.2f} TFLOP/s", flush=True)
    results.sort(key=lambda r: r[0])
    print(f"== {problem}: {len(results)} timed")
    for seconds, config, _ in results[:5]:
        print(f"   {problem.flops / seconds / 1e12:.2f} TFLOP/s  {config}")
    print("   fastest verifies:", verify(results[0][2], gpu))
    plain = Problem(problem.M, problem.N, problem.K, problem.dtype, "nt")
    config = load_space("blockedx").seed_configs(plain, gpu.limits)[0]
    seconds, _ = timed(config, plain, gpu)
    print(f"   blockedx {config} unquantized: {plain.flops / seconds / 1e12:.2f} TFLOP/s")


def main() -> None:
    gpu = get_gpu()
    total = float(sys.argv[1]) if len(sys.argv) > 1 else 300.0
    for problem in PROBLEMS:
        sweep(problem, gpu, total / len(PROBLEMS))


if __name__ == "__main__":
    main()
