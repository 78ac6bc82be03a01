"""Export bundles: files, manifest, and a real browser (headless Chromium, WebGPU on
SwiftShader, i.e. Dawn and Tint rather than wgpu and naga) running them unchanged."""

import base64
import json
import math
import re

import numpy as np
import pytest
from chromium import run_bundles

import autotune
from autotune.__main__ import main
from autotune.device import portable_limits
from autotune.export import default_name
from autotune.kernel import Kernel
from autotune.problem import Problem
from autotune.quantize import quantize_activations
from autotune.space import Config, load_space


def blocked(**params):
    base = dict(
        VEC=4, BM=64, TM=4, BN=64, TN=4, BK=16, PAD=0, UNROLL=1, DB=0, AT=0, GROUP=1, WARP=0
    )
    return Config.make("blocked", base | params)


def test_bundle_files_and_manifest(gpu, tmp_path):
    kernel = autotune.lookup(70, 36, 44, portable=True)
    paths = autotune.export(kernel, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gemm_70x36x44_f32.js",
        "gemm_70x36x44_f32.json",
        "gemm_70x36x44_f32.wgsl",
    ]
    manifest = json.loads(paths["json"].read_text())
    assert manifest["shape"] == {"M": 70, "N": 36, "K": 44} and manifest["format"] == 2
    assert [(b["binding"], b["name"], b["kind"]) for b in manifest["buffers"]] == [
        (0, "A", "read-only-storage"),
        (1, "B", "read-only-storage"),
        (2, "C", "storage"),
        (3, "dims", "uniform"),
    ]
    assert [f["name"] for f in manifest["uniform"]["fields"]] == ["M", "N", "K", "pad"]
    assert manifest["required_limits"] == {} and manifest["required_features"] == []
    (step,) = kernel.shader.plan.passes  # one pass: entry point main
    assert manifest["passes"] == [
        {
            "entry_point": "main",
            "workgroup_size": list(step.workgroup_size),
            "dispatch": list(step.grid),
        }
    ]
    provenance = manifest["provenance"]
    assert provenance["fingerprint"] == gpu.fingerprint.as_dict()
    assert provenance["runtime_checks"] is True and provenance["versions"]["wgpu"]
    wgsl = paths["wgsl"].read_text()
    assert wgsl.startswith("// autotune GEMM kernel: C = A * B") and "70x44" in wgsl
    assert not re.search(r"\{\{|\}\}|\{%|%\}|\{#", wgsl)
    module = paths["js"].read_text()
    assert "export async function createGemm(device, " in module
    assert "export const manifest" in module and json.dumps(wgsl) in module


def test_required_limits_are_listed_when_beyond_webgpu_defaults(gpu, tmp_path):
    config = blocked(BM=128, TM=8, BN=128, TN=8, BK=32)  # 32 KiB of workgroup memory
    problem = Problem(128, 128, 64)
    if load_space("blocked").why_invalid(config, problem, gpu.limits):
        pytest.skip("this adapter cannot run the large config")
    paths = autotune.export(Kernel(problem, config, "default", gpu=gpu), tmp_path)
    required = json.loads(paths["json"].read_text())["required_limits"]
    assert required == {"maxComputeWorkgroupStorageSize": 32768}


def test_bad_name_is_refused(gpu, tmp_path):
    with pytest.raises(autotune.ExportError, match="name '../x'"):
        autotune.export(autotune.lookup(4, 4, 4), tmp_path, name="../x")
    assert not list(tmp_path.iterdir())


def test_a_folder_that_cannot_be_written_is_refused_by_name(gpu, tmp_path):
    """The folder check passes a path below a file, or one through a missing folder to a
    file (out/../FILE); making it, or writing a bundle whose name is a folder, fails:
    an ExportError naming out_dir, not a bare OSError, and no bundle file written."""
    kernel = autotune.lookup(4, 4, 4)
    (tmp_path / "FILE").write_text("a file")
    (tmp_path / "taken" / "gemm.wgsl").mkdir(parents=True)
    for out, name in [
        (tmp_path / "FILE" / "below", None),
        (tmp_path / "missing" / ".." / "FILE", None),
        (tmp_path / "taken", "gemm"),
    ]:
        with pytest.raises(
            autotune.ExportError, match="cannot be written|nothing written"
        ) as raised:
            autotune.export(kernel, out, name)
        assert raised.value.field == "out_dir"
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [tmp_path / "FILE"]


