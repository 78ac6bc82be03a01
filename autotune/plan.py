"""Launch plan: a kernel as data, the passes it dispatches and the buffers they bind.

Every stage that runs or describes a kernel (compile, bind, limit checks, verification,
timing, the export manifest and its JS module) iterates over a `Plan`, so a template of
several passes (split-K: partial products into a workspace, then a reduction) needs no
change outside its own files.

A template declares its plan in its search-space file, as expressions over the problem,
the parameters and the derived values (the same expression form as constraints):

    [[passes]]                       # in order; all passes run in one compute pass
    entry_point = "partial"
    workgroup_size = ["WG", "1", "1"]
    grid = ["cdiv(M * N, WG)", "2", "BATCH"]

    [[workspaces]]                   # scratch buffers the kernel owns (bindings 5, 6, ...)
    name = "partials"
    bytes = "2 * M * N * 4"

A pass or a workspace may say `when = "QS > 0"`: the plan has it only where the expression
holds (a config that fuses a pass into the next has neither the pass nor its buffers); a
workspace keeps the binding number of its place in the declarations either way.

A space without [[passes]] has the one-pass plan of the built-in templates: entry point
`main`, workgroups of (workgroup_size_x, workgroup_size_y, 1), a grid of (grid_x, grid_y,
grid_z or 1), all derived in the space.

The kernel's interface (its ABI) is declared here once: the problem's buffers and their
binding numbers, and the uniform block's layout. WGSL declares the same bindings in
templates/_bindings*.wgsl.j2, the one place WGSL text lives.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from .problem import Problem

# The problem's buffers: binding number, name, kind. bias only where the epilogue has it;
# scales and zeros only with quantized weights (B then holds the packed codes), numbered
# after the workspaces' 5 to 8 so that no earlier kernel's bindings moved.
OPERANDS = (
    (0, "A", "read-only-storage"),
    (1, "B", "read-only-storage"),
    (2, "C", "storage"),
    (3, "dims", "uniform"),
    (4, "bias", "read-only-storage"),
    (9, "scales", "read-only-storage"),
    (10, "zeros", "read-only-storage"),
)
FIRST_WORKSPACE_BINDING = 5
# The uniform block: field, byte offset, type. The plain problem's (f32, nn, one matrix,
# no epilogue) predates the variants and keeps its 16 bytes.
PLAIN_UNIFORM = (("M", 0, "u32"), ("N", 4, "u32"), ("K", 8, "u32"), ("pad", 12, "u32"))
VARIANT_UNIFORM = (
    ("M", 0, "u32"),
    ("N", 4, "u32"),
    ("K", 8, "u32"),
    ("batch", 12, "u32"),  # matrices per operand
    ("alpha", 16, "f32"),  # runtime values: one kernel serves any alpha and beta
    ("beta", 20, "f32"),
    ("pad0", 24, "u32"),
    ("pad1", 28, "u32"),
)
MAX_PASSES = 8
QUANTIZE_PASS = "quantize"  # the entry point that quantizes activations (no product)
MAX_WORKSPACES = 4  # bindings 5 to 8


class PlanError(ValueError):
    """A plan that cannot run: a malformed declaration or a bad value at a problem."""


def uniform_layout(problem: Problem) -> tuple[tuple[tuple[str, int, str], ...], int]:
    """(fields as (name, byte offset, type), size in bytes) of the uniform block."""
    fields = PLAIN_UNIFORM if problem.plain else VARIANT_UNIFORM
    return fields, fields[-1][1] + 4


def storage_bytes(elements: int, itemsize: int) -> int:
    """Bytes of a storage buffer of `elements`: WebGPU binds whole 4-byte words (an odd
    count of f16 rounds up)."""
    return -(-elements * itemsize // 4) * 4


@dataclass(frozen=True)
class Pass:
    """One dispatch of the plan."""

    entry_point: str
    workgroup_size: tuple[int, int, int]
    grid: tuple[int, int, int]  # workgroups in x, y, z

    @property
    def invocations(self) -> int:
        return math.prod(self.workgroup_size)


@dataclass(frozen=True)
class Binding:
    """One buffer the passes bind: an operand, the uniform block or a workspace."""

    number: int
    name: str
    kind: str  # "read-only-storage", "storage" or "uniform"
    size: int  # bytes
    workspace: bool = False  # owned by the kernel (allocated with it), not the caller's


@dataclass(frozen=True)
class Plan:
    """A kernel's launch plan at one problem: passes in order, and their bindings."""

    passes: tuple[Pass, ...]
    bindings: tuple[Binding, ...]
    workgroup_storage: int  # bytes of var<workgroup> memory (the largest pass's)
    vector_width: int  # the template's VEC (an operand it binds as scalars: export.operand_types)

    @property
    def workspaces(self) -> tuple[Binding, ...]:
        return tuple(b for b in self.bindings if b.workspace)

    def text(self) -> str:
        """The plan's values as canonical JSON (part of the kernel identity): the same
        plan gives the same text whatever the classes' field names."""
        passes = [[p.entry_point, list(p.workgroup_size), list(p.grid)] for p in self.passes]
        bindings = [[b.number, b.name, b.kind, b.size, b.workspace] for b in self.bindings]
        values = [passes, bindings, self.workgroup_storage, self.vector_width]
        return json.dumps(values, separators=(",", ":"))

    @property
    def work(self) -> Pass:
        """The pass that computes the product: the first, after the activations'
        quantization where the kernel quantizes them (split-K's reduction comes after
        its product)."""
        steps = [p for p in self.passes if p.entry_point != QUANTIZE_PASS]
        return steps[0] if steps else self.passes[0]

    def binding(self, name: str) -> Binding:
        return next(b for b in self.bindings if b.name == name)

    def needs(self) -> dict[str, int]:
        """Each device limit this plan meets, and what it needs of it. The one table of
        limits: compile refuses on it, export lists what exceeds WebGPU's defaults."""
        storage = max(b.size for b in self.bindings if b.kind != "uniform")
        return {
            "max-compute-invocations-per-workgroup": max(p.invocations for p in self.passes),
            "max-compute-workgroup-size-x": max(p.workgroup_size[0] for p in self.passes),
            "max-compute-workgroup-size-y": max(p.workgroup_size[1] for p in self.passes),
            "max-compute-workgroup-size-z": max(p.workgroup_size[2] for p in self.passes),
            "max-compute-workgroup-storage-size": self.workgroup_storage,
            "max-compute-workgroups-per-dimension": max(max(p.grid) for p in self.passes),
            "max-storage-buffer-binding-size": storage,
            "max-buffer-size": storage,
        }


