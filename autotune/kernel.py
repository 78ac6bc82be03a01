"""Run: a compiled kernel applied to NumPy arrays on the GPU, and the Kernel object.

`dispatch` is the whole GPU round trip (upload, bind, dispatch, read back) as one
function; `Kernel` is what `autotune.lookup` hands out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import wgpu

from .arguments import ArgumentError, as_float, check_flag, is_number, shown
from .compile import Compiled, compile_shader
from .device import Gpu, get_gpu
from .encode import Resident, operand_sizes, record, uniform_bytes
from .problem import Problem, ProblemError, check_dtype
from .quantize import QuantizedWeight
from .render import Shader, render
from .space import Config

# Where a Kernel's config came from (see Kernel): tuned for the shape; timed at it by
# lookup among a few ranked configs; ranked, not timed; a sound untuned config.
SOURCES = ("exact", "estimated", "predicted", "default")


def _array(name: str, value: object, ndims: tuple[int, ...]) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise ProblemError(name, f"{name} must be a numpy.ndarray, got {type(value).__name__}")
    if value.ndim not in ndims:
        wanted = " or ".join(f"{n}-D" for n in ndims)
        raise ProblemError(
            name, f"{name} must be {wanted}, got {value.ndim}-D with shape {value.shape}"
        )
    if 0 in value.shape:
        raise ProblemError(name, f"{name} must not be empty, got shape {value.shape}")
    return value


# alpha and beta reach the kernel as f32 uniforms: beyond this they would be inf there
F32_MAX = float(np.finfo(np.float32).max)


def check_scalar(name: str, value: object) -> float:
    """alpha or beta as a float: a number (NumPy's too, never a bool) that is finite
    and within f32's range."""
    if not is_number(value):
        raise ProblemError(name, f"{name} must be a number, got {shown(value, 40)}")
    number = as_float(value)
    if math.isnan(number) or (math.isinf(number) and isinstance(value, float | np.floating)):
        raise ProblemError(name, f"{name} must be finite, got {shown(value, 40)}")
    if abs(number) > F32_MAX:  # an int beyond any float too
        raise ProblemError(
            name,
            f"{name} must be within f32's range (|{name}| <= {F32_MAX:.4g}), "
            f"got {shown(value, 40)}",
        )
    return number


def check_operands(
    A: object,
    B: object,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    C: object = None,
    bias: object = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    activation: str | None = None,
) -> tuple[dict, Problem]:
    """Validate the operands of C = epilogue(op(A) @ op(B)) and return them C-contiguous
    (by name: A, B, and C, bias when given) with their Problem.

    A 3-D A is a batch; B 3-D too (one per item) or 2-D (shared). trans_a: A holds
    A.T (K x M); trans_b: B holds B.T (N x K, a linear layer's weight). alpha != 1,
    beta != 0 (C then holds the addend), bias (N values) and activation ("relu",
    "gelu") make the epilogue.

    B may be a QuantizedWeight (autotune.quantize of a weight W, N x K): then C =
    epilogue(A @ W'.T) with W' its dequantized weight, whatever trans_b says, and one
    weight serves every item of a batch. It stays a QuantizedWeight in the result.
    """
    trans_a, trans_b = check_flag("trans_a", trans_a), check_flag("trans_b", trans_b)
    if isinstance(B, QuantizedWeight):
        return _quantized_operands(A, B, trans_a, C, bias, alpha, beta, activation)
    A = _array("A", A, (2, 3))
    B = _array("B", B, (2, 3) if A.ndim == 3 else (2,))
    if A.dtype != B.dtype:
        raise ProblemError("shape", f"A and B must have one dtype, got A {A.dtype} and B {B.dtype}")
    dtype = check_dtype(A.dtype)
    batch = A.shape[0] if A.ndim == 3 else 1
    if B.ndim == 3 and B.shape[0] != batch:
        raise ProblemError(
            "shape", f"A and B must have one batch count, got {batch} and {B.shape[0]}"
        )
    M, K = A.shape[-2:][::-1] if trans_a else A.shape[-2:]
    KB, N = B.shape[-2:][::-1] if trans_b else B.shape[-2:]
    if K != KB:
        raise ProblemError(
            "shape",
            f"inner dimensions differ: op(A) is {M}x{K} (K={K}), op(B) is {KB}x{N} (K={KB})",
        )
    ops = _epilogue(bias, alpha, beta, activation)
    problem = Problem(
        M,
        N,
        K,
        dtype,
        ("t" if trans_a else "n") + ("t" if trans_b else "n"),
        batch,
        batch > 1 and B.ndim == 2,
        ops,
    )
    return _with_outputs({"A": A, "B": B}, problem, C, bias, beta)


def _epilogue(bias, alpha, beta, activation) -> str:
    """The epilogue that bias, alpha, beta and activation ask for, each checked."""
    alpha, beta = check_scalar("alpha", alpha), check_scalar("beta", beta)
    if activation is not None and (
        not isinstance(activation, str) or activation not in ("relu", "gelu")
    ):
        raise ProblemError(
            "activation",
            f"activation {shown(activation, 40)} is unknown; known: relu, gelu (or None)",
        )
    ops = [op for op, on in (("alpha", alpha != 1), ("beta", beta != 0)) if on]
    ops += ["bias"] if bias is not None else []
    return ",".join(ops + ([activation] if activation else []))


def _quantized_operands(A, qw: QuantizedWeight, trans_a, C, bias, alpha, beta, activation):
    """check_operands for a QuantizedWeight B: A (M x K, or a batch of them) times the
    dequantized weight transposed."""
    if trans_a:
        raise ProblemError("trans_a", "with a quantized weight, A is M x K (trans_a=False)")
    A = _array("A", A, (2, 3))
    dtype = check_dtype(A.dtype)
    if qw.scales.dtype != np.float16:
        raise ProblemError(
            "B",
            f"the kernels read f16 scales; this weight has {qw.scales.dtype} scales "
            "(quantize with scales='f16', the default)",
        )
    N, K = qw.shape
    if A.shape[-1] != K:
        raise ProblemError(
            "shape", f"inner dimensions differ: A is {A.shape} (K={A.shape[-1]}), W is {N}x{K}"
        )
    batch = A.shape[0] if A.ndim == 3 else 1
    ops = _epilogue(bias, alpha, beta, activation)
    problem = Problem(A.shape[-2], N, K, dtype, "nt", batch, batch > 1, ops, weights=qw.format)
    return _with_outputs({"A": A, "B": qw}, problem, C, bias, beta)


def _mismatched_field(same: bool, extra: set, has_bias: bool, bias) -> str:
    """The argument a kernel call's mismatch is blamed on: the bias or a scalar that the
    kernel's epilogue lacks, else the problem itself."""
    if has_bias != (bias is not None):
        return "bias"
    return min(extra) if same and extra else "shape"  # (extra: alpha or beta)


def _with_outputs(arrays: dict, problem: Problem, C, bias, beta) -> tuple[dict, Problem]:
    """`arrays` with C and bias, each checked against `problem`; arrays C-contiguous."""
    A = arrays["A"]
    M, N = problem.M, problem.N
    if beta != 0 and C is None:
        raise ProblemError("C", "beta != 0 needs C, the addend (C = alpha A B + beta C)")
    for name, value in (("C", C), ("bias", bias)):
        if value is not None:
            # C has A's batch dimension, also for a batch of one (as NumPy's matmul)
            want = A.shape[:-2] + (M, N) if name == "C" else problem.matrix_shapes()[name]
            value = _array(name, value, (len(want),))
            if value.shape != want or value.dtype != A.dtype:
                raise ProblemError(
                    name, f"{name} must be {want} {A.dtype}, got {value.shape} {value.dtype}"
                )
            arrays[name] = value
    contiguous = {k: v if isinstance(v, QuantizedWeight) else np.ascontiguousarray(v)
                  for k, v in arrays.items()}  # fmt: skip
    return contiguous, problem


def check_features(problem: Problem, features, device: str = "this device") -> None:
    """Raise ProblemError naming the missing feature (f16 needs shader-f16)."""
    if problem.dtype == "f16" and "shader-f16" not in features:
        raise ProblemError(
            "dtype",
            f"dtype f16 needs the feature shader-f16, which {device} does not have",
        )


def check_fits(problem: Problem, gpu: Gpu, limits: dict | None = None) -> None:
    """Raise ProblemError when a matrix of `problem` exceeds the buffer limits (the
    device's, or `limits` such as WebGPU's defaults), or the device lacks a feature."""
    check_features(problem, gpu.features, gpu.described)
    limits = limits or gpu.limits
    # the smaller limit is the one a matrix meets first (checked before any allocation)
    limit_name = min(("max-storage-buffer-binding-size", "max-buffer-size"), key=limits.get)
    limit = limits[limit_name]
    types = problem.operand_dtypes()
    for name, shape in problem.matrix_shapes().items():
        size = math.prod(shape) * np.dtype(types[name]).itemsize
        if size > limit:
            # each array's own element type: a quantized weight's codes are uint32 words
            own = types[name] is not problem.numpy_dtype
            element = np.dtype(types[name]).name if own else problem.dtype
            what = "x".join(str(s) for s in shape) + f" {element}"
            # one matrix of a batched operand fits: the batch is what is too large
            batched = len(shape) == 3 and size // problem.batch <= limit
            raise ProblemError(
                "batch" if batched else "shape",
                f"{name} ({what}) needs {size} bytes, more than this "
                f"device's storage buffer limit {limit_name} = {limit} bytes",
            )


def input_arrays(A: np.ndarray, B) -> dict[str, np.ndarray]:
    """The input buffers by binding name: A and B, or for a QuantizedWeight B its packed
    codes as B, its scales and (with zero points) zeros."""
    if not isinstance(B, QuantizedWeight):
        return {"A": A, "B": B}
    arrays = {"A": A, "B": B.data, "scales": B.scales}
    return arrays | ({} if B.zero_points is None else {"zeros": B.zero_points})


def _storage(gpu: Gpu, data: np.ndarray, extra=0):
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | extra
    data = data.ravel()
    if data.size % 4:  # room for a whole vec4 at the end (a binding's size is plan's)
        data = np.concatenate([data, np.zeros(4 - data.size % 4, data.dtype)])
    return gpu.device.create_buffer_with_data(data=data, usage=usage)


@dataclass
class Bound:
    """Buffers of one problem bound to one compiled kernel; reusable for timing."""

    compiled: Compiled
    gpu: Gpu
    buffers: dict = field(default_factory=dict)
    bind_group: object = None

    @classmethod
    def make(
        cls,
        compiled: Compiled,
        gpu: Gpu,
        arrays: dict[str, np.ndarray],
        alpha: float = 1.0,
        beta: float = 0.0,
    ):
        """Upload `arrays` (by binding name: A, B, C's starting contents, and bias or a
        workspace's starting contents when given) and bind every buffer of the plan;
        a bias not given is zeros, a workspace not given is allocated zeroed."""
        problem, plan = compiled.shader.problem, compiled.shader.plan
        buffers = {}
        for binding in plan.bindings:
            if binding.kind == "uniform":
                data = uniform_bytes(problem, alpha, beta)
                usage = wgpu.BufferUsage.UNIFORM
                buffers[binding.name] = gpu.device.create_buffer_with_data(data=data, usage=usage)
            elif binding.name in arrays:
                extra = wgpu.BufferUsage.COPY_SRC if binding.kind == "storage" else 0
                buffers[binding.name] = _storage(gpu, arrays[binding.name], extra)
            else:
                usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
                buffers[binding.name] = gpu.device.create_buffer(size=binding.size, usage=usage)
        bind_group = gpu.device.create_bind_group(
            layout=compiled.bind_group_layout,
            entries=[
                {"binding": b.number, "resource": {"buffer": buffers[b.name]}}
                for b in plan.bindings
            ],
        )
        return cls(compiled, gpu, buffers, bind_group)

    def encode(self, encoder, repeats: int = 1, timestamp_writes=None) -> None:
        """Record one compute pass running the whole plan `repeats` times."""
        record(encoder, self.compiled, self.bind_group, repeats, timestamp_writes)

    def run(self, repeats: int = 1) -> None:
        encoder = self.gpu.device.create_command_encoder()
        self.encode(encoder, repeats)
        self.gpu.queue.submit([encoder.finish()])

    def read(self, name: str = "C") -> np.ndarray:
        """A buffer's contents as elements of its type (an operand's own, e.g. a quantized
        weight's uint32 codes; a workspace's the problem's), C in C's shape."""
        problem = self.compiled.shader.problem
        dtype = problem.operand_dtypes().get(name, problem.numpy_dtype)
        data = np.frombuffer(self.gpu.queue.read_buffer(self.buffers[name]), dtype)
        if name != "C":
            return data.copy()
        shape = problem.matrix_shapes()["C"]
        return data[: math.prod(shape)].reshape(shape).copy()

    def release(self) -> None:
        for buffer in self.buffers.values():
            buffer.destroy()
        self.buffers.clear()


def dispatch(
    compiled: Compiled,
    gpu: Gpu,
    A: np.ndarray,
    B: np.ndarray,
    fill: float = np.nan,
    *,
    C: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> np.ndarray:
    """Compute C = A @ B (with the problem's variant) with a compiled kernel; C starts
    as `C` when given, else filled with `fill`."""
    problem = compiled.shader.problem
    if C is None:
        C = np.full(problem.matrix_shapes()["C"], fill, dtype=problem.numpy_dtype)
    arrays = input_arrays(A, B) | {"C": C} | ({} if bias is None else {"bias": bias})
    bound = Bound.make(compiled, gpu, arrays, alpha, beta)
    try:
        bound.run()
        return bound.read()
    finally:
        bound.release()


class Kernel:
    """A GEMM kernel for one problem on one device: WGSL text, config, and a callable.

    `source` says where the config came from: "exact" (tuned for this shape),
    "estimated" (the fastest of a few configs lookup timed at this shape, ranked by
    predicted time from this device's cache), "predicted" (ranked so, verified, not
    timed) or "default" (a sound untuned config).
    """

    def __init__(
        self,
        problem: Problem,
        config: Config,
        source: str,
        *,
        checks: bool = True,
        gpu: Gpu | None = None,
        entry: object = None,
    ):
        if not isinstance(source, str) or source not in SOURCES:
            raise ArgumentError("source", f"source must be one of {SOURCES}, got {shown(source)}")
        self.problem = problem
        self.config = config
        self.source = source
        self.checks = checks
        self.entry = entry  # the cache entry this kernel came from, if any
        self._gpu = gpu
        self._shader: Shader | None = None
        self._compiled: Compiled | None = None
        self._resident: Resident | None = None

    @property
    def gpu(self) -> Gpu:
        if self._gpu is None:
            self._gpu = get_gpu()
        return self._gpu

    @property
    def shader(self) -> Shader:
        if self._shader is None:
            self._shader = render(self.config, self.problem)
        return self._shader

    @property
    def wgsl(self) -> str:
        return self.shader.wgsl

    @property
    def compiled(self) -> Compiled:
        if self._compiled is None:
            self._compiled = compile_shader(self.shader, self.gpu, checks=self.checks)
        return self._compiled

    def __call__(
        self,
        A: np.ndarray,
        B: np.ndarray,
        C: np.ndarray | None = None,
        *,
        bias: np.ndarray | None = None,
        alpha: float = 1.0,
        beta: float | None = None,
    ) -> np.ndarray:
        """C = epilogue(op(A) @ op(B)) on the GPU; the operands must match this kernel's
        problem (shape, dtype, layout, batch and epilogue). A transposed operand is
        passed as stored (layout "nt": B is N x K). A kernel with beta in its epilogue
        takes C and beta (0 too); one without takes neither."""
        problem = self.problem
        activation = problem.activation
        given_beta = 0.0 if beta is None else beta  # (None: not given, checked below)
        arrays, got = check_operands(
            A,
            B,
            trans_a=problem.trans_a,
            trans_b=problem.trans_b,
            C=C,
            bias=bias,
            alpha=alpha,
            beta=given_beta,
            activation=activation,
        )
        # a kernel with alpha or beta in its epilogue computes alpha = 1 or beta = 0 too
        same = got.variant[:4] == problem.variant[:4] and got.shape == problem.shape
        same = same and got.weights == problem.weights
        extra = set(got.ops) - set(problem.ops)
        if not same or extra or ("bias" in problem.ops) != (bias is not None):
            raise ProblemError(
                _mismatched_field(same, extra, "bias" in problem.ops, bias),
                f"this kernel computes {problem}; got {got}; use autotune.matmul or "
                "lookup() for another problem",
            )
        self._check_addend(C, beta)  # after the scalars' and the problem's own checks
        check_fits(problem, self.gpu)
        result = dispatch(
            self.compiled,
            self.gpu,
            arrays["A"],
            arrays["B"],
            C=arrays.get("C"),
            bias=arrays.get("bias"),
            alpha=float(alpha),
            beta=float(given_beta),
        )
        # a 3-D A of one matrix is the plain problem, but its result keeps the batch axis
        return result.reshape(arrays["A"].shape[:-2] + (problem.M, problem.N))

    # --- on the caller's own buffers ----------------------------------------------------

    def buffer_sizes(self) -> dict[str, int]:
        """Bytes of each buffer `encode` binds, by name (A, B, C, and bias where the
        epilogue has it), as the export manifest states them: allocate at least these."""
        return operand_sizes(self.shader.plan)

    @property
    def resident(self) -> Resident:
        """The kernel's uniform block and workspaces on its device (made at first use)."""
        if self._resident is None:
            check_fits(self.problem, self.gpu)
            self._resident = Resident(self.compiled, self.gpu)
        return self._resident

    def _check_addend(self, C, beta) -> None:
        """C and beta go together with an epilogue that has beta: a C passed to another
        kernel, or without its beta, would be dropped without a word."""
        if "beta" in self.problem.ops:
            for name, value in (("C", C), ("beta", beta)):
                if value is None:
                    raise ProblemError(name, "this kernel's epilogue has beta: pass C and beta")
        elif C is not None:
            raise ProblemError(
                "C",
                "this kernel's epilogue has no beta, so C would not be read: look up "
                "one with epilogue beta (autotune.matmul does, given beta)",
            )

    def set_scalars(self, alpha: float = 1.0, beta: float = 0.0) -> None:
        """alpha and beta for what `encode` records and is submitted from now on: one
        pair per kernel object, kept with it (keep the object: another lookup may return
        a new one, at alpha = 1 and beta = 0, e.g. after a tune). The epilogue must have
        them: alpha != 1 needs "alpha", beta != 0 "beta". A call on arrays
        (`kernel(A, B, C, alpha=..., beta=...)`) takes its own and leaves these as set."""
        values = {"alpha": check_scalar("alpha", alpha), "beta": check_scalar("beta", beta)}
        for name, neutral in (("alpha", 1.0), ("beta", 0.0)):
            if values[name] != neutral and name not in self.problem.ops:
                raise ProblemError(
                    name,
                    f"this kernel's epilogue has no {name} (it computes {name} = {neutral:g}); "
                    f"look up {self.problem} with {name} in its epilogue",
                )
        self.resident.set_scalars(values["alpha"], values["beta"])

    def encode(self, encoder, A, B, C, bias=None, *, scales=None, zeros=None) -> None:
        """Record C = epilogue(op(A) @ op(B)) into the caller's wgpu.GPUCommandEncoder,
        on the caller's buffers of this kernel's device: each a wgpu.GPUBuffer with
        STORAGE usage, or a (buffer, byte offset) pair, of at least `buffer_sizes()`
        bytes past its offset (beta reads C before it is written). Every pass of the
        kernel's launch plan is recorded; nothing is submitted, nothing read back.
        Quantized weights: B holds the packed codes (QuantizedWeight.data), `scales` the
        f16 scales and, for a format with zero points, `zeros` them, as the files of
        docs/QUANTIZED.md lay them out."""
        optional = {"bias": bias, "scales": scales, "zeros": zeros}
        sizes = self.buffer_sizes()
        for name, value in optional.items():
            if value is not None and name not in sizes:
                raise ProblemError(name, f"this kernel binds no {name}: {self.problem}")
        operands = {"A": A, "B": B, "C": C} | {k: v for k, v in optional.items() if v is not None}
        self.resident.encode(encoder, operands)

    def __repr__(self) -> str:
        checks = "on" if self.checks else "off"
        return f"Kernel({self.problem}, {self.config}, source={self.source!r}, checks={checks})"