def test_portable_lookup_stays_within_webgpu_defaults(gpu, cache_dir):
    limits = portable_limits(gpu.limits)
    for shape in [(256, 256, 256), (1, 512, 64), (1000, 17, 999)]:
        kernel = autotune.lookup(*shape, portable=True)
        assert (
            load_space(kernel.config.template).why_invalid(kernel.config, kernel.problem, limits)
            is None
        )


@pytest.mark.slow
def test_cli_export(gpu, tmp_path, cache_dir):
    out = tmp_path / "out"
    assert (
        main(
            [
                "export",
                "--shape",
                "20x12x8",
                "--shape",
                "1x16x5",
                "--out",
                str(out),
                "--portable",
                "--trials",
                "3",
            ]
        )
        == 0
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        f"gemm_{s}_f32.{e}" for s in ("20x12x8", "1x16x5") for e in ("js", "json", "wgsl")
    )
    assert main(["export", "--shape", "0x1x1", "--out", str(out)]) == 2


# --- the browser ----------------------------------------------------------------------

BROWSER_CASES = [
    (Problem(64, 48, 40), None),  # whatever lookup(portable=True) gives
    (Problem(1, 33, 17), None),  # a vector times a matrix
    (Problem(130, 68, 36), blocked(DB=1)),  # ragged tiles, double buffered
    (Problem(300, 72, 36), blocked(AT=1, GROUP=4, DB=1)),  # A transposed, banded order
    (Problem(130, 68, 36), blocked(AT=1, DB=2, WARP=1)),  # two workgroup buffers, 3 slices
    (Problem(128, 64, 64), blocked(DB=1, UNROLL=0)),  # whole tiles: no edge tests
    (Problem(67, 45, 37), blocked(VEC=1, BM=32, TM=2, BN=32, TN=2, BK=8, PAD=1)),
    # vector tiles at sizes VEC does not divide: A, B and C bound as scalars; then B and C
    (Problem(67, 45, 37), blocked(DB=1)),
    (Problem(67, 45, 36), blocked(AT=1, DB=2, WARP=1)),
    (Problem(67, 45, 37), Config.make("tiled", dict(TX=16, TY=16, TK=16, PAD=1))),
    (Problem(67, 45, 37), Config.make("naive", dict(WX=16, WY=8))),
    # decoding, the plain problem's 16-byte uniform block
    (
        Problem(1, 37, 129),
        Config.make("gemv", dict(SG=0, WG=64, TK=8, NC=2, VEC=1, U=2, ACC=0, RS=1, H8=0)),
    ),
]


@pytest.mark.slow
def test_exported_bundles_run_unchanged_in_chromium(gpu, tmp_path):
    names = []
    for i, (problem, config) in enumerate(BROWSER_CASES):
        kernel = (
            autotune.lookup(problem.M, problem.N, problem.K, portable=True, gpu=gpu)
            if config is None
            else Kernel(problem, config, "default", gpu=gpu)
        )
        name = f"case{i}_{problem.M}x{problem.N}x{problem.K}"
        autotune.export(kernel, tmp_path, name=name)
        names.append(name)
    results = run_bundles(tmp_path, names)
    assert sorted(results) == sorted(names)
    for name, result in results.items():  # each module parsed (loaded), each kernel right
        assert result["loaded"] and result["ok"], f"{name}: {result}"
        assert result["errors"] == []


def variant(**params):
    base = dict(VEC=4, BM=32, TM=4, BN=32, TN=4, BK=16, PAD=0, UNROLL=1, DB=1, AT=1, GROUP=1)
    return Config.make("blockedx", base | dict(ACC=0, SWZ=0) | params)


