"""Odd values for every public argument: unhashable ones, NumPy scalars, ints beyond any
float, non-finite or out-of-range floats, bools posing as numbers, repeated options.

Each is either accepted as the number it is (NumPy's scalars are numbers) or refused
with a ValueError subclass whose `field` names the argument; never a TypeError,
AttributeError or OverflowError from deeper down. On the command line: exit code 2
and one line naming the option.
"""

import subprocess
import sys

import numpy as np
import optuna
import pytest
from test_limits import WIDEST_COLUMNS

import autotune
from autotune.__main__ import main
from autotune.arguments import check_seconds
from autotune.kernel import check_operands
from autotune.problem import Problem, ProblemError, parse_shape
from autotune.tune import check_budget, check_storage, tune_many

F32 = np.ones((4, 4), np.float32)
HUGE = 10**400  # beyond any float
GIANT = 10**5000  # beyond what Python turns into text (4300 digits)


def _text(value, width=20):
    """A test id for `value` (an int of 5,000 digits has no repr)."""
    if isinstance(value, dict):
        return ",".join(f"{k}={_text(v)}" for k, v in value.items())
    if isinstance(value, int) and value.bit_length() > 64:
        return f"{'-' if value < 0 else ''}int of {value.bit_length()} bits"
    return repr(value)[:width]


def _refused(call, error, field):
    with pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, ValueError) and raised.value.field == field
    return str(raised.value)


# --- the reported cases ---------------------------------------------------------------


def test_matmul_alpha_beyond_any_float_names_alpha():
    words = _refused(lambda: autotune.matmul(F32, F32, alpha=HUGE), ProblemError, "alpha")
    assert "alpha must be within f32's range" in words


def test_lookup_with_a_list_for_dtype_names_dtype():
    words = _refused(lambda: autotune.lookup(4, 4, 4, ["f32"]), ProblemError, "dtype")
    assert "dtype ['f32'] is not supported" in words


@pytest.mark.parametrize("storage", [123, b"sqlite:///x.db", ["sqlite:///x.db"], object()])
def test_tune_storage_of_the_wrong_type_names_storage(tmp_path, storage):
    words = _refused(
        lambda: autotune.tune(4, 4, 4, trials=1, storage=storage, cache_dir=tmp_path),
        autotune.TuneError,
        "storage",
    )
    assert "storage must be None, a URL" in words


def test_storage_objects_and_urls_are_accepted(tmp_path):
    memory = optuna.storages.InMemoryStorage()
    assert check_storage(memory) is memory and check_storage(None) is None
    url = f"sqlite:///{tmp_path / 'study.db'}"
    assert isinstance(check_storage(url), optuna.storages.BaseStorage)


@pytest.mark.parametrize(
    "alpha", [np.int64(2), np.int8(-3), np.uint16(5), np.float32(0.5), np.float16(2)]
)
def test_numpy_scalars_are_numbers(gpu, cache_dir, alpha):
    rng = np.random.default_rng(0)
    A, B = rng.random((5, 3), np.float32), rng.random((3, 7), np.float32)
    expected = float(alpha) * (A.astype(np.float64) @ B)
    np.testing.assert_allclose(autotune.matmul(A, B, alpha=alpha), expected, rtol=1e-5)


# --- the class: every argument with the same kinds of odd values ----------------------

SCALARS_REFUSED = [
    (HUGE, "within f32's range"),
    (-HUGE, "within f32's range"),
    (GIANT, "within f32's range"),
    (1e39, "within f32's range"),  # finite in Python, inf as the kernel's f32 uniform
    (np.float64(-1e300), "within f32's range"),
    (float("nan"), "must be finite"),
    (np.float32("inf"), "must be finite"),
    (True, "must be a number"),
    (np.bool_(False), "must be a number"),
    ("2", "must be a number"),
    (None, "must be a number"),
    ([1.0], "must be a number"),
    (1 + 0j, "must be a number"),
]


@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize(
    "value, words", SCALARS_REFUSED, ids=[_text(v) for v, _ in SCALARS_REFUSED]
)
def test_alpha_and_beta_odd_values_are_refused_naming_them(name, value, words):
    call = lambda: check_operands(F32, F32, C=F32, **{name: value})  # noqa: E731
    assert words in _refused(call, ProblemError, name)


def test_alpha_and_beta_accept_every_numpy_number():
    for value in (np.int64(2), np.uint8(0), np.float16(1.5), np.float32(3.4e38), 3, -2.5):
        check_operands(F32, F32, C=F32, alpha=value, beta=value)


UNHASHABLE = [["f32"], {"f32": 1}, {"f32"}, np.array(["f32", "f16"]), bytearray(b"f32")]
PROBLEM_FIELDS = {
    "dtype": "dtype",
    "layout": "layout",
    "accumulate": "accumulate",
    "epilogue": "epilogue",
    "shared_b": "shared_b",
}


