"""Encode: a compiled kernel's launch plan recorded into a command encoder.

`record` writes every pass of the plan into one compute pass; `Bound` (kernel.py) uses it
on buffers it uploaded, and `Resident` on the caller's own buffers, which never leave the
GPU: `kernel.encode(encoder, A, B, C)` chains GEMMs with the caller's other pipelines.

A Resident owns what the caller does not see: the uniform block (the sizes, alpha and
beta: `set_scalars`) and the plan's workspaces. The caller's buffers are checked before
anything is recorded (type, device, STORAGE usage, size past the offset, the offset's
alignment, C not sharing a buffer with an input), since wgpu would only report them
later, as a validation error of the whole submission.
"""

from __future__ import annotations

import numpy as np
import wgpu

from .arguments import ArgumentError, shown
from .compile import Compiled
from .device import Gpu
from .plan import Plan, uniform_layout
from .problem import Problem

BIND_GROUPS_KEPT = 16  # bind groups kept per kernel, by the buffers and offsets bound
ALIGNMENT_LIMIT = "min-storage-buffer-offset-alignment"


def uniform_bytes(problem: Problem, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
    """The uniform block (plan.uniform_layout): the sizes, and alpha and beta."""
    fields, size = uniform_layout(problem)
    values = {"M": problem.M, "N": problem.N, "K": problem.K, "batch": problem.batch}
    values |= {"alpha": alpha, "beta": beta}
    data = np.zeros(size // 4, np.uint32)
    for name, offset, kind in fields:
        number = np.array([values.get(name, 0)], np.float32 if kind == "f32" else np.uint32)
        data[offset // 4] = number.view(np.uint32)[0]
    return data


def record(encoder, compiled: Compiled, bind_group, repeats: int = 1, timestamp_writes=None):
    """One compute pass running the whole plan `repeats` times (dispatches in one pass
    are ordered: each sees what the one before it wrote)."""
    kwargs = {"timestamp_writes": timestamp_writes} if timestamp_writes else {}
    compute = encoder.begin_compute_pass(**kwargs)
    compute.set_bind_group(0, bind_group)
    steps = list(zip(compiled.pipelines, compiled.shader.plan.passes, strict=True))
    for _ in range(repeats):
        for pipeline, step in steps:
            compute.set_pipeline(pipeline)
            compute.dispatch_workgroups(*step.grid)
    compute.end()


def operand_sizes(plan: Plan) -> dict[str, int]:
    """Bytes of each buffer the caller provides (A, B, C, and bias where the epilogue has
    it): what the kernel binds, as the export manifest states them."""
    return {b.name: b.size for b in plan.bindings if b.kind != "uniform" and not b.workspace}


def _usage(flags: int) -> str:
    """A buffer's usage flags by name, e.g. "COPY_DST|UNIFORM"."""
    usage = wgpu.BufferUsage
    names = [n for n in dir(usage) if n.isupper() and flags & getattr(usage, n)]
    return "|".join(names) or "no usage"


class Resident:
    """A compiled kernel ready to record on the caller's buffers: its own uniform block
    and workspaces on the kernel's device."""

    def __init__(self, compiled: Compiled, gpu: Gpu):
        self.compiled, self.gpu = compiled, gpu
        plan = compiled.shader.plan
        self.sizes = operand_sizes(plan)
        self.uniform = gpu.device.create_buffer(
            size=plan.binding("dims").size,
            usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST,
        )
        self.workspaces = {
            b.name: gpu.device.create_buffer(size=b.size, usage=wgpu.BufferUsage.STORAGE)
            for b in plan.workspaces
        }
        self._bind_groups: dict[tuple, tuple] = {}  # key -> (bind group, the buffers)
        self.set_scalars()

    def set_scalars(self, alpha: float = 1.0, beta: float = 0.0) -> None:
        """Write alpha and beta (already checked against the problem) into the uniform
        block: work submitted from now on uses them."""
        data = uniform_bytes(self.compiled.shader.problem, alpha, beta)
        self.gpu.queue.write_buffer(self.uniform, 0, data)

    def encode(self, encoder, operands: dict[str, object]) -> None:
        """Record the plan into `encoder` on the caller's buffers `operands` (by name:
        a wgpu.GPUBuffer, or a (buffer, byte offset) pair)."""
        if not isinstance(encoder, wgpu.GPUCommandEncoder):
            raise ArgumentError(
                "encoder", f"encoder must be a wgpu.GPUCommandEncoder, got {shown(encoder)}"
            )
        if encoder._device is not self.gpu.device:
            raise ArgumentError("encoder", "encoder belongs to another device than this kernel")
        placed = {name: self._placed(name, operands.get(name)) for name in self.sizes}
        written = placed["C"][0]
        for name in placed.keys() - {"C"}:
            if placed[name][0] is written:
                raise ArgumentError(
                    "C",
                    f"C and {name} are one buffer: WebGPU forbids a buffer written and read "
                    "by one dispatch; give C a buffer of its own",
                )
        record(encoder, self.compiled, self._bind_group(placed))

    def _placed(self, name: str, value: object) -> tuple[object, int]:
        """(buffer, offset) of the operand `name`, checked."""
        if value is None:
            binds = ", ".join(self.sizes)
            raise ArgumentError(name, f"{name} is missing: this kernel binds {binds}")
        buffer, offset = value if isinstance(value, tuple) and len(value) == 2 else (value, 0)
        if not isinstance(buffer, wgpu.GPUBuffer):
            raise ArgumentError(
                name,
                f"{name} must be a wgpu.GPUBuffer or a (GPUBuffer, byte offset) pair, "
                f"got {shown(value)}",
            )
        if buffer._device is not self.gpu.device:
            raise ArgumentError(name, f"{name} belongs to another device than this kernel")
        if not buffer.usage & wgpu.BufferUsage.STORAGE:
            raise ArgumentError(name, f"{name} needs STORAGE usage; it has {_usage(buffer.usage)}")
        alignment = int(self.gpu.device.limits[ALIGNMENT_LIMIT])
        if type(offset) is not int or offset < 0 or offset % alignment:
            raise ArgumentError(
                name,
                f"{name}'s offset must be a whole number of bytes, a multiple of this "
                f"device's {ALIGNMENT_LIMIT} ({alignment}), got {shown(offset)}",
            )
        need = self.sizes[name]
        if buffer.size - offset < need:
            raise ArgumentError(
                name,
                f"{name} needs {need} bytes from offset {offset}; its buffer has "
                f"{buffer.size - offset} there (size {buffer.size})",
            )
        return buffer, offset

    def _bind_group(self, placed: dict[str, tuple]):
        key = tuple((name, id(buffer), offset) for name, (buffer, offset) in sorted(placed.items()))
        if key not in self._bind_groups:
            if len(self._bind_groups) >= BIND_GROUPS_KEPT:
                self._bind_groups.pop(next(iter(self._bind_groups)))
            group = self.gpu.device.create_bind_group(
                layout=self.compiled.bind_group_layout, entries=self._entries(placed)
            )
            # the buffers stay referenced with their bind group, so an id is never reused
            self._bind_groups[key] = (group, [b for b, _ in placed.values()])
        return self._bind_groups[key][0]

    def _entries(self, placed: dict[str, tuple]) -> list[dict]:
        """The bind group's entries: the caller's ranges, our uniform and workspaces."""
        resources = {"dims": {"buffer": self.uniform}}
        resources |= {name: {"buffer": b} for name, b in self.workspaces.items()}
        for name, (buffer, offset) in placed.items():
            resources[name] = {"buffer": buffer, "offset": offset, "size": self.sizes[name]}
        plan = self.compiled.shader.plan
        return [{"binding": b.number, "resource": resources[b.name]} for b in plan.bindings]
