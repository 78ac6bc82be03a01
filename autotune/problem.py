"""The problem: C = epilogue(op(A) @ op(B)), per batch item, as transformer layers use it.

The plain problem is C = A @ B with A of M x K and B of K x N, row-major f32. Its
variants (each a field of Problem, each part of the cache key):
- dtype "f16": f16 inputs and output (the adapter must have `shader-f16`).
- layout "nn", "nt", "tn", "tt": A, then B, row-major as above ("n") or stored transposed
  ("t": A as K x M, B as N x K), so y = x @ W.T with W stored [N, K] is layout "nt".
- batch > 1: A, B and C are stacks of `batch` matrices; `shared_b`: one B for all.
- epilogue: a subset of alpha (C = alpha * A@B), beta (+ beta * C's old value), bias
  (+ a vector of N, per column), and one activation, relu or gelu (tanh approximation),
  listed and applied in that order. alpha and beta are runtime values (a uniform), not
  baked in.
- accumulate (f16 only): "auto" lets the tuner choose f32 or f16 accumulation (its ACC
  parameter) by speed; "f32" or "f16" pins it, for users who choose by accuracy.
- weights "q8", "q4g32", "q4g64", "q4g128" (4-bit with "z": zero points): B is a linear
  layer's weight quantized by autotune.quantize (docs/QUANTIZED.md), stored N x K (layout
  "nt"): the packed codes (uint32), their f16 scales and zero points. The kernel computes
  with the dequantized weight; A, C and the bias keep the dtype.
- activations "q8" (with quantized weights): each row of A is quantized to int8 too, by the
  kernel before its product (quantize.quantize_activations: a power-of-two scale per row,
  so the codes are exact), and the product is summed in integers (dot4I8Packed).

Every other stage takes a Problem; it is validated once, here, so that a bad size,
dtype or variant is reported with the argument's name before anything touches the GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from .arguments import ArgumentError, is_integer, shown
from .quantize import parse_format

# dtype name -> NumPy type of the arrays in and out, and the WGSL scalar type.
DTYPES = {"f32": (np.float32, "f32"), "f16": (np.float16, "f16")}
# A then B: "n" as in C = A @ B (A is M x K, B is K x N), "t" stored transposed.
LAYOUTS = ("nn", "nt", "tn", "tt")
# Epilogue operations in the order they apply; at most one activation.
EPILOGUE_OPS = ("alpha", "beta", "bias", "relu", "gelu")
ACTIVATIONS = ("relu", "gelu")
ACCUMULATE = ("auto", "f32", "f16")
ACTIVATION_FORMATS = ("none", "q8")  # A as given, or quantized per row to int8
MAX_BATCH = 2**31 - 1


class ProblemError(ArgumentError):
    """A problem that cannot be computed: bad size, dtype, layout or too large. `field`
    names the argument (the CLI prints it as an option: --shape, --dtype, --layout...)."""


def check_size(name: str, value: object) -> int:
    """Return `value` as an int if it is a whole number >= 1, else raise naming `name`."""
    field = "batch" if name == "batch" else "shape"
    if not is_integer(value):
        raise ProblemError(field, f"{name} must be an integer >= 1, got {shown(value)}")
    if value < 1:
        raise ProblemError(field, f"{name} must be >= 1, got {shown(value)}")
    if value > 2**31 - 1:
        raise ProblemError(field, f"{name} must be < 2**31, got {shown(value)}")
    return int(value)


def check_dtype(dtype: object) -> str:
    """Map a dtype given by name or NumPy type to its name ("f32"), or raise."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    for name, (np_type, _) in DTYPES.items():
        if _same_numpy_type(dtype, np_type):
            return name
    # a NumPy dtype as NumPy writes it: "dtype 'int32'" (">f4" big-endian), not "dtype dtype(...)"
    named = repr(str(dtype)) if isinstance(dtype, np.dtype) else shown(dtype)
    raise ProblemError("dtype", f"dtype {named} is not supported; supported: {', '.join(DTYPES)}")