@pytest.mark.parametrize("argument", list(PROBLEM_FIELDS))
@pytest.mark.parametrize("value", UNHASHABLE, ids=lambda v: type(v).__name__)
def test_unhashable_and_array_values_name_the_argument(argument, value):
    if argument == "epilogue" and isinstance(value, list):
        value = [value]  # a list of strings is a valid epilogue; a nested one is not
    _refused(lambda: Problem(4, 4, 4, **{argument: value}), ProblemError, argument)


SIZES_REFUSED = [HUGE, GIANT, -HUGE, np.uint64(2**63), True, np.bool_(True), 4.0, np.float64(4)]


@pytest.mark.parametrize("name", ["M", "N", "K", "batch"])
@pytest.mark.parametrize("value", SIZES_REFUSED, ids=_text)
def test_sizes_beyond_int32_or_not_integers_are_refused(name, value):
    sizes = dict(M=4, N=4, K=4) | {name: value}
    field = "batch" if name == "batch" else "shape"
    _refused(lambda: Problem(**sizes), ProblemError, field)


def test_numpy_integers_are_sizes():
    assert Problem(np.int64(4), np.uint16(5), np.int8(6), batch=np.int32(2)).shape == "4x5x6"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(trials=HUGE), "trials"),
        (dict(trials=np.float64(3)), "trials"),
        (dict(trials=np.bool_(True)), "trials"),
        (dict(timeout=float("inf")), "timeout"),
        (dict(timeout=float("nan")), "timeout"),
        (dict(timeout=HUGE), "timeout"),
        (dict(timeout=True), "timeout"),
        (dict(candidate_timeout=GIANT), "candidate_timeout"),
        (dict(candidate_timeout=np.float32("inf")), "candidate_timeout"),
        (dict(seed=GIANT), "seed"),
        (dict(seed=np.bool_(False)), "seed"),
        (dict(compile_ahead=HUGE), "compile_ahead"),
        (dict(cache_dir=GIANT), "cache_dir"),
        (dict(checks=np.array([True, False])), "checks"),
        (dict(templates=[["naive"]]), "template"),
        (dict(templates=np.array(["naive", "tiled"])), "template"),
        (dict(templates=[np.array(["naive"])]), "template"),
        (dict(sampler=["tpe"]), "sampler"),
        (dict(sampler={"tpe": 1}), "sampler"),
        (dict(sampler=np.array(["tpe", "grid"])), "sampler"),
    ],
    ids=lambda v: _text(v) if isinstance(v, dict) else v,
)
def test_tune_odd_values_name_the_argument(tmp_path, kwargs, field):
    call = lambda: autotune.tune(4, 4, 4, **({"trials": 1, "cache_dir": tmp_path} | kwargs))  # noqa: E731
    _refused(call, autotune.TuneError, field)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(problems=[[4, 4, 4]]), "problems"),
        (dict(problems=[{"shape": "4x4x4"}]), "problems"),
        (dict(problems=4), "problems"),
        (dict(problems=np.array([Problem(4, 4, 4)])), "problems"),
        (dict(on_start=5), "on_start"),
        (dict(radius=np.bool_(True)), "radius"),
        (dict(radius=HUGE), "radius"),
    ],
    ids=lambda v: _text(v) if isinstance(v, dict) else v,
)
def test_tune_many_odd_values_name_the_argument(tmp_path, kwargs, field):
    arguments = dict(problems=[Problem(4, 4, 4)], trials=1, cache_dir=tmp_path) | kwargs
    error = ProblemError if field == "radius" else autotune.TuneError
    _refused(lambda: tune_many(**arguments), error, field)


def test_tune_budget_takes_numpy_numbers():
    assert check_budget(np.int64(3), np.float32(1.5)) == (3, 1.5)
    assert check_seconds("candidate_timeout", np.int16(2)) == 2.0


@pytest.mark.parametrize("activation", [["relu"], {"relu": 1}, np.array(["relu", "gelu"]), 1])
def test_matmul_activation_of_the_wrong_type_names_activation(activation):
    _refused(lambda: autotune.matmul(F32, F32, activation=activation), ProblemError, "activation")


def test_kernel_call_refuses_odd_scalars_naming_them(gpu, cache_dir):
    kernel = autotune.lookup(4, 4, 4, epilogue="alpha,beta")
    for name, value in (("alpha", HUGE), ("beta", np.float64(1e39)), ("alpha", np.bool_(True))):
        call = lambda name=name, value=value: kernel(F32, F32, F32, **{name: value})  # noqa: E731
        _refused(call, ProblemError, name)
    np.testing.assert_allclose(
        kernel(F32, F32, F32, alpha=np.int64(2), beta=np.float16(1)), 9 * F32
    )


