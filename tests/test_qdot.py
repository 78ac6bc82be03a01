"""int8 dot products: activations quantized per row with power-of-two scales (exact on any
device), q8 and 4-bit weights, `qdot`'s two passes verified against float64 of what they
claim, and the arguments that ask for it."""

import random

import numpy as np
import pytest

import autotune
from autotune.compile import compile_shader
from autotune.device import get_gpu
from autotune.kernel import Kernel
from autotune.key import Key
from autotune.problem import Problem, ProblemError
from autotune.quantize import quantize_activations
from autotune.render import render
from autotune.space import Config, load_space
from autotune.verify import Reference, verify


def test_activation_codes_and_scales_by_hand():
    x = np.array([[1.0, -0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0], [127.0, 1.0, -3.0, 0.5]])
    codes, scales = quantize_activations(x)
    # amax 1 = 0.5 * 2^1: scale 2^-6, codes x * 64; zeros: codes 0; amax 127 = 0.99 * 2^7:
    # scale 1, codes rint(x) (0.5 to even: 0)
    assert scales.tolist() == [2.0**-6, 2.0**-7, 1.0]
    assert codes.tolist() == [[64, -32, 16, 0], [0, 0, 0, 0], [127, 1, -3, 0]]
    assert codes.dtype == np.int8 and scales.dtype == np.float32


@pytest.mark.parametrize("seed", range(5))
def test_activation_codes_are_within_half_a_step(seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((7, 300)) * 10.0 ** rng.integers(-20, 20, (7, 1))).astype(np.float32)
    codes, scales = quantize_activations(x)
    step = scales[:, None].astype(np.float64)
    error = np.abs(x - codes * step)
    # half a step, but a value above 127.5 steps is clamped to 127: one step at most
    assert np.all(error <= step * np.where(np.abs(x) > 127.5 * step, 1.0, 0.5))
    assert np.all(np.abs(codes) <= 127)
    amax = np.max(np.abs(x), axis=1)
    assert np.all((amax / scales >= 64) & (amax / scales < 128))  # the int8 range used


def test_activations_q8_is_part_of_the_problem_and_the_key():
    problem = Problem(3, 64, 256, "f32", "nt", weights="q8", activations="q8")
    assert problem.dtype_text == "f32.q8.a8" and not problem.plain
    config = load_space("qdot").seed_configs(problem)[0]
    key = Key.of(problem, config, checks=False)
    assert ".q8.a8:" in str(key) and Key.parse(str(key)) == key
    assert Problem(3, 64, 256, weights="q4g32z", layout="nt", activations="q8").dtype_text == (
        "f32.q4g32z.a8"
    )
    for bad, field in (
        (dict(weights="none", activations="q8"), "activations"),
        (dict(weights="q8", activations="q4"), "activations"),
        (dict(weights="q8", activations=None), "activations"),
    ):
        with pytest.raises(ProblemError) as error:
            Problem(3, 64, 256, "f32", "nt", **bad)
        assert error.value.field == field


def test_only_qdot_computes_quantized_activations():
    gpu = get_gpu()
    ours = Problem(3, 64, 256, "f32", "nt", weights="q8", activations="q8")
    weights_only = Problem(3, 64, 256, "f32", "nt", weights="q8")
    for template in ("blockedx", "gemv", "splitk", "qgemv"):
        assert load_space(template).first_config(ours, gpu.limits) is None
    assert load_space("qdot").first_config(weights_only, gpu.limits) is None
    assert load_space("qdot").first_config(ours, gpu.limits) is not None


SHAPES = [  # M, N, K, weights, dtype, epilogue, batch: edges everywhere, K past a word
    (1, 64, 256, "q8", "f32", "none", 1),
    (37, 70, 202, "q8", "f32", "bias,gelu", 1),
    (5, 33, 102, "q8", "f32", "alpha,beta", 2),
    (20, 40, 96, "q8", "f16", "relu", 1),
    (37, 70, 200, "q4g32z", "f32", "bias,gelu", 1),
    (5, 33, 130, "q4g64z", "f32", "alpha,beta", 2),
    (64, 72, 300, "q4g128", "f32", "none", 1),
    (20, 40, 96, "q4g32", "f16", "relu", 1),
    (40, 37, 595, "q4g32z", "f32", "none", 1),  # three words of zero points a row
]


