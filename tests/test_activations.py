"""Activations at NaN and infinity: each kernel gives what NumPy gives, element for element.

relu is np.maximum(x, 0), which keeps NaN; gelu is the tanh formula in float64
(autotune.verify.gelu), with gelu(+inf) = +inf, gelu(-inf) = 0 and NaN kept. The
pre-activation is made NaN, +inf and -inf through A (an infinite or NaN input in one
product) and through the bias, at both vector widths of the epilogue (VEC 1 and 4).
"""

import numpy as np
import pytest

import autotune
from autotune.kernel import Kernel, check_features
from autotune.problem import Problem
from autotune.space import load_space
from autotune.verify import gelu

M, N, K = 13, 12, 8
NUMPY = {"relu": lambda x: np.maximum(x, 0.0), "gelu": gelu}


def test_reference_gelu_at_nan_and_infinity():
    x = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, -8.0, 0.0, 1.0])
    got = gelu(x)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 0.0
    assert got[3] == 1e30 and got[4] == 0.0 and got[5] == 0.0 and got[6] == 0.0
    assert got[7] == pytest.approx(0.8411920, rel=1e-6)
    assert np.isnan(NUMPY["relu"](x)[0]) and NUMPY["relu"](x)[2] == 0.0


def operands(dtype: str):
    """A, B and a bias whose products and sums give NaN, +-inf and large finite values."""
    big = 1e30 if dtype == "f32" else 6e4
    rng = np.random.default_rng(0)
    A = rng.uniform(-1, 1, (M, K))
    A[0, 2], A[1, 2], A[2, 2], A[3, 2] = np.nan, np.inf, -np.inf, big
    A[4, 1], A[4, 3] = np.inf, -np.inf  # +inf and -inf in one sum: NaN
    B = rng.uniform(0.25, 1, (K, N)) * np.where(np.arange(N) % 2, -1, 1)  # no zero: no inf * 0
    bias = rng.uniform(-1, 1, N)
    bias[:4] = np.nan, np.inf, -np.inf, -big
    return [x.astype(np.float32 if dtype == "f32" else np.float16) for x in (A, B, bias)]


def expected(A, B, bias, activation):
    with np.errstate(invalid="ignore", over="ignore"):
        pre = A.astype(np.float64) @ B.astype(np.float64) + bias.astype(np.float64)
    return NUMPY[activation](pre)


def assert_matches_numpy(got, want):
    with np.errstate(over="ignore"):
        want = want.astype(got.dtype)  # what the output format can hold
    for kind, test in (("NaN", np.isnan), ("infinity", np.isinf)):
        wrong = (test(got) != test(want)) | (test(want) & (got != want) & ~np.isnan(want))
        where = np.argwhere(wrong).tolist()
        assert not where, f"{kind} differs at {where}: got {got[wrong]}, NumPy {want[wrong]}"
    tol = 1e-5 if got.dtype == np.float32 else 2e-3
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)


def configs(problem):
    """A blockedx config of each vector width the problem allows (1 and 4)."""
    space = load_space("blockedx")
    found = {}
    for config in space.seed_configs(problem) + space.configs(problem):
        found.setdefault(config["VEC"], config)
    assert 1 in found and 4 in found, found
    return [found[1], found[4]]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_activation_keeps_nan_and_infinity_like_numpy(gpu, dtype, activation):
    problem = Problem(M, N, K, dtype, "nn", 1, False, f"bias,{activation}")
    check_features(problem, gpu.features)
    A, B, bias = operands(dtype)
    want = expected(A, B, bias, activation)
    assert np.isnan(want).any() and np.isinf(want).any()  # the cases are exercised
    for config in configs(problem):
        got = Kernel(problem, config, "default", gpu=gpu)(A, B, bias=bias)
        assert_matches_numpy(got, want)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_matmul_activation_keeps_nan(gpu, activation):
    """Through the public API: NaN in A and in the bias is NaN in C, not 0."""
    A, B, bias = operands("f32")
    got = autotune.matmul(A, B, bias=bias, activation=activation)
    want = expected(A, B, bias, activation)
    assert np.isnan(got[0]).all() and np.isnan(got[:, 0]).all()
    assert_matches_numpy(got, want)
