"""The GEMM family for quantized weights at any M (`qgemm`): the weight dequantized while
it is staged in workgroup memory, checked against the dequantized weight on odd shapes,
for every format, f16, the epilogue and a batch sharing one weight; what lookup and
matmul serve past the decode families' rows."""

import numpy as np
import pytest

import autotune
from autotune.compile import compile_shader
from autotune.problem import Problem
from autotune.render import render
from autotune.space import load_space
from autotune.verify import Reference, verify

FORMATS = ["q8", "q4g32", "q4g128z", "q4g64"]


def check(gpu, problem: Problem, configs) -> None:
    """Each of `configs` is valid at `problem` and computes it right (one set of data)."""
    space, reference = load_space("qgemm"), Reference(problem)
    assert configs, f"no config at {problem}"
    for config in configs:
        assert space.why_invalid(config, problem, gpu.limits) is None, f"{config} at {problem}"
        verdict = verify(compile_shader(render(config, problem), gpu), gpu, reference=reference)
        assert verdict.ok, f"{config} at {problem}: {verdict.reason}"


@pytest.mark.parametrize("weights", FORMATS)
def test_every_seed_verifies_where_tiles_cut_m_n_and_k(gpu, weights):
    # 70 x 66 x 200: every seed is valid, and each cuts a ragged edge in M, N and K.
    problem = Problem(70, 66, 200, "f32", "nt", weights=weights)
    seeds = load_space("qgemm").seed_configs(problem, gpu.limits)
    assert len(seeds) == len(load_space("qgemm").seeds)
    check(gpu, problem, seeds)


# One row; K not a multiple of 4 with bias and GELU; f16 with alpha, beta and ReLU; a
# batch of two sharing the weight: each format once, with the seeds valid there.
ODD = [
    Problem(1, 33, 100, "f32", "nt", weights="q4g32"),
    Problem(100, 50, 130, "f32", "nt", epilogue="bias,gelu", weights="q4g64"),
    Problem(37, 70, 200, "f16", "nt", epilogue="alpha,beta,relu", weights="q4g128z"),
    Problem(20, 36, 64, "f32", "nt", 2, True, "bias", weights="q8"),
    # 19 groups a row: three words of zero points per row (their row stride)
    Problem(40, 37, 595, "f32", "nt", weights="q4g32z"),
]


@pytest.mark.parametrize("problem", ODD, ids=str)
def test_seeds_verify_at_odd_shapes_and_variants(gpu, problem):
    if problem.dtype == "f16" and "shader-f16" not in gpu.features:
        pytest.skip("the adapter has no shader-f16")
    check(gpu, problem, load_space("qgemm").seed_configs(problem, gpu.limits))


@pytest.mark.parametrize(
    "problem",
    [
        Problem(64, 64, 256, "f32", "nt", weights="q4g32z"),
        Problem(37, 70, 200, "f32", "nt", epilogue="alpha,bias", weights="q8"),
    ],
    ids=str,
)
def test_a_random_sample_of_configs_verifies(gpu, problem):
    configs = load_space("qgemm").configs(problem, gpu.limits)
    picked = np.random.default_rng(7).choice(len(configs), 3, replace=False)
    check(gpu, problem, [configs[i] for i in picked])


def test_the_space_at_a_prefill_shape_is_a_few_hundred_configs_with_its_seeds():
    space = load_space("qgemm")
    problem = Problem(2048, 4096, 4096, "f32", "nt", weights="q4g128")
    configs = space.configs(problem)
    assert 50 <= len(configs) <= 300
    assert len(space.seed_configs(problem)) == len(space.seeds)


def test_it_computes_only_quantized_weights_accumulating_in_f32():
    space = load_space("qgemm")
    assert space.configs(Problem(64, 64, 64, "f32", "nt")) == []
    pinned = Problem(64, 64, 64, "f16", "nt", accumulate="f16", weights="q8")
    assert space.configs(pinned) == []
    assert space.configs(Problem(64, 64, 64, "f16", "nt", accumulate="f32", weights="q8"))


def test_lookup_and_matmul_serve_it_above_decode_sizes(gpu, cache_dir):
    rng = np.random.default_rng(3)
    W = rng.standard_normal((70, 200)).astype(np.float32)
    x = rng.standard_normal((40, 200)).astype(np.float32)
    qw = autotune.quantize(W, bits=4, group=32)
    kernel = autotune.lookup(40, 70, 200, layout="nt", weights="q4g32", estimate=False)
    assert kernel.config.template in ("qgemm", "qsplitk")  # a tile grid, not a decode kernel
    want = x.astype(np.float64) @ qw.dequantize().T.astype(np.float64)
    scale = np.sqrt((x.astype(np.float64) ** 2) @ (qw.dequantize().T.astype(np.float64) ** 2))
    got = autotune.matmul(x, qw)
    assert got.shape == (40, 70)
    assert np.all(np.abs(got - want) <= 1e-5 * scale)