def test_c_without_beta_is_refused_never_dropped(gpu, cache_dir):
    """C is read only with beta: a C passed without it, or to a kernel without beta in
    its epilogue, is refused naming what is missing (it was ignored); so is a call
    blamed on another epilogue input than the one that does not match."""
    text = _refused(lambda: autotune.matmul(F32, F32, F32), ProblemError, "beta")
    assert "C is given without beta" in text
    np.testing.assert_allclose(autotune.matmul(F32, F32, 2 * F32, beta=0.5), 5 * F32)
    np.testing.assert_allclose(autotune.matmul(F32, F32, F32 * np.nan, beta=0), 4 * F32)
    plain, with_beta = autotune.lookup(4, 4, 4), autotune.lookup(4, 4, 4, epilogue="beta")
    assert "no beta" in _refused(lambda: plain(F32, F32, F32), ProblemError, "C")
    _refused(lambda: with_beta(F32, F32, F32), ProblemError, "beta")
    _refused(lambda: with_beta(F32, F32, beta=1.0), ProblemError, "C")
    np.testing.assert_allclose(with_beta(F32, F32, F32, beta=0), 4 * F32)  # 0 is a value
    bias = np.zeros(4, np.float32)
    _refused(lambda: plain(F32, F32, bias=bias), ProblemError, "bias")
    _refused(lambda: plain(F32, F32, alpha=2.0), ProblemError, "alpha")
    _refused(lambda: plain(np.ones((5, 4), np.float32), F32), ProblemError, "shape")  # M


def test_export_name_that_is_an_array_names_name(gpu, cache_dir, tmp_path):
    kernel = autotune.lookup(4, 4, 4)
    call = lambda: autotune.export(kernel, tmp_path / "out", np.array(["a", "b"]))  # noqa: E731
    _refused(call, autotune.ExportError, "name")
    assert not (tmp_path / "out").exists()


# --- sizes written as text: ASCII digits, no leading zeros -----------------------------


@pytest.mark.parametrize("text", ["032x32x32", "00x1x1", "３２x32x32", "32x٣٢x32", "32x32x3²"])
def test_shapes_in_other_digits_or_with_leading_zeros_are_refused(text):
    with pytest.raises(ProblemError, match="is not of the form MxNxK") as raised:
        parse_shape(text)
    assert raised.value.field == "shape"


def test_a_shape_of_thousands_of_digits_is_refused_naming_the_size():
    with pytest.raises(ProblemError, match="K must be < 2\\*\\*31") as raised:
        parse_shape("4x4x" + "9" * 5000)
    assert raised.value.field == "shape"


# --- the command line --------------------------------------------------------------------

CLI = [
    (["lookup", "--shape", "4x4x4", "--shape", "8x8x8"], "argument --shape: given more than once"),
    (["demo", "--shape", "4x4x4", "--shape", "8x8x8"], "argument --shape: given more than once"),
    (["lookup", "--shape", "032x32x32"], "argument --shape: shape '032x32x32' is not of the form"),
    (
        ["lookup", "--shape", "３２x32x32"],
        "argument --shape: shape '３２x32x32' is not of the form",
    ),
    (["tune", "--shape", "4x4x4", "--trials", "10000000000"], "argument --trials: trials must be"),
    (["tune", "--shape", "4x4x4", "--seed", "99999999999"], "argument --seed: seed must be from"),
]


@pytest.mark.parametrize("argv, words", CLI, ids=[" ".join(a) for a, _ in CLI])
def test_cli_odd_values_exit_2_naming_the_option(capsys, tmp_path, argv, words):
    assert main([*argv, "--cache", str(tmp_path)] if argv[0] != "demo" else argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autotune: error: ") and words in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["lookup", "--shape", "64x64x64", "--batch", "100000"],
            "argument --batch: A (100000x64x64",
        ),
        (["lookup", "--shape", "8x8x8", "--batch", "100000"], "argument --batch: batch 100000 of"),
        (["lookup", "--shape", "100000x100000x1", "--batch", "2"], "argument --shape: C (2x100000"),
        (["demo", "--shape", "100000x100000x8"], "argument --shape: C (100000x100000 f32) needs"),
        (
            ["demo", "--shape", f"1x{WIDEST_COLUMNS * 65535 + 1}x1"],
            "max-compute-workgroups-per-dimension = 65535",
        ),
    ],
    ids=["batch over the buffer limit", "batch over the workgroup limit", "shape", "demo", "demo2"],
)
def test_limits_name_what_exceeds_them(gpu, capsys, cache_dir, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


def test_each_cache_warning_is_printed_once(gpu, tmp_path):
    """A cache file with a bad entry: one lookup reads the file more than once (exact
    match, then the nearest shapes) and used to print the warning each time."""
    import json

    from autotune import cache
    from autotune.device import versions
    from autotune.space import load_space

    store = cache.DeviceCache(tmp_path, gpu.fingerprint.as_dict(), versions())
    problem = Problem(32, 32, 32)
    config = load_space("naive").seed_configs(problem)[0]
    entry = cache.Entry(
        cache.Key.of(problem, config, True), config.as_dict(), 1e-4, 1e-4, 1e-4,
        "timestamp", 1.0, 1e-7,
    )  # fmt: skip
    store.put(entry)
    data = json.loads(store.path.read_text())
    data["entries"][str(entry.key)]["median_s"] = "fast"
    store.path.write_text(json.dumps(data))
    command = [sys.executable, "-m", "autotune", "lookup", "--shape", "64x64x64"]
    done = subprocess.run(
        [*command, "--cache", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("CacheWarning") == 1, done.stderr
    assert "median_s must be a number" in done.stderr
