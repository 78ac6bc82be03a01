"""Verify: a compiled kernel against NumPy's float64 product, on fresh random data.

C is pre-filled with NaN so a kernel that skips an element fails; inputs are random in
[-1, 1] so a kernel that is right only on zeros, ones or positive data fails. Each
element's error is measured against the rounding bound of its own dot product,
|C - R| <= tol * (|A| @ |B|), with tol a generous multiple of eps * sqrt(K); NaN or
infinity never passes.

Problems up to FULL_CHECK_FLOPS are compared element by element in full. Larger ones
(a float64 product of 4096^3 takes seconds, too slow per candidate) are checked for
NaN everywhere, element by element on sampled rows and columns of three batch items
(the first, the last and one random row or column in each of SAMPLES bands, so edge
tiles are always covered and no band of rows or columns goes unchecked), and, with a
linear epilogue, on all of C, every batch item, through Freivalds' test C x = A (B x)
with random vectors x, which sees any wrong element.

Each buffer is followed by a guard: A and B by NaN (a kernel that reads past the end of
its input gets NaN into its result), C by a canary bit pattern that must come back
unchanged (a kernel that writes outside C, e.g. an edge tile without its row test, is
rejected even where the stray write would land in some other allocation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .compile import Compiled
from .device import Gpu
from .kernel import Bound, input_arrays
from .problem import Problem
from .quantize import QuantizedWeight, quantize, quantize_activations

# Unit roundoff per dtype; a sum of K products in that precision drifts like sqrt(K).
EPSILON = {"f32": 2.0**-24, "f16": 2.0**-11}
# alpha and beta of the epilogue at verification: neither 1 nor 0, so a kernel that
# ignores either fails.
TEST_ALPHA, TEST_BETA = 0.75, -0.5
GELU_SLOPE = 1.13  # largest |d gelu(x) / dx|: how much an error before it can grow


FULL_CHECK_FLOPS = 2 * 512**3
SAMPLES = 32  # bands of rows and of columns, one checked in full each, on large problems
GUARD = 1024  # elements after each buffer, beyond one row of it
CANARY = 0xDEADBEEF  # bits of each guard element after C: a finite float no kernel computes


@dataclass(frozen=True)
class Verdict:
    ok: bool
    error: float  # largest |C - R| / sqrt(A**2 @ B**2) over the checked elements
    tolerance: float
    outside: int = 0  # guard elements after C that the kernel overwrote

    @property
    def reason(self) -> str:
        if self.outside:
            return f"wrote {self.outside} elements past the end of C or of a workspace"
        return (
            "" if self.ok else f"relative error {self.error:.3g} > tolerance {self.tolerance:.3g}"
        )


def accumulation(problem: Problem, config=None) -> str:
    """The type a config accumulates in: f16 where its ACC parameter says so."""
    return "f16" if config is not None and config.as_dict().get("ACC") else "f32"


def tolerance(problem: Problem, accumulate: str = "f32") -> float:
    """Allowed error relative to sqrt(A**2 @ B**2): 16x eps * sqrt(K), the random-walk
    growth of rounding in a K-term sum, with a floor for tiny K. One dropped product in
    a dot product is off by ~1/sqrt(K) of that scale: far above this for any K < 2**24.

    Accumulating in f16 is much looser: 8 x 2**-11 x (sqrt(K) + 2), e.g. 0.039 at K = 64
    and 0.26 at K = 4096 (the partial sums themselves are rounded to 11 bits). It still
    sees a dropped product for K up to ~100 and any dropped slice of the K loop; f16
    inputs with f32 accumulation keep the f32 bound plus the rounding of the stored
    output (output_rounding, absolute per element).
    """
    if accumulate == "f16":
        return EPSILON["f16"] * 8 * (math.sqrt(problem.K) + 2)
    return EPSILON["f32"] * (16 * math.sqrt(problem.K) + 16)


def random_operands(problem: Problem, rng: np.random.Generator):
    """A and B as stored (layout and batch applied), uniform in [-1, 1] (activations
    quantized by the kernel: each row of A times its own power of two). Quantized
    weights: B is a varied N x K weight (_varied_weight) quantized to the problem's
    format (f16 scales), a QuantizedWeight."""
    shapes = problem.matrix_shapes()
    A = rng.uniform(-1, 1, shapes["A"]).astype(problem.numpy_dtype)
    if problem.activations == "q8":
        # rows of different magnitudes get different scales: a kernel that takes one row's
        # (or batch item's) scale for another's fails
        rows = shapes["A"][:-1] + (1,)
        A = (A * 2.0 ** rng.integers(-4, 5, rows)).astype(problem.numpy_dtype)
    if problem.quantized:
        bits, group, zero_points = problem.weight_format
        return A, quantize(_varied_weight(problem, rng), bits=bits, group=group,
                           zero_points=zero_points)  # fmt: skip
    B = rng.uniform(-1, 1, shapes["B"]).astype(problem.numpy_dtype)
    return A, B


def _varied_weight(problem: Problem, rng: np.random.Generator) -> np.ndarray:
    """A weight (N x K) whose quantization varies everywhere: each row at its own power of
    two (its scales differ from its neighbours', so a kernel taking another row's scale
    fails) and each run of 32 K shifted by its own offset (4-bit zero points then cover
    0 to 15, not only 7 and 8)."""
    N, K = problem.N, problem.K
    W = rng.uniform(-1, 1, (N, K)) * 2.0 ** rng.integers(-4, 5, (N, 1))
    shift = np.repeat(rng.uniform(-1.5, 1.5, (N, -(-K // 32))), 32, axis=1)[:, :K]
    return (W + shift * np.abs(W).max(axis=1, keepdims=True)).astype(np.float32)


# The roundings of C's elements to the output format are independent, each at most half
# a spacing: a weighted sum of them has a standard deviation below their root-sum-square
# over sqrt(3). Six root-sum-squares (over ten deviations) is never reached by a
# correctly rounded result (one was refused in two with a factor of 1, at 16 x 4096 x
# 4096 f16), and keeps a sum over thousands of elements from hiding one wrong element
# (the sum of the bounds would, at that width).
ROUNDING_SPREAD = 6.0


def output_rounding(got: np.ndarray, dtype) -> np.ndarray:
    """How far storing in the output `dtype` may have moved each stored value `got` from
    the kernel's unrounded result: half the format's spacing at `got` (np.spacing, so
    subnormals included), a bound that holds for round-to-nearest at any magnitude.

    A relative allowance has no room for the absolute spacing near zero: a correctly
    rounded f16 product of 1e-6 is off by up to 3e-8, 3% of itself. Zero where `got` is
    not finite (refused anyway).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        stored = np.abs(np.asarray(got)).astype(dtype)
        half = np.spacing(stored).astype(np.float64) / 2
    return np.where(np.isfinite(half), half, 0.0)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation in float64, as the kernels compute it. NaN stays NaN,
    gelu(+inf) = +inf and gelu(-inf) = 0, the formula's limit (evaluated literally it is
    -inf * 0 = NaN); relu is np.maximum(x, 0), which keeps NaN too."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))
    return np.where(x == -np.inf, 0.0, y)


