"""Quantized weights: the byte layout on hand-written examples, the error bound, what a
changed byte does, the files (save, load, refusals), the CLI and every argument check.
No GPU: a kernel reading the format must match `dequantize()`, which these pin down."""

import json
import subprocess
import sys

import numpy as np
import pytest

import autotune
from autotune.__main__ import main
from autotune.arguments import ArgumentError
from autotune.quantize import QuantizedWeight, quantize

FORMATS = [
    dict(bits=8),
    dict(bits=4, group=32),
    dict(bits=4, group=64),
    dict(bits=4, group=128),
    dict(bits=4, group=32, zero_points=True),
    dict(bits=4, group=128, zero_points=True),
]


def words(*values):
    return np.array(values, np.uint32)


# --- the byte layout, by hand -----------------------------------------------------------


def test_q8_layout_by_hand():
    W = np.array(
        [
            [127, -1, 0, -127, 64, -64],  # scale 1: q = W
            [127, 0.5, 1.5, 2.5, -0.5, -1.5],  # half to even: 0, 2, 2, -0, -2
        ],
        np.float32,
    )
    qw = quantize(W, bits=8, scales="f32")
    assert qw.format == "q8" and qw.padded_k == 8 and qw.data.shape == (2, 2)
    np.testing.assert_array_equal(qw.scales, np.float32([1, 1]))
    # bytes 7f ff 00 81 | 40 c0 00 00 (two's complement; k >= 6 is padding, 0)
    np.testing.assert_array_equal(qw.data[0], words(0x8100FF7F, 0x0000C040))
    # bytes 7f 00 02 02 | 00 fe 00 00
    np.testing.assert_array_equal(qw.data[1], words(0x0202007F, 0x0000FE00))
    # the little-endian bytes of a row are its int8 codes, in order
    assert qw.data[1].astype("<u4").tobytes() == np.int8([127, 0, 2, 2, 0, -2, 0, 0]).tobytes()


def test_q4_layout_by_hand():
    W = np.zeros((1, 20), np.float32)  # K = 20, one group of 32: 12 values of padding
    W[0, :16] = [0, 1, 2, 3, 4, 5, 6, 7, -1, -2, -3, -4, -5, -6, -7, 0]  # scale 1
    W[0, 16:] = [1, 0, 0, -1]
    qw = quantize(W, bits=4, group=32, scales="f32")
    assert qw.format == "q4g32" and qw.padded_k == 32 and qw.zero_points is None
    np.testing.assert_array_equal(qw.scales, np.float32([[1]]))
    # code = q + 8, nibble k in bits 4 * (k % 8): the first value is the lowest nibble
    expected = words(0xFEDCBA98, 0x81234567, 0x88887889, 0x88888888)
    np.testing.assert_array_equal(qw.data[0], expected)
    assert qw.data.astype("<u4").tobytes()[:2] == bytes([0x98, 0xBA])  # ONNX's order


def test_q4_zero_points_layout_by_hand():
    W = np.zeros((1, 64), np.float32)  # two groups of 32
    W[0, :8] = [-3, 12, 0, 1, 2, -1, 5, 6]  # range -3..12: scale 1, zero 3
    W[0, 32:34] = [-10, 5]  # range -10..5: scale 1, zero 10
    qw = quantize(W, bits=4, group=32, zero_points=True, scales="f32")
    assert qw.format == "q4g32z" and qw.zero_points.shape == (1, 1)
    np.testing.assert_array_equal(qw.scales, np.float32([[1, 1]]))
    expected = [0x982543F0, *[0x33333333] * 3, 0xAAAAAAF0, *[0xAAAAAAAA] * 3]
    np.testing.assert_array_equal(qw.data[0], words(*expected))
    np.testing.assert_array_equal(qw.zero_points, words(0xA3)[None])  # group 0 low
    np.testing.assert_array_equal(qw.dequantize(), W)


def test_zero_points_pack_eight_groups_a_word():
    W = np.zeros((1, 9 * 32), np.float32)
    W[0, ::32] = -np.arange(1, 10)  # group g: range -(g+1)..0, scale (g+1)/15, zero 15
    qw = quantize(W, bits=4, group=32, zero_points=True)
    assert qw.zero_points.shape == (1, 2)
    np.testing.assert_array_equal(qw.zero_points[0], words(0xFFFFFFFF, 0x0000000F))


