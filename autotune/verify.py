"""Verify: a compiled kernel against NumPy's float64 product, on fresh random data.

C is pre-filled with NaN so a kernel that skips an element fails; inputs are random in
[-1, 1] so a kernel that is right only on zeros, ones or positive data fails. Each
element's error is measured against the rounding bound of its own dot product,
|C - R| <= tol * (|A| @ |B|), with tol a generous multiple of eps * sqrt(K); NaN or
infinity never passes.

Problems up to FULL_CHECK_FLOPS are compared element by element in full. Larger ones
(a float64 product of 4096^3 takes seconds, too slow per candidate) are checked for
NaN everywhere, element by element on sampled rows and columns (the first, the last
and random ones, so edge tiles are always covered) and on all of C through Freivalds'
test C x = A (B x) with random vectors x, which sees any wrong element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .compile import Compiled
from .device import Gpu
from .kernel import dispatch
from .problem import Problem

# Unit roundoff per dtype; a sum of K products in that precision drifts like sqrt(K).
EPSILON = {"f32": 2.0**-24, "f16": 2.0**-11}


FULL_CHECK_FLOPS = 2 * 512**3
SAMPLES = 32  # random rows and columns checked in full on large problems


@dataclass(frozen=True)
class Verdict:
    ok: bool
    error: float  # largest |C - R| / sqrt(A**2 @ B**2) over the checked elements
    tolerance: float

    @property
    def reason(self) -> str:
        return (
            "" if self.ok else f"relative error {self.error:.3g} > tolerance {self.tolerance:.3g}"
        )


def tolerance(problem: Problem) -> float:
    """Allowed error relative to sqrt(A**2 @ B**2): 16x eps * sqrt(K), the random-walk
    growth of rounding in a K-term sum, with a floor for tiny K. One dropped product in
    a dot product is off by ~1/sqrt(K) of that scale: far above this for any K < 2**24.
    """
    return EPSILON[problem.dtype] * (16 * math.sqrt(problem.K) + 16)


def random_operands(problem: Problem, rng: np.random.Generator):
    A = rng.uniform(-1, 1, (problem.M, problem.K)).astype(problem.numpy_dtype)
    B = rng.uniform(-1, 1, (problem.K, problem.N)).astype(problem.numpy_dtype)
    return A, B


def _worst(got: np.ndarray, want: np.ndarray, scale: np.ndarray) -> float:
    """Largest |got - want| / scale; infinity if `got` has a NaN or infinity."""
    got = got.astype(np.float64)
    if not np.all(np.isfinite(got)):
        return math.inf
    return float(np.max(np.abs(got - want) / np.maximum(scale, 1e-300)))


def check_result(
    C: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    problem: Problem,
    rng: np.random.Generator | None = None,
) -> Verdict:
    """Compare C with A @ B computed in float64 (in full or sampled, see the module doc).

    Each element's error is divided by sqrt(A**2 @ B**2), the root-sum-square of the
    products it sums: the size rounding errors scale with.
    """
    limit = tolerance(problem)
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    A2, B2 = A64 * A64, B64 * B64
    if problem.flops <= FULL_CHECK_FLOPS:
        error = _worst(C, A64 @ B64, np.sqrt(A2 @ B2))
        return Verdict(error <= limit, error, limit)
    if not np.all(np.isfinite(C)):
        return Verdict(False, math.inf, limit)
    rng = rng or np.random.default_rng()
    rows = np.unique(np.r_[0, problem.M - 1, rng.integers(0, problem.M, SAMPLES)])
    cols = np.unique(np.r_[0, problem.N - 1, rng.integers(0, problem.N, SAMPLES)])
    errors = [
        _worst(C[rows], A64[rows] @ B64, np.sqrt(A2[rows] @ B2)),
        _worst(C[:, cols], A64 @ B64[:, cols], np.sqrt(A2 @ B2[:, cols])),
    ]
    C64 = C.astype(np.float64)
    for _ in range(2):  # Freivalds: a wrong element anywhere shows in C x
        x = rng.choice([-1.0, 1.0], problem.N)  # +-1: every column weighs fully
        errors.append(_worst(C64 @ x, A64 @ (B64 @ x), np.sqrt(A2 @ (B2 @ (x * x)))))
    error = max(errors)
    return Verdict(error <= limit, error, limit)


def verify(compiled: Compiled, gpu: Gpu, seed: int | None = None) -> Verdict:
    """Run the kernel once on fresh random data and compare with float64 NumPy."""
    problem = compiled.shader.problem
    rng = np.random.default_rng(seed)
    A, B = random_operands(problem, rng)
    C = dispatch(compiled, gpu, A, B, fill=np.nan)
    return check_result(C, A, B, problem, rng)
