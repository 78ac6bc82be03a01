"""Property-based fuzzing (Hypothesis) of the doors a user's input comes through.

- the cache file and its entries: any bytes, any JSON, any key text gives a skipped
  entry or a set-aside file with a CacheWarning, or a valid entry whose key is its own
  text; never another exception;
- the command line: any argument list built from the real options and hostile values
  exits 0, 1 (no adapter) or 2 with one line, never with a traceback;
- matmul's and lookup's arguments: a ValueError naming the argument, or a result
  within the documented tolerance of float64 (lookup: a kernel for exactly the problem
  asked, verified);
- export's name and folder: an ExportError naming the argument, or exactly the three
  files, inside the folder.

Fuzzed paths stay inside the test's folder.

CI runs a bounded number of examples (the "ci" profile, tests/conftest.py); a longer
local run, with what each test saw:
    HYPOTHESIS_PROFILE=long python -m pytest tests/test_fuzz.py --hypothesis-show-statistics
"""

import itertools
import json
import os
import string
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from entries import seed_entry
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

import autotune
from autotune import cache
from autotune.__main__ import main
from autotune.device import ADAPTER_ENV
from autotune.export import default_name
from autotune.kernel import check_operands
from autotune.key import Key
from autotune.problem import ACCUMULATE, DTYPES, LAYOUTS, Problem
from autotune.space import SpaceError, load_space, template_names
from autotune.verify import GELU_SLOPE, accumulation, output_rounding, tolerance, verify