def _worst(got: np.ndarray, want: np.ndarray, scale: np.ndarray, out=0.0) -> float:
    """Largest (|got - want| - out) / scale; infinity if `got` has a NaN or infinity.
    `out`: the output's own rounding (absolute, per element), allowed on top."""
    got = got.astype(np.float64)
    if not np.all(np.isfinite(got)):
        return math.inf
    excess = np.maximum(np.abs(got - want) - out, 0.0)
    return float(np.max(excess / np.maximum(scale, 1e-300)))


def _logical(problem: Problem, A: np.ndarray, B):
    """op(A) and op(B) in float64 as (batch or 1, rows, columns); a QuantizedWeight's
    op(B) is its dequantized weight, and quantized activations' op(A) the codes times
    their row scales: what the kernel claims to multiply."""
    A64 = A.astype(np.float64)
    if problem.activations == "q8":
        codes, scales = quantize_activations(A)
        A64 = codes.astype(np.float64) * scales[..., None].astype(np.float64)
    B64 = (B.dequantize() if isinstance(B, QuantizedWeight) else B).astype(np.float64)
    A64 = np.swapaxes(A64, -1, -2) if problem.trans_a else A64
    B64 = np.swapaxes(B64, -1, -2) if problem.trans_b else B64
    return (A64[None] if A64.ndim == 2 else A64), (B64[None] if B64.ndim == 2 else B64)


