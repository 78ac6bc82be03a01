"""The problem: C = A @ B with A of M x K and B of K x N, row-major.

Every other stage takes a Problem; it is validated once, here, so that a bad size or
dtype is reported with the argument's name before anything touches the GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# dtype name -> NumPy type of the arrays in and out, and the WGSL scalar type.
DTYPES = {"f32": (np.float32, "f32")}
LAYOUTS = ("nn",)  # A and B both row-major, not transposed


class ProblemError(ValueError):
    """A problem that cannot be computed: bad size, dtype, layout or too large."""


def check_size(name: str, value: object) -> int:
    """Return `value` as an int if it is a whole number >= 1, else raise naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ProblemError(f"{name} must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ProblemError(f"{name} must be >= 1, got {value}")
    if value > 2**31 - 1:
        raise ProblemError(f"{name} must be < 2**31, got {value}")
    return int(value)


def check_dtype(dtype: object) -> str:
    """Map a dtype given by name or NumPy type to its name ("f32"), or raise."""
    for name, (np_type, _) in DTYPES.items():
        if dtype == name or (dtype not in DTYPES and _same_numpy_type(dtype, np_type)):
            return name
    raise ProblemError(f"dtype {dtype!r} is not supported; supported: {', '.join(DTYPES)}")


def _same_numpy_type(dtype: object, np_type: type) -> bool:
    try:
        return np.dtype(dtype) == np.dtype(np_type)
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class Problem:
    """One GEMM: sizes, element type and layout."""

    M: int  # rows of A and C
    N: int  # columns of B and C
    K: int  # columns of A, rows of B
    dtype: str = "f32"
    layout: str = "nn"

    def __post_init__(self):
        for name in ("M", "N", "K"):
            object.__setattr__(self, name, check_size(name, getattr(self, name)))
        object.__setattr__(self, "dtype", check_dtype(self.dtype))
        if self.layout not in LAYOUTS:
            raise ProblemError(f"layout {self.layout!r} is not supported; supported: {LAYOUTS}")

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    @property
    def numpy_dtype(self) -> type:
        return DTYPES[self.dtype][0]

    @property
    def wgsl_type(self) -> str:
        return DTYPES[self.dtype][1]

    @property
    def itemsize(self) -> int:
        return np.dtype(self.numpy_dtype).itemsize

    @property
    def shape(self) -> str:
        return f"{self.M}x{self.N}x{self.K}"

    def __str__(self) -> str:
        return f"{self.shape} {self.dtype} {self.layout}"


_SHAPE = re.compile(r"^\s*(-?\d+)\s*[xX×]\s*(-?\d+)\s*[xX×]\s*(-?\d+)\s*$")


def parse_shape(text: str, dtype: str = "f32") -> Problem:
    """Parse "MxNxK" (e.g. "1024x1024x512") into a Problem."""
    match = _SHAPE.match(text)
    if not match:
        raise ProblemError(f"shape {text!r} is not of the form MxNxK, e.g. 1024x1024x1024")
    M, N, K = (int(g) for g in match.groups())
    return Problem(M, N, K, dtype)


# Keys a problem may have in a --shapes-from file, and the largest file we read.
PROBLEM_KEYS = ("shape", "M", "N", "K", "dtype", "name")
MAX_PROBLEMS_FILE_BYTES = 4 * 2**20


def problems_from_file(path, dtype: str = "f32") -> list[Problem]:
    """The problems a JSON or TOML file lists, duplicates dropped (the first is kept).

    JSON: a list of objects, or {"problems": [...]}; TOML: [[problems]] tables. Each
    problem has `shape = "MxNxK"` or M, N and K, and optionally `dtype` (default: the
    `dtype` argument) and `name` (a label, e.g. the layer it comes from, not used).
    """
    import json
    import tomllib
    from pathlib import Path

    path = Path(path)
    try:
        if path.stat().st_size > MAX_PROBLEMS_FILE_BYTES:
            raise ProblemError(f"{path} is larger than {MAX_PROBLEMS_FILE_BYTES} bytes")
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError, RecursionError) as error:  # decode errors are ValueErrors
        raise ProblemError(f"{path}: {str(error)[:200]}") from None
    if isinstance(data, dict) and set(data) == {"problems"}:
        data = data["problems"]
    if not isinstance(data, list) or not data:
        raise ProblemError(f"{path}: expected a non-empty list of problems (JSON) or [[problems]]")
    problems = []
    for index, item in enumerate(data):
        where = f"{path}: problem {index + 1}"
        if not isinstance(item, dict):
            raise ProblemError(f"{where} is not an object/table")
        unknown = sorted(set(item) - set(PROBLEM_KEYS))
        if unknown:
            raise ProblemError(f"{where}: unknown key {unknown[0]!r}; known: {PROBLEM_KEYS}")
        if not isinstance(item.get("name", ""), str) or len(item.get("name", "")) > 200:
            raise ProblemError(f"{where}: name must be a string of at most 200 characters")
        item_dtype = item.get("dtype", dtype)
        try:
            if "shape" in item:
                if any(k in item for k in "MNK") or not isinstance(item["shape"], str):
                    raise ProblemError('give either shape = "MxNxK" or M, N and K')
                problem = parse_shape(item["shape"], item_dtype)
            else:
                missing = [k for k in "MNK" if k not in item]
                if missing:
                    raise ProblemError(f"{', '.join(missing)} missing (or give shape)")
                problem = Problem(item["M"], item["N"], item["K"], item_dtype)
        except ProblemError as error:
            raise ProblemError(f"{where}: {error}") from None
        if problem not in problems:
            problems.append(problem)
    return problems
