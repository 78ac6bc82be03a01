"""Probe: what lookup's estimate serves at new shapes on a GPU that sat idle, against the
fastest of its own shortlist timed warm; and how the clocks come back after 3 s idle.
python PATH/estimate_probe.py CODE_DIR OUT.json [--ramp] [--quick]
CODE_DIR: a checkout (or an archive of one) whose autotune and cache are used."""

import json
import sys
import tempfile
import time

sys.path.insert(0, sys.argv[1])
import numpy as np  # noqa: E402

import autotune  # noqa: E402
from autotune import predict  # noqa: E402
from autotune.compile import compile_shader  # noqa: E402
from autotune.kernel import Bound, input_arrays  # noqa: E402
from autotune.lookup import SHORTLIST, _ranked, _stores, forget  # noqa: E402
from autotune.measure import _PassTimer, _repeats_for, measure  # noqa: E402
from autotune.problem import Problem  # noqa: E402
from autotune.render import render  # noqa: E402
from autotune.verify import random_operands  # noqa: E402

QUICK = "--quick" in sys.argv
IDLE = 0.2 if QUICK else 3.0
gpu = autotune.get_gpu()
SHAPES = [
    (1, 3072, 8192, "f16", "nt", "q4g128", "none"),
    (1, 5120, 5120, "f32", "nt", "q4g32", "none"),
    (1, 13824, 5120, "f32", "nt", "q8", "q8"),
    (8, 4096, 11008, "f32", "nt", "q4g128", "q8"),
    (3, 5120, 5120, "f32", "nt", "none", "none"),
    (7, 13824, 5120, "f16", "nt", "none", "none"),
    (100, 5120, 5120, "f32", "nn", "none", "none"),
    (333, 3072, 8192, "f32", "nt", "none", "none"),
]
if QUICK:
    SHAPES = [
        (1, 256, 512, "f32", "nt", "q4g128", "none"),
        (3, 64, 300, "f32", "nn", "none", "none"),
    ]


def ramp(kernel, seconds=2.0):
    problem = kernel.shader.problem
    A, B = random_operands(problem, np.random.default_rng(0))
    C = np.zeros(problem.matrix_shapes()["C"], dtype=problem.numpy_dtype)
    bound = Bound.make(kernel, gpu, input_arrays(A, B) | {"C": C})
    timer = _PassTimer(bound, gpu, gpu.has_timestamps)
    stamp, wall = timer.run(1)
    repeats = _repeats_for(stamp or wall, 0.005)
    time.sleep(IDLE)
    t0, rows = time.perf_counter(), []
    while time.perf_counter() - t0 < seconds:
        stamp, wall = timer.run(repeats)
        rows.append((time.perf_counter() - t0, (stamp or wall) / repeats))
    return rows


def main():
    out = {"rows": []}
    for M, N, K, dtype, layout, weights, activations in SHAPES:
        problem = Problem(M, N, K, dtype, layout, weights=weights, activations=activations)
        with tempfile.TemporaryDirectory() as folder:
            forget()
            time.sleep(IDLE)
            started = time.perf_counter()
            served = autotune.lookup(**problem.arguments, checks=False, gpu=gpu, cache_dir=folder)
            lookup_s = time.perf_counter() - started
            ranked = _ranked(problem, False, _stores(gpu, folder), gpu, dict(gpu.limits))
        shortlist = [c.config for c in predict.shortlist(ranked, SHORTLIST)]
        if served.config not in shortlist:
            shortlist.append(served.config)
        warm = {}
        compiled = [compile_shader(render(c, problem), gpu, checks=False) for c in shortlist]
        A, B = random_operands(problem, np.random.default_rng(1))
        measure(compiled[0], gpu, operands=(A, B), warmup_s=1.0, max_warmup_s=1.0)
        for _ in range(2):
            for c, k in zip(shortlist, compiled, strict=True):
                s = measure(k, gpu, operands=(A, B), min_pass_s=0.01, passes=5).median_s
                warm[c] = min(warm.get(c, s), s)
        best = min(warm.values())
        row = dict(
            problem=str(problem),
            served=str(served.config),
            source=served.source,
            estimate_s=served.entry.median_s if served.entry else None,
            served_warm_s=warm[served.config],
            best_warm_s=best,
            lookup_s=lookup_s,
            regret=warm[served.config] / best,
        )
        out["rows"].append(row)
        print(row, flush=True)
    if "--ramp" in sys.argv:
        M, N, K, dtype, layout, weights, activations = SHAPES[min(3, len(SHAPES) - 1)]
        problem = Problem(M, N, K, dtype, layout, weights=weights, activations=activations)
        k = autotune.lookup(**problem.arguments, checks=False, gpu=gpu, estimate=False)
        out["ramp"] = ramp(compile_shader(render(k.config, problem), gpu, checks=False))
    json.dump(out, open(sys.argv[2], "w"), indent=1)
    print(
        "\nproblem | served / best of shortlist (warm) | estimate's time / served warm | lookup s"
    )
    for r in out["rows"]:
        est = r["estimate_s"] / r["served_warm_s"] if r["estimate_s"] else float("nan")
        print(f"{r['problem']} | {r['regret']:.2f} | {est:.2f} | {r['lookup_s']:.1f}")
    if "ramp" in out:
        last = out["ramp"][-1][1]
        print("ramp: t s -> us per dispatch (x of final)")
        for t, s in out["ramp"][:: max(1, len(out["ramp"]) // 25)]:
            print(f"  {t:.2f} {s * 1e6:.1f} ({s / last:.2f})")


main()