DECODE_SHAPES = [  # qdotv's: M <= 32
    (1, 64, 4096, "q8", "f32", "none", 2),
    (3, 50, 100, "q8", "f32", "bias", 1),
    (7, 70, 200, "q4g32z", "f32", "bias,gelu", 1),
    (16, 72, 300, "q4g128", "f32", "alpha,beta", 1),
    (9, 40, 96, "q4g32", "f16", "relu", 1),
    (5, 37, 595, "q4g32z", "f32", "none", 1),  # three words of zero points a row
    (32, 45, 640, "q4g128", "f32", "bias", 1),
    (23, 40, 256, "q8", "f16", "none", 1),
]


@pytest.mark.parametrize(
    "template, shape",
    [("qdot", s) for s in SHAPES] + [("qdotv", s) for s in DECODE_SHAPES],
    ids=lambda s: "-".join(map(str, s[:6])) if isinstance(s, tuple) else s,
)
def test_int8_configs_verify(template, shape):
    M, N, K, weights, dtype, epilogue, batch = shape
    gpu = get_gpu()
    if dtype == "f16" and "shader-f16" not in gpu.features:
        pytest.skip("the adapter lacks shader-f16")
    problem = Problem(M, N, K, dtype, "nt", batch, batch > 1, epilogue, weights=weights,
                      activations="q8")  # fmt: skip
    space = load_space(template)
    configs = space.configs(problem, gpu.limits)
    picked = space.seed_configs(problem, gpu.limits) + random.Random(K).sample(configs, 2)
    reference = Reference(problem, seed=1)
    for config in picked:
        compiled = compile_shader(render(config, problem), gpu, checks=True)
        verdict = verify(compiled, gpu, reference=reference)
        assert verdict.ok, f"{config}: {verdict.reason}"


