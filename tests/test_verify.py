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


# --- broken kernels planted on the GPU (tests/faulty), each rejected ------------------

PLANTED = {
    "correct": (0, ""),
    "writes nothing": (3, "relative error inf"),
    "writes outside its tile": (7, "past the end of C"),
    "reads uninitialised memory": (8, "relative error inf"),
    "right only on zeros": (9, "relative error"),
    "right only on non-negative inputs": (10, "relative error"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("checks", [True, False], ids=["checks", "nochecks"])
@pytest.mark.parametrize("planted", list(PLANTED))
def test_planted_broken_kernels_are_rejected(gpu, faulty_templates, planted, checks):
    from autotune.compile import compile_shader
    from autotune.render import render
    from autotune.space import Config
    from autotune.verify import verify

    mode, words = PLANTED[planted]
    problem = Problem(20, 20, 16)  # the last 8x8 tile row sticks out of C
    config = Config.make("faulty", {"MODE": mode})
    verdict = verify(compile_shader(render(config, problem), gpu, checks=checks), gpu)
    assert verdict.ok == (mode == 0), verdict.reason
    assert words in verdict.reason


@pytest.mark.gpu
def test_planted_kernels_look_right_where_a_weak_check_would_look(gpu, faulty_templates):
    """Each planted fault is real and subtle: on the inputs a weaker check would use
    (zeros, non-negative data, a zeroed C, C's own elements only) it gives the right C."""
    from autotune.compile import compile_shader
    from autotune.kernel import dispatch
    from autotune.render import render
    from autotune.space import Config

    problem = Problem(20, 20, 16)

    def run(mode, A, B, fill=np.nan):
        config = Config.make("faulty", {"MODE": mode})
        return dispatch(compile_shader(render(config, problem), gpu), gpu, A, B, fill=fill)

    rng = np.random.default_rng(0)
    A, B = rng.uniform(0, 1, (20, 16)).astype(np.float32), rng.uniform(0, 1, (16, 20))
    B = B.astype(np.float32)
    zeros = np.zeros_like(A), np.zeros_like(B)
    np.testing.assert_array_equal(run(9, *zeros), 0.0)
    np.testing.assert_allclose(run(10, A, B), A @ B, rtol=1e-5)
    np.testing.assert_allclose(run(8, A, B, fill=0.0), A @ B, rtol=1e-5)
    np.testing.assert_allclose(run(7, A, B), A @ B, rtol=1e-5)  # wrong only outside C