# One f16 kernel per accumulation type, and transposed, batched, fused ones (ragged M).
F16_CASES = {
    "f16acc": (Problem(36, 44, 40, "f16"), variant(ACC=1)),
    "f16f32": (Problem(37, 44, 40, "f16", "nt"), variant(BK=8, DB=0, SWZ=1)),
    # decoding with A and B read as words (eight halves a load), rows split, a tail of K
    "f16_decode_eight_halves": (
        Problem(13, 44, 136, "f16", "nt", 2, False, "bias,gelu"),
        Config.make("gemv", dict(SG=0, WG=128, TK=16, NC=4, VEC=4, U=1, ACC=0, RS=2, H8=1)),
    ),
}
FUSED_CASES = {
    "nt_batch_gelu": (Problem(37, 44, 28, "f32", "nt", 3, False, "alpha,beta,bias,gelu"), None),
    "tn_shared_relu": (Problem(36, 20, 24, "f32", "tn", 2, True, "bias,relu"), variant()),
    # two passes and a workspace: K cut into ranges, summed with the epilogue
    "splitk_plain": (
        Problem(24, 20, 300),
        load_space("splitk").seed_configs(Problem(24, 20, 300))[-1],
    ),
    "splitk_nt_batch_gelu": (
        Problem(20, 24, 200, "f32", "nt", 2, False, "alpha,beta,bias,gelu"),
        Config.make(
            "splitk", load_space("splitk").seeds[0] | dict(VEC=4, BM=16, TM=4, BN=32, TN=4, SPLIT=4)
        ),
    ),
    # vector tiles at odd sizes: A and B gathered along K, C and bias stored by scalar
    "odd_nt_batch_gelu": (
        Problem(37, 45, 29, "f32", "nt", 2, False, "alpha,beta,bias,gelu"),
        variant(),
    ),
    "odd_tn_shared_relu": (Problem(37, 44, 24, "f32", "tn", 2, True, "bias,relu"), variant()),
    "splitk_odd": (
        Problem(23, 21, 301),
        Config.make(
            "splitk", load_space("splitk").seeds[0] | dict(VEC=4, BM=16, TM=4, BN=32, TN=4, SPLIT=4)
        ),
    ),
    # decoding (M <= 16), reduced through workgroup memory: ragged N, odd K
    "decode_workgroup": (
        Problem(3, 37, 129, "f32", "nt", 2, False, "bias,gelu"),
        Config.make("gemv", dict(SG=0, WG=128, TK=16, NC=1, VEC=1, U=4, ACC=0, RS=1, H8=0)),
    ),
    # 16 rows, eight columns per invocation: 128 accumulators in the browser's compiler
    "decode_eight_columns": (
        Problem(16, 44, 132, "f32", "nt", 2, False, "bias,gelu"),
        Config.make("gemv", dict(SG=0, WG=128, TK=16, NC=8, VEC=4, U=1, ACC=0, RS=1, H8=0)),
    ),
    # 13 rows in two row groups, the second of six
    "decode_rows_split": (
        Problem(13, 44, 132, "f32", "nt", 2, False, "bias,gelu"),
        Config.make("gemv", dict(SG=0, WG=128, TK=16, NC=4, VEC=4, U=1, ACC=0, RS=2, H8=0)),
    ),
}
# decoding reduced with subgroupAdd: needs the device feature "subgroups"
SUBGROUP_CASES = {
    "decode_subgroups": (
        Problem(4, 36, 64, "f32", "nt", 1, False, "alpha,bias"),
        Config.make("gemv", dict(SG=1, WG=64, TK=8, NC=1, VEC=4, U=2, ACC=0, RS=1, H8=0)),
    ),
}


@pytest.fixture(scope="module")
def variant_results(gpu, tmp_path_factory):
    """The variant bundles, run once in Chromium: name -> the runner's result."""
    folder = tmp_path_factory.mktemp("variants")
    for name, (problem, config) in (F16_CASES | FUSED_CASES | SUBGROUP_CASES).items():
        kernel = (
            Kernel(problem, config, "default", gpu=gpu)
            if config
            else autotune.lookup(**problem.arguments, portable=True, gpu=gpu)
        )
        autotune.export(kernel, folder, name=name)
    return run_bundles(folder, F16_CASES | FUSED_CASES | SUBGROUP_CASES)