def check_layout(layout: object) -> str:
    # a str first: `in` compares an array element-wise and hashes a dict's keys
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ProblemError(
            "layout",
            f"layout {shown(layout, 40)} is not supported; supported: {', '.join(LAYOUTS)} "
            "(A then B; n: as in A @ B, t: stored transposed)",
        )
    return layout


def check_epilogue(epilogue: object) -> str:
    """ "bias,gelu", ["bias", "gelu"], "" or None -> the canonical "bias,gelu" ("none":
    nothing after the product)."""
    if epilogue is None or (isinstance(epilogue, str) and epilogue in ("", "none")):
        return "none"
    if isinstance(epilogue, str):
        ops = [op.strip() for op in epilogue.split(",")]
    elif isinstance(epilogue, list | tuple) and all(isinstance(op, str) for op in epilogue):
        ops = list(epilogue)
    else:
        raise ProblemError(
            "epilogue",
            f"epilogue must be a comma-separated string or a list, got {shown(epilogue, 40)}",
        )
    for op in ops:
        if op not in EPILOGUE_OPS:
            raise ProblemError(
                "epilogue",
                f"epilogue operation {shown(op, 40)} is unknown; known: {', '.join(EPILOGUE_OPS)}",
            )
    if len(set(ops)) != len(ops) or len(set(ops) & set(ACTIVATIONS)) > 1:
        raise ProblemError(
            "epilogue",
            f"epilogue {shown(epilogue)} repeats an operation or has two activations",
        )
    canonical = [op for op in EPILOGUE_OPS if op in ops]
    if ops != canonical:  # "gelu,bias" could mean the activation first: never reorder it
        raise ProblemError(
            "epilogue",
            f"epilogue {shown(epilogue)} is out of order: the operations apply as "
            f"{', '.join(EPILOGUE_OPS[:3])}, then the activation; write {','.join(canonical)!r}",
        )
    return ",".join(canonical) or "none"


def _same_numpy_type(dtype: object, np_type: type) -> bool:
    try:
        return bool(np.dtype(dtype) == np.dtype(np_type))
    except Exception:  # np.dtype() raises TypeError, ValueError, KeyError... for odd input
        return False