class Reference:
    """Random inputs for one problem and what its result must be, computed once.

    A tuning run makes one Reference and checks every candidate against it (each with a
    fresh NaN-filled C): building the float64 reference is the slow part at large sizes.
    Variants: op() per layout, per batch item; the epilogue with TEST_ALPHA, TEST_BETA,
    a random bias, and C's starting contents random (beta reads them) instead of NaN.
    """

    def __init__(self, problem: Problem, seed: int | None = None, operands=None, extra=None):
        self.problem = problem
        rng = np.random.default_rng(seed)
        self.A, self.B = operands if operands is not None else random_operands(problem, rng)
        ops, shapes = problem.ops, problem.matrix_shapes()
        self.alpha = TEST_ALPHA if "alpha" in ops else 1.0
        self.beta = TEST_BETA if "beta" in ops else 0.0
        extra = dict(extra or {})
        for name in ("C", "bias") if "beta" in ops else ("bias",):
            if name in shapes and name not in extra:
                extra[name] = rng.uniform(-1, 1, shapes[name]).astype(problem.numpy_dtype)
        self.C0, self.bias = extra.get("C"), extra.get("bias")
        self.dtype = problem.numpy_dtype
        A64, B64 = _logical(problem, self.A, self.B)
        self._A64, self._B64 = A64, B64
        C64 = (
            None
            if self.C0 is None
            else self.C0.astype(np.float64).reshape(A64.shape[0], -1, problem.N)
        )
        self._C64 = C64
        self._bias64 = None if self.bias is None else self.bias.astype(np.float64)
        self.full = problem.flops <= FULL_CHECK_FLOPS
        if self.full:  # (want, scale) of every element
            want, scale = self._finish(A64 @ B64, np.sqrt((A64 * A64) @ (B64 * B64)), C64)
            self.want = want.reshape(shapes["C"])
            self.scale = scale.reshape(shapes["C"])
            return
        M, N, batch = problem.M, problem.N, problem.batch
        # batch items checked in detail: the first, the last and a random one
        self.items = np.unique(np.r_[0, batch - 1, rng.integers(0, batch)])
        self.rows, self.cols = _spread(M, rng), _spread(N, rng)
        # Freivalds: a wrong element anywhere shows in C x; x = +-1 weighs every column
        # fully. Only for a linear epilogue (an activation does not commute with x).
        self.xs = [] if problem.activation else [rng.choice([-1.0, 1.0], N) for _ in range(2)]
        self.samples = {int(b): self._sampled(*self._item(b)) for b in self.items}
        # on every batch item: one computed from another's operands, or skipped, fails
        # (each B's squared row sums taken once: a shared B is one for the whole batch)
        self._b2_sums = [(bb * bb).sum(axis=1) for bb in B64] if self.xs else []
        self.freivalds = {b: self._freivalds(b, *self._item(b)) for b in range(batch) if self.xs}

    def _item(self, b):
        """op(A), op(B) and C's addend of batch item b, in float64."""
        A64, B64, C64 = self._A64, self._B64, self._C64
        c0 = None if C64 is None else C64[b]
        return A64[min(b, len(A64) - 1)], B64[min(b, len(B64) - 1)], c0

    def _sampled(self, a, bb, c0):
        """(want, scale) of one item's sampled rows, and of its sampled columns."""
        a2, b2 = a * a, bb * bb
        rows = self._finish(a[self.rows] @ bb, np.sqrt(a2[self.rows] @ b2), _rows(c0, self.rows))
        cols = self._finish(
            a @ bb[:, self.cols],
            np.sqrt(a2 @ b2[:, self.cols]),
            None if c0 is None else c0[:, self.cols],
            self.cols,
        )
        return rows, cols

    def _freivalds(self, b, a, bb, c0):
        """(x, C x as it must be, its error scale) of item b, per random vector x. Each
        x is +-1, so x * x is 1: the scale is one for all of them."""
        sq = self.alpha**2 * ((a * a) @ self._b2_sums[min(b, len(self._b2_sums) - 1)])
        if c0 is not None:
            sq = sq + self.beta**2 * (c0 * c0).sum(axis=1)
        if self._bias64 is not None:
            sq = sq + self._bias64 @ self._bias64
        # the terms' bounds add up: sqrt(3 * sum of squares) bounds their sum
        scale = np.sqrt((1 + (c0 is not None) + (self._bias64 is not None)) * sq)
        tests = []
        for x in self.xs:
            want = self.alpha * (a @ (bb @ x))
            if c0 is not None:
                want = want + self.beta * (c0 @ x)
            if self._bias64 is not None:
                want = want + self._bias64 @ x
            tests.append((x, want, scale))
        return tests

    def _finish(self, product, scale, C0, cols=None):
        """The epilogue applied to a float64 product, and the scale its error bound is
        relative to (the sizes of the terms summed, through the activation's slope)."""
        want, scale = self.alpha * product, abs(self.alpha) * scale
        if C0 is not None:
            want, scale = want + self.beta * C0, scale + abs(self.beta * C0)
        if self._bias64 is not None:
            bias = self._bias64 if cols is None else self._bias64[cols]
            want, scale = want + bias, scale + np.abs(bias)
        if self.problem.activation == "relu":
            want = np.maximum(want, 0.0)
        elif self.problem.activation == "gelu":
            want, scale = gelu(want), GELU_SLOPE * scale
        return want, scale

    def guarded(self, limit: int) -> dict[str, np.ndarray]:
        """Every buffer the caller binds, by name, made once (every candidate uploads the
        same): the inputs (A, B, a quantized weight's scales and zeros, the bias) each
        followed by its poison guard, and C's starting contents (NaN, or the addend when
        the epilogue has beta; then the canary)."""
        if getattr(self, "_guarded", (None,))[0] != limit:
            inputs = input_arrays(self.A, self.B)
            inputs |= {} if self.bias is None else {"bias": self.bias}
            arrays = {name: guarded_input(data, limit) for name, data in inputs.items()}
            arrays["C"] = guarded_output(self.problem, limit)
            if self.C0 is not None:
                arrays["C"][: self.C0.size] = self.C0.ravel()
            self._guarded = (limit, arrays)
        return self._guarded[1]

    def check(self, C: np.ndarray, accumulate: str = "f32") -> Verdict:
        """Compare C with the float64 result (in full or sampled, see the module doc).

        Each element's error is divided by sqrt(A**2 @ B**2), the root-sum-square of the
        products it sums: the size its rounding errors scale with.
        """
        limit = tolerance(self.problem, accumulate)
        if self.full:
            error = _worst(C, self.want, self.scale, output_rounding(C, self.dtype))
            return Verdict(error <= limit, error, limit)
        if not np.all(np.isfinite(C)):
            return Verdict(False, math.inf, limit)
        C3 = C.reshape(-1, self.problem.M, self.problem.N)
        errors = []
        for b, ((row_want, row_scale), (col_want, col_scale)) in self.samples.items():
            for got, want, scale in (
                (C3[b][self.rows], row_want, row_scale),
                (C3[b][:, self.cols], col_want, col_scale),
            ):
                errors.append(_worst(got, want, scale, output_rounding(got, self.dtype)))
        for b, freivalds in self.freivalds.items():
            C64 = C3[b].astype(np.float64)
            out = output_rounding(C64, self.dtype)  # each element's, summed as in C x
            rounding = ROUNDING_SPREAD * np.sqrt((out * out).sum(axis=1))  # (x * x is 1)
            for x, want, scale in freivalds:
                errors.append(_worst(C64 @ x, want, scale + rounding / max(limit, 1e-300)))
        error = max(errors)
        return Verdict(error <= limit, error, limit)


