"""Timing shared by bench.py and layer.py: cuBLAS from a CUDA graph, our kernel as
`autotune.lookup` serves it, both in alternating rounds, and the bytes a GEMM moves.

cuBLAS is the reference of every ratio: SGEMM in f32 with TF32 off, whatever the dtype
of our problem (an f16 kernel is judged against cuBLAS f32), in the problem's layout
(nt: x @ W.T with W stored N x K) and batch. It is timed as a CUDA graph of R matmuls
replayed, R chosen so a replay lasts >= 20 ms, as our side records R dispatches in one
compute pass: a Python loop of matmuls would add launch overhead (at 128^3 cuBLAS
measured 0.38 TFLOP/s from a loop and 0.99 from a graph).
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent))  # this checkout's autotune

from shapes import quick  # noqa: E402

import autotune  # noqa: E402
from autotune.compile import compile_shader  # noqa: E402
from autotune.device import versions  # noqa: E402
from autotune.measure import measure  # noqa: E402
from autotune.problem import Problem  # noqa: E402
from autotune.render import render  # noqa: E402
from autotune.verify import Reference, verify  # noqa: E402

# What a memory-bound row is judged against, in TB/s: the fastest streaming read WGSL
# achieved on the H200 (measured), and the H200's HBM3e bandwidth (NVIDIA's figure).
WGSL_STREAM_TBS = 4.4
HBM_TBS = 4.8
BOUNDS = (
    f"memory bounds: WGSL's streaming read {WGSL_STREAM_TBS} TB/s (measured on the H200), "
    f"HBM {HBM_TBS} TB/s"
)

MODES = {"checks": True, "nochecks": False}  # result name -> wgpu's runtime checks
MODE_TITLES = {"tiled": "tiled 16x16", "checks": "checks on", "nochecks": "checks off"}
CHECKS_CHOICES = {"on": ("checks",), "off": ("nochecks",), "both": ("checks", "nochecks")}

# passes of >= 20 ms, 10 of them, as on the H200; quick mode: a dry run in seconds
MEASURE = dict(min_pass_s=0.02, passes=10, budget_s=4.0)
QUICK_MEASURE = dict(min_pass_s=0.002, passes=3, budget_s=0.2, warmup_s=0.0, max_warmup_s=0.01)


def cublas_problem(problem: Problem) -> Problem:
    """What cuBLAS runs for `problem`: its sizes, layout and batch in f32, with the
    weight unquantized (N x K f32, as a quantized weight's layer had it)."""
    return replace(problem, dtype="f32", accumulate="auto", weights="none", activations="none")


def cublas_seconds(problem: Problem, passes: int = 10, min_pass_s: float = 0.02) -> float:
    """Median seconds per cuBLAS SGEMM (f32, TF32 off) of `problem`'s sizes, layout and
    batch, from a CUDA graph (the module doc). The epilogue is not part of it."""
    problem = cublas_problem(problem)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    op_a, op_b, C = reference_operands(
        problem, lambda shape: torch.rand(shape, device="cuda") * 2 - 1
    )
    return graph_seconds(lambda: torch.matmul(op_a, op_b, out=C), passes, min_pass_s)


def reference_operands(problem: Problem, make) -> tuple:
    """(op(A), op(B), C) of `problem`, each array made by `make(shape)` and stored as our
    kernel reads it (layout "t": stored transposed, viewed as op() through .mT; a batch:
    3-D, a shared B 2-D), so that matmul(op(A), op(B), out=C) is the problem's product."""
    stored = problem.matrix_shapes()
    A, B, C = (make(stored[name]) for name in "ABC")
    return (A.mT if problem.trans_a else A), (B.mT if problem.trans_b else B), C


def graph_seconds(run, passes: int = 10, min_pass_s: float = 0.02, max_repeats=16384) -> float:
    """Median seconds per call of `run` (CUDA work on the current stream): warmed up on a
    side stream (as torch's graph capture requires), captured R times in one CUDA graph
    with R grown until a replay lasts `min_pass_s`, replayed `passes` times."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    repeats = 1
    while True:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(repeats):
                run()
        seconds = _replay_seconds(graph, 3)
        if seconds >= min_pass_s or repeats >= max_repeats:
            return _replay_seconds(graph, passes) / repeats
        repeats = min(max_repeats, math.ceil(repeats * 1.2 * min_pass_s / seconds))


def _replay_seconds(graph, passes: int) -> float:
    """Median seconds of one replay of `graph`, after one untimed replay."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(passes):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def wgsl_seconds(config, problem, gpu, checks: bool, reference: Reference) -> dict:
    """One timing of `config` at `problem`, verified against float64 first."""
    return wgsl_timing(verified(config, problem, gpu, checks, reference), gpu, reference)


def verified(config, problem, gpu, checks: bool, reference: Reference):
    """`config` compiled for `problem`, and its error, after it computed `reference` right."""
    compiled = compile_shader(render(config, problem), gpu, checks=checks)
    verdict = verify(compiled, gpu, reference=reference)
    if not verdict.ok:
        raise AssertionError(f"{config} checks={checks} is WRONG at {problem}: {verdict.reason}")
    return compiled, verdict.error


def wgsl_timing(verified_kernel, gpu, reference: Reference) -> dict:
    """One timing of a kernel `verified` returned, on the reference's operands."""
    compiled, error = verified_kernel
    settings = QUICK_MEASURE if quick() else MEASURE
    m = measure(compiled, gpu, **settings, operands=(reference.A, reference.B))
    config = compiled.shader.config
    return {
        "config": str(config),
        "template": config.template,
        "seconds": m.median_s,
        "p20_s": m.p20_s,
        "p80_s": m.p80_s,
        "method": m.method,
        "error": error,
    }


def min_bytes(problem: Problem) -> int:
    """The bytes a GEMM must move at least: each of its arrays once (A, B, C, and the
    bias, a quantized weight's scales and zero points), in its element type."""
    types = problem.operand_dtypes()
    return sum(
        math.prod(shape) * np.dtype(types[name]).itemsize
        for name, shape in problem.matrix_shapes().items()
    )


def cublas_bytes(problem: Problem) -> int:
    return min_bytes(cublas_problem(problem))


def try_cublas(problem: Problem) -> float:
    """cublas_seconds, or NaN without PyTorch (a dry run: our columns only)."""
    try:
        return cublas_seconds(problem)
    except ImportError:
        return math.nan


def time_problem(problem: Problem, gpu, modes, rounds: int, reference=None) -> dict:
    """A row: cuBLAS and the kernel `lookup` serves in each mode ("checks", "nochecks"),
    timed `rounds` times in turn, so that a drift of the GPU's clocks between rounds
    moves both sides of a ratio; each ratio is the median of the rounds' ratios."""
    reference = reference or Reference(problem, seed=0)
    kernels, lookup_s = {}, {}
    for mode in modes:
        start = time.perf_counter()
        # quick: a dry run of the tables; a new shape gets the best ranked config untimed
        kernels[mode] = autotune.lookup(
            **problem.arguments, checks=MODES[mode], gpu=gpu, estimate=not quick()
        )
        lookup_s[mode] = time.perf_counter() - start
    ready = {  # compiled and verified once; timed in each round
        mode: verified(kernel.config, problem, gpu, MODES[mode], reference)
        for mode, kernel in kernels.items()
    }
    cublas, timed = [], {mode: [] for mode in modes}
    for _ in range(rounds):
        cublas.append(try_cublas(problem))
        for mode in modes:
            timed[mode].append(wgsl_timing(ready[mode], gpu, reference))
    row = {
        "shape": problem.shape,
        "problem": str(problem),
        "dtype": problem.dtype,
        "layout": problem.layout,
        "bytes": min_bytes(problem),
        "cublas_s": statistics.median(cublas),
        "cublas_rounds_s": cublas,
    }
    row["cublas_tflops"] = problem.flops / row["cublas_s"] / 1e12
    row["cublas_tbs"] = cublas_bytes(problem) / row["cublas_s"] / 1e12
    for mode, results in timed.items():
        result = sorted(results, key=lambda r: r["seconds"])[len(results) // 2]
        result |= {"source": kernels[mode].source, "lookup_s": lookup_s[mode]}
        result["rounds_s"] = [r["seconds"] for r in results]
        result["ratio"] = statistics.median(
            c / r["seconds"] for c, r in zip(cublas, results, strict=True)
        )
        row[mode] = with_rates(result, problem)
    return row


def with_rates(result: dict, problem: Problem) -> dict:
    """`result` with its TFLOP/s and the TB/s of its minimum bytes."""
    result["tflops"] = problem.flops / result["seconds"] / 1e12
    result["tbs"] = min_bytes(problem) / result["seconds"] / 1e12
    return result


def result_cell(result: dict) -> str:
    """ "44.9 (0.89x; 1.23 TB/s; exact blocked)" for a timed kernel."""
    where = f"; {result['source']} {result['template']}" if "source" in result else ""
    return f"{result['tflops']:.3g} ({result['ratio']:.2f}x; {result['tbs']:.2f} TB/s{where})"


def cublas_cell(row: dict) -> str:
    return f"{row['cublas_tflops']:.3g} ({row['cublas_tbs']:.2f} TB/s)"


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def provenance(gpu) -> dict:
    info = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": gpu.summary,
        "fingerprint": gpu.fingerprint.as_dict(),
        "versions": versions(),
        "commit": os.environ.get("AUTOTUNE_COMMIT") or _git_commit(),
        "bounds_tbs": {"wgsl_stream": WGSL_STREAM_TBS, "hbm": HBM_TBS},
        "quick": quick(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        info["cuda_device"] = torch.cuda.get_device_name()
    except Exception as error:  # no torch: WGSL rows only
        info["torch"] = f"unavailable: {error}"
    try:
        info["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["driver"] = gpu.fingerprint.description
    return info


def heading(p: dict) -> str:
    """The first line of every table: device, driver, versions, date, commit."""
    return (
        f"{p['device']}, driver {p.get('driver')}, wgpu {p['versions']}, {p['date']}, "
        f"commit {p.get('commit')}"
        + (" (quick: tiny shapes, not a measurement)" if p.get("quick") else "")
    )


def _git_commit() -> str:
    """The commit of the checkout this script is in, wherever it is run from."""
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                cwd=Path(__file__).parent,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
