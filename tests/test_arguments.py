"""Every argument of the API and the CLI, with its bad values: each is refused with a
message that names the argument and what it allows (CLI: exit code 2, one line)."""

import numpy as np
import pytest

import autotune
from autotune.__main__ import main
from autotune.arguments import ArgumentError
from autotune.problem import ProblemError

F32 = np.ones((4, 4), np.float32)

TUNE = [
    (dict(M=0), ProblemError, "M must be >= 1, got 0"),
    (dict(N="8"), ProblemError, "N must be an integer >= 1, got '8'"),
    (dict(K=2**31), ProblemError, "K must be < 2**31"),
    (dict(dtype="f64"), ProblemError, "dtype 'f64' is not supported; supported: f32"),
    (dict(trials=0), "trials", "trials must be an integer >= 1, got 0"),
    (dict(trials=1.5), "trials", "trials must be an integer >= 1, got 1.5"),
    (dict(trials=True), "trials", "trials must be an integer >= 1, got True"),
    (dict(timeout=-1), "timeout", "timeout must be a number of seconds > 0, got -1"),
    (dict(timeout="10"), "timeout", "timeout must be a number of seconds > 0, got '10'"),
    (dict(trials=None, timeout=None), "trials", "give trials, timeout or both"),
    (dict(templates=["nope"]), "template", "template 'nope' is unknown; known: blocked, "),
    (dict(templates="naive"), "template", "templates must be a list of template names"),
    (dict(checks="no"), "checks", "checks must be True or False, got 'no'"),
    (dict(sampler="annealing"), "sampler", "sampler 'annealing' is unknown; known: tpe, "),
    (dict(storage="nosuchdb://x"), "storage", "storage 'nosuchdb://x' cannot be opened"),
    (dict(cache_dir="FILE"), "cache_dir", "exists and is not a folder"),
    (dict(cache_dir=42), "cache_dir", "cache_dir must be a folder path, got 42"),
    (dict(cache_dir="a\0b"), "cache_dir", "cache_dir 'a\\x00b' contains a NUL character"),
    (dict(seed="1"), "seed", "seed must be an integer or None, got '1'"),
    (dict(seed=-1), "seed", "seed must be from 0 to 2**32 - 1, got -1"),
    (dict(gpu="llvmpipe"), "gpu", "gpu must be an autotune.Gpu or None, got str"),
    (dict(on_trial=5), "on_trial", "on_trial must be callable or None, got 5"),
    (dict(portable="yes"), "portable", "portable must be True or False, got 'yes'"),
    (dict(candidate_timeout=0), "candidate_timeout", "candidate_timeout must be a number of"),
    (dict(compile_ahead=-1), "compile_ahead", "compile_ahead must be None or an integer 0..4"),
    (dict(compile_ahead=9), "compile_ahead", "compile_ahead must be None or an integer 0..4"),
    (dict(compile_ahead=1.0), "compile_ahead", "compile_ahead must be None or an integer"),
    (dict(gpus="some"), "gpus", "gpus must be 'all', a count >= 1 or adapter indices"),
    (dict(gpus=[0, 0]), "gpus", "gpus [0, 0] names an adapter twice"),
    (dict(gpus=[0, 99]), "gpus", "gpus [0, 99]: there is no adapter 99"),
    (dict(gpus=[0, 0], repeat_gpus=1), "repeat_gpus", "repeat_gpus must be True or False"),
    (
        dict(layout="xn"),
        (ProblemError, "layout"),
        "layout 'xn' is not supported; supported: nn, nt",
    ),
    (dict(batch=0), (ProblemError, "batch"), "batch must be >= 1, got 0"),
    (dict(shared_b="yes"), (ProblemError, "shared_b"), "shared_b must be True or False, got 'yes'"),
    (dict(epilogue="tanh"), (ProblemError, "epilogue"), "epilogue operation 'tanh' is unknown"),
    (dict(epilogue="relu,gelu"), (ProblemError, "epilogue"), "has two activations"),
    (dict(epilogue=5), (ProblemError, "epilogue"), "epilogue must be a comma-separated string"),
    (dict(accumulate="f64"), (ProblemError, "accumulate"), "accumulate 'f64' is not one of auto"),
    (
        dict(dtype="f16", templates=["blocked", "tiled"]),
        (ProblemError, "template"),
        "blocked, tiled compute only the plain problem (f32, nn, one matrix, no epilogue)",
    ),  # fmt: skip
    (dict(accumulate="f16"), (ProblemError, "accumulate"), "accumulate f16 needs dtype f16"),
    (
        dict(dtype="f16", accumulate="f16", layout="nt", weights="q8", activations="q8"),
        (ProblemError, "accumulate"),
        "accumulate f16 does not go with activations q8",
    ),
]