def _rows(C0, rows):
    return None if C0 is None else C0[rows]


def _spread(n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices below n checked in full: the first, the last and a random one in each of
    SAMPLES equal bands, so every run of 2 n / SAMPLES indices holds one (64 at n = 1024,
    688 at 11008: a wrong tile narrower than that may meet none under an activation,
    where no Freivalds test runs)."""
    bands = np.linspace(0, n, SAMPLES + 1).astype(int)
    picks = [rng.integers(lo, hi) for lo, hi in zip(bands[:-1], bands[1:], strict=True) if hi > lo]
    return np.unique(np.r_[0, n - 1, picks])


def check_result(C: np.ndarray, A: np.ndarray, B: np.ndarray, problem: Problem) -> Verdict:
    """Compare C with A @ B computed in float64."""
    return Reference(problem, operands=(A, B)).check(C)


def _guarded(data: np.ndarray, guard: int, fill: float) -> np.ndarray:
    """`data` flattened, then `guard` elements of `fill`."""
    out = np.empty(data.size + guard, data.dtype)
    out[: data.size] = data.ravel()
    out[data.size :] = fill
    return out


def _guard_size(elements: int, row: int, itemsize: int, limit: int) -> int:
    """A row plus GUARD elements, a multiple of 4 (vec4 bindings), within the buffer limit."""
    guard = -(-(elements + row + GUARD) // 4) * 4 - elements  # the total a whole vec4
    room = (limit // itemsize - elements) // 4 * 4
    return max(0, min(guard, room))


def guarded_input(data: np.ndarray, limit: int) -> np.ndarray:
    """An input flattened and followed by poison, within the buffer `limit`: NaN after
    floats (a kernel reading past the end gets NaN into its result), all bits set after
    packed words (a quantized weight's codes and zero points)."""
    poison = math.nan if np.issubdtype(data.dtype, np.floating) else np.iinfo(data.dtype).max
    # (for 4-bit weights an overrun along B also reads NaN-guarded group scales; a q8
    # weight has one scale per row, so its guard of all-ones codes decodes to -1s)
    size = _guard_size(data.size, data.shape[-1], data.dtype.itemsize, limit)
    return _guarded(data, size, poison)


def guarded_output(problem: Problem, limit: int) -> np.ndarray:
    """C's starting contents: NaN, then the canary (within the buffer `limit`)."""
    size = problem.itemsize
    c_size = math.prod(problem.matrix_shapes()["C"])
    C = np.full(c_size + _guard_size(c_size, problem.N, size, limit), np.nan, problem.numpy_dtype)
    C[c_size:].view(_BITS[size])[:] = CANARY & (256**size - 1)
    return C


_BITS = {4: np.uint32, 2: np.uint16}


def guarded_workspace(size: int, limit: int) -> np.ndarray:
    """A workspace's starting contents: NaN in f32 and f16 alike (all bits set), so a pass
    that reads what no pass wrote gets NaN; then up to GUARD words of the canary, as many
    as the buffer `limit` leaves room for."""
    guard = max(0, min(GUARD, (limit - size) // 4))
    words = np.full(size // 4 + guard, 0xFFFFFFFF, np.uint32)
    words[size // 4 :] = CANARY
    return words


def run_guarded(compiled: Compiled, gpu: Gpu, reference: Reference):
    """The whole plan once with guarded buffers: (C, number of guard elements after C
    or after a workspace that changed)."""
    problem, plan = compiled.shader.problem, compiled.shader.plan
    limit = min(gpu.limits["max-storage-buffer-binding-size"], gpu.limits["max-buffer-size"])
    arrays = dict(reference.guarded(limit))
    C = arrays["C"]
    arrays |= {w.name: guarded_workspace(w.size, limit) for w in plan.workspaces}
    bound = Bound.make(compiled, gpu, arrays, reference.alpha, reference.beta)
    try:
        bound.run()
        written = ["C", *(w.name for w in plan.workspaces)]
        data = {name: gpu.queue.read_buffer(bound.buffers[name]) for name in written}
    finally:
        bound.release()
    out = np.frombuffer(data["C"], dtype=problem.numpy_dtype)[: C.size]
    shape = problem.matrix_shapes()["C"]
    size = math.prod(shape)
    bits = _BITS[problem.itemsize]
    outside = int(np.count_nonzero(out[size:].view(bits) != CANARY & (256**problem.itemsize - 1)))
    for workspace in plan.workspaces:
        words = np.frombuffer(data[workspace.name], np.uint32)[workspace.size // 4 :]
        outside += int(np.count_nonzero(words[:GUARD] != CANARY))
    return out[:size].reshape(shape).copy(), outside


def verify(
    compiled: Compiled, gpu: Gpu, seed: int | None = None, reference: Reference | None = None
) -> Verdict:
    """Run the kernel once (C filled with NaN, guards after each buffer) and compare with
    float64 NumPy. Without a `reference`, on fresh random data made for this call.
    """
    reference = reference or Reference(compiled.shader.problem, seed)
    C, outside = run_guarded(compiled, gpu, reference)
    verdict = reference.check(C, accumulation(reference.problem, compiled.shader.config))
    if outside:
        return Verdict(False, verdict.error, verdict.tolerance, outside)
    return verdict
