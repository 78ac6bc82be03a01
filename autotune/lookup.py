"""Lookup: the best known kernel for a problem on this device, and `matmul`.

Order: the user's cache, the shipped cache/, the nearest tuned shape on this device
(re-verified at the new shape before it is handed out), a sound default config (also
verified at this shape first). Exact entries were verified at their shape when tuned.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from . import cache
from .arguments import ArgumentError, check_flag, check_folder
from .compile import CompileError, compile_shader
from .data import BUILT_IN
from .device import Gpu, get_gpu, portable_limits, versions
from .kernel import Kernel, check_fits, check_operands
from .problem import Problem, ProblemError, shape_distance
from .render import render
from .space import Config, check_runnable, load_space
from .verify import Reference, verify


def _stores(gpu: Gpu, cache_dir) -> list[cache.DeviceCache]:
    folders = [Path(cache_dir) if cache_dir else cache.default_cache_dir()]
    shipped = cache.shipped_cache_dir()
    if shipped.resolve() != folders[0].resolve():
        folders.append(shipped)
    return [cache.DeviceCache(f, gpu.fingerprint.as_dict(), versions()) for f in folders]


def _fits(limits: dict, problem: Problem):
    """accept(entry): its config is valid for `problem` within `limits`."""
    return lambda entry: (
        not load_space(entry.key.template).why_invalid(entry.config, problem, limits)
    )


def _verified(problem, config: Config, source, checks, gpu, reference, entry=None):
    """A Kernel of `config` if it compiles and verifies at `problem` on this device."""
    try:
        compiled = compile_shader(render(config, problem), gpu, checks=checks)
    except CompileError:
        return None
    if not verify(compiled, gpu, reference=reference).ok:
        return None
    kernel = Kernel(problem, config, source, checks=checks, gpu=gpu, entry=entry)
    kernel._compiled = compiled
    return kernel


def _nearest(problem, checks, stores, gpu, limits, reference) -> Kernel | None:
    fits = _fits(limits, problem)  # e.g. vec4 loads need N % 4 == 0
    variants = {p.variant for p in problem.answered_by}
    candidates = []
    for store in stores:
        for entry in store.entries().values():
            key = entry.key
            if key.checks == checks and key.problem.variant in variants:
                if fits(entry):
                    candidates.append((shape_distance(key.problem, problem), entry.median_s, entry))
    for _, _, entry in sorted(candidates, key=lambda c: c[:2]):
        # tuned for another shape: verified at this one before it is handed out
        kernel = _verified(problem, entry.config, "nearest", checks, gpu, reference, entry)
        if kernel is not None:
            return kernel
    return None


def default_kernel(
    problem: Problem,
    gpu: Gpu,
    checks: bool = True,
    limits: dict | None = None,
    reference: Reference | None = None,
) -> Kernel:
    """A sound untuned kernel, verified at this shape: the first known-good config valid
    here, else the first valid config of each template. A problem no config can run
    within the device's limits is refused with the limit named."""
    limits = limits or gpu.limits
    check_runnable(problem, limits, BUILT_IN)
    reference = reference or Reference(problem)
    spaces = [load_space(t) for t in BUILT_IN]
    configs = [c for space in spaces for c in space.seed_configs(problem, limits)]
    configs += [space.first_config(problem, limits) for space in spaces]
    for config in dict.fromkeys(c for c in configs if c is not None):
        kernel = _verified(problem, config, "default", checks, gpu, reference)
        if kernel is not None:
            return kernel
    raise ProblemError("shape", f"no default kernel computes {problem} correctly on this device")


@functools.lru_cache(maxsize=256)
def _lookup(
    problem: Problem, checks: bool, cache_dir: str | None, gpu: Gpu, portable: bool
) -> Kernel:
    limits = portable_limits(gpu.limits) if portable else gpu.limits
    stores = _stores(gpu, cache_dir)
    for store in stores:
        entry = store.best(problem, checks, accept=_fits(limits, problem))
        if entry is not None:
            return Kernel(problem, entry.config, "exact", checks=checks, gpu=gpu, entry=entry)
    check_runnable(problem, limits, BUILT_IN)
    reference = Reference(problem)  # one set of data for every kernel tried below
    return _nearest(problem, checks, stores, gpu, limits, reference) or default_kernel(
        problem, gpu, checks, limits, reference
    )


def forget() -> None:
    """Drop memoized lookups (after a tune wrote new entries)."""
    _lookup.cache_clear()


def lookup(
    M: int,
    N: int,
    K: int,
    dtype: str = "f32",
    *,
    layout: str = "nn",
    batch: int = 1,
    shared_b: bool = False,
    epilogue: str | list | None = "none",
    accumulate: str = "auto",
    checks: bool = True,
    cache_dir: str | Path | None = None,
    gpu: Gpu | None = None,
    portable: bool = False,
) -> Kernel:
    """The best known kernel for C = A @ B with A of M x K and B of K x N, on this device.

    The variant (see autotune.Problem): `layout` "nn", "nt" (B stored N x K), "tn", "tt";
    `batch` matrices per operand (`shared_b`: one B for all); `epilogue`, e.g.
    "bias,gelu" or "alpha,beta,bias,relu"; `accumulate` (f16) "auto", "f32" or "f16".
    `kernel.source` is "exact", "nearest" or
    "default"; call it with NumPy arrays. `portable` keeps to configs within WebGPU's
    default limits (for export).
    """
    problem = Problem(M, N, K, dtype, layout, batch, shared_b, epilogue, accumulate)
    checks, portable = check_flag("checks", checks), check_flag("portable", portable)
    check_folder("cache_dir", cache_dir, writable=False)
    if gpu is not None and not isinstance(gpu, Gpu):
        raise ArgumentError("gpu", f"gpu must be an autotune.Gpu or None, got {type(gpu).__name__}")
    gpu = gpu or get_gpu()
    check_fits(problem, gpu, portable_limits(gpu.limits) if portable else None)
    folder = str(cache_dir) if cache_dir else None
    kernel = _lookup(problem, bool(checks), folder, gpu, bool(portable))
    if kernel.entry is not None and not cache.is_current(kernel.entry):
        # its template changed since it was looked up: never served, look again
        forget()
        kernel = _lookup(problem, bool(checks), folder, gpu, bool(portable))
    return kernel


def matmul(
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray | None = None,
    *,
    bias: np.ndarray | None = None,
    activation: str | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    trans_a: bool = False,
    trans_b: bool = False,
    accumulate: str = "auto",
    checks: bool = True,
) -> np.ndarray:
    """activation(alpha * op(A) @ op(B) + beta * C + bias) on the GPU with the best known
    kernel for the problem; returns a new array (C is read, not written).

    trans_b=True: B is stored N x K (a linear layer's weight, y = x @ W.T); trans_a=True:
    A is stored K x M. A 3-D A is a batch, with a 3-D B (one per item) or a 2-D B (shared).
    f16 arrays run in f16 (the adapter needs shader-f16), accumulating in whichever type
    was fastest when tuned, or as `accumulate` ("f32", "f16") says.
    """
    arrays, problem = check_operands(
        A,
        B,
        trans_a=trans_a,
        trans_b=trans_b,
        C=C,
        bias=bias,
        alpha=alpha,
        beta=beta,
        activation=activation,
    )
    checks = check_flag("checks", checks)
    kernel = lookup(**(problem.arguments | {"accumulate": accumulate}), checks=checks)
    return kernel(
        arrays["A"],
        arrays["B"],
        arrays.get("C"),
        bias=arrays.get("bias"),
        alpha=alpha,
        beta=beta,
    )