LOOKUP = [
    (dict(M=-1), ProblemError, "M must be >= 1, got -1"),
    (dict(K=2.5), ProblemError, "K must be an integer >= 1, got 2.5"),
    (dict(dtype="float64"), ProblemError, "dtype 'float64' is not supported; supported: f32"),
    (dict(checks="on"), "checks", "checks must be True or False, got 'on'"),
    (dict(portable=1), "portable", "portable must be True or False, got 1"),
    (dict(cache_dir="FILE"), "cache_dir", "exists and is not a folder"),
    (dict(gpu=object()), "gpu", "gpu must be an autotune.Gpu or None, got object"),
    (dict(gpu=True), "gpu", "gpu must be an autotune.Gpu or None, got bool"),
    (dict(cache_dir="a\0b"), "cache_dir", "cache_dir 'a\\x00b' contains a NUL character"),
    (dict(layout="TN"), (ProblemError, "layout"), "layout 'TN' is not supported"),
    (dict(batch=1.5), (ProblemError, "batch"), "batch must be an integer >= 1, got 1.5"),
    (dict(epilogue=["bias", "bias"]), (ProblemError, "epilogue"), "repeats an operation"),
    (dict(epilogue="bias;relu"), (ProblemError, "epilogue"), "operation 'bias;relu' is unknown"),
    (dict(epilogue="gelu,bias"), (ProblemError, "epilogue"), "out of order: the operations apply"),
    (dict(epilogue=["beta", "alpha"]), (ProblemError, "epilogue"), "write 'alpha,beta'"),
]

MATMUL = [
    (dict(A=[[1.0]]), ProblemError, "A must be a numpy.ndarray, got list"),
    (dict(A=np.ones(4, np.float32)), ProblemError, "A must be 2-D or 3-D, got 1-D"),
    (dict(B=np.ones((1, 4, 4), np.float32)), (ProblemError, "B"), "B must be 2-D, got 3-D"),
    (
        dict(A=np.ones((2, 4, 4), np.float32), B=np.ones((3, 4, 4), np.float32)),
        ProblemError,
        "A and B must have one batch count, got 2 and 3",
    ),  # fmt: skip
    (dict(activation="tanh"), (ProblemError, "activation"), "activation 'tanh' is unknown"),
    (dict(bias=np.ones(3, np.float32)), (ProblemError, "bias"), "bias must be (4,) float32, got"),
    (dict(bias=np.ones(4)), (ProblemError, "bias"), "bias must be (4,) float32, got (4,) float64"),
    (dict(beta=0.5), (ProblemError, "C"), "beta != 0 needs C, the addend"),
    (dict(alpha="2"), (ProblemError, "alpha"), "alpha must be a number, got '2'"),
    (dict(beta=float("inf"), C=F32), (ProblemError, "beta"), "beta must be finite, got inf"),
    (dict(alpha=1e39), (ProblemError, "alpha"), "alpha must be within f32's range"),
    (dict(beta=-1e39, C=F32), (ProblemError, "beta"), "beta must be within f32's range"),
    (dict(trans_b="yes"), "trans_b", "trans_b must be True or False, got 'yes'"),
    (dict(B=np.ones((4, 5), np.float32), trans_b=True), ProblemError, "inner dimensions differ"),
    (dict(B=np.ones((4, 4))), ProblemError, "A and B must have one dtype"),
    (dict(B=np.ones((5, 4), np.float32)), ProblemError, "inner dimensions differ"),
    (dict(A=np.ones((0, 4), np.float32)), ProblemError, "A must not be empty"),
    (dict(checks="off"), "checks", "checks must be True or False, got 'off'"),
]

