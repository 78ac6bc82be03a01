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