@pytest.mark.parametrize("bits, group", [(8, None), (4, 32)])
def test_a_zero_row_dequantizes_to_exact_zeros_with_scale_1(bits, group):
    W = np.zeros((2, 40), np.float32)
    W[1, 3] = -2.5
    for zero_points in [False, True] if bits == 4 else [False]:
        qw = quantize(W, bits=bits, group=group, zero_points=zero_points)
        assert np.all(qw.scales[0] == 1)
        assert np.all(qw.dequantize()[0] == 0) and np.all(np.signbit(qw.dequantize()[0]) == 0)


# --- dequantize(): the bound, and the bytes a kernel reads -------------------------------


def stored_scale(qw):
    """Each element's stored scale, N x K, as float64."""
    width = qw.padded_k // qw.groups
    return np.repeat(qw.scales.reshape(qw.shape[0], -1), width, axis=1)[:, : qw.shape[1]]


MATRICES = {
    "uniform": lambda rng, shape: rng.uniform(-3, 5, shape),
    "gaussian": lambda rng, shape: rng.standard_normal(shape) * 0.02,
    "outliers": lambda rng, shape: rng.standard_normal(shape) * (rng.random(shape) < 0.01) * 50,
    "positive": lambda rng, shape: rng.uniform(1, 2, shape),
}


@pytest.mark.parametrize("options", FORMATS, ids=lambda o: str(sorted(o.items())))
@pytest.mark.parametrize("scales", ["f16", "f32"])
@pytest.mark.parametrize("kind", list(MATRICES))
@pytest.mark.parametrize("shape", [(37, 301), (3, 5), (1, 129), (8, 256)])
def test_error_is_at_most_half_the_stored_scale(options, scales, kind, shape):
    rng = np.random.default_rng(sum(shape))
    W = MATRICES[kind](rng, shape).astype(np.float32)
    qw = quantize(W, scales=scales, **options)
    restored = qw.dequantize()
    assert restored.dtype == np.float32 and restored.shape == shape
    # the stored scale is rounded up: no clamping, half a step plus f32's product rounding
    bound = stored_scale(qw).astype(np.float64) * (0.5 + 1e-6) + 1e-30
    assert np.all(np.abs(restored.astype(np.float64) - W) <= bound)


