"""Problems beyond the device's limits are refused with the limit named, before any
allocation; they are not split. Limits are lavapipe's real ones (128 MiB per binding,
65535 workgroups per dimension)."""

import time

import numpy as np
import pytest

import autotune
from autotune.__main__ import main
from autotune.problem import ProblemError

# The most columns one workgroup covers at 1 x N x 1 with N odd (so scalars): gemv's 64
# column groups of 8 columns (blocked's BN is 256).
WIDEST_COLUMNS = 512


def wide(gpu) -> int:
    """An N for which every template's widest tile needs more workgroups than allowed."""
    return WIDEST_COLUMNS * gpu.limits["max-compute-workgroups-per-dimension"] + 1


def test_too_many_workgroups_is_refused_naming_the_limit(gpu, cache_dir):
    N = wide(gpu)
    assert 4 * N < gpu.limits["max-storage-buffer-binding-size"]  # the buffers would fit
    words = "max-compute-workgroups-per-dimension = 65535"
    with pytest.raises(ProblemError, match=words):
        autotune.lookup(1, N, 1)
    with pytest.raises(ProblemError, match=words):
        autotune.tune(1, N, 1, trials=1, cache_dir=cache_dir)
    assert not list(cache_dir.glob("*.json"))  # refused before anything was written


def test_too_many_workgroups_on_the_command_line(gpu, capsys, cache_dir):
    assert main(["tune", "--shape", f"1x{wide(gpu)}x1", "--trials", "1"]) == 2
    err = capsys.readouterr().err
    assert "argument --shape:" in err and "max-compute-workgroups-per-dimension" in err


@pytest.mark.parametrize(
    "shape, matrix",
    [((100_000, 100_000, 1), "C"), ((70_000, 1, 1_000), "A"), ((1, 70_000, 1_000), "B")],
)
def test_buffer_beyond_the_device_is_refused_before_any_allocation(gpu, shape, matrix):
    limit = min(gpu.limits["max-storage-buffer-binding-size"], gpu.limits["max-buffer-size"])
    started = time.monotonic()
    with pytest.raises(
        ProblemError, match=rf"^{matrix} \(.*max-storage-buffer-binding-size = {limit}"
    ):
        autotune.lookup(*shape)
    M, N, K = shape
    with pytest.raises(ProblemError, match=rf"^{matrix} \("):  # 40 GB of C never allocated
        autotune.matmul(np.ones((M, K), np.float32), np.ones((K, N), np.float32))
    assert time.monotonic() - started < 10


def test_problem_whose_default_tile_is_too_small_gets_a_valid_verified_kernel(gpu, cache_dir):
    # 16x16 tiles (the seeds) need 65536 workgroups here; wider configs fit
    N = 16 * gpu.limits["max-compute-workgroups-per-dimension"] + 1
    kernel = autotune.lookup(1, N, 1)
    assert kernel.source == "default"  # no known-good config fits: a valid one of a space
    assert max(max(p.grid) for p in kernel.shader.plan.passes) <= 65535
    rng = np.random.default_rng(0)
    A, B = rng.random((1, 1), np.float32), rng.random((1, N), np.float32)
    np.testing.assert_allclose(kernel(A, B), A @ B, rtol=1e-6)