EXPORT = [
    (dict(kernel="gemm.wgsl"), "kernel", "kernel must be an autotune.Kernel"),
    (dict(name="../x"), "name", "name '../x' must be a letter then letters, digits"),
    (dict(name=7), "name", "name 7 must be a letter"),
    (dict(out_dir="FILE"), "out_dir", "exists and is not a folder"),
    (dict(out_dir=None), "out_dir", "out_dir must be a folder path, got None"),
    (dict(out_dir="a\0b"), "out_dir", "out_dir 'a\\x00b' contains a NUL character"),
]


def _check(call, kwargs, expected, words, tmp_path, error_type=ArgumentError):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    kwargs = {
        k: (str(a_file) if isinstance(v, str) and v == "FILE" else v) for k, v in kwargs.items()
    }
    # expected: an error type, a field of `error_type`, or (error type, field)
    error, field = (expected, None) if isinstance(expected, type) else (error_type, expected)
    if isinstance(expected, tuple):
        error, field = expected
    with pytest.raises(error) as raised:
        call(**kwargs)
    assert words in str(raised.value)
    if field is not None:
        assert raised.value.field == field


def _ids(table):
    return [
        f"{next(iter(k))}={next(iter(k.values()))!r:.20}" + ("+" if len(k) > 1 else "")
        for k, _, _ in table
    ]


@pytest.mark.parametrize("kwargs, expected, words", TUNE, ids=_ids(TUNE))
def test_tune_arguments(kwargs, expected, words, tmp_path, gpu):
    # (the adapter: some values are judged against it, f16 against its features)
    def call(M=8, N=8, K=8, **rest):
        return autotune.tune(M, N, K, **({"trials": 1, "cache_dir": tmp_path} | rest))

    _check(call, kwargs, expected, words, tmp_path, autotune.TuneError)


@pytest.mark.parametrize("kwargs, expected, words", LOOKUP, ids=_ids(LOOKUP))
def test_lookup_arguments(gpu, kwargs, expected, words, tmp_path):
    def call(M=8, N=8, K=8, **rest):
        return autotune.lookup(M, N, K, **rest)

    _check(call, kwargs, expected, words, tmp_path)


@pytest.mark.parametrize("kwargs, expected, words", MATMUL, ids=_ids(MATMUL))
def test_matmul_arguments(gpu, kwargs, expected, words, tmp_path):
    def call(A=F32, B=F32, **rest):
        return autotune.matmul(A, B, **rest)

    _check(call, kwargs, expected, words, tmp_path)


@pytest.mark.parametrize("kwargs, expected, words", EXPORT, ids=_ids(EXPORT))
def test_export_arguments(gpu, kwargs, expected, words, tmp_path, cache_dir):
    def call(kernel=None, out_dir=tmp_path / "out", name=None):
        return autotune.export(kernel or autotune.lookup(4, 4, 4), out_dir, name)

    _check(call, kwargs, expected, words, tmp_path, autotune.ExportError)
    assert not (tmp_path / "out").exists()  # nothing written