# GPU examples cost a compile and a dispatch on lavapipe: a share of the profile's count
GPU_EXAMPLES = max(5, settings.default.max_examples // 2)

FINGERPRINT = {"device": "Fuzz GPU", "backend": "none", "vendor_id": 1, "device_id": 2}
VERSIONS = {"wgpu": "0.32.0"}


def _inside(root: Path, cwd: Path, token: object) -> bool:
    """True when `token`, read as a path from `cwd`, is inside `root`: the fuzzed paths
    must reach nothing else on the machine (absolute ones, or too many "..")."""
    if not isinstance(token, str):
        return True
    for text in (token, token.removeprefix("sqlite:///")):  # sqlite:///x: the file x
        path = os.path.normpath(os.path.join(cwd, text))
        if not (path + os.sep).startswith(str(root) + os.sep):
            return False
    return True


# --- the cache file ---------------------------------------------------------------------

SIZES = st.integers(1, 5000).map(str)
BAD_SIZES = st.sampled_from(["0", "-1", "1" * 11, "x", "", "1e3", " 8", "0x10"])
EPILOGUES = ["none", "bias", "bias,gelu", "alpha,beta,relu", "alpha"]


HEX12 = st.text("0123456789abcdef", min_size=12, max_size=12)  # a limited device's digest


@st.composite
def key_texts(draw) -> str:
    """Cache keys: valid ones made of the real parts, a third of them with one part
    replaced by a near miss or arbitrary text, and now and then any text at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=80))
    template = draw(st.sampled_from(template_names()))
    parts = [
        template,
        draw(st.integers(0, 2**64 - 1).map("{:016x}".format)),  # a kernel identity
        draw(st.sampled_from(["checks", "nochecks"])),
        draw(st.sampled_from(["f32", "f16", "f16-acc32", "f16-acc16"])),
        draw(st.sampled_from(LAYOUTS)),
        draw(st.sampled_from(["device", "portable"]) | HEX12.map("limited-{}".format)),
        "x".join(draw(st.lists(SIZES, min_size=3, max_size=3))),
    ]
    batch = draw(st.integers(1, 40))
    parts += [f"b{batch}" + draw(st.sampled_from(["", "s"])), draw(st.sampled_from(EPILOGUES))]
    if draw(st.integers(0, 9)) == 0:  # the 7 parts keys had before batch and epilogue
        parts = parts[:7]
    if draw(st.integers(0, 2)) == 0:
        index = draw(st.integers(0, len(parts) - 1))
        near = {  # near misses of each part
            1: st.text("0123456789abcdefABCDEF", max_size=17),
            3: st.sampled_from(["f32-acc16", "f16-acc", "f16-acc64", "F16", "f16-acc32 "]),
            5: st.sampled_from(
                [
                    "limited-",
                    "limited-ABCDEF012345",
                    "limited-0123456789a",
                    "limited-0123456789abc",
                    "limited-0123456789ab\n",
                    "limited-０123456789ab",
                    "Limited-0123456789ab",
                ]
            ),  # fmt: skip
            6: st.lists(SIZES | BAD_SIZES, min_size=2, max_size=4).map("x".join),
            7: st.sampled_from(["b0", "b01", "b1s", "b", "bs", "b2S", "b+2", "b1\n"]),
            8: st.sampled_from(["gelu,bias", "bias,bias", "relu,gelu", "", "none,bias"]),
        }.get(index, st.nothing())
        parts[index] = draw(near | st.text(max_size=12))
    return ":".join(parts)


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from([10**400, -(10**400), 2**63, 1e308, -0.0, "2024-01-01T00:00:00Z"])
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
ENTRY_FIELDS = [f for f in cache._FIELDS if f != "key"]


def valid_entry_json(problem: Problem, template: str = "naive") -> tuple[str, dict]:
    entry = seed_entry(problem, template, date="2024-01-01T00:00:00Z", origin="host")
    return str(entry.key), entry.to_json()


@st.composite
def entries(draw) -> tuple[str, object]:
    """(key text, entry data): a valid entry of a random problem, half of them with some
    fields changed, dropped or added; now and then an arbitrary key and value."""
    if draw(st.integers(0, 9)) == 0:
        return draw(key_texts()), draw(JSON_VALUES)
    M, N, K = (draw(st.integers(1, 64)) for _ in range(3))
    variant = draw(
        st.sampled_from([{}, dict(dtype="f16"), dict(layout="nt", batch=3, epilogue="bias")])
    )
    problem = Problem(M, N, K, **variant)
    templates = [t for t in template_names() if load_space(t).seed_configs(problem)]
    key, data = valid_entry_json(problem, draw(st.sampled_from(templates)))
    if draw(st.booleans()):
        for name in draw(st.lists(st.sampled_from(ENTRY_FIELDS), max_size=2)):
            data[name] = draw(JSON_VALUES)
        for name in draw(st.lists(st.sampled_from(ENTRY_FIELDS + ["key"]), max_size=2)):
            data.pop(name, None)
        if draw(st.integers(0, 5)) == 0:
            data[draw(st.text(max_size=8))] = draw(JSON_VALUES)
        if draw(st.integers(0, 3)) == 0:
            key = draw(key_texts())
            data["key"] = key if draw(st.booleans()) else data.get("key")
    return key, data


def _check_entry(text_key: str, entry: cache.Entry) -> None:
    """A parsed entry: its key is its own text, and it survives a round trip."""
    assert str(entry.key) == text_key
    again = cache.Entry.from_json(text_key, json.loads(json.dumps(entry.to_json())))
    assert again == entry
    json.dumps(entry.to_json(), allow_nan=False)  # finite numbers only


@given(key_texts())
def test_fuzz_cache_keys_parse_to_themselves_or_are_refused(text):
    try:
        key = Key.parse(text)
    except ValueError:  # (SpaceError is a ValueError too)
        event("refused")
        return
    event("parsed")
    assert str(key) == text
    assert Key.parse(str(key)) == key


@given(entries())
def test_fuzz_cache_entries_are_valid_or_refused(item):
    text_key, data = item
    try:
        entry = cache.Entry.from_json(text_key, data)
    except (ValueError, SpaceError) as error:
        event(f"refused: {str(error)[:30]}")
        return
    event("parsed")
    _check_entry(text_key, entry)


@st.composite
def cache_documents(draw) -> bytes:
    """A cache file's bytes: arbitrary bytes, arbitrary JSON, or a cache document with
    fuzzed entries (and now and then a fuzzed header)."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.binary(max_size=200))
    if kind == 1:
        return json.dumps(draw(JSON_VALUES)).encode()
    document = {
        "schema": 1,
        "fingerprint": FINGERPRINT,
        "versions": VERSIONS,
        "entries": dict(draw(st.lists(entries(), max_size=4))),
    }
    if kind == 2:
        document[draw(st.sampled_from(sorted(document) + ["extra"]))] = draw(JSON_VALUES)
    return json.dumps(document).encode()


_folders = itertools.count()


@given(cache_documents())
def test_fuzz_cache_file_gives_valid_entries_or_warnings(tmp_path, content):
    store = cache.DeviceCache(tmp_path / str(next(_folders)), FINGERPRINT, VERSIONS)
    store.folder.mkdir()
    store.path.write_bytes(content)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = store.entries()
    assert all(issubclass(w.category, cache.CacheWarning) for w in caught), caught
    event(f"{len(found)} valid entries, {len(caught)} warnings")
    for text_key, entry in found.items():
        _check_entry(text_key, entry)
    # whatever the file held, the cache works afterwards
    key, data = valid_entry_json(Problem(40, 40, 40))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cache.CacheWarning)
        store.put(cache.Entry.from_json(key, data))
        assert key in store.entries()