def test_transposed_batched_fused_bundles_run_in_chromium(variant_results):
    for name in FUSED_CASES:
        result = variant_results[name]
        assert result.get("ok") and result["errors"] == [], f"{name}: {result}"


def test_f16_bundles_run_in_chromium(variant_results):
    skipped = [variant_results[n]["skipped"] for n in F16_CASES if "skipped" in variant_results[n]]
    for name in F16_CASES:  # where it cannot run, createGemm refuses, naming the feature
        refused = variant_results[name].get("refused")
        assert "skipped" not in variant_results[name] or "needs the device feature shader-f16" in (
            refused or ""
        ), variant_results[name]
    if skipped:  # said out loud, never a silent pass
        pytest.skip(f"f16 in the browser: {skipped[0]}")
    for name in F16_CASES:
        result = variant_results[name]
        assert result.get("ok") and result["errors"] == [], f"{name}: {result}"


def test_subgroup_bundles_run_in_chromium(variant_results):
    """Where the browser's adapter has "subgroups" the bundle runs right; where it lacks
    it, createGemm refuses, naming the feature, and the test says so."""
    for name in SUBGROUP_CASES:
        result = variant_results[name]
        if "skipped" in result:
            assert "needs the device feature subgroups" in (result.get("refused") or ""), result
            pytest.skip(f"subgroups in the browser: {result['skipped']}")
        assert result.get("ok") and result["errors"] == [], f"{name}: {result}"


def test_the_browser_check_catches_broken_bundles(gpu, tmp_path):
    """The harness must be able to fail: a bundle that skips most of C, one whose
    manifest binds C read-only (a WebGPU validation error), and one whose module does not
    parse (a line break in a comment)."""
    folder = tmp_path
    kernel = Kernel(Problem(40, 36, 24), blocked(BM=16, TM=2, BN=16, TN=4), "default", gpu=gpu)
    for name in ("short", "readonly", "syntax"):
        autotune.export(kernel, folder, name=name)
    short = folder / "short.js"
    short.write_text(
        short.read_text().replace('"dispatch": [\n    3,\n    3,', '"dispatch": [\n    1,\n    1,')
    )
    readonly = folder / "readonly.js"
    readonly.write_text(
        readonly.read_text().replace('"kind": "storage"', '"kind": "read-only-storage"')
    )
    syntax = folder / "syntax.js"
    syntax.write_text(syntax.read_text().replace("// Usage:", "// Usage\n:", 1))
    results = run_bundles(folder, ["short", "readonly", "syntax"])
    assert not results["short"]["ok"] and results["short"]["errors"] == []
    assert not results["readonly"]["ok"] and results["readonly"]["errors"]
    assert results["short"]["loaded"] and results["readonly"]["loaded"]
    assert not results["syntax"]["ok"] and results["syntax"]["loaded"] is False
    assert "SyntaxError" in results["syntax"]["errors"][0], results["syntax"]


# --- quantized weights ------------------------------------------------------------------