@pytest.mark.parametrize("options", FORMATS, ids=lambda o: str(sorted(o.items())))
def test_dequantize_is_what_the_stored_bytes_give(options):
    """Decoded here from the little-endian bytes alone, another way than the module."""
    rng = np.random.default_rng(7)
    W = rng.standard_normal((5, 77)).astype(np.float16)  # K a multiple of neither
    qw = quantize(W, **options)
    n, kp = qw.shape[0], qw.padded_k
    raw = np.frombuffer(qw.data.astype("<u4").tobytes(), np.uint8).reshape(n, -1)
    if qw.bits == 8:
        codes = raw.view(np.int8).astype(np.int64)
        zeros = np.zeros((n, kp), np.int64)
    else:
        codes = np.stack([raw & 0xF, raw >> 4], axis=2).reshape(n, kp).astype(np.int64)
        zeros = np.full((n, kp // qw.group), 8)
        if qw.zero_points is not None:
            zraw = np.frombuffer(qw.zero_points.astype("<u4").tobytes(), np.uint8).reshape(n, -1)
            zeros = np.stack([zraw & 0xF, zraw >> 4], axis=2).reshape(n, -1)[:, : kp // qw.group]
        zeros = np.repeat(zeros, qw.group, axis=1)
    scale = stored_scale(qw).astype(np.float32)
    expected = (codes - zeros)[:, : qw.shape[1]].astype(np.float32) * scale
    np.testing.assert_array_equal(qw.dequantize(), expected)
    assert np.all((codes - zeros)[:, qw.shape[1] :] == 0)  # padding: the code of 0


def test_codes_are_rounded_with_the_stored_f16_scale():
    W = np.array([[1.0, 100.52 / 127]], np.float32)  # 100.52 steps of the exact scale
    qw = quantize(W, bits=8, scales="f16")
    scale = float(qw.scales[0])
    assert scale > 1 / 127 * 1.0009  # f16 rounded up: 100.43 steps of the stored one
    assert qw.codes()[0, :2].tolist() == [127, 100]


# --- a changed byte changes the result ---------------------------------------------------


def changed(qw, **fields):
    return QuantizedWeight(**{f: getattr(qw, f) for f in FIELDS} | fields)


FIELDS = ("data", "scales", "zero_points", "bits", "group", "shape")


@pytest.fixture
def weights():
    return np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32)


@pytest.mark.parametrize("nibble", range(8))
def test_one_flipped_nibble_changes_exactly_that_element(weights, nibble):
    qw = quantize(weights, bits=4, group=64)
    data = qw.data.copy()
    data[2, 5] ^= np.uint32(0x8 << (4 * nibble))
    difference = changed(qw, data=data).dequantize() != qw.dequantize()
    assert np.argwhere(difference).tolist() == [[2, 5 * 8 + nibble]]


def test_one_flipped_byte_of_q8_changes_that_element(weights):
    qw = quantize(weights, bits=8)
    data = qw.data.copy()
    data[1, 3] ^= np.uint32(0x01 << 16)
    difference = changed(qw, data=data).dequantize() != qw.dequantize()
    assert np.argwhere(difference).tolist() == [[1, 3 * 4 + 2]]


def test_a_wrong_groups_scale_changes_that_group(weights):
    qw = quantize(weights, bits=4, group=64, scales="f32")
    scales = qw.scales.copy()
    scales[0, [1, 2]] = scales[0, [2, 1]]  # two groups' scales swapped
    difference = changed(qw, scales=scales).dequantize() != qw.dequantize()
    assert set(np.argwhere(difference.any(axis=0)).ravel() // 64) == {1, 2}
    assert not difference[1:].any()


def test_a_dropped_zero_point_changes_the_result(weights):
    qw = quantize(weights + 1, bits=4, group=32, zero_points=True)
    assert not np.array_equal(changed(qw, zero_points=None).dequantize(), qw.dequantize())
    zeros = qw.zero_points.copy()
    zeros[3, 0] &= ~np.uint32(0xF << 4)  # group 1 of row 3 read as zero point 0
    difference = changed(qw, zero_points=zeros).dequantize() != qw.dequantize()
    assert set(np.argwhere(difference).tolist()[i][1] // 32 for i in range(difference.sum())) == {1}


# --- files --------------------------------------------------------------------------------


@pytest.mark.parametrize("options", FORMATS, ids=lambda o: str(sorted(o.items())))
@pytest.mark.parametrize("scales", ["f16", "f32"])
def test_save_then_load_is_equal(tmp_path, options, scales):
    W = np.random.default_rng(5).standard_normal((9, 100))
    qw = quantize(W, scales=scales, **options)
    paths = qw.save(tmp_path, "fc1")
    names = {"data": "fc1.data.bin", "scales": "fc1.scales.bin", "manifest": "fc1.json"}
    if qw.zero_points is not None:
        names["zero_points"] = "fc1.zeros.bin"
    assert {role: p.name for role, p in paths.items()} == names
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names.values())
    loaded = QuantizedWeight.load(paths["manifest"])
    assert loaded == qw and loaded.format == qw.format
    np.testing.assert_array_equal(loaded.dequantize(), qw.dequantize())
    assert paths["data"].read_bytes() == qw.data.astype("<u4").tobytes()
    manifest = json.loads(paths["manifest"].read_text())
    assert manifest["format"] == qw.format and manifest["padded_k"] == qw.padded_k
    assert manifest["shape"] == [9, 100] and manifest["files"]["data"]["dtype"] == "uint32"


@pytest.fixture
def saved(tmp_path):
    qw = quantize(np.random.default_rng(1).standard_normal((6, 70)), bits=4, group=32)
    return qw, qw.save(tmp_path, "w")


def test_a_truncated_file_is_refused(saved):
    qw, paths = saved
    for role in ("data", "scales"):
        whole = paths[role].read_bytes()
        paths[role].write_bytes(whole[:-1])
        with pytest.raises(ArgumentError, match=rf"w\.{role}\.bin has .* bytes") as raised:
            QuantizedWeight.load(paths["manifest"])
        assert raised.value.field == "path"
        paths[role].write_bytes(whole + b"\0")  # one byte too many
        with pytest.raises(ArgumentError, match="larger than .* its manifest says"):
            QuantizedWeight.load(paths["manifest"])
        paths[role].write_bytes(whole)
    assert QuantizedWeight.load(paths["manifest"]) == qw


def edit(path, change):
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda m: m.update(shape=[7, 70]), "data has shape"),
        (lambda m: m.update(shape=[6, 200]), "data has shape"),
        (lambda m: m.update(shape=[6]), "shape must be"),
        (lambda m: m.update(shape=[3, 140]), "data has shape"),
        (lambda m: m.update(padded_k=70), "padded_k 70"),
        (lambda m: m.update(format="q4g32z"), "format 'q4g32z'"),
        (lambda m: m.update(group=64), "data has shape"),
        (lambda m: m.update(bits=8), "group must be None"),
        (lambda m: m.update(version=2), "version 2 is not 1"),
        (lambda m: m.update(manifest="other"), "not a manifest"),
        (lambda m: m["files"]["data"].update(shape=[6, 40]), "w.data.bin has 288 bytes"),
        (lambda m: m["files"]["scales"].update(dtype="float32"), "w.scales.bin has"),
        (lambda m: m["files"]["data"].update(name="../w.data.bin"), "plain name"),
        (lambda m: m["files"]["data"].update(name="/dev/zero"), "plain name"),
        (lambda m: m["files"].pop("scales"), "scales must be a NumPy"),
    ],
)
def test_a_manifest_that_does_not_match_is_refused(saved, change, words):
    qw, paths = saved
    edit(paths["manifest"], change)
    with pytest.raises(ArgumentError, match=words) as raised:
        QuantizedWeight.load(paths["manifest"])
    assert raised.value.field == "path" and str(paths["manifest"]) in str(raised.value)


