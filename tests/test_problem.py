import numpy as np
import pytest

from autotune.problem import Problem, ProblemError, parse_shape


def test_parse_shape():
    assert parse_shape("1024x512x7") == Problem(1024, 512, 7)
    assert parse_shape(" 3 X 4 x 5 ") == Problem(3, 4, 5)


@pytest.mark.parametrize(
    "text, words",
    [
        ("0x1x1", "M must be >= 1"),
        ("1x-2x1", "N must be >= 1"),
        ("1x1", "MxNxK"),
        ("axbxc", "MxNxK"),
        ("", "MxNxK"),
        ("1x1x99999999999", r"K must be < 2\*\*31"),
    ],
)
def test_parse_shape_rejects(text, words):
    with pytest.raises(ProblemError, match=words):
        parse_shape(text)


@pytest.mark.parametrize("dtype", ["f64", "float64", np.float64, np.int32, "int8", None])
def test_unsupported_dtype_names_the_supported_ones(dtype):
    with pytest.raises(ProblemError, match="supported: f32"):
        Problem(2, 2, 2, dtype)


def test_dtype_accepts_numpy_spelling():
    assert Problem(2, 2, 2, np.float32).dtype == "f32"
    assert Problem(2, 2, 2, "float32").dtype == "f32"


@pytest.mark.parametrize("value", [1.5, "3", True, None])
def test_sizes_must_be_integers(value):
    with pytest.raises(ProblemError, match="M must be an integer"):
        Problem(value, 1, 1)


def test_flops_and_shape():
    p = Problem(2, 3, 4)
    assert p.flops == 48 and p.shape == "2x3x4" and p.itemsize == 4