# (problem, params: qgemv's unless they name another template): A as vec4 with a ragged N
# and K padded to the group; A as scalars with K padded to a word (K % 4 != 0) and an odd
# count of f16 scales; every 4-bit group size with and without zero points; the 4-bit codes
# masked in place (DQ = 1), with and without zero points and 16-byte loads; int8
# activations over 4-bit weights in both int8 families (qdot: a group spanning K steps;
# qdotv's quantize pass also split across workgroups, QS = 4, or done by each workgroup
# of its one pass, QS = 0); the decode families'
# partial sums reduced by subgroupAdd (SG = 1), A read as vectors by the quantize pass
# (AV = 4); both decode families past 16 rows; qgemm past one tile of rows (ragged M, N
# and K), and both GEMM tiles split into ranges of K (scales applied once, after the sum).
# Tiny shapes: one Chromium launch runs them all.
QUANTIZED_CASES = {  # dequantized in registers (qgemv, qgemm), int8 activations (qdot, qdotv)
    "q4g32z": (Problem(3, 37, 100, "f32", "nt", weights="q4g32z"), dict(NC=1, AV=4)),
    "q8": (Problem(2, 41, 70, "f32", "nt", weights="q8"), dict(NC=2, AV=1)),
    "q4g64": (Problem(1, 24, 128, "f32", "nt", weights="q4g64"), dict(NC=1, AV=4, BW=4)),
    "q4g128": (Problem(2, 29, 256, "f32", "nt", weights="q4g128"), dict(NC=1, AV=4, U=2, BW=4)),
    "q4g32": (Problem(4, 33, 70, "f32", "nt", weights="q4g32"), dict(NC=2, AV=1)),
    "q4g128_in_place": (
        Problem(1, 30, 256, "f32", "nt", weights="q4g128"),
        dict(NC=2, AV=4, U=2, BW=4, DQ=1),
    ),
    "q4g64z_in_place": (Problem(2, 27, 190, "f32", "nt", weights="q4g64z"), dict(NC=1, AV=1, DQ=1)),
    "q4g32_a8": (
        Problem(2, 37, 100, "f32", "nt", weights="q4g32", activations="q8"),
        dict(template="qdotv", NC=2, QWG=64),
    ),
    "q4g64z_a8": (
        Problem(3, 40, 200, "f32", "nt", weights="q4g64z", activations="q8"),
        dict(template="qdotv", NC=1, QWG=64),
    ),
    "q4g128_a8_split": (
        Problem(2, 37, 1024, "f32", "nt", weights="q4g128", activations="q8"),
        dict(template="qdotv", NC=2, QWG=64, QS=4),
    ),
    "q4g128_a8_one_pass": (
        Problem(3, 37, 1024, "f32", "nt", weights="q4g128", activations="q8"),
        dict(template="qdotv", NC=2, QWG=64, QS=0, AV=4),
    ),
    "q4g128_a8_subgroups": (
        Problem(1, 37, 1024, "f32", "nt", weights="q4g128", activations="q8"),
        dict(template="qdotv", SG=1, TK=16, NC=2, QWG=64, QS=4, AV=4),
    ),
    "q4g64_in_place_subgroups": (
        Problem(3, 30, 512, "f32", "nt", weights="q4g64"),
        dict(SG=1, TK=32, WG=128, NC=2, AV=4, U=2, DQ=1),
    ),
    "q4g32_24_rows": (Problem(24, 37, 128, "f32", "nt", weights="q4g32"), dict(NC=2, AV=4)),
    "q4g128_a8_32_rows": (
        Problem(32, 30, 256, "f32", "nt", weights="q4g128", activations="q8"),
        dict(template="qdotv", NC=1, QWG=64),
    ),
    "q8_a8": (
        Problem(20, 41, 70, "f32", "nt", weights="q8", activations="q8"),
        dict(template="qdot", BM=32, BN=32, TM=4, TN=4, BK=16, QWG=64),
    ),
    "q4g128z_a8": (
        Problem(18, 36, 300, "f32", "nt", weights="q4g128z", activations="q8"),
        dict(template="qdot", BM=32, BN=32, TM=4, TN=4, BK=32, QWG=64),
    ),
    "qgemm_q4g32z": (
        Problem(20, 37, 100, "f32", "nt", weights="q4g32z"),
        dict(template="qgemm", BM=32, BN=32, TM=4, TN=4, BK=16, AV=4, DB=1),
    ),
    "qsplitk_q8": (
        Problem(20, 37, 200, "f32", "nt", weights="q8"),
        dict(template="qsplitk", BM=32, BN=32, TM=4, TN=4, BK=16, AV=4, DB=1, SPLIT=4, RW=64),
    ),
    "qdotsplitk_q4g32z_a8": (
        Problem(20, 37, 300, "f32", "nt", weights="q4g32z", activations="q8"),
        dict(template="qdotsplitk", BM=32, BN=32, TM=4, TN=4, BK=16, QWG=64, SPLIT=4, RW=64),
    ),
}