@dataclass(frozen=True)
class Problem:
    """One GEMM: sizes, element type, layout, batch and epilogue (see the module doc)."""

    M: int  # rows of C
    N: int  # columns of C
    K: int  # the summed dimension
    dtype: str = "f32"
    layout: str = "nn"
    batch: int = 1  # matrices per operand
    shared_b: bool = False  # one B for the whole batch (batch > 1 only)
    epilogue: str = "none"  # canonical, e.g. "alpha,beta,bias,gelu"
    accumulate: str = "auto"  # f16: "auto" (tuned), "f32" or "f16" (pinned)
    weights: str = "none"  # B's format: "none" (the dtype), or quantized ("q4g128"...)
    activations: str = "none"  # "q8": A quantized per row by the kernel (quantized weights)

    def __post_init__(self):
        for name in ("M", "N", "K", "batch"):
            object.__setattr__(self, name, check_size(name, getattr(self, name)))
        object.__setattr__(self, "dtype", check_dtype(self.dtype))
        object.__setattr__(self, "layout", check_layout(self.layout))
        if not isinstance(self.shared_b, bool | np.bool_):
            raise ProblemError(
                "shared_b", f"shared_b must be True or False, got {shown(self.shared_b, 40)}"
            )
        # one B for a batch of one is the plain problem: one name for one problem
        object.__setattr__(self, "shared_b", bool(self.shared_b) and self.batch > 1)
        object.__setattr__(self, "epilogue", check_epilogue(self.epilogue))
        if not isinstance(self.accumulate, str) or self.accumulate not in ACCUMULATE:
            raise ProblemError(
                "accumulate",
                f"accumulate {shown(self.accumulate, 40)} is not one of {', '.join(ACCUMULATE)}",
            )
        if self.dtype == "f32" and self.accumulate == "f16":
            raise ProblemError("accumulate", "accumulate f16 needs dtype f16")
        if self.dtype == "f32":  # f32 accumulates in f32: one name for one problem
            object.__setattr__(self, "accumulate", "auto")
        self._check_weights()
        self._check_activations()

    def _check_activations(self) -> None:
        if not isinstance(self.activations, str) or self.activations not in ACTIVATION_FORMATS:
            raise ProblemError(
                "activations",
                f"activations {shown(self.activations, 40)} is not one of "
                f"{', '.join(ACTIVATION_FORMATS)}",
            )
        if self.activations == "q8" and not self.quantized:
            raise ProblemError(
                "activations",
                "activations q8 (int8 dot products) need quantized weights (weights q8, q4g128...)",
            )
        if self.activations == "q8" and self.accumulate == "f16":
            raise ProblemError(
                "accumulate",
                "accumulate f16 does not go with activations q8: int8 products sum in i32 "
                "(give auto or f32)",
            )

    def _check_weights(self) -> None:
        if self.weights == "none":
            return
        try:
            parse_format(self.weights)
        except ArgumentError as error:
            raise ProblemError("weights", str(error)) from None
        if self.layout != "nt":
            raise ProblemError(
                "layout",
                f"quantized weights ({self.weights}) are stored N x K: layout nt (A M x K "
                f"row-major, B a linear layer's weight), not {self.layout}",
            )
        if self.batch > 1 and not self.shared_b:
            raise ProblemError(
                "shared_b",
                "quantized weights are one weight for the whole batch: give shared_b "
                f"(batch {self.batch})",
            )

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K * self.batch

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

    @property
    def trans_a(self) -> bool:
        return self.layout[0] == "t"

    @property
    def trans_b(self) -> bool:
        return self.layout[1] == "t"

    @property
    def ops(self) -> tuple[str, ...]:
        return () if self.epilogue == "none" else tuple(self.epilogue.split(","))

    @property
    def activation(self) -> str | None:
        return next((op for op in self.ops if op in ACTIVATIONS), None)

    @property
    def plain(self) -> bool:
        """f32, nn, one matrix, no epilogue: the problem every template computes."""
        return self.variant == ("f32", "nn", 1, False, "none", "auto", "none", "none")

    @property
    def variant(self) -> tuple:
        """Everything but the shape."""
        return (
            self.dtype,
            self.layout,
            self.batch,
            self.shared_b,
            self.epilogue,
            self.accumulate,
            self.weights,
            self.activations,
        )

    @property
    def variant_arguments(self) -> dict:
        """The variant fields beside M, N, K and dtype, as lookup's and tune's keywords."""
        return dict(
            layout=self.layout,
            batch=self.batch,
            shared_b=self.shared_b,
            epilogue=self.epilogue,
            accumulate=self.accumulate,
            weights=self.weights,
            activations=self.activations,
        )

    @property
    def answered_by(self) -> tuple[Problem, ...]:
        """The problems whose tuned kernels compute this one: itself, and for f16 with
        the accumulation left to the tuner ("auto"), each pinned accumulation too (the
        tuner's choice is whichever of them is faster)."""
        if self.dtype == "f16" and self.accumulate == "auto":
            pins = ("f32",) if self.activations == "q8" else ("f16", "f32")
            return (self,) + tuple(replace(self, accumulate=a) for a in pins)
        return (self,)

    @property
    def arguments(self) -> dict:
        """The whole problem as lookup's and tune's keywords: M, N, K, dtype, variant."""
        return dict(M=self.M, N=self.N, K=self.K, dtype=self.dtype) | self.variant_arguments

    @property
    def arithmetic(self) -> tuple[str, str, str]:
        """What sets a kernel's rate of arithmetic: its element type, weight and
        activation formats (f16 runs faster than f32, int8 dot products faster still)."""
        return self.dtype, self.weights, self.activations

    @property
    def dtype_text(self) -> str:
        """ "f16", or "f16-acc32" / "f16-acc16" with the accumulation pinned; ".q4g128"
        after it with quantized weights, then ".a8" with quantized activations."""
        text = self.dtype + ("" if self.accumulate == "auto" else f"-acc{self.accumulate[1:]}")
        text += "" if self.weights == "none" else f".{self.weights}"
        return text + ("" if self.activations == "none" else ".a8")

    @property
    def quantized(self) -> bool:
        return self.weights != "none"

    @property
    def weight_format(self) -> tuple[int, int | None, bool]:
        """(bits, group, zero points) of quantized weights (quantize.parse_format)."""
        return parse_format(self.weights)

    @property
    def padded_k(self) -> int:
        """K as the quantized weight stores it (a multiple of 4 for q8, of the group for
        4-bit; padded with codes of 0); K itself for unquantized weights."""
        if not self.quantized:
            return self.K
        bits, group, _ = self.weight_format
        step = 4 if bits == 8 else group
        return -(-self.K // step) * step

    @property
    def batch_text(self) -> str:
        """ "b8" (8 matrices each), "b8s" (one B shared by 8 A matrices)."""
        return f"b{self.batch}" + ("s" if self.shared_b else "")

    def matrix_shapes(self) -> dict[str, tuple[int, ...]]:
        """The arrays in memory (row-major), with the batch dimension when batched.
        Quantized weights: B is the packed codes (N x words), with `scales` and, for
        zero points, `zeros` (operand_dtypes gives each array's element type)."""
        M, N, K = self.M, self.N, self.K
        a = (K, M) if self.trans_a else (M, K)
        b = (N, K) if self.trans_b else (K, N)
        lead = (self.batch,) if self.batch > 1 else ()
        shapes = {"A": lead + a, "B": (b if self.shared_b else lead + b), "C": lead + (M, N)}
        if "bias" in self.ops:
            shapes["bias"] = (N,)
        if self.quantized:
            bits, group, zero_points = self.weight_format
            shapes["B"] = (N, self.padded_k * bits // 32)
            shapes["scales"] = (N,) if bits == 8 else (N, self.padded_k // group)
            if zero_points:
                shapes["zeros"] = (N, -(-self.padded_k // group // 8))
        return shapes

    def operand_dtypes(self) -> dict[str, type]:
        """Each array's NumPy element type (matrix_shapes' names): the dtype's, and for
        quantized weights uint32 codes and zero points and float16 scales."""
        types = dict.fromkeys(self.matrix_shapes(), self.numpy_dtype)
        if self.quantized:
            types.update(B=np.uint32, scales=np.float16)
            types.update({"zeros": np.uint32} if "zeros" in types else {})
        return types

    def __str__(self) -> str:
        text = f"{self.shape} {self.dtype_text} {self.layout}"
        if self.batch > 1:
            text += f" batch {self.batch}" + (" shared B" if self.shared_b else "")
        if self.epilogue != "none":
            text += f" epilogue {self.epilogue}"
        return text


def shape_distance(a: Problem, b: Problem) -> float:
    """How far apart two shapes are: the summed |log| ratios of M, N and K (0: the same;
    ln 2 = 0.69: twice as large in one dimension)."""
    return sum(abs(math.log(x / y)) for x, y in ((a.M, b.M), (a.N, b.N), (a.K, b.K)))


# ASCII digits only (\d and int() accept any script's digits, e.g. full-width "３２"),
# and no leading zeros: one text for one size, as in cache keys.
SIZE = r"-?(?:0|[1-9][0-9]*)"
_SHAPE = re.compile(rf"\s*({SIZE})\s*[xX×]\s*({SIZE})\s*[xX×]\s*({SIZE})\s*", re.ASCII)


def parse_shape(text: str, dtype: str = "f32", **variant) -> Problem:
    """Parse "MxNxK" (e.g. "1024x1024x512") into a Problem (with `variant` fields)."""
    match = _SHAPE.fullmatch(text) if isinstance(text, str) else None
    if not match:
        raise ProblemError(
            "shape",
            f"shape {shown(text)} is not of the form MxNxK (sizes in digits 0-9, no leading "
            "zeros), e.g. 1024x1024x1024",
        )
    for name, digits in zip("MNK", match.groups(), strict=True):
        if len(digits) > 12:  # int() refuses texts of over 4300 digits; no size needs 12
            raise ProblemError(
                "shape", f"{name} must be < 2**31, got a number of {len(digits)} digits"
            )
    M, N, K = (int(g) for g in match.groups())
    return Problem(M, N, K, dtype, **variant)


# Keys a problem may have in a --shapes-from file, and the largest file we read.
VARIANT_KEYS = (
    "layout", "batch", "shared_b", "epilogue", "accumulate", "weights", "activations",
)  # fmt: skip
PROBLEM_KEYS = ("shape", "M", "N", "K", "dtype", *VARIANT_KEYS, "name")
MAX_PROBLEMS_FILE_BYTES = 4 * 2**20


def problems_from_file(path, dtype: str = "f32", **variant) -> list[Problem]:
    """The problems a JSON or TOML file lists, duplicates dropped (the first is kept);
    see named_problems_from_file for the format."""
    return list(
        dict.fromkeys(problem for _, problem in named_problems_from_file(path, dtype, **variant))
    )


def named_problems_from_file(path, dtype: str = "f32", **variant) -> list[tuple[str, Problem]]:
    """Each problem a JSON or TOML file lists with its name ("" where it has none), in
    the file's order, duplicates kept (a layer's gate and up projections share a shape).

    JSON: a list of objects, or {"problems": [...]}; TOML: [[problems]] tables. Each
    problem has `shape = "MxNxK"` or M, N and K, and optionally `dtype`, `layout`,
    `batch`, `shared_b`, `epilogue`, `accumulate`, `weights`, `activations` (defaults:
    the `dtype` and `variant` arguments, as the CLI's options give them) and `name` (a
    label, e.g. the layer it comes from).
    """
    import json
    import tomllib
    from pathlib import Path

    from .files import read_limited

    path = Path(path)
    try:  # a regular file (not /dev/zero, not a FIFO), read at most to the limit
        text = read_limited(path, MAX_PROBLEMS_FILE_BYTES).decode()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError, RecursionError) as error:  # decode errors are ValueErrors
        raise ProblemError("shape", f"{path}: {str(error)[:200]}") from None
    if isinstance(data, dict) and set(data) == {"problems"}:
        data = data["problems"]
    if not isinstance(data, list) or not data:
        raise ProblemError(
            "shape", f"{path}: expected a non-empty list of problems (JSON) or [[problems]]"
        )
    problems = []
    for index, item in enumerate(data):
        where = f"{path}: problem {index + 1}"
        if not isinstance(item, dict):
            raise ProblemError("shape", f"{where} is not an object/table")
        unknown = sorted(set(item) - set(PROBLEM_KEYS))
        if unknown:
            raise ProblemError(
                "shape", f"{where}: unknown key {unknown[0]!r}; known: {', '.join(PROBLEM_KEYS)}"
            )
        if not isinstance(item.get("name", ""), str) or len(item.get("name", "")) > 200:
            raise ProblemError("shape", f"{where}: name must be a string of at most 200 characters")
        item_dtype = item.get("dtype", dtype)
        item_variant = variant | {k: item[k] for k in VARIANT_KEYS if k in item}
        try:
            if "shape" in item:
                if any(k in item for k in "MNK") or not isinstance(item["shape"], str):
                    raise ProblemError("shape", 'give either shape = "MxNxK" or M, N and K')
                problem = parse_shape(item["shape"], item_dtype, **item_variant)
            else:
                missing = [k for k in "MNK" if k not in item]
                if missing:
                    raise ProblemError("shape", f"{', '.join(missing)} missing (or give shape)")
                problem = Problem(item["M"], item["N"], item["K"], item_dtype, **item_variant)
        except ProblemError as error:
            raise ProblemError(error.field, f"{where}: {error}") from None
        problems.append((item.get("name", ""), problem))
    return problems
