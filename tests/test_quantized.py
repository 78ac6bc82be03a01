"""Quantized weights end to end: the problem and its key, verification against the
dequantized weight (planted faulty decoders refused), matmul(x, qw) with every variant,
kernel.encode on the caller's buffers, the CLI's --weights, and a tune served exactly."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import autotune
from autotune.arguments import ArgumentError
from autotune.key import Key
from autotune.plan import storage_bytes
from autotune.problem import Problem, ProblemError
from autotune.quantize import parse_format
from autotune.space import Config
from autotune.verify import GELU_SLOPE, output_rounding, tolerance

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ["q8", "q4g32", "q4g64", "q4g128", "q4g32z", "q4g64z", "q4g128z"]

# --- the problem and its key ----------------------------------------------------------


@pytest.mark.parametrize("weights", FORMATS)
def test_every_format_makes_a_problem(weights):
    problem = Problem(4, 40, 100, layout="nt", weights=weights)
    assert problem.quantized and problem.weights == weights
    assert problem.dtype_text == f"f32.{weights}"


@pytest.mark.parametrize("weights", ["q5", "q4g16", "q8z", "q4", "Q8", "q4g128 ", 3, None, 8.0])
def test_a_bad_format_is_refused_naming_weights(weights):
    with pytest.raises(ProblemError) as error:
        Problem(4, 40, 100, layout="nt", weights=weights)
    assert error.value.field == "weights"
    assert "weights" in str(error.value)


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
def test_quantized_weights_need_layout_nt(layout):
    with pytest.raises(ProblemError) as error:
        Problem(4, 40, 100, layout=layout, weights="q8")
    assert error.value.field == "layout" and layout in str(error.value)


def test_a_batch_of_quantized_weights_needs_one_shared_weight():
    with pytest.raises(ProblemError) as error:
        Problem(4, 40, 100, layout="nt", batch=3, weights="q4g32")
    assert error.value.field == "shared_b"
    assert Problem(4, 40, 100, layout="nt", batch=3, shared_b=True, weights="q4g32").shared_b


KEYED = [
    Problem(1, 4096, 4096, layout="nt", weights=w)
    for w in FORMATS
] + [
    Problem(16, 11008, 4096, "f16", "nt", weights="q4g128z"),
    Problem(5, 37, 200, "f16", "nt", accumulate="f32", weights="q8"),
    Problem(3, 40, 64, "f32", "nt", 4, True, "alpha,beta,bias,gelu", weights="q4g64"),
    Problem(2, 40, 64, "f16", "nt", 8, True, "bias,relu", weights="q4g32z"),
]  # fmt: skip


@pytest.mark.parametrize("problem", KEYED, ids=str)
def test_a_quantized_key_round_trips(problem):
    params = {"SG": 0, "WG": 64, "TK": 8, "NC": 1, "U": 1, "AV": 4, "BW": 1, "DQ": 0}
    key = Key.of(problem, Config.make("qgemv", params), True)
    text = str(key)
    assert f":{problem.dtype_text}:" in text and f".{problem.weights}:" in text
    assert Key.parse(text) == key and Key.parse(text).problem.weights == problem.weights
    # the same key without the format is another problem's
    plain = Key.parse(text.replace(f".{problem.weights}", ""))
    assert plain.problem.weights == "none" and plain.problem != problem


def test_shipped_unquantized_keys_are_unchanged():
    keys = []
    for path in sorted((ROOT / "cache").glob("*.json")):
        keys += list(json.loads(path.read_text())["entries"])
    unquantized = [text for text in keys if "." not in text.split(":")[3]]
    assert unquantized and len(unquantized) < len(keys)  # both kinds ship
    for text in keys:
        key = Key.parse(text)
        assert str(key) == text
        assert (key.problem.weights == "none") == (text in unquantized)


# --- verification refuses a wrong decoder ---------------------------------------------

QGEMV = (ROOT / "templates" / "qgemv.wgsl.j2").read_text()
QGEMV_SPACE = (ROOT / "search_spaces" / "qgemv.toml").read_text()
# One line of qgemv changed: (what it was, what it becomes).
FAULTS = {
    "drops_high_nibbles": (
        "let {{ hi }} = codes(({{ word }} >> 4u) & 0x0F0F0F0Fu) - z;",
        "let {{ hi }} = vec4<f32>(0.0);",
    ),
    "scale_of_group_0": (
        "let s = scale_at(n{{ c }} * NG + g);",
        "let s = scale_at(n{{ c }} * NG);",
    ),
    "ignores_zero_points": (
        "let z = {{ magic }}f32(extractBits(zeros[n{{ c }} * {{ ZW }}u + g / 8u], 4u * (g % 8u), "
        "4u));",
        "let z = {{ magic }}8.0 + 0.0 * f32(zeros[0]);",
    ),
    "scale_of_next_row": (
        "let s = scale_at(n{{ c }} * NG + g);",
        "let s = scale_at(((n{{ c }} + 1u) % N) * NG + g);",
    ),
    "q8_unsigned_codes": (
        "let w8 = codes(q{{ j }}_{{ c }} ^ 0x80808080u) - (MAGIC + 128.0);",
        "let w8 = codes(q{{ j }}_{{ c }}) - (MAGIC + 128.0);",
    ),
    "q8_scale_of_next_row": (
        '"x * scale_at(n)"',
        '"x * scale_at((n + 1u) % N)"',
    ),
}
# The same faults in the 16-byte loads (BW = 4), and the words of a load out of order.
WIDE_FAULTS = {
    "wide_drops_high_nibbles": FAULTS["drops_high_nibbles"],
    "wide_words_reversed": (
        '{{- nibbles("q%d_%d[%d]" % (j, c, i), "lo%d" % i, "hi%d" % i) }}',
        '{{- nibbles("q%d_%d[%d]" % (j, c, BW - 1 - i), "lo%d" % i, "hi%d" % i) }}',
    ),
    "wide_q8_unsigned_codes": (
        "let w{{ i }} = codes(q{{ j }}_{{ c }}[{{ i }}] ^ 0x80808080u) - (MAGIC + 128.0);",
        "let w{{ i }} = codes(q{{ j }}_{{ c }}[{{ i }}]) - (MAGIC + 128.0);",
    ),
}
# The 4-bit codes masked in place (DQ = 1): the high nibbles dropped, the shifted word's
# nibbles taken from the word itself, a bit of the last nibble masked off, a scale off by
# a power of two, and the zero points ignored.
IN_PLACE_FAULTS = {
    "in_place_drops_high_nibbles": (
        "let {{ hi }} = fma(in_place(vec4<u32>({{ word }}, {{ word }}, t{{ lo }}, t{{ lo }}) & "
        'HI_MASKS), HI_SCALES, {{ "-(HI_OFFSETS + z)" if QZ else "HI_ZEROED" }});',
        "let {{ hi }} = vec4<f32>(0.0);",
    ),
    "in_place_unshifted": ("let t{{ lo }} = {{ word }} >> 12u;", "let t{{ lo }} = {{ word }};"),
    "in_place_nibble_7_short": (
        "const HI_MASKS = vec4<u32>(0xF0u, 0xF000u, 0xF00u, 0xF0000u);",
        "const HI_MASKS = vec4<u32>(0xF0u, 0xF000u, 0xF00u, 0x70000u);",
    ),
    "in_place_scale_off": (
        "const LO_SCALES = vec4<f32>(1.0, 0x1p-8f, 0x1p-16f, 0x1p-12f);",
        "const LO_SCALES = vec4<f32>(1.0, 0x1p-8f, 0x1p-15f, 0x1p-12f);",
    ),
    "in_place_ignores_zero_points": FAULTS["ignores_zero_points"],
}
FAULTS |= WIDE_FAULTS | IN_PLACE_FAULTS
FAULT_PROBLEM = {
    name: Problem(
        3, 37, 205 if name in WIDE_FAULTS else 200, "f32", "nt",  # 205: whole loads, padded
        weights="q8" if "q8" in name else "q4g32z",
    )
    for name in FAULTS
}  # fmt: skip


@pytest.fixture
def faulty_decoders(tmp_path, monkeypatch):
    """qgemv with one line changed, one template per fault, in a template folder."""
    for name, (line, wrong) in FAULTS.items():
        assert QGEMV.count(line) == 1, name  # the fault changes the line it names
        (tmp_path / f"{name}.wgsl.j2").write_text(QGEMV.replace(line, wrong))
        (tmp_path / f"{name}.toml").write_text(QGEMV_SPACE)
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    return list(FAULTS)


PARAMS = {"SG": 0, "WG": 64, "TK": 8, "NC": 2, "U": 1, "AV": 4, "BW": 1, "DQ": 0}
WIDE_PARAMS = PARAMS | {"BW": 4, "AV": 1}  # A as scalars: K = 205
IN_PLACE_PARAMS = PARAMS | {"DQ": 1}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_verification_refuses_a_faulty_decoder(gpu, faulty_decoders, fault):
    from autotune.compile import compile_shader
    from autotune.render import render
    from autotune.verify import verify

    problem = FAULT_PROBLEM[fault]
    params = WIDE_PARAMS if fault in WIDE_FAULTS else PARAMS
    params = IN_PLACE_PARAMS if fault in IN_PLACE_FAULTS else params
    right = compile_shader(render(Config.make("qgemv", params), problem), gpu)
    assert verify(right, gpu, seed=1).ok
    wrong = compile_shader(render(Config.make(fault, params), problem), gpu)
    verdict = verify(wrong, gpu, seed=1)
    assert not verdict.ok and "relative error" in verdict.reason, verdict.reason


SIXTEEN_ROWS_FOUR_COLUMNS = [
    ("qgemv", Problem(16, 45, 640, "f32", "nt", weights="q4g32z"), PARAMS | {"NC": 4}),
    ("qgemv", Problem(13, 40, 1024, "f16", "nt", 2, True, "bias,relu", weights="q8"),
     PARAMS | {"NC": 4, "WG": 128, "TK": 32, "U": 2}),
    ("qdotv", Problem(16, 37, 4096, "f32", "nt", weights="q4g128", activations="q8"),
     dict(SG=0, WG=128, TK=64, NC=4, U=4, QWG=256, QS=4, AV=4)),
    ("qdotv", Problem(16, 45, 1990, "f32", "nt", weights="q8", activations="q8"),
     dict(SG=0, WG=64, TK=16, NC=4, U=1, QWG=64, QS=1, AV=1)),
]  # fmt: skip


# Beyond 16 rows (the decode families serve up to 32): two columns at 32 rows, odd row
# counts, zero points, f16, a batch with an epilogue.
BEYOND_SIXTEEN_ROWS = [
    ("qgemv", Problem(32, 45, 640, "f32", "nt", weights="q4g32z"), PARAMS | {"NC": 2}),
    ("qgemv", Problem(25, 40, 1024, "f16", "nt", 2, True, "bias,gelu", weights="q4g128"),
     PARAMS | {"WG": 128, "TK": 32, "U": 2}),
    ("qgemv", Problem(17, 33, 255, "f32", "nt", weights="q8"), PARAMS | {"NC": 2, "AV": 1}),
    ("qdotv", Problem(32, 37, 4096, "f32", "nt", weights="q4g128", activations="q8"),
     dict(SG=0, WG=128, TK=64, NC=2, U=4, QWG=256, QS=4, AV=4)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("template", "problem", "params"), SIXTEEN_ROWS_FOUR_COLUMNS + BEYOND_SIXTEEN_ROWS, ids=str
)
def test_the_decode_families_widest_configs_verify(gpu, template, problem, params):
    """The decode families' 64 accumulators per invocation (16 rows x 4 columns, in the
    spaces since their 16-row tunes all took the 32 allowed before; 32 rows x 2), and
    row counts beyond 16, at ragged N."""
    from autotune.compile import compile_shader
    from autotune.render import render
    from autotune.space import load_space
    from autotune.verify import Reference, verify

    if problem.dtype == "f16" and "shader-f16" not in gpu.features:
        pytest.skip("the adapter lacks shader-f16")
    config = Config.make(template, params)
    assert load_space(template).why_invalid(config, problem, gpu.limits) is None
    compiled = compile_shader(render(config, problem), gpu, checks=True)
    verdict = verify(compiled, gpu, reference=Reference(problem, seed=3))
    assert verdict.ok, verdict.reason


# --- matmul(x, qw) ----------------------------------------------------------------------


def gelu(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def assert_within_bound(got, x, qw, *, bias=None, alpha=1.0, beta=0.0, C=None, act=None):
    """got == act(alpha x W'^T + beta C + bias) within verification's f32 bound (each
    element's rounding scale), plus the output format's rounding."""
    W = qw.dequantize().astype(np.float64)
    x64 = x.astype(np.float64)
    want = alpha * (x64 @ W.T)
    scale = abs(alpha) * np.sqrt((x64 * x64) @ (W * W).T)
    if C is not None:
        want, scale = want + beta * C.astype(np.float64), scale + np.abs(beta * C)
    if bias is not None:
        want, scale = want + bias.astype(np.float64), scale + np.abs(bias.astype(np.float64))
    if act == "gelu":
        want, scale = gelu(want), GELU_SLOPE * scale
    assert got.shape == want.shape and got.dtype == x.dtype
    limit = tolerance(Problem(1, 1, qw.shape[1])) * scale + output_rounding(got, x.dtype)
    excess = np.abs(got.astype(np.float64) - want) - limit
    assert np.all(np.isfinite(got)) and excess.max() <= 0, excess.max()


def weight(fmt, N, K, seed=0):
    bits, group, zero_points = parse_format(fmt)
    W = np.random.default_rng(seed).uniform(-1, 1, (N, K)).astype(np.float32)
    W[: N // 2] += 0.5  # asymmetric rows: zero points other than 8
    return autotune.quantize(W, bits=bits, group=group, zero_points=zero_points)


@pytest.mark.parametrize("fmt", ["q8", "q4g32", "q4g128z"])
@pytest.mark.parametrize("M", [1, 5, 16])
def test_matmul_with_a_quantized_weight(gpu, fmt, M):
    qw = weight(fmt, 37, 203)  # odd N and K: K padded to the group
    rng = np.random.default_rng(M)
    x = rng.uniform(-1, 1, (M, 203)).astype(np.float32)
    assert_within_bound(autotune.matmul(x, qw, estimate=False), x, qw)
    bias = rng.uniform(-1, 1, 37).astype(np.float32)
    got = autotune.matmul(x, qw, bias=bias, activation="gelu", estimate=False)
    assert_within_bound(got, x, qw, bias=bias, act="gelu")


def test_matmul_quantized_alpha_beta_and_batch(gpu):
    qw = weight("q4g32z", 41, 595)  # 19 groups: three words of zero points a row
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (5, 595)).astype(np.float32)
    C = rng.uniform(-1, 1, (5, 41)).astype(np.float32)
    got = autotune.matmul(x, qw, C, alpha=0.75, beta=-0.5, estimate=False)
    assert_within_bound(got, x, qw, alpha=0.75, beta=-0.5, C=C)
    x3 = rng.uniform(-1, 1, (3, 4, 595)).astype(np.float32)  # one weight for the batch
    got = autotune.matmul(x3, qw, estimate=False)
    assert got.shape == (3, 4, 41)
    for item in range(3):
        assert_within_bound(got[item], x3[item], qw)


def test_matmul_quantized_f16(gpu):
    if "shader-f16" not in gpu.features:
        pytest.skip("this adapter has no shader-f16")
    qw = weight("q4g128z", 37, 203)
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (5, 203)).astype(np.float16)
    bias = rng.uniform(-1, 1, 37).astype(np.float16)
    got = autotune.matmul(x, qw, bias=bias, estimate=False)
    assert got.dtype == np.float16
    assert_within_bound(got, x, qw, bias=bias)


def test_matmul_quantized_refusals_come_before_any_gpu_work():
    qw = weight("q4g32", 37, 64)
    x = np.ones((4, 64), np.float32)
    f32_scales = autotune.quantize(qw.dequantize(), bits=4, group=32, scales="f32")
    cases = {
        "B": lambda: autotune.matmul(x, f32_scales),
        "trans_a": lambda: autotune.matmul(x.T.copy(), qw, trans_a=True),
        "shape": lambda: autotune.matmul(np.ones((4, 65), np.float32), qw),
        "C": lambda: autotune.matmul(x, qw, np.ones((4, 36), np.float32), beta=1.0),
    }
    for field, call in cases.items():
        with pytest.raises(ProblemError) as error:
            call()
        assert error.value.field == field, (field, error.value)
        assert len(str(error.value)) > 20


# --- kernel.encode on the caller's buffers ----------------------------------------------


def test_encode_quantized_on_the_callers_buffers(gpu, tmp_path):
    import wgpu

    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
    device = gpu.device
    qw = weight("q4g32z", 37, 203)
    x = np.random.default_rng(4).uniform(-1, 1, (5, 203)).astype(np.float32)
    kernel = autotune.lookup(5, 37, 203, layout="nt", weights="q4g32z", cache_dir=tmp_path)
    sizes = kernel.buffer_sizes()
    packed = {"A": x, "B": qw.data, "scales": qw.scales, "zeros": qw.zero_points}
    assert sizes == {name: storage_bytes(a.size, a.itemsize) for name, a in packed.items()} | {
        "C": 5 * 37 * 4
    }
    at = device.limits["min-storage-buffer-offset-alignment"]

    def upload(array):
        data = array.tobytes() + bytes(-array.nbytes % 4)  # whole words
        buffer = device.create_buffer(size=at + len(data), usage=usage)
        device.queue.write_buffer(buffer, at, data)
        return buffer, at

    buffers = {name: upload(array) for name, array in packed.items()}
    buffers["C"] = upload(np.full((5, 37), np.nan, np.float32))
    encoder = device.create_command_encoder()
    kernel.encode(encoder, buffers["A"], buffers["B"], buffers["C"],
                  scales=buffers["scales"], zeros=buffers["zeros"])  # fmt: skip
    device.queue.submit([encoder.finish()])
    got = np.frombuffer(device.queue.read_buffer(buffers["C"][0], at), np.float32).reshape(5, 37)
    assert_within_bound(got, x, qw)
    for missing in ("scales", "zeros"):
        given = {k: buffers[k] for k in ("scales", "zeros") if k != missing}
        with pytest.raises(ArgumentError) as error:
            kernel.encode(device.create_command_encoder(), buffers["A"], buffers["B"],
                          buffers["C"], **given)  # fmt: skip
        assert error.value.field == missing and missing in str(error.value)
    plain = autotune.lookup(5, 37, 203, layout="nt", cache_dir=tmp_path, estimate=False)
    a = upload(np.ones((5, 203), np.float32))
    b = upload(np.ones((37, 203), np.float32))
    with pytest.raises(ArgumentError) as error:
        plain.encode(device.create_command_encoder(), a, b, buffers["C"], scales=buffers["scales"])
    assert error.value.field == "scales"
    symmetric = autotune.lookup(5, 37, 203, layout="nt", weights="q4g32", cache_dir=tmp_path,
                                estimate=False)  # fmt: skip
    with pytest.raises(ArgumentError) as error:
        symmetric.encode(
            device.create_command_encoder(), *(buffers[k] for k in ("A", "B", "C")),
            scales=buffers["scales"], zeros=buffers["zeros"],
        )  # fmt: skip
    assert error.value.field == "zeros"


# --- the command line --------------------------------------------------------------------


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_lookup_with_weights(gpu, tmp_path):
    done = cli("lookup", "--shape", "1x64x256", "--layout", "nt", "--weights", "q4g32",
               "--json", "--cache", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["template"] == "qgemv" and info["weights"] == "q4g32"
    assert info["shape"] == "1x64x256" and info["layout"] == "nt"


@pytest.mark.parametrize(
    "args, option",
    [(["--weights", "q5", "--layout", "nt"], "--weights"), (["--weights", "q8"], "--layout")],
)
def test_cli_refuses_bad_weights_in_one_line(args, option):
    done = cli("lookup", "--shape", "1x64x256", *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and option in done.stderr
    assert "Traceback" not in done.stderr


# --- tune ----------------------------------------------------------------------------------


def test_tune_quantized_then_lookup_exact(gpu, tmp_path):
    result = autotune.tune(
        1, 64, 256, layout="nt", weights="q8", trials=4, checks=False, cache_dir=tmp_path
    )
    assert result.entry is not None and result.entry.config.template == "qgemv"
    assert result.cache_path.parent == tmp_path
    keys = list(json.loads(result.cache_path.read_text())["entries"])
    assert keys and all(":f32.q8:" in k for k in keys)
    kernel = autotune.lookup(
        1, 64, 256, layout="nt", weights="q8", checks=False, cache_dir=tmp_path
    )
    assert kernel.source == "exact" and kernel.problem.weights == "q8"


def test_a_weight_too_large_is_refused_naming_its_packed_type(gpu):
    from autotune.kernel import check_fits

    limit = min(gpu.limits["max-storage-buffer-binding-size"], gpu.limits["max-buffer-size"])
    N = limit // 4096 + 1  # rows of 4096 words (q8, K = 16384): one row past the limit
    with pytest.raises(ProblemError) as error:
        check_fits(Problem(1, N, 16384, layout="nt", weights="q8"), gpu)
    assert f"B ({N}x4096 uint32)" in str(error.value), error.value
    assert error.value.field == "shape"
