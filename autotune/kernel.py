"""Run: a compiled kernel applied to NumPy arrays on the GPU, and the Kernel object.

`dispatch` is the whole GPU round trip (upload, bind, dispatch, read back) as one
function; `Kernel` is what `autotune.lookup` hands out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import wgpu

from .compile import Compiled, compile_shader
from .device import Gpu, get_gpu
from .problem import Problem, ProblemError, check_dtype
from .render import UNIFORM_SIZE, Shader, render
from .space import Config


def check_operands(A: object, B: object) -> tuple[np.ndarray, np.ndarray, Problem]:
    """Validate two matrices for C = A @ B and return them C-contiguous with their Problem."""
    for name, array in (("A", A), ("B", B)):
        if not isinstance(array, np.ndarray):
            raise ProblemError(f"{name} must be a numpy.ndarray, got {type(array).__name__}")
        if array.ndim != 2:
            raise ProblemError(f"{name} must be 2-D, got {array.ndim}-D with shape {array.shape}")
        if 0 in array.shape:
            raise ProblemError(f"{name} must not be empty, got shape {array.shape}")
    if A.dtype != B.dtype:
        raise ProblemError(f"A and B must have one dtype, got A {A.dtype} and B {B.dtype}")
    dtype = check_dtype(A.dtype)
    if A.shape[1] != B.shape[0]:
        raise ProblemError(
            f"inner dimensions differ: A is {A.shape[0]}x{A.shape[1]} (K={A.shape[1]}), "
            f"B is {B.shape[0]}x{B.shape[1]} (K={B.shape[0]})"
        )
    problem = Problem(A.shape[0], B.shape[1], A.shape[1], dtype)
    return np.ascontiguousarray(A), np.ascontiguousarray(B), problem


def check_fits(problem: Problem, gpu: Gpu, limits: dict | None = None) -> None:
    """Raise ProblemError when a matrix of `problem` exceeds the buffer limits (the
    device's, or `limits` such as WebGPU's defaults)."""
    limits = limits or gpu.limits
    # the smaller limit is the one a matrix meets first (checked before any allocation)
    limit_name = min(("max-storage-buffer-binding-size", "max-buffer-size"), key=limits.get)
    limit = limits[limit_name]
    for name, rows, cols in (
        ("A", problem.M, problem.K),
        ("B", problem.K, problem.N),
        ("C", problem.M, problem.N),
    ):
        size = rows * cols * problem.itemsize
        if size > limit:
            raise ProblemError(
                f"{name} ({rows}x{cols} {problem.dtype}) needs {size} bytes, more than this "
                f"device's storage buffer limit {limit_name} = {limit} bytes"
            )


def _storage(gpu: Gpu, data: np.ndarray, extra=0):
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | extra
    return gpu.device.create_buffer_with_data(data=data, usage=usage)


def uniform_bytes(problem: Problem) -> np.ndarray:
    data = np.array([problem.M, problem.N, problem.K, 0], dtype=np.uint32)
    assert data.nbytes == UNIFORM_SIZE
    return data


@dataclass
class Bound:
    """Buffers of one problem bound to one compiled kernel; reusable for timing."""

    compiled: Compiled
    gpu: Gpu
    buffers: dict = field(default_factory=dict)
    bind_group: object = None

    @classmethod
    def make(cls, compiled: Compiled, gpu: Gpu, A: np.ndarray, B: np.ndarray, C: np.ndarray):
        problem = compiled.shader.problem
        buffers = {
            "A": _storage(gpu, A),
            "B": _storage(gpu, B),
            "C": _storage(gpu, C, wgpu.BufferUsage.COPY_SRC),
            "dims": gpu.device.create_buffer_with_data(
                data=uniform_bytes(problem), usage=wgpu.BufferUsage.UNIFORM
            ),
        }
        bind_group = gpu.device.create_bind_group(
            layout=compiled.bind_group_layout,
            entries=[
                {"binding": i, "resource": {"buffer": buffers[name]}}
                for i, name in enumerate(("A", "B", "C", "dims"))
            ],
        )
        return cls(compiled, gpu, buffers, bind_group)

    def encode(self, encoder, repeats: int = 1, timestamp_writes=None) -> None:
        """Record one compute pass of `repeats` dispatches."""
        kwargs = {"timestamp_writes": timestamp_writes} if timestamp_writes else {}
        compute = encoder.begin_compute_pass(**kwargs)
        compute.set_pipeline(self.compiled.pipeline)
        compute.set_bind_group(0, self.bind_group)
        for _ in range(repeats):
            compute.dispatch_workgroups(*self.compiled.shader.dispatch)
        compute.end()

    def run(self, repeats: int = 1) -> None:
        encoder = self.gpu.device.create_command_encoder()
        self.encode(encoder, repeats)
        self.gpu.queue.submit([encoder.finish()])

    def read_c(self) -> np.ndarray:
        problem = self.compiled.shader.problem
        data = self.gpu.queue.read_buffer(self.buffers["C"])
        return np.frombuffer(data, dtype=problem.numpy_dtype).reshape(problem.M, problem.N).copy()

    def release(self) -> None:
        for buffer in self.buffers.values():
            buffer.destroy()
        self.buffers.clear()


def dispatch(
    compiled: Compiled, gpu: Gpu, A: np.ndarray, B: np.ndarray, fill: float = np.nan
) -> np.ndarray:
    """Compute C = A @ B with a compiled kernel; C starts filled with `fill`."""
    problem = compiled.shader.problem
    C = np.full((problem.M, problem.N), fill, dtype=problem.numpy_dtype)
    bound = Bound.make(compiled, gpu, A, B, C)
    try:
        bound.run()
        return bound.read_c()
    finally:
        bound.release()


class Kernel:
    """A GEMM kernel for one problem on one device: WGSL text, config, and a callable.

    `source` says where the config came from: "exact" (tuned for this shape), "nearest"
    (tuned for a nearby shape on this device) or "default" (a sound untuned config).
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
        self.problem = problem
        self.config = config
        self.source = source
        self.checks = checks
        self.entry = entry  # the cache entry this kernel came from, if any
        self._gpu = gpu
        self._shader: Shader | None = None
        self._compiled: Compiled | None = None

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

    def __call__(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """C = A @ B on the GPU; A and B must match this kernel's shape and dtype."""
        A, B, problem = check_operands(A, B)
        if problem != self.problem:
            raise ProblemError(
                f"this kernel computes {self.problem}; got A {A.shape} and B {B.shape} "
                f"({problem}); use autotune.matmul or lookup() for another shape"
            )
        check_fits(problem, self.gpu)
        return dispatch(self.compiled, self.gpu, A, B)

    def __repr__(self) -> str:
        checks = "on" if self.checks else "off"
        return f"Kernel({self.problem}, {self.config}, source={self.source!r}, checks={checks})"