def operand_bindings(problem: Problem) -> tuple[Binding, ...]:
    """The problem's buffers with their sizes in bytes (before any workspace)."""
    shapes, types = problem.matrix_shapes(), problem.operand_dtypes()
    _, uniform_size = uniform_layout(problem)
    bindings = []
    for number, name, kind in OPERANDS:
        if kind == "uniform":
            bindings.append(Binding(number, name, kind, uniform_size))
        elif name in shapes:
            size = storage_bytes(math.prod(shapes[name]), np.dtype(types[name]).itemsize)
            bindings.append(Binding(number, name, kind, size))
    return tuple(bindings)


def make_plan(
    problem: Problem,
    passes: list[tuple[str, tuple[int, ...], tuple[int, ...]]],
    workspaces: list[tuple[int, str, int]],
    workgroup_storage: int,
    vector_width: int,
) -> Plan:
    """A plan from evaluated declarations, each value checked: at least one pass,
    positive sizes and grids, whole workspaces, each (place declared, name, bytes) (see
    search spaces' [[passes]] and [[workspaces]])."""
    if not passes:
        raise PlanError("the plan has no pass: every pass's `when` is false here")
    steps = []
    for entry_point, size, grid in passes:
        for what, values in (("workgroup_size", size), ("grid", grid)):
            if len(values) != 3 or any(type(v) is not int or v < 1 for v in values):
                raise PlanError(f"pass {entry_point}: {what} must be 3 integers >= 1: {values}")
        steps.append(Pass(entry_point, tuple(size), tuple(grid)))
    bindings = list(operand_bindings(problem))
    for index, name, size in workspaces:
        if type(size) is not int or size < 4 or size % 4:
            raise PlanError(f"workspace {name}: bytes must be a positive multiple of 4: {size}")
        bindings.append(Binding(FIRST_WORKSPACE_BINDING + index, name, "storage", size, True))
    return Plan(tuple(steps), tuple(bindings), workgroup_storage, vector_width)
