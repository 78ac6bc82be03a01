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


class Reference:
    """Random inputs for one problem and what their product must be, computed once.

    A tuning run makes one Reference and checks every candidate against it (each with a
    fresh NaN-filled C): building the float64 reference is the slow part at large sizes.
    """

    def __init__(self, problem: Problem, seed: int | None = None, operands=None):
        self.problem = problem
        rng = np.random.default_rng(seed)
        self.A, self.B = operands if operands is not None else random_operands(problem, rng)
        A64, B64 = self.A.astype(np.float64), self.B.astype(np.float64)
        A2, B2 = A64 * A64, B64 * B64
        self.full = problem.flops <= FULL_CHECK_FLOPS
        if self.full:  # (want, scale) of every element
            self.want, self.scale = A64 @ B64, np.sqrt(A2 @ B2)
            return
        M, N = problem.M, problem.N
        self.rows = np.unique(np.r_[0, M - 1, rng.integers(0, M, SAMPLES)])
        self.cols = np.unique(np.r_[0, N - 1, rng.integers(0, N, SAMPLES)])
        self.row_want, self.row_scale = A64[self.rows] @ B64, np.sqrt(A2[self.rows] @ B2)
        self.col_want, self.col_scale = A64 @ B64[:, self.cols], np.sqrt(A2 @ B2[:, self.cols])
        # Freivalds: a wrong element anywhere shows in C x; x = +-1 weighs every column fully
        self.xs = [rng.choice([-1.0, 1.0], N) for _ in range(2)]
        self.x_want = [A64 @ (B64 @ x) for x in self.xs]
        self.x_scale = [np.sqrt(A2 @ (B2 @ (x * x))) for x in self.xs]

    def check(self, C: np.ndarray) -> Verdict:
        """Compare C with the float64 product (in full or sampled, see the module doc).

        Each element's error is divided by sqrt(A**2 @ B**2), the root-sum-square of the
        products it sums: the size its rounding errors scale with.
        """
        limit = tolerance(self.problem)
        if self.full:
            error = _worst(C, self.want, self.scale)
            return Verdict(error <= limit, error, limit)
        if not np.all(np.isfinite(C)):
            return Verdict(False, math.inf, limit)
        errors = [
            _worst(C[self.rows], self.row_want, self.row_scale),
            _worst(C[:, self.cols], self.col_want, self.col_scale),
        ]
        C64 = C.astype(np.float64)
        for x, want, scale in zip(self.xs, self.x_want, self.x_scale, strict=True):
            errors.append(_worst(C64 @ x, want, scale))
        error = max(errors)
        return Verdict(error <= limit, error, limit)


def check_result(C: np.ndarray, A: np.ndarray, B: np.ndarray, problem: Problem) -> Verdict:
    """Compare C with A @ B computed in float64."""
    return Reference(problem, operands=(A, B)).check(C)


def verify(
    compiled: Compiled, gpu: Gpu, seed: int | None = None, reference: Reference | None = None
) -> Verdict:
    """Run the kernel once (C filled with NaN first) and compare with float64 NumPy.

    Without a `reference`, on fresh random data made for this call.
    """
    reference = reference or Reference(compiled.shader.problem, seed)
    C = dispatch(compiled, gpu, reference.A, reference.B, fill=np.nan)
    return reference.check(C)
