"""Verification rejects every kind of broken result, and accepts correct f32 ones."""

import numpy as np
import pytest

from autotune.problem import Problem
from autotune.verify import FULL_CHECK_FLOPS, Reference, check_result, random_operands, tolerance

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


# --- the output format's own rounding, subnormals included ----------------------------

F16_K1 = [Problem(97, 251, 1, "f16"), Problem(200, 200, 1, "f16")]
F16_TINY = 2.0**-14  # f16's smallest normal: below it the spacing is 2**-24, fixed


def rounded_f16(problem, seed):
    """A, B and the correctly rounded f16 product: what a right kernel stores."""
    A, B = random_operands(problem, np.random.default_rng(seed))
    return A, B, (A.astype(np.float64) @ B.astype(np.float64)).astype(np.float16)


@pytest.mark.parametrize("problem", F16_K1, ids=str)
def test_correctly_rounded_f16_passes_with_subnormal_results(problem):
    """At K = 1 each element is one product, often tiny: f16 stores it with an absolute
    spacing (2**-24 among subnormals) that no relative allowance covers."""
    for seed in range(5):
        A, B, C = rounded_f16(problem, seed)
        want = A.astype(np.float64) @ B.astype(np.float64)
        assert np.any((want != 0) & (np.abs(want) < F16_TINY))  # the case is exercised
        verdict = check_result(C, A, B, problem)
        assert verdict.ok, f"seed {seed}: {verdict.reason}"


@pytest.mark.parametrize("off", [2, -2, "sign", "zero"])
def test_a_wrong_tiny_f16_value_fails(off):
    """The allowance is half a spacing of the output format, no more: the smallest
    nonzero element (a subnormal) two spacings off, negated or dropped (zero) is refused."""
    problem = F16_K1[0]
    A, B, C = rounded_f16(problem, 0)
    index = np.unravel_index(np.argmin(np.where(C != 0, np.abs(C), np.inf)), C.shape)
    assert 0 < abs(C[index]) < F16_TINY
    C = C.copy()
    tiny = C[index]
    spacing = np.spacing(np.abs(tiny))
    if off == "sign":
        C[index] = -tiny
    elif off == "zero":
        C[index] = 0
    else:
        C[index] = tiny + off * spacing
    assert C[index] != tiny
    assert not check_result(C, A, B, problem).ok, off


def test_f16_output_still_sees_a_dropped_product():
    problem = Problem(67, 45, 300, "f16")
    A, B = random_operands(problem, np.random.default_rng(0))
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    C = (A64 @ B64).astype(np.float16)
    assert check_result(C, A, B, problem).ok
    for k in (0, 150, 299):  # one product of each dot product left out
        dropped = (A64 @ B64 - np.outer(A64[:, k], B64[k])).astype(np.float16)
        assert not check_result(dropped, A, B, problem).ok, k


@pytest.mark.parametrize("problem", F16_K1, ids=str)
def test_default_f16_kernel_at_k_1_verifies_every_time(gpu, problem):
    """The default f16 kernel's output is NumPy's correctly rounded product, and it is
    accepted on every fresh set of data (it was refused at random)."""
    from autotune.kernel import check_features
    from autotune.lookup import default_kernel
    from autotune.verify import Reference, verify

    check_features(problem, gpu.features)
    kernel = default_kernel(problem, gpu, reference=Reference(problem, seed=0))
    for seed in range(1, 5):
        verdict = verify(kernel.compiled, gpu, seed=seed)
        assert verdict.ok, f"seed {seed}: {verdict.reason}"
    A, B, C = rounded_f16(problem, 9)
    np.testing.assert_array_equal(kernel(A, B), C)


def test_a_correctly_rounded_f16_result_passes_the_sampled_check():
    """The sampled check sums each element's rounding to f16 with the test vector's
    weights: its allowance must cover that sum (a root-sum-square of the roundings, the
    typical size, refused about one such result in two at 16 x 4096 x 4096)."""
    problem = Problem(16, 4096, 4096, "f16", "nt")
    for seed in range(4):
        reference = Reference(problem, seed=seed)
        assert not reference.full
        exact = reference.A.astype(np.float64) @ reference.B.astype(np.float64).T
        assert reference.check(exact.astype(np.float16)).ok


def test_one_wrong_element_outside_the_sampled_rows_and_columns_is_refused():
    """The allowance for f16 rounding in the sampled check must not grow with N so far
    that one element set to zero, in a row and a column no sample reads, passes."""
    problem = Problem(64, 4096, 4096, "f16", "nt")  # (at 16 rows every row is sampled)
    reference = Reference(problem, seed=0)
    exact = reference.A.astype(np.float64) @ reference.B.astype(np.float64).T
    C = exact.astype(np.float16)
    rows = np.setdiff1d(np.arange(64), reference.rows)
    cols = np.setdiff1d(np.arange(4096), reference.cols)
    block = np.abs(exact[np.ix_(rows, cols)])
    r, c = np.unravel_index(np.argmax(block), block.shape)
    C[rows[r], cols[c]] = 0
    assert not reference.check(C).ok


def _exact(reference: Reference) -> np.ndarray:
    """The right result of a sampled reference's problem, in its output type."""
    problem = reference.problem
    A64, B64 = reference._A64, reference._B64
    want, _ = reference._finish(A64 @ B64, np.ones(1), reference._C64)
    return want.astype(problem.numpy_dtype).reshape(problem.matrix_shapes()["C"])


def test_every_batch_item_of_a_large_problem_is_checked():
    """A batch item beyond the three checked row by row, left as zeros or computed from
    another item's A, is refused (Freivalds' test runs on every item)."""
    reference = Reference(Problem(256, 256, 256, batch=16, shared_b=True), seed=0)
    assert not reference.full and len(reference.items) < 16
    C = _exact(reference)
    assert reference.check(C).ok
    other = next(b for b in range(16) if b not in reference.items)
    for wrong in (0.0, C[0]):
        bad = C.copy()
        bad[other] = wrong
        assert not reference.check(bad).ok


@pytest.mark.parametrize("epilogue", ["bias,relu", "gelu"])
def test_a_wrong_tile_under_an_activation_is_refused(epilogue):
    """With an activation there is no Freivalds test: the rows and columns checked in full
    are spread over bands, so a wrong 64x64 tile anywhere meets one of them (drawn at
    random, some of the 256 tiles met none)."""
    reference = Reference(Problem(1024, 1024, 256, epilogue=epilogue), seed=0)
    assert not reference.full and not reference.xs
    C = _exact(reference)
    assert reference.check(C).ok
    for row in range(0, 1024, 64):
        for col in range(0, 1024, 64):
            bad = C.copy()
            bad[row : row + 64, col : col + 64] = 123.0
            assert not reference.check(bad).ok, (row, col)