def test_a_file_that_is_not_a_manifest_is_refused(tmp_path):
    for text in ["", "not json", "[1, 2]"]:
        (tmp_path / "x.json").write_text(text)
        with pytest.raises(ArgumentError, match="x.json"):
            QuantizedWeight.load(tmp_path / "x.json")
    with pytest.raises(ArgumentError, match="a FIFO|a character device"):
        QuantizedWeight.load("/dev/zero")


def test_a_bin_that_is_a_link_to_a_device_is_refused(saved):
    qw, paths = saved
    paths["data"].unlink()
    paths["data"].symlink_to("/dev/zero")
    with pytest.raises(ArgumentError, match="a character device"):
        QuantizedWeight.load(paths["manifest"])


def test_loaded_bytes_that_break_the_format_are_refused(saved):
    qw, paths = saved
    data = bytearray(paths["data"].read_bytes())
    data[-1] ^= 0x10  # a nibble of padding (k >= K) that is not the code of 0
    paths["data"].write_bytes(bytes(data))
    with pytest.raises(ArgumentError, match="padding"):
        QuantizedWeight.load(paths["manifest"])


# --- the CLI ------------------------------------------------------------------------------


def test_cli_writes_the_files(tmp_path, capsys):
    W = np.random.default_rng(2).standard_normal((16, 96)).astype(np.float32)
    np.save(tmp_path / "W.npy", W)
    out = tmp_path / "out"
    argv = ["quantize", str(tmp_path / "W.npy"), "--bits", "4", "--group", "32"]
    assert main(argv + ["--zero-points", "--out", str(out), "--name", "fc1"]) == 0
    printed = capsys.readouterr().out
    assert "q4g32z" in printed and "16x96" in printed and "6,144 bytes" in printed
    assert "RMS" in printed
    loaded = QuantizedWeight.load(out / "fc1.json")
    assert loaded == quantize(W, bits=4, group=32, zero_points=True)
    assert main(["quantize", str(tmp_path / "W.npy"), "--bits", "8", "--out", str(out)]) == 0
    assert QuantizedWeight.load(out / "W.json") == quantize(W, bits=8)
    for stem, name in (("layer.0.weight", "layer_0_weight"), ("1w", "w_1w")):
        np.save(tmp_path / f"{stem}.npy", W)  # a stem that is no name is made one
        assert (
            main(["quantize", str(tmp_path / f"{stem}.npy"), "--bits", "8", "--out", str(out)]) == 0
        )
        assert QuantizedWeight.load(out / f"{name}.json") == quantize(W, bits=8)
    bad = ["quantize", str(tmp_path / "W.npy"), "--bits", "8", "--out", str(out), "--name", "1w"]
    assert main(bad) == 2  # a name given is never changed


@pytest.mark.parametrize(
    "arguments, option",
    [
        (["--bits", "3"], "--bits"),
        (["--bits", "4"], "--group"),
        (["--bits", "4", "--group", "48"], "--group"),
        (["--bits", "8", "--group", "32"], "--group"),
        (["--bits", "8", "--zero-points"], "--zero-points"),
        (["--bits", "8", "--scales", "bf16"], "--scales"),
        (["--bits", "8", "--name", "a/b"], "--name"),
        (["--bits", "8", "--out", "FILE"], "--out"),
        (["--bits", "8", "--weight", "INT"], "W"),
        (["--bits", "8", "--weight", "MISSING"], "W"),
        (["--bits", "8", "--weight", "TEXT"], "W"),
        (["--bits", "8", "--weight", "ARCHIVE"], "W"),
        (["--bits", "8", "--weight", "BIG"], "--scales"),
    ],
)
def test_cli_bad_arguments_exit_2_naming_the_option(tmp_path, capsys, arguments, option):
    np.save(tmp_path / "W.npy", np.ones((2, 8), np.float32))
    np.save(tmp_path / "INT.npy", np.ones((2, 8), np.int32))
    np.save(tmp_path / "BIG.npy", np.full((2, 8), 1e8, np.float32))
    (tmp_path / "FILE").write_text("")
    (tmp_path / "TEXT.npy").write_text("1 2 3\n4 5 6\n")
    with open(tmp_path / "ARCHIVE.npy", "wb") as archive:  # (a path would gain .npz)
        np.savez(archive, W=np.ones((2, 8), np.float32))
    weight = "W"
    if "--weight" in arguments:
        weight = arguments[arguments.index("--weight") + 1]
        arguments = arguments[: arguments.index("--weight")]
    argv = ["quantize", str(tmp_path / f"{weight}.npy"), *arguments]
    out = str(tmp_path / "FILE") if "FILE" in arguments else str(tmp_path / "out")
    argv += [] if "--out" in arguments else ["--out", out]
    if "FILE" in arguments:
        argv[argv.index("FILE")] = out
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"autotune: error: argument {option}: ")
    assert "pickle" not in error


