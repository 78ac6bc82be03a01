"""The public API as the README shows it: matmul, lookup, Kernel, and their errors."""

import numpy as np
import pytest

import autotune
from autotune.data import BUILT_IN
from autotune.problem import ProblemError


def test_readme_example(gpu, cache_dir):
    A = np.random.rand(1000, 999).astype(np.float32)
    B = np.random.rand(999, 17).astype(np.float32)
    C = autotune.matmul(A, B)
    reference = A.astype(np.float64) @ B.astype(np.float64)
    assert C.shape == (1000, 17) and C.dtype == np.float32
    assert np.linalg.norm(C - reference) / np.linalg.norm(reference) < 1e-5
    k = autotune.lookup(1000, 17, 999)
    assert k.source == "estimated"  # timed at the shape by the first call, then kept
    assert "@compute" in k.wgsl and k.config.template in BUILT_IN
    np.testing.assert_allclose(k(A, B), C, rtol=1e-6)


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 64, 64), (64, 1, 64), (64, 64, 1), (5, 3, 2)])
def test_matmul_tiny_and_degenerate(gpu, cache_dir, shape):
    M, N, K = shape
    rng = np.random.default_rng(0)
    A, B = rng.random((M, K), np.float32), rng.random((K, N), np.float32)
    np.testing.assert_allclose(autotune.matmul(A, B), A @ B, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shared_b", [False, True], ids=["B per item", "B shared"])
def test_a_batch_of_one_keeps_its_batch_dimension(gpu, cache_dir, shared_b):
    """As NumPy's matmul: A of 1 x M x K gives C of 1 x M x N, and C given as the addend
    has that shape too (the batch axis used to be dropped, and such a C refused)."""
    rng = np.random.default_rng(3)
    A = rng.uniform(-1, 1, (1, 7, 5)).astype(np.float32)
    B = rng.uniform(-1, 1, (5, 3) if shared_b else (1, 5, 3)).astype(np.float32)
    C = rng.uniform(-1, 1, (1, 7, 3)).astype(np.float32)
    got = autotune.matmul(A, B, C, beta=0.5)
    assert got.shape == (1, 7, 3)
    np.testing.assert_allclose(got, A @ B + 0.5 * C, rtol=1e-5, atol=1e-5)
    assert autotune.matmul(A, B).shape == (1, 7, 3)


def test_matmul_accepts_non_contiguous_views(gpu, cache_dir):
    rng = np.random.default_rng(1)
    A = rng.random((40, 30), np.float32).T  # 30 x 40, Fortran order
    B = rng.random((40, 20), np.float32)[:, ::2]
    np.testing.assert_allclose(autotune.matmul(A, B), A @ B, rtol=1e-5)


BAD_OPERANDS = [
    ("not 2-D", np.ones(4, np.float32), np.ones((4, 4), np.float32), "A must be 2-D"),
    ("3-D", np.ones((2, 2), np.float32), np.ones((2, 2, 2), np.float32), "B must be 2-D"),
    (
        "inner mismatch",
        np.ones((3, 4), np.float32),
        np.ones((5, 2), np.float32),
        "inner dimensions differ.*K=4.*K=5",
    ),
    ("float64", np.ones((2, 2)), np.ones((2, 2)), "float64.*supported: f32"),
    ("int32", np.ones((2, 2), np.int32), np.ones((2, 2), np.int32), "int32.*supported: f32"),
    ("mixed", np.ones((2, 2), np.float32), np.ones((2, 2), np.float16), "one dtype"),
    ("empty", np.ones((0, 2), np.float32), np.ones((2, 2), np.float32), "A must not be empty"),
    ("a list", [[1.0]], np.ones((1, 1), np.float32), "A must be a numpy.ndarray"),
]


@pytest.mark.parametrize("name, A, B, words", BAD_OPERANDS, ids=[b[0] for b in BAD_OPERANDS])
def test_matmul_bad_operands(gpu, name, A, B, words):
    with pytest.raises(ProblemError, match=words):
        autotune.matmul(A, B)


@pytest.mark.parametrize(
    "args, words",
    [
        ((0, 4, 4), "M must be >= 1, got 0"),
        ((4, -1, 4), "N must be >= 1, got -1"),
        ((4, 4, 2.5), "K must be an integer"),
        ((4, 4, 4, "f64"), "dtype 'f64' is not supported; supported: f32"),
    ],
)
def test_lookup_bad_arguments(gpu, args, words):
    with pytest.raises(ValueError, match=words):
        autotune.lookup(*args)


def test_problem_larger_than_the_device_is_refused_with_the_limit(gpu):
    limit = min(gpu.limits["max-storage-buffer-binding-size"], gpu.limits["max-buffer-size"])
    M = limit // 4 + 1
    with pytest.raises(ProblemError, match=rf"A \({M}x1 f32\) needs {4 * M} bytes.*{limit}"):
        autotune.lookup(M, 1, 1)


def test_kernel_refuses_another_shape(gpu, cache_dir):
    kernel = autotune.lookup(8, 8, 8)
    with pytest.raises(ProblemError, match="this kernel computes 8x8x8"):
        kernel(np.ones((8, 9), np.float32), np.ones((9, 8), np.float32))


@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        (dict(trials=0), "trials", "trials must be an integer >= 1, got 0"),
        (dict(trials=None, timeout=None), "trials", "give trials, timeout or both"),
        (dict(timeout=-1), "timeout", "timeout must be a number of seconds > 0"),
        (dict(templates=["nope"]), "template", "template 'nope' is unknown; known: blocked"),
        (dict(sampler="annealing"), "sampler", "sampler 'annealing' is unknown; known: tpe"),
        (dict(storage="nosuchdb://x"), "storage", "storage 'nosuchdb://x' cannot be opened"),
    ],
)
def test_tune_bad_arguments_name_the_field(kwargs, field, words):
    with pytest.raises(autotune.TuneError, match=words) as raised:
        autotune.tune(8, 8, 8, **kwargs)
    assert raised.value.field == field