# --- the command line -------------------------------------------------------------------

SHAPE_OPTIONS = ["--shape", "--dtype", "--layout", "--batch", "--shared-b", "--epilogue"]
SHAPE_OPTIONS += ["--accumulate", "--checks", "--cache"]
OPTIONS = {
    "tune": SHAPE_OPTIONS
    + ["--shapes-from", "--model", "--radius", "--trials", "--timeout", "--template"]
    + ["--sampler", "--storage", "--seed", "--gpus", "--adapter"],
    "lookup": SHAPE_OPTIONS + ["--json", "--wgsl", "--adapter"],
    "export": SHAPE_OPTIONS + ["--out", "--portable", "--trials", "--adapter"],
    "demo": ["--shape", "--adapter"],
    "devices": ["--adapter"],
    "cache": ["merge", "--out"],
}
FLAGS = {"--shared-b", "--json", "--wgsl", "--portable", "--help", "-h"}
GOOD_VALUES = {
    "--shape": ["4x4x4", "8x5x3", "1x1x1"],
    "--dtype": list(DTYPES),
    "--layout": list(LAYOUTS),
    "--batch": ["1", "2"],
    "--epilogue": ["none", "bias", "bias,gelu", "alpha,beta,relu"],
    "--accumulate": list(ACCUMULATE),
    "--checks": ["on", "off"],
    "--cache": ["cache", "deeper/cache"],
    "--shapes-from": ["shapes.json", "shapes.toml"],
    "--model": ["shapes.json"],
    "--radius": ["0", "1.5"],
    "--trials": ["1", "3"],
    "--timeout": ["0.5"],
    "--template": template_names(),
    "--sampler": ["climb", "tpe", "random", "grid"],
    "--storage": ["sqlite:///study.db"],
    "--seed": ["0", "7"],
    "--out": ["out", "merged.json"],
    "--gpus": ["1", "all", "2", "0,1"],
    "--adapter": ["no adapter has this name", "llvmpipe:99"],  # (none reaches a GPU)
}
# Hostile values, by the kind of option. Special files: "zero" links to /dev/zero, "fifo"
# is a named pipe (never a storage URL: SQLite would wait on it). Not here: network
# storage URLs (a connection attempt takes seconds).
HOSTILE = [
    "", " ", "-", "--", "-1", "0", "1e400", "nan", "inf", "-inf", "1" * 30, "0x4x4",
    "4x4", "4x4x4x4", "4x4x-4", "99999999999x1x1", "4 x 4 x 4", "４x4x4", "4x4x4\n",
    "f64", "F32", "relu,relu", "gelu,relu", "bias,", ",", "none,bias", "tanh", "--shape",
    "--out", "merge", "-h", "a\nb",
]  # fmt: skip
HOSTILE_PATHS = [
    "", ".", "..", "/", "a\x00b", "a\nb", "shapes.json", "bad.json", "folder", "missing.json",
    "file.txt", "file.txt/below", "cache.json", "x" * 300, "x/" * 3000, "-x", "~", "zero",
    "fifo", "fifo/x",
]  # fmt: skip
TOKENS = st.sampled_from(HOSTILE) | st.text(string.printable, max_size=10) | st.text(max_size=6)
PATHS = st.sampled_from(HOSTILE_PATHS) | st.text("ab./-~ \n\x00", max_size=10)
SQLITE_FILES = PATHS.filter(lambda path: "fifo" not in path).map(lambda p: "sqlite:///" + p)
STORAGE_URLS = st.sampled_from(["", "sqlite://", "nosuch://x", "sqlite:///folder"]) | SQLITE_FILES
HOSTILE_VALUES = {name: PATHS for name in ("--cache", "--out", "--shapes-from", "--model")}
HOSTILE_VALUES["--storage"] = STORAGE_URLS
# ("0" would be a real adapter: the fixture's AUTOTUNE_ADAPTER keeps every GPU out)
HOSTILE_VALUES["--adapter"] = st.sampled_from(["", " ", "a:b", ":1", "x:", "99", "-1", "a\nb"])