def quantized_case(name: str, seed: int = 0):
    """The case's kernel, its A and its weight (autotune.quantize of a random W)."""
    problem, params = QUANTIZED_CASES[name]
    bits, group, zero_points = problem.weight_format
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((problem.N, problem.K)).astype(np.float32)
    qw = autotune.quantize(W, bits=bits, group=group, zero_points=zero_points)
    A = rng.standard_normal((problem.M, problem.K)).astype(np.float32)
    params = dict(params)
    template = params.pop("template", "qgemv")
    base = dict(SG=0, WG=64, TK=8, U=1) if template in ("qgemv", "qdotv") else {}
    base |= dict(BW=1, DQ=0) if template == "qgemv" else {}  # 4-byte loads, bytes unpacked
    base |= dict(QS=1, AV=1) if template == "qdotv" else {}  # one workgroup a row, A as scalars
    return Config.make(template, base | params), problem, A, qw


def claimed_activations(A: np.ndarray, problem: Problem) -> np.ndarray:
    """A in float64 as the kernel multiplies it: its int8 codes times their row scales
    where the kernel quantizes its activations."""
    if problem.activations != "q8":
        return A.astype(np.float64)
    codes, scales = quantize_activations(A)
    return codes.astype(np.float64) * scales[:, None]


def test_quantized_manifest_describes_each_binding(gpu, tmp_path):
    """B, scales and zeros are u32 words holding the weight files' bytes (sizes the
    arrays' nbytes rounded to whole words, shapes theirs), at bindings 1, 9 and 10; A is
    bound as AV says, C as scalars; the format is in the manifest and its text."""
    for name in QUANTIZED_CASES:
        config, problem, A, qw = quantized_case(name)
        paths = autotune.export(Kernel(problem, config, "default", gpu=gpu), tmp_path, name)
        manifest = json.loads(paths["json"].read_text())
        buffers = {b["name"]: b for b in manifest["buffers"]}
        assert manifest["weights"] == qw.format == problem.weights
        assert manifest["valid_for"][0]["weights"] == qw.format
        assert qw.format in manifest["computes"] and "docs/QUANTIZED.md" in manifest["computes"]
        # unpack4xU8 and dot4I8Packed need the feature; codes masked in place use neither
        packed = config.as_dict().get("DQ", 0) == 0 or problem.activations == "q8"
        features = ["packed_4x8_integer_dot_product"] if packed else None
        assert manifest.get("required_language_features") == features
        arrays = {"B": ("data", qw.data), "scales": ("scales", qw.scales)}
        if qw.zero_points is not None:
            arrays["zeros"] = ("zero_points", qw.zero_points)
        quantized_first = problem.activations == "q8"
        two_passes = quantized_first and config.as_dict().get("QS") != 0
        workspaces = ["xq", "xs"] if two_passes else []
        split = ["partials"] if "SPLIT" in config.as_dict() else []
        assert sorted(buffers) == sorted(["A", "C", "dims", *arrays, *workspaces, *split])
        assert manifest["activations"] == problem.activations
        assert default_name(Kernel(problem, config, "default", gpu=gpu)).endswith(
            f"_{problem.weights}" + ("_a8" if quantized_first else "")
        )
        assert ("A's rows are quantized first" in manifest["computes"]) == quantized_first
        assert [buffers[n]["binding"] for n in ("B", "scales")] == [1, 9]
        for binding, (role, array) in arrays.items():
            entry = buffers[binding]
            # qgemv's 16-byte loads bind the codes as vec4<u32>: the same bytes
            width = config.as_dict().get("BW", 1) if binding == "B" else 1
            words = "u32" if width == 1 else f"vec{width}<u32>"
            assert entry["type"] == f"array<{words}>" and entry["vector_width"] == width
            assert entry["size_bytes"] == -(-array.nbytes // 4) * 4, binding
            assert entry["shape"] == list(array.shape)
            assert entry["element"] == {"uint32": "u32", "float16": "f16"}[array.dtype.name]
            assert entry["layout"] == qw.files[role]["layout"]
        assert buffers["B"]["packing"] == "codes"
        assert buffers["scales"]["packing"] == "f16 pairs"
        if "zeros" in buffers:
            assert buffers["zeros"]["binding"] == 10
            assert buffers["zeros"]["packing"] == "zero-point nibbles"
        av = config.as_dict().get("AV", 1)  # the int8 families read A as scalars
        assert buffers["A"]["type"] == ("array<vec4<f32>>" if av == 4 else "array<f32>")
        assert buffers["A"]["size_bytes"] == A.nbytes
        assert buffers["C"]["type"] == "array<f32>" and buffers["C"]["vector_width"] == 1
        named = "{ scales, zeros }" if "zeros" in buffers else "{ scales }"
        assert f"bufC, bufBias, {named});" in paths["js"].read_text()


def test_manifest_types_are_the_bindings_the_wgsl_declares(gpu, tmp_path):
    """A vector config at a size VEC does not divide binds those operands as scalars:
    the manifest says so, binding by binding, as the WGSL declares them."""
    cases = {
        "k_odd": (Problem(64, 64, 61), blocked(), {"A": 1, "B": 4, "C": 4}),
        "n_odd": (Problem(64, 66, 64, "f32", "nt", epilogue="bias"), variant(),
                  {"A": 4, "B": 4, "C": 1, "bias": 1}),
        "aligned": (Problem(64, 64, 64), blocked(), {"A": 4, "B": 4, "C": 4}),
    }  # fmt: skip
    for name, (problem, config, widths) in cases.items():
        paths = autotune.export(Kernel(problem, config, "default", gpu=gpu), tmp_path, name=name)
        buffers = {b["name"]: b for b in json.loads(paths["json"].read_text())["buffers"]}
        wgsl = paths["wgsl"].read_text()
        for operand, width in widths.items():
            element = "f32" if width == 1 else f"vec{width}<f32>"
            assert buffers[operand]["type"] == f"array<{element}>", (name, operand)
            assert buffers[operand]["vector_width"] == width
            assert re.search(
                rf"var<storage, [a-z_]+> {operand}: array<{re.escape(element)}>;", wgsl
            )


def test_unquantized_manifest_has_no_weight_fields(gpu, tmp_path):
    """(An f16 kernel reading halves as words marks them `packing`: the test below.)"""
    paths = autotune.export(Kernel(*FUSED_CASES["decode_workgroup"], "default", gpu=gpu), tmp_path)
    manifest = json.loads(paths["json"].read_text())
    assert "weights" not in manifest and "required_language_features" not in manifest
    assert not any("packing" in b for b in manifest["buffers"])


def test_manifest_names_halves_read_as_words(gpu, tmp_path):
    """A kernel that reads f16 A and B as vec4<u32> (eight halves a load): the manifest
    gives the WGSL type and says what the words hold; C, bound as halves, has no packing."""
    if "shader-f16" not in gpu.features:
        pytest.skip("the adapter has no shader-f16")
    kernel = Kernel(*F16_CASES["f16_decode_eight_halves"], "default", gpu=gpu)
    paths = autotune.export(kernel, tmp_path)
    buffers = {b["name"]: b for b in json.loads(paths["json"].read_text())["buffers"]}
    for name, shape in (("A", [2, 13, 136]), ("B", [2, 44, 136])):
        assert buffers[name]["type"] == "array<vec4<u32>>", buffers[name]
        assert buffers[name]["element"] == "f16" and buffers[name]["packing"] == "f16 pairs"
        assert buffers[name]["size_bytes"] == 2 * math.prod(shape)
    assert buffers["C"]["type"] == "array<vec4<f16>>" and "packing" not in buffers["C"]


def test_cli_exports_a_quantized_bundle(gpu, tmp_path, cache_dir):
    out = tmp_path / "out"
    argv = ["export", "--shape", "1x64x256", "--layout", "nt", "--weights", "q4g32"]
    assert main([*argv, "--out", str(out), "--portable", "--trials", "2"]) == 0
    manifest = json.loads((out / "gemm_1x64x256_f32_nt_b1_q4g32.json").read_text())
    assert manifest["weights"] == "q4g32"
    assert main([*argv[:3], "--weights", "q4g32", "--out", str(out)]) == 2  # layout nn


def test_cli_export_portable_tunes_within_the_timeout_it_was_given(gpu, tmp_path, capsys):
    """With no portable kernel cached, export says what the tune will spend and stops it
    at --timeout (a big shape on a slow adapter would otherwise take minutes)."""
    cache = tmp_path / "cache"
    argv = ["export", "--shape", "96x80x64", "--out", str(tmp_path / "out"), "--portable"]
    assert main([*argv, "--trials", "100000", "--timeout", "3", "--cache", str(cache)]) == 0
    assert "tuning one (100000 trials or 3 s;" in capsys.readouterr().out
    (entry,) = json.loads(next(cache.glob("*.json")).read_text())["entries"].values()
    assert entry["tuning_s"] < 30 and entry["trials"] < 100000
    for option in (["--trials", "3"], ["--timeout", "3"]):  # only --portable tunes
        assert main([*argv[:-1], *option, "--cache", str(cache)]) == 2
        assert f"argument {option[0]}: only with --portable" in capsys.readouterr().err


@pytest.fixture(scope="module")
def quantized_results(gpu, tmp_path_factory):
    """The quantized bundles run once in Chromium on the test's A and weight files:
    name -> (the runner's result, A, the weight)."""
    folder = tmp_path_factory.mktemp("quantized")
    inputs = {}
    for name in QUANTIZED_CASES:
        config, problem, A, qw = quantized_case(name)
        autotune.export(Kernel(problem, config, "default", gpu=gpu), folder, name=name)
        (folder / f"{name}.A.bin").write_bytes(A.tobytes())
        qw.save(folder, f"{name}_w")  # NAME_w.data.bin, .scales.bin (.zeros.bin)
        inputs[name] = (A, qw)
    results = run_bundles(folder, QUANTIZED_CASES)
    return {name: (results.get(name), *inputs[name]) for name in QUANTIZED_CASES}


@pytest.mark.slow
def test_quantized_bundles_run_unchanged_in_chromium(quantized_results):
    """Each bundle, fed the bytes QuantizedWeight.save wrote, computes A @ W'^T (W' the
    dequantized weight) within f32 summation's bound, and its encode refuses to run
    without the scales, naming them. A bundle the browser's adapter cannot run (no packed
    integer dot product, no subgroups) is refused by createGemm, naming what is lacking,
    and the test says so."""
    skipped = []
    for name, (result, A, qw) in quantized_results.items():
        assert result is not None, name
        if "skipped" in result:  # said out loud, never a silent pass
            refused = result.get("refused") or ""
            lacking = ("packed_4x8_integer_dot_product", "needs the device feature subgroups")
            assert any(reason in refused for reason in lacking), result
            skipped.append(f"{name}: {result['skipped']}")
            continue
        assert result["ok"] and result["errors"] == [], f"{name}: {result}"
        assert "needs the buffer scales (binding 9" in (result["missing"] or ""), result
        assert f"f16 pairs of {QUANTIZED_CASES[name][0].weights})" in result["missing"], result
        M, N, K = A.shape[0], qw.shape[0], A.shape[1]
        C = np.frombuffer(base64.b64decode(result["C"]), np.float32)[: M * N].reshape(M, N)
        W = qw.dequantize().astype(np.float64)
        A64 = claimed_activations(A, QUANTIZED_CASES[name][0])
        want = A64 @ W.T
        bound = (K + 2) * 2.0**-24 * (np.abs(A64) @ np.abs(W).T)
        assert np.all(np.abs(C - want) <= bound), f"{name}: {np.abs(C - want).max()}"
    if skipped:
        pytest.skip(f"quantized weights in the browser: {'; '.join(skipped)}")
