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

Each buffer is followed by a guard: A and B by NaN (a kernel that reads past the end of
its input gets NaN into its result), C by a canary bit pattern that must come back
unchanged (a kernel that writes outside C, e.g. an edge tile without its row test, is
rejected even where the stray write would land in some other allocation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .compile import Compiled
from .device import Gpu
from .kernel import Bound
from .problem import Problem

# Unit roundoff per dtype; a sum of K products in that precision drifts like sqrt(K).
EPSILON = {"f32": 2.0**-24, "f16": 2.0**-11}


FULL_CHECK_FLOPS = 2 * 512**3
SAMPLES = 32  # random rows and columns checked in full on large problems
GUARD = 1024  # elements after each buffer, beyond one row of it
CANARY = 0xDEADBEEF  # bits of each guard element after C: a finite float no kernel computes


@dataclass(frozen=True)
class Verdict:
    ok: bool
    error: float  # largest |C - R| / sqrt(A**2 @ B**2) over the checked elements
    tolerance: float
    outside: int = 0  # guard elements after C that the kernel overwrote

    @property
    def reason(self) -> str:
        if self.outside:
            return f"wrote {self.outside} elements past the end of C"
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

    def guarded(self, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A and B with their NaN guards, and C's starting contents (NaN, then the canary):
        made once, every candidate uploads the same."""
        if getattr(self, "_guarded", (None,))[0] != limit:
            self._guarded = (limit, *guarded_inputs(self.A, self.B, self.problem, limit))
        return self._guarded[1:]

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


def _guarded(data: np.ndarray, guard: int, fill: float) -> np.ndarray:
    """`data` flattened, then `guard` elements of `fill`."""
    out = np.empty(data.size + guard, data.dtype)
    out[: data.size] = data.ravel()
    out[data.size :] = fill
    return out


def _guard_size(elements: int, row: int, itemsize: int, limit: int) -> int:
    """A row plus GUARD elements, a multiple of 4 (vec4 bindings), within the buffer limit."""
    guard = -(-(row + GUARD) // 4) * 4
    room = (limit // itemsize - elements) // 4 * 4
    return max(0, min(guard, room))


def guarded_inputs(A: np.ndarray, B: np.ndarray, problem: Problem, limit: int):
    """A and B flattened, each followed by NaN guards, and C: NaN then the canary (each
    within the buffer `limit`)."""
    M, N, K, size = problem.M, problem.N, problem.K, problem.itemsize
    C = np.full(M * N + _guard_size(M * N, N, size, limit), np.nan, problem.numpy_dtype)
    C[M * N :].view(np.uint32)[:] = CANARY
    return (
        _guarded(A, _guard_size(M * K, K, size, limit), math.nan),
        _guarded(B, _guard_size(K * N, N, size, limit), math.nan),
        C,
    )


def run_guarded(compiled: Compiled, gpu: Gpu, reference: Reference):
    """One dispatch with guarded buffers: (C, number of guard elements after C changed)."""
    problem = compiled.shader.problem
    limit = min(gpu.limits["max-storage-buffer-binding-size"], gpu.limits["max-buffer-size"])
    M, N = problem.M, problem.N
    bound = Bound.make(compiled, gpu, *reference.guarded(limit))
    try:
        bound.run()
        data = gpu.queue.read_buffer(bound.buffers["C"])
    finally:
        bound.release()
    out = np.frombuffer(data, dtype=problem.numpy_dtype)
    outside = int(np.count_nonzero(out[M * N :].view(np.uint32) != CANARY))
    return out[: M * N].reshape(M, N).copy(), outside


def verify(
    compiled: Compiled, gpu: Gpu, seed: int | None = None, reference: Reference | None = None
) -> Verdict:
    """Run the kernel once (C filled with NaN, guards after each buffer) and compare with
    float64 NumPy. Without a `reference`, on fresh random data made for this call.
    """
    reference = reference or Reference(compiled.shader.problem, seed)
    C, outside = run_guarded(compiled, gpu, reference)
    verdict = reference.check(C)
    if outside:
        return Verdict(False, verdict.error, verdict.tolerance, outside)
    return verdict
