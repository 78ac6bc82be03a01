"""Verification rejects every kind of broken result, and accepts correct f32 ones."""

import numpy as np
import pytest

from autotune.problem import Problem
from autotune.verify import FULL_CHECK_FLOPS, check_result, random_operands, tolerance

SMALL = Problem(67, 45, 300)
LARGE = Problem(700, 600, 900)  # above FULL_CHECK_FLOPS: the sampled check
assert LARGE.flops > FULL_CHECK_FLOPS >= SMALL.flops


def correct(problem, seed=0):
    A, B = random_operands(problem, np.random.default_rng(seed))
    # float32 accumulation in a different order than the reference: a real kernel's error
    C = np.zeros((problem.M, problem.N), np.float32)
    for k in range(0, problem.K, 8):
        C += A[:, k : k + 8] @ B[k : k + 8]
    return A, B, C


BROKEN = {
    "nan everywhere": lambda C, A, B: np.full_like(C, np.nan),
    "zeros": lambda C, A, B: np.zeros_like(C),
    "one element unwritten": lambda C, A, B: _set(C, (-1, -1), np.nan),
    "one element off by 1e-3": lambda C, A, B: _set(C, (5, 7), C[5, 7] * 1.001 + 1e-3),
    "last k dropped": lambda C, A, B: C - np.outer(A[:, -1], B[-1]),
    "last row is another row": lambda C, A, B: _copy_row(C),
    "transposed operands": lambda C, A, B: (A[:, : B.shape[0]] @ B) * 0 + C[::-1],
    "an edge tile missing": lambda C, A, B: _set(C, (slice(-3, None), slice(-5, None)), 0.0),
}


def _set(C, where, value):
    C = C.copy()
    C[where] = value
    return C


def _copy_row(C):
    C = C.copy()
    C[-1] = C[0]
    return C


@pytest.mark.parametrize("problem", [SMALL, LARGE], ids=["full", "sampled"])
def test_correct_result_passes(problem):
    A, B, C = correct(problem)
    verdict = check_result(C, A, B, problem)
    assert verdict.ok, verdict.reason
    assert verdict.error < verdict.tolerance / 3  # with a margin, not by luck


@pytest.mark.parametrize("problem", [SMALL, LARGE], ids=["full", "sampled"])
@pytest.mark.parametrize("breakage", list(BROKEN))
def test_broken_results_fail(problem, breakage):
    A, B, C = correct(problem)
    verdict = check_result(BROKEN[breakage](C, A, B), A, B, problem)
    assert not verdict.ok, breakage


def test_tolerance_grows_with_k():
    assert tolerance(Problem(4, 4, 4096)) > tolerance(Problem(4, 4, 16)) > 0