def _faulty(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


@pytest.mark.parametrize(
    "template, weights, old, new",
    [
        ("qdotv", "q4g32", "- z * xsum", "- 0 * xsum"),  # the zero point's share kept
        ("qdotv", "q4g32", "(xe{{ j }}_{{ m }}, lo)", "(xo{{ j }}_{{ m }}, lo)"),  # x' order
        # every batch item with item 0's scales
        ("qdotv", "q8", '"xs[z * M + i]" if QS', '"xs[i]" if QS'),
        ("qdotv", "q8", '"xs[z * M + i]" if QS', '"xs[z * M]" if QS'),  # row 0's
    ] + [("qdot", *case) for case in [
        ("q8", "let e = frexp(", "let e = 1 + frexp("),  # the activations' scale off by 2
        ("q8", "put(z, row0", "put(0u, row0"),  # every batch item reads item 0's scales
        ("q8", "* scale_at(n)", "* scale_at(0u)"),  # the weight's first row scale everywhere
        ("q8", "-127.0, 127.0", "-127.0, 126.0"),  # a clamp one code short
        ("q4g32z", "u + g);", "u + 0u);"),  # every group with the first group's scale
        ("q4g32z", "let zero = i32(", "let zero = 8i + 0 * i32("),  # zero points ignored
        ("q4g32", "lo.x, hi.x, lo.y, hi.y", "lo.x, lo.x, lo.y, hi.y"),  # a nibble dropped
    ]],
    ids=["v-zero-point", "v-order", "v-batch-scale", "v-row-scale", "activation-scale",
         "batch-scale", "weight-scale", "clamp", "group-scale", "zero-points", "nibble"],
)  # fmt: skip
def test_verification_refuses_a_wrong_int8_kernel(
    tmp_path, monkeypatch, template, weights, old, new
):
    # qdotv's faults are in the kernel of two passes (QS = 1); qdot's, its last seed's
    params = SPLIT_QUANTIZE | {"QS": 1} if template == "qdotv" else None
    assert _refused(tmp_path, monkeypatch, template, (old, new), weights, K=256, params=params)


@pytest.mark.parametrize(
    ("template", "old", "new"),
    [
        ("qdot", "zeros[n * {{ ZW }}u + g / 8u]", "zeros[n + g / 8u]"),
        ("qdotv", "zeros[n{{ c }} * {{ ZW }}u + g / 8u]", "zeros[n{{ c }} + g / 8u]"),
    ],
)
def test_verification_refuses_a_wrong_row_of_zero_points(tmp_path, monkeypatch, template, old, new):
    """K = 595 in groups of 32: three words of zero points a row, so each row's start
    matters (at K <= 256 every row has one word)."""
    assert _refused(tmp_path, monkeypatch, template, (old, new), "q4g32z", K=595)


SPLIT_QUANTIZE = dict(
    SG=0, WG=64, TK=8, NC=2, U=1, QWG=64, AV=1
)  # qdotv's, quantize pass's QS to add


@pytest.mark.parametrize(
    "problem, QS",
    [
        (Problem(1, 37, 4096, "f32", "nt", weights="q4g128", activations="q8"), 4),
        (Problem(1, 37, 4096, "f32", "nt", weights="q4g128", activations="q8"), 16),
        (Problem(3, 45, 1990, "f32", "nt", weights="q8", activations="q8"), 4),  # a short share
        (Problem(5, 40, 2050, "f32", "nt", weights="q4g32z", activations="q8"), 4),
        (Problem(2, 40, 1024, "f32", "nt", 3, True, "bias,relu", weights="q4g64",
                 activations="q8"), 4),
    ],
    ids=str,
)  # fmt: skip
def test_a_quantize_pass_split_across_workgroups_verifies(problem, QS):
    gpu = get_gpu()
    config = Config.make("qdotv", SPLIT_QUANTIZE | {"QS": QS})
    assert load_space("qdotv").why_invalid(config, problem, gpu.limits) is None
    compiled = compile_shader(render(config, problem), gpu, checks=True)
    verdict = verify(compiled, gpu, reference=Reference(problem, seed=2))
    assert verdict.ok, verdict.reason


@pytest.mark.parametrize(
    "problem, QS",
    [
        (Problem(1, 37, 4096, "f32", "nt", weights="q4g128", activations="q8"), 4),
        (Problem(3, 45, 1992, "f32", "nt", weights="q8", activations="q8"), 4),  # a short share
        (Problem(5, 40, 2052, "f32", "nt", weights="q4g32z", activations="q8"), 1),  # K padded
        (Problem(2, 40, 1100, "f16", "nt", 3, True, "bias,relu", weights="q4g64",
                 activations="q8"), 4),  # K padded to 1152: vectors past K are 0
        (Problem(4, 36, 300, "f32", "nt", 2, True, weights="q8", activations="q8"), 1),
    ],
    ids=str,
)  # fmt: skip
def test_a_quantize_pass_reading_vectors_verifies(problem, QS):
    """AV = 4: the quantize pass reads A as vec4 (both weight orders of x', padded K)."""
    gpu = get_gpu()
    config = Config.make("qdotv", SPLIT_QUANTIZE | {"QS": QS, "AV": 4})
    assert load_space("qdotv").why_invalid(config, problem, gpu.limits) is None
    compiled = compile_shader(render(config, problem), gpu, checks=True)
    verdict = verify(compiled, gpu, reference=Reference(problem, seed=2))
    assert verdict.ok, verdict.reason


def test_vectors_of_a_need_k_a_multiple_of_4():
    config = Config.make("qdotv", SPLIT_QUANTIZE | {"QS": 1, "AV": 4})
    problem = Problem(3, 45, 1990, "f32", "nt", weights="q8", activations="q8")
    assert load_space("qdotv").why_invalid(config, problem).startswith("a_vectors")


@pytest.mark.parametrize(
    "old, new, QS",
    [
        # even and odd codes swapped; the second vector of a word's eight codes not read
        (
            "vec4<f32>(v0.y, v0.w, v1.y, v1.w), w % 2u == 1u",
            "vec4<f32>(v0.y, v0.w, v1.y, v1.w), w % 2u == 0u",
            4,
        ),
        ("let v1 = a4(base / 4u, w / 2u * 2u + 1u);", "let v1 = a4(base / 4u, w / 2u * 2u);", 1),
    ],
    ids=["even-odd", "one-vector"],
)  # fmt: skip
def test_verification_refuses_a_wrong_vector_quantize_pass(tmp_path, monkeypatch, old, new, QS):
    params = SPLIT_QUANTIZE | {"QS": QS, "AV": 4}
    assert _refused(tmp_path, monkeypatch, "qdotv", (old, new), "q4g128", K=1024, params=params)


@pytest.mark.parametrize(
    "old, new",
    [
        ("min(w0 + {{ WS }}u, XW)", "min(w0 + {{ WS }}u - 1u, XW)"),  # a word of each share left
        ('else "row" }} * XW + w]', 'else "row" }} * XW + w - w0]'),  # shares on one another
    ],
    ids=["word-left", "overlapping-shares"],
)
def test_verification_refuses_a_wrong_split_quantize_pass(tmp_path, monkeypatch, old, new):
    params = SPLIT_QUANTIZE | {"QS": 4}
    assert _refused(tmp_path, monkeypatch, "qdotv", (old, new), "q4g128", K=1024, params=params)


def _refused(tmp_path, monkeypatch, template, fault, weights, K, params=None) -> bool:
    """Whether verification refuses `template` (its last seed, or `params`) with its line
    fault[0] written as fault[1]."""
    from autotune.data import data_path

    old, new = fault

    folder = data_path("templates")
    # the fault is in the template or in the quantization it includes: both copied, the
    # copy including the copy
    include, copy = "_quantize_activations.wgsl.j2", "_quantize_bad.wgsl.j2"
    own = (folder / f"{template}.wgsl.j2").read_text().replace(include, copy)
    included = (folder / include).read_text()
    assert (own + included).count(old) == 1, old
    if old in own:
        own = _faulty(own, old, new)
    else:
        included = _faulty(included, old, new)
    (tmp_path / "qdotbad.wgsl.j2").write_text(own)
    (tmp_path / copy).write_text(included)
    space = (data_path("search_spaces") / f"{template}.toml").read_text()
    (tmp_path / "qdotbad.toml").write_text(space)
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    gpu = get_gpu()
    # the amax of each row is 127.x steps only with outliers: a clamp of 126 shows there
    problem = Problem(4, 40, K, "f32", "nt", 2, True, weights=weights, activations="q8")
    reference = Reference(problem, seed=3)
    if params:
        config = Config.make("qdotbad", params)
    else:
        config = load_space("qdotbad").seed_configs(problem, gpu.limits)[-1]
    compiled = compile_shader(render(config, problem), gpu, checks=True)
    return not verify(compiled, gpu, reference=reference).ok


def test_matmul_with_int8_activations_matches_numpy():
    rng = np.random.default_rng(0)
    W = rng.standard_normal((96, 200)).astype(np.float32)
    x = rng.standard_normal((40, 200)).astype(np.float32)
    qw = autotune.quantize(W, bits=8)
    got = autotune.matmul(x, qw, activations="q8", checks=False, estimate=False)
    codes, scales = quantize_activations(x)
    claimed = (codes * scales[:, None].astype(np.float64)) @ qw.dequantize().T.astype(np.float64)
    assert np.allclose(got, claimed, rtol=1e-5, atol=1e-5 * np.abs(claimed).max())
    q4 = autotune.quantize(W, bits=4, group=32, zero_points=True)
    got = autotune.matmul(x, q4, activations="q8", checks=False, estimate=False)
    claimed = (codes * scales[:, None].astype(np.float64)) @ q4.dequantize().T.astype(np.float64)
    assert np.allclose(got, claimed, rtol=1e-5, atol=1e-5 * np.abs(claimed).max())
    with pytest.raises(ProblemError) as error:
        autotune.matmul(x, W, trans_b=True, activations="q8")
    assert error.value.field == "activations"


ONE_PASS = dict(SG=0, WG=64, TK=8, NC=2, U=1, QWG=64, QS=0)  # qdotv's; AV to add


@pytest.mark.parametrize(
    "problem, AV",
    [
        (Problem(1, 37, 4096, "f32", "nt", weights="q4g128", activations="q8"), 4),
        (Problem(3, 45, 1990, "f32", "nt", weights="q8", activations="q8"), 1),  # scalar A
        (Problem(5, 40, 2052, "f32", "nt", weights="q4g32z", activations="q8"), 4),  # K padded
        (Problem(2, 40, 1100, "f16", "nt", 3, True, "bias,relu", weights="q4g64",
                 activations="q8"), 4),  # a batch: each item's rows in its own workgroups
        (Problem(16, 36, 300, "f32", "nt", weights="q8", activations="q8"), 1),
    ],
    ids=str,
)  # fmt: skip
def test_one_pass_quantizing_in_each_workgroup_verifies(problem, AV):
    """QS = 0: no quantize pass and no workspaces; each workgroup quantizes the rows it
    reads into workgroup memory, then multiplies."""
    gpu = get_gpu()
    if problem.dtype == "f16" and "shader-f16" not in gpu.features:
        pytest.skip("the adapter has no shader-f16")
    config = Config.make("qdotv", ONE_PASS | {"AV": AV})
    assert load_space("qdotv").why_invalid(config, problem, gpu.limits) is None
    shader = render(config, problem)
    assert [p.entry_point for p in shader.plan.passes] == ["gemv"] and not shader.plan.workspaces
    verdict = verify(
        compile_shader(shader, gpu, checks=True), gpu, reference=Reference(problem, seed=2)
    )
    assert verdict.ok, verdict.reason


def test_one_pass_computes_the_same_bits_as_two():
    """The codes and scales each workgroup makes are the quantize pass's: C is the same
    to the bit, at a batch of two with rows of different magnitudes."""
    gpu = get_gpu()
    problem = Problem(3, 45, 1024, "f32", "nt", 2, True, weights="q4g128", activations="q8")
    rng = np.random.default_rng(5)
    scales = np.array([1, 30, 1e-3], np.float32)[:, None]  # rows of different magnitudes
    x = rng.standard_normal((2, 3, 1024)).astype(np.float32) * scales
    W = rng.standard_normal((45, 1024)).astype(np.float32)
    qw = autotune.quantize(W, bits=4, group=128)
    one, two = ({**ONE_PASS, "AV": 4, "QS": qs} for qs in (0, 1))
    kernels = [Kernel(problem, Config.make("qdotv", p), "default", gpu=gpu) for p in (one, two)]
    got = [kernel(x, qw) for kernel in kernels]
    assert np.array_equal(got[0], got[1]) and np.isfinite(got[0]).all()


@pytest.mark.parametrize(
    "old, new",
    [
        ("xs[{{ r }}] = ldexp", "xs[0] = ldexp"),  # every row with row 0's scale
        ("xq[{{ r * XW }}u + w] = pack4xI8(q)", "xq[w] = pack4xI8(q)"),  # rows on one another
    ],
    ids=["one-scale", "one-row"],
)
def test_verification_refuses_a_wrong_one_pass_quantization(tmp_path, monkeypatch, old, new):
    params = ONE_PASS | {"AV": 4}
    assert _refused(tmp_path, monkeypatch, "qdotv", (old, new), "q4g128", K=1024, params=params)


def test_one_pass_rows_wait_for_the_last_row_s_peak_to_be_read():
    """Each row after the first reuses `peak`: a barrier stands before its first write,
    else a fast invocation's new maximum could replace the last row's before a slow one
    read it (lavapipe's lockstep hides such a race, so the text is checked)."""
    problem = Problem(3, 45, 1024, "f32", "nt", weights="q8", activations="q8")
    wgsl = render(Config.make("qdotv", ONE_PASS | {"AV": 4}), problem).wgsl
    for r in (1, 2):  # between row r - 1's scale and row r's first write of peak
        start = wgsl.index(f"xs[{r - 1}] = ldexp")
        end = wgsl.index("peak[lid] = m;", start)
        assert "workgroupBarrier();" in wgsl[start:end], r


def test_one_pass_keeps_x_in_workgroup_memory_within_the_limit():
    """x' of every row lives in workgroup memory: a long row of many rows is refused by the
    device's limit, named, where two passes are valid."""
    problem = Problem(16, 64, 16384, "f32", "nt", weights="q8", activations="q8")
    limits = {"max-compute-workgroup-storage-size": 32768}
    space = load_space("qdotv")
    reason = space.why_invalid(Config.make("qdotv", ONE_PASS | {"AV": 4}), problem, limits)
    assert reason and "max-compute-workgroup-storage-size" in reason
    two = Config.make("qdotv", ONE_PASS | {"AV": 4, "QS": 1})
    assert space.why_invalid(two, problem, limits) is None