CLI = [
    (["tune", "--shape", "0x4x4"], "argument --shape: M must be >= 1, got 0"),
    (["tune", "--shape", "4x4"], "argument --shape: shape '4x4' is not of the form MxNxK"),
    (["tune", "--shape", "4x-4x4"], "argument --shape: N must be >= 1, got -4"),
    (["tune", "--shape", "big"], "argument --shape: shape 'big' is not of the form MxNxK"),
    (["tune", "--shape", "4x4x4", "--trials", "x"], "argument --trials: must be an integer"),
    (["tune", "--shape", "4x4x4", "--storage", "sqlite:////nonexistent/dir/x.db"], "--storage:"),
    (["tune", "--shape", "4x4x4x4"], "argument --shape: shape '4x4x4x4' is not of the form"),
    (["tune", "--shape", "4x4x99999999999"], "argument --shape: K must be < 2**31"),
    (["tune", "--shape", "4x4x4", "--dtype", "f64"], "argument --dtype: invalid choice: 'f64'"),
    (["tune", "--shape", "4x4x4", "--trials", "0"], "argument --trials: must be an integer >= 1"),
    (["tune", "--shape", "4x4x4", "--trials", "1.5"], "argument --trials: must be an integer"),
    (["tune", "--shape", "4x4x4", "--timeout", "-3"], "argument --timeout: must be a number"),
    (["tune", "--shape", "4x4x4", "--timeout", "inf"], "argument --timeout: must be a number"),
    (["tune", "--shape", "4x4x4", "--template", "nope"], "argument --template: invalid choice"),
    (["tune", "--shape", "4x4x4", "--checks", "maybe"], "argument --checks: invalid choice"),
    (["tune", "--shape", "4x4x4", "--sampler", "magic"], "argument --sampler: invalid choice"),
    (["tune", "--shape", "4x4x4", "--storage", "nosuchdb://x"], "argument --storage: storage"),
    (["tune", "--shape", "4x4x4", "--cache", "FILE"], "argument --cache: cache_dir '"),
    (["tune", "--shape", "4x4x4", "--cache", "a\0b"], "--cache: cache_dir 'a\\x00b' contains"),
    (["tune", "--shape", "4x4x4", "--shapes-from", ""], "argument --shapes-from: "),
    (["tune", "--shape", "4x4x4", "--cache", "x" * 256], "--cache: cache_dir 'xxx"),
    (["export", "--shape", "4x4x4", "--out", "x" * 256], "--out: out_dir 'xxx"),
    (["cache", "merge", "ok.json", "--out", "x" * 256], "--out: out 'xxx"),
    (["tune", "--shapes-from", "no\nfile\u2028"], "argument --shapes-from: no\\nfile\\u2028"),
    (["tune", "--shape", "4x4x4", "--seed", "x"], "argument --seed: invalid int value: 'x'"),
    (["tune", "--shape", "4x4x4", "--gpus", "0"], "argument --gpus: gpus must be 'all', a co"),
    (["tune", "--shape", "4x4x4", "--gpus", "1,1"], "argument --gpus: gpus '1,1' names an ad"),
    (["tune", "--shape", "4x4x4", "--adapter", "x:"], "argument --adapter: adapter must be an"),
    (["lookup", "--shape", "4x4x4", "--adapter", "99"], "argument --adapter: adapter '99' is o"),
    (["export", "--shape", "4x4x4", "--out", "o", "--adapter", ":1"], "argument --adapter: "),
    (["devices", "--adapter", "no-such-gpu"], "argument --adapter: adapter 'no-such-gpu' matc"),
    (["tune", "--shape", "4x4x4", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["tune"], "argument --shape: required: give --shape MxNxK (repeatable), --shapes-from F"),
    (["tune", "--shapes-from", "nope.json"], "argument --shapes-from: nope.json: [Errno 2]"),
    (["tune", "--shapes-from", "FILE"], "argument --shapes-from: FILE: Expecting value"),
    (["tune", "--shapes-from", "empty.json"], "expected a non-empty list of problems"),
    (
        ["tune", "--shapes-from", "bad.toml"],
        "problem 2: unknown key 'layer'; known: shape, M, N, K",
    ),
    (["tune", "--shapes-from", "zero.json"], "problem 1: M must be >= 1, got 0"),
    (["tune", "--shapes-from", "both.json"], 'problem 1: give either shape = "MxNxK" or M, N'),
    (["tune", "--shapes-from", "text.json"], "problem 1: N must be an integer >= 1, got '4'"),
    (["tune", "--shapes-from", "f64.json"], "problem 1: dtype 'f64' is not supported"),
    (["tune", "--shapes-from", "xx.json"], "problem 1: layout 'xx' is not supported"),
    (["tune", "--shapes-from", "big.json"], "argument --shapes-from: big.json: B (8192x8192"),
    (["tune", "--model", "big.json"], "argument --model: big.json: B (8192x8192 f32) needs"),
    (["tune", "--model", "nope.json"], "argument --model: nope.json: [Errno 2]"),
    (["tune", "--model", "xx.json"], "argument --model: xx.json: problem 1: layout 'xx'"),
    (["tune", "--model", "f64.json", "--radius", "-1"], "argument --model: f64.json: problem 1"),
    (["tune", "--model", "ok.json", "--radius", "-1"], "argument --radius: radius must be a"),
    (["tune", "--model", "ok.json", "--radius", "nan"], "argument --radius: radius must be a"),
    (["tune", "--model", "ok.json", "--radius", "x"], "argument --radius: invalid float value"),
    (["tune", "--shape", "4x4x4", "--radius", "1"], "argument --radius: only with --model"),
    (["tune", "--model", "ok.json", "--shape", "4x4x4"], "argument --model: not with --shape"),
    (["cache"], "the following arguments are required: action"),
    (["cache", "merge", "--out", "m.json"], "the following arguments are required: FILE"),
    (["cache", "merge", "FILE", "--out", "m.json"], "argument FILE: FILE: Expecting value"),
    (["cache", "merge", "nope.json", "--out", "m.json"], "argument FILE: nope.json: [Errno 2]"),
    (["lookup", "--shape", "1x1x0"], "argument --shape: K must be >= 1, got 0"),
    (["lookup", "--shape", "4x4x4", "--dtype", "f64"], "argument --dtype: invalid choice"),
    (["tune", "--shape", "4x4x4", "--layout", "xx"], "argument --layout: invalid choice: 'xx'"),
    (["tune", "--shape", "4x4x4", "--batch", "0"], "argument --batch: must be an integer >= 1"),
    (["tune", "--shape", "4x4x4", "--epilogue", "tanh"], "argument --epilogue: epilogue operati"),
    (["lookup", "--shape", "4x4x4", "--epilogue", "relu,gelu"], "argument --epilogue: epilogue"),
    (["export", "--shape", "4x4x4", "--out", "d", "--epilogue", "x"], "argument --epilogue: "),
    (["tune", "--shape", "4x4x4", "--accumulate", "f64"], "argument --accumulate: invalid choi"),
    (["tune", "--shape", "4x4x4", "--accumulate", "f16"], "argument --accumulate: accumulate f1"),
    (["lookup", "--shape", "4x4x4", "--checks", "x"], "argument --checks: invalid choice"),
    (["lookup", "--shape", "4x4x4", "--cache", "FILE"], "argument --cache: cache_dir '"),
    (["lookup"], "the following arguments are required: --shape"),
    (["export", "--shape", "4x4x4", "--out", "FILE"], "argument --out: out_dir '"),
    (["export", "--shape", "4x4x4", "--out", "a\0b"], "--out: out_dir 'a\\x00b' contains"),
    (["export", "--shape", "4x4x4"], "the following arguments are required: --out"),
    (["export", "--shape", "x", "--out", "d"], "argument --shape: shape 'x' is not of the form"),
    (["export", "--shape", "4x4x4", "--out", "d", "--trials", "0"], "argument --trials: must"),
    (["export", "--shape", "4x4x4", "--out", "d", "--timeout", "0"], "argument --timeout: must"),
    (["tune", "--shape", "64x64x64", "--template", "gemv"], "(gemv: decode_shapes: M <= 16)"),
    (["tune", "--shape", "4x4x4", "--epilogue", "gelu,bias"], "'gelu,bias' is out of order"),
    (["demo", "--shape", "0x1x1"], "argument --shape: M must be >= 1, got 0"),
    (["demo", "--shape", ""], "argument --shape: shape '' is not of the form MxNxK"),
    (["lookup", "--shape", ""], "argument --shape: shape '' is not of the form MxNxK"),
    (["devices", "extra"], "unrecognized arguments: extra"),
    (["devices", "a\nb", "c\rd"], "unrecognized arguments: a\\nb c\\rd"),  # one line
    (["frobnicate"], "argument command: invalid choice: 'frobnicate'"),
    ([], "the following arguments are required: command"),
]


@pytest.mark.parametrize("argv, words", CLI, ids=[" ".join(a) or "nothing" for a, _ in CLI])
def test_cli_arguments(capsys, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)  # (export --out d would write here)
    (tmp_path / "FILE").write_text("not a folder")
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "bad.toml").write_text('[[problems]]\nshape = "4x4x4"\n[[problems]]\nlayer = 1\n')
    (tmp_path / "zero.json").write_text('[{"M": 0, "N": 4, "K": 4}]')
    (tmp_path / "both.json").write_text('[{"shape": "4x4x4", "M": 4}]')
    (tmp_path / "text.json").write_text('[{"M": 4, "N": "4", "K": 4}]')
    (tmp_path / "f64.json").write_text('[{"shape": "4x4x4", "dtype": "f64"}]')
    (tmp_path / "xx.json").write_text('[{"shape": "4x4x4", "layout": "xx"}]')
    (tmp_path / "ok.json").write_text('[{"shape": "4x4x4"}]')
    (tmp_path / "big.json").write_text('[{"shape": "16x8192x8192"}]')  # B: 256 MiB
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("autotune: error: ") and words in err