def test_cli_bad_argument_in_a_real_process(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "quantize", "nope.npy", "--bits", "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--out" in done.stderr


# --- every argument check names its field ---------------------------------------------------

GOOD = np.ones((2, 8), np.float32)

BAD = [
    (dict(W=[[1.0, 2.0]]), "W", "W must be a 2-D NumPy float array, got list"),
    (dict(W=np.ones(8, np.float32)), "W", "got shape (8,)"),
    (dict(W=np.ones((2, 2, 2), np.float32)), "W", "got shape (2, 2, 2)"),
    (dict(W=np.ones((0, 8), np.float32)), "W", "got shape (0, 8)"),
    (dict(W=np.ones((2, 8), np.int8)), "W", "got int8"),
    (dict(W=np.ones((2, 8), np.complex64)), "W", "got complex64"),
    (dict(W=np.array([[1.0, np.nan]])), "W", "W must be finite, got nan at [0, 1]"),
    (dict(W=np.array([[1.0], [-np.inf]])), "W", "got -inf at [1, 0]"),
    (dict(bits=2), "bits", "bits must be 4 or 8, got 2"),
    (dict(bits="8"), "bits", "bits must be 4 or 8, got '8'"),
    (dict(bits=True), "bits", "bits must be 4 or 8, got True"),
    (dict(bits=4), "group", "group is required for bits=4"),
    (dict(bits=4, group=16), "group", "group must be one of 32, 64, 128, got 16"),
    (dict(bits=4, group=32.0), "group", "got 32.0"),
    (dict(bits=8, group=32), "group", "group must be None for bits=8"),
    (dict(bits=8, zero_points=True), "zero_points", "zero_points are for bits=4 only"),
    (dict(bits=4, group=32, zero_points="yes"), "zero_points", "True or False, got 'yes'"),
    (dict(scales="bf16"), "scales", "scales must be 'f16' or 'f32', got 'bf16'"),
    (dict(scales=["f16"]), "scales", "got ['f16']"),
    (dict(W=np.full((2, 8), 1e7)), "scales", "scales 'f16' cannot hold the scale"),
    (dict(W=np.full((2, 64), 1e6), bits=4, group=32), "scales", "scales='f32' holds it, for other"),
    (dict(W=np.full((2, 8), 1e300), scales="f32"), "scales", "scales 'f32' cannot hold"),
]


@pytest.mark.parametrize("arguments, field, words", BAD)
def test_every_bad_argument_is_named(arguments, field, words):
    arguments = dict(W=GOOD, bits=8) | arguments
    with pytest.raises(ArgumentError) as raised:
        autotune.quantize(**arguments)
    assert raised.value.field == field and words in str(raised.value)


def test_save_names_its_bad_arguments(tmp_path):
    qw = quantize(GOOD)
    for name in ["", "1x", "a/b", "a\n", None]:
        with pytest.raises(ArgumentError, match="name") as raised:
            qw.save(tmp_path, name)
        assert raised.value.field == "name"
    (tmp_path / "file").write_text("")
    with pytest.raises(ArgumentError, match="not a folder") as raised:
        qw.save(tmp_path / "file", "w")
    assert raised.value.field == "folder"


def test_a_quantized_weight_is_read_only(weights):
    qw = quantize(weights, bits=4, group=32)
    with pytest.raises(ValueError, match="read-only"):
        qw.data[0, 0] = 0
    with pytest.raises(AttributeError):
        qw.bits = 8
    assert qw == quantize(weights, bits=4, group=32) and qw != quantize(weights, bits=8)