@pytest.fixture
def cli_folder(tmp_path, monkeypatch, cache_dir):
    """A folder with the files the fuzzed options name, as the working directory (one
    level below tmp_path, so ".." stays inside it); no adapter (AUTOTUNE_ADAPTER names
    none), so nothing reaches a GPU or starts a tune."""
    tmp_path = tmp_path / "here"
    tmp_path.mkdir()
    (tmp_path / "shapes.json").write_text('[{"shape": "4x4x4"}, {"M": 8, "N": 4, "K": 2}]')
    (tmp_path / "shapes.toml").write_text('[[problems]]\nshape = "4x4x4"\n')
    (tmp_path / "bad.json").write_text('{"problems": [{"shape": 4}]')
    (tmp_path / "file.txt").write_text("not a folder")
    (tmp_path / "folder").mkdir()
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    key, data = valid_entry_json(Problem(8, 8, 8))
    document = {"schema": 1, "fingerprint": FINGERPRINT, "versions": VERSIONS}
    (tmp_path / "cache.json").write_text(json.dumps(document | {"entries": {key: data}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ADAPTER_ENV, "no adapter has this name")
    return tmp_path


@st.composite
def argument_lists(draw) -> list[str]:
    """A command and options: mostly good ones with a few hostile values among them (so
    that a hostile value is what the command meets), sometimes anything."""
    command = draw(st.sampled_from(sorted(OPTIONS)) if draw(st.integers(0, 9)) else TOKENS)
    argv = [command] if command != "cache" else ["cache", "merge", draw(PATHS)]
    if command in ("tune", "lookup", "export", "demo") and draw(st.integers(0, 3)):
        argv += ["--shape", draw(st.sampled_from(GOOD_VALUES["--shape"]))]
    if command == "export" and draw(st.integers(0, 3)):
        argv += ["--out", "out"]
    names = OPTIONS.get(command, []) + ["--help"] * (draw(st.integers(0, 20)) == 0)
    all_names = sorted({n for options in OPTIONS.values() for n in options})
    for _ in range(draw(st.integers(0, 5))):
        name = draw(st.sampled_from(names) if names and draw(st.integers(0, 5)) else TOKENS)
        if draw(st.integers(0, 9)) == 0:
            name = draw(st.sampled_from(all_names))  # another command's option
        argv.append(name)
        if name not in FLAGS and draw(st.integers(0, 9)):
            good = GOOD_VALUES.get(name)
            hostile = HOSTILE_VALUES.get(name, TOKENS)
            use_good = good and draw(st.integers(0, 2))
            argv.append(draw(st.sampled_from(good) if use_good else hostile))
    return argv


def _run_cli(argv, capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit:  # --help: argparse prints the usage and exits 0
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


@given(argument_lists())
def test_fuzz_cli_exits_0_1_or_2_with_one_line(cli_folder, capsys, argv):
    assume(all(_inside(cli_folder.parent, cli_folder, token) for token in argv))
    code, out, err = _run_cli(argv, capsys)
    assert code in (0, 1, 2), (argv, code, err)
    if code == 0:
        assert not err, (argv, err)
        return
    assert err.startswith("autotune: error: "), (argv, err)
    assert len(err.rstrip("\n").splitlines()) == 1, (argv, err)
    if code == 1:  # only the missing adapter (the fixture names none) ends with 1
        assert "matches no adapter" in err, (argv, err)


@settings(max_examples=max(3, GPU_EXAMPLES // 3))
@given(
    shape=st.tuples(*[st.integers(1, 24)] * 3).map(lambda s: "x".join(map(str, s))),
    options=st.lists(
        st.sampled_from(
            [
                ["--dtype", "f16"],
                ["--layout", "nt"],
                ["--layout", "tt"],
                ["--batch", "2"],
                ["--shared-b"],
                ["--epilogue", "bias,gelu"],
                ["--epilogue", "alpha,beta,relu"],
                ["--accumulate", "f32"],
                ["--checks", "off"],
                ["--json"],
            ]
        ),
        max_size=4,
        unique_by=lambda option: option[0],
    ),
)
def test_fuzz_cli_lookup_on_the_adapter(gpu, cache_dir, capsys, shape, options):
    argv = ["lookup", "--shape", shape, *[token for option in options for token in option]]
    code, out, err = _run_cli(argv, capsys)
    assert code in (0, 2), (argv, err)
    if code == 2:
        assert err.startswith("autotune: error: argument --") and err.count("\n") == 1, err
    elif "--json" in argv:
        assert json.loads(out)["shape"] == shape
    else:
        assert "source" in out


# --- matmul's arguments -----------------------------------------------------------------

MATMUL_FIELDS = {"A", "B", "C", "bias", "alpha", "beta", "activation", "trans_a", "trans_b"}
MATMUL_FIELDS |= {"accumulate", "checks", "shape", "dtype", "batch"}
SCALARS = st.sampled_from([1.0, 0.0, 1, 0, -1, 0.5, -2.5, 3, np.float32(1.5), np.float64(-0.25)])
SCALARS |= st.floats(1e-3, 8) | st.floats(-8, -1e-3)
BAD_SCALARS = [True, None, "2", 1j, float("nan"), float("inf"), [1.0], np.int64(2), 1e39]
BAD_SCALARS += [10**400]
MEMORY_LAYOUTS = ["C", "F", "strided", "reversed", "read-only"]
BAD_ARGUMENTS = ["dtype", "B dtype", "inner", "batch", "trans", "alpha", "beta", "C", "bias"]
BAD_ARGUMENTS += ["activation", "accumulate", "checks"]


def _stored(rng, shape, dtype, how):
    """An array of `shape` laid out `how` in memory (the values do not depend on it)."""
    data = rng.uniform(-1, 1, shape).astype(dtype)
    if how == "F":
        return np.asfortranarray(data)
    if how == "strided":  # every other element of a larger array
        big = np.zeros(tuple(2 * s for s in shape), dtype)
        view = big[tuple(slice(None, None, 2) for _ in shape)]
        view[...] = data
        return view
    if how == "reversed":
        return data[::-1].copy()[::-1]
    if how == "read-only":
        data.flags.writeable = False
    return data


@st.composite
def matmul_calls(draw) -> dict:
    """matmul's keyword arguments: most calls valid (every layout, batch, epilogue and
    memory layout of the operands), one in three with one bad argument."""
    bad = draw(st.sampled_from(BAD_ARGUMENTS)) if draw(st.integers(0, 2)) == 0 else None
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    if bad == "dtype":
        dtype = draw(st.sampled_from([np.float64, np.int32, np.complex64, np.dtype(">f4")]))
    M, N, K = (draw(st.integers(1, 40)) for _ in range(3))
    batch = draw(st.sampled_from([None, None, 1, 2, 3]))
    trans_a, trans_b = draw(st.booleans()), draw(st.booleans())
    a_shape = (K, M) if trans_a else (M, K)
    inner = int(bad == "inner")  # inner dimensions that differ
    b_shape = (N, K + inner) if trans_b else (K + inner, N)
    lead = () if batch is None else (batch,)
    shared = batch is not None and draw(st.booleans())
    store = st.sampled_from(MEMORY_LAYOUTS)
    call = {
        "A": _stored(rng, lead + a_shape, dtype, draw(store)),
        "B": _stored(rng, (() if shared else lead) + b_shape, dtype, draw(store)),
    }
    if bad == "B dtype":
        call["B"] = call["B"].astype(np.float64 if dtype != np.float64 else np.float32)
    if bad == "batch" and batch:
        call["B"] = _stored(rng, (batch + 1,) + b_shape, dtype, "C")
    if trans_a or draw(st.booleans()):
        call["trans_a"] = trans_a if bad != "trans" else draw(st.sampled_from([1, "t", None]))
    if trans_b:
        call["trans_b"] = True
    for name in ("alpha", "beta"):
        if draw(st.booleans()):
            call[name] = draw(SCALARS if bad != name else st.sampled_from(BAD_SCALARS))
    if "beta" in call or draw(st.integers(0, 5)) == 0:
        c_shape = (M + 1, N) if bad == "C" else lead + (M, N)
        call["C"] = _stored(rng, c_shape, dtype, draw(store))
    if bad == "bias" or draw(st.booleans()):
        call["bias"] = _stored(rng, (N,) if bad != "bias" else (N, 1), dtype, "C")
    if bad == "activation" or draw(st.booleans()):
        good = ["relu", "gelu"]
        call["activation"] = draw(st.sampled_from(good if bad != "activation" else ["tanh", ""]))
    if bad == "accumulate" or draw(st.integers(0, 3)) == 0:
        good = list(ACCUMULATE) if dtype == np.float16 else ["auto", "f32"]
        call["accumulate"] = draw(st.sampled_from(good if bad != "accumulate" else ["f64", None]))
    if bad == "checks" or draw(st.integers(0, 5)) == 0:
        call["checks"] = False if bad != "checks" else "yes"
    return call


def _expected(call: dict) -> tuple[np.ndarray, np.ndarray]:
    """The float64 result of a valid call and the scale its error is bounded by
    (autotune.verify: the sizes of the terms summed, through the activation's slope)."""
    A = call["A"].astype(np.float64)
    B = call["B"].astype(np.float64)
    A = np.swapaxes(A, -1, -2) if call.get("trans_a") else A
    B = np.swapaxes(B, -1, -2) if call.get("trans_b") else B
    alpha, beta = float(call.get("alpha", 1.0)), float(call.get("beta", 0.0))
    want = alpha * (A @ B)
    scale = abs(alpha) * np.sqrt((A * A) @ (B * B))
    if beta != 0:
        C = call["C"].astype(np.float64)
        want, scale = want + beta * C, scale + np.abs(beta * C)
    if "bias" in call:
        bias = call["bias"].astype(np.float64)
        want, scale = want + bias, scale + np.abs(bias)
    if call.get("activation") == "relu":
        want = np.maximum(want, 0.0)
    elif call.get("activation") == "gelu":
        want = 0.5 * want * (1 + np.tanh(0.7978845608028654 * (want + 0.044715 * want**3)))
        scale = GELU_SLOPE * scale
    return want, scale


@settings(max_examples=GPU_EXAMPLES)
@given(matmul_calls())
def test_fuzz_matmul_is_refused_by_name_or_right(gpu, cache_dir, call):
    before = {k: v.copy() for k, v in call.items() if isinstance(v, np.ndarray)}
    try:
        got = autotune.matmul(**call)
    except ValueError as error:
        event(f"refused: {getattr(error, 'field', None)}")
        assert getattr(error, "field", None) in MATMUL_FIELDS, (error, getattr(error, "field", 0))
        return
    for name, value in before.items():  # C is read, not written
        assert np.array_equal(call[name], value, equal_nan=True), name
    event("computed")
    want, scale = _expected(call)
    # beyond the output format's range NumPy overflows too: not what is checked here
    assume(np.all(np.abs(want) <= np.finfo(got.dtype).max))
    assert got.dtype == call["A"].dtype and got.shape == want.shape, (got.shape, want.shape)
    # the kernel matmul used (lookup is memoized): its accumulation sets the tolerance
    operands = {k: v for k, v in call.items() if k not in ("accumulate", "checks")}
    problem = replace(check_operands(**operands)[1], accumulate=call.get("accumulate", "auto"))
    kernel = autotune.lookup(**problem.arguments, checks=call.get("checks", True))
    limit = tolerance(problem, accumulation(problem, kernel.config))
    # (the output's own rounding: half its spacing at each stored value, subnormals too)
    bound = limit * scale + output_rounding(got, got.dtype)
    error = np.abs(got.astype(np.float64) - want)
    assert np.all(np.isfinite(got)) and np.all(error <= bound), np.max(error - bound)


LOOKUP_FIELDS = {"shape", "dtype", "layout", "batch", "shared_b", "epilogue", "accumulate"}
LOOKUP_FIELDS |= {"checks", "portable", "cache_dir"}


def _either(good, bad):
    """Mostly a good value, one time in eight a bad one."""
    return st.integers(0, 7).flatmap(lambda n: good if n else bad)


@st.composite
def lookup_calls(draw) -> dict:
    size = _either(st.integers(1, 40), st.sampled_from([0, -1, 2**31, 1.5, "8", True, None]))
    call = {name: draw(size) for name in "MNK"}
    dtypes = st.sampled_from(["f32", "f16", np.float32, np.float16, "float16", np.dtype("f4")])
    bad_dtypes = st.sampled_from(["f64", np.float64, None, 3, "F32", "f32 ", ["f32"]])
    bad_strings = st.sampled_from(["", "NN", "nn\n", None, 1, "b", "auto,"])
    options = {
        "dtype": _either(dtypes, bad_dtypes),
        "layout": _either(st.sampled_from(LAYOUTS), bad_strings),
        "batch": _either(st.integers(1, 3), st.sampled_from([0, 2.0, "2", 2**31])),
        "shared_b": _either(st.booleans(), st.sampled_from([1, "yes", None])),
        "epilogue": _either(
            st.sampled_from(["none", "", None, "bias", "alpha,beta", "relu", ["bias", "gelu"]]),
            st.sampled_from(["tanh", "relu,gelu", "bias,bias", 5, ["bias", 1], "bias;relu"]),
        ),
        "accumulate": _either(st.sampled_from(["auto", "f32", "f16"]), bad_strings),
        "checks": _either(st.booleans(), st.sampled_from(["on", 1, None])),
        "portable": _either(st.booleans(), st.sampled_from(["yes", 0])),
        "cache_dir": _either(st.sampled_from([None, "cache"]), st.sampled_from(["", 3, "FILE"])),
    }
    for name, values in options.items():
        if draw(st.booleans()):
            call[name] = draw(values)
    return call


@settings(max_examples=GPU_EXAMPLES)
@given(lookup_calls())
def test_fuzz_lookup_is_refused_by_name_or_computes_its_problem(gpu, tmp_path, call):
    """lookup: a ValueError naming the argument, or a kernel for exactly that problem
    which computes it right (verified against float64 on fresh random data)."""
    (tmp_path / "FILE").write_text("not a folder")
    if call.get("cache_dir") in ("cache", "FILE"):
        call["cache_dir"] = str(tmp_path / call["cache_dir"])
    try:
        kernel = autotune.lookup(**call, gpu=gpu)
    except ValueError as error:
        event(f"refused: {getattr(error, 'field', None)}")
        assert getattr(error, "field", None) in LOOKUP_FIELDS, (error, getattr(error, "field", 0))
        return
    event("kernel")
    variant = {k: v for k, v in call.items() if k not in ("M", "N", "K", "checks", "portable")}
    variant.pop("cache_dir", None)
    assert kernel.problem == Problem(call["M"], call["N"], call["K"], **variant)
    assert kernel.checks == call.get("checks", True)
    assert verify(kernel.compiled, gpu).ok


# --- export's name and folder -----------------------------------------------------------

VALID_NAME = r"[A-Za-z][A-Za-z0-9_-]{0,99}"  # export's rule for a bundle's name
NAMES = st.one_of(
    st.from_regex(VALID_NAME, fullmatch=True),
    st.text(max_size=12),
    st.text(string.ascii_letters + "_-./\\ \n\x00", min_size=1, max_size=12),
    st.sampled_from(["gemm", "a" * 100, "a" * 101, "..", "a/b", "con", "gemm\n", "-x"]),
    st.none(),
)
FOLDERS = st.one_of(
    st.lists(
        st.sampled_from(["out", "a b", "..", ".", "x" * 80, "file.txt", "deep"]), max_size=3
    ).map(lambda parts: "/".join(parts)),
    st.text(string.ascii_letters + "./\\ \x00", max_size=10),
    st.sampled_from(["", None, 3, b"out", "x" * 300]),
)


@pytest.fixture(scope="module")
def small_kernel(gpu):
    return autotune.lookup(8, 12, 4, gpu=gpu)


def _tree(root) -> set:
    return {p.relative_to(root) for p in root.rglob("*")}


@given(name=NAMES, folder=FOLDERS)
def test_fuzz_export_refuses_by_name_or_writes_exactly_its_files(
    small_kernel, tmp_path, monkeypatch, name, folder
):
    root = tmp_path / str(next(_folders))
    here = root / "a" / "b" / "here"  # the working directory
    assume(_inside(root, here, folder))
    here.mkdir(parents=True)
    (here / "file.txt").write_text("a file, not a folder")
    monkeypatch.chdir(here)
    before = _tree(root)
    try:
        paths = autotune.export(small_kernel, folder, name)
    except autotune.ExportError as error:
        event(f"refused: {error.field}")
        assert error.field in ("name", "out_dir"), error
        assert not [p for p in _tree(root) - before if (root / p).is_file()]  # nothing written
        return
    event("written")
    stem = name or default_name(small_kernel)
    out = (here / folder).resolve()
    written = {kind: path.resolve() for kind, path in paths.items()}
    assert written == {kind: out / f"{stem}.{kind}" for kind in ("wgsl", "json", "js")}
    new_files = {(root / p).resolve() for p in _tree(root) - before if (root / p).is_file()}
    assert new_files == set(written.values())
