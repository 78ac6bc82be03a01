"""Compile: a rendered Shader becomes a compute pipeline on the device.

One pipeline per pass of the launch plan, all on one explicit bind group layout (not
"auto") made from the plan's bindings: the layout the export manifest describes, so a
kernel that compiles here binds the same way in a browser.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import wgpu

from .device import Gpu, required_features
from .problem import Problem
from .render import Shader, render
from .space import Config

_BUFFER_TYPES = {
    "read-only-storage": wgpu.BufferBindingType.read_only_storage,
    "storage": wgpu.BufferBindingType.storage,
    "uniform": wgpu.BufferBindingType.uniform,
}


class CompileError(RuntimeError):
    """The shader or its pipeline was refused. `reason` is "compile" or "limits"."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Compiled:
    """A shader compiled on one device: ready to dispatch."""

    shader: Shader
    checks: bool  # wgpu's runtime checks on (as in browsers) or off
    pipelines: tuple  # wgpu.GPUComputePipeline of each pass, in plan order
    bind_group_layout: object  # wgpu.GPUBindGroupLayout
    seconds: float  # wall time of shader module + pipeline creation


def _check_limits(shader: Shader, gpu: Gpu) -> None:
    """Refuse, before wgpu does, a shader that needs more than the device has."""
    for feature in gpu.lacks(required_features(shader.wgsl)):  # its `enable` directives
        what = "f16" if feature == "shader-f16" else "the shader"
        message = f"{what} needs the {feature} feature; {gpu.described} lacks it"
        raise CompileError("limits", message)
    for limit, need in shader.plan.needs().items():
        if need > gpu.limits[limit]:
            raise CompileError("limits", f"{limit} is {gpu.limits[limit]}, the shader needs {need}")


def missing_features(config: Config, problem: Problem, gpu) -> tuple[str, ...]:
    """The features `config`'s kernel at `problem` needs (its `enable` lines) that the
    device lacks: a subgroup kernel for a device requested without subgroups. Rendering
    (about 10 ms) is skipped where the device has every one (or a stand-in Gpu of a
    replayed search says nothing of features)."""
    if getattr(gpu, "has_every_feature", True):
        return ()
    return gpu.lacks(required_features(render(config, problem).wgsl))


def compile_shader(shader: Shader, gpu: Gpu, *, checks: bool = True) -> Compiled:
    """Create the shader module and compute pipeline; raise CompileError on refusal."""
    _check_limits(shader, gpu)
    return create_pipeline(shader, gpu, checks=checks)


def create_pipeline(shader: Shader, gpu: Gpu, *, checks: bool = True) -> Compiled:
    """compile_shader without our own limit check: wgpu alone judges the shader."""
    start = time.perf_counter()
    label = str(shader.config)
    try:
        module = gpu.create_shader_module(shader.wgsl, checks=checks, label=label)
        layout = gpu.device.create_bind_group_layout(
            entries=[
                {
                    "binding": binding.number,
                    "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": _BUFFER_TYPES[binding.kind]},
                }
                for binding in shader.plan.bindings
            ]
        )
        pipeline_layout = gpu.device.create_pipeline_layout(bind_group_layouts=[layout])
        pipelines = tuple(
            gpu.device.create_compute_pipeline(
                layout=pipeline_layout,
                compute={"module": module, "entry_point": step.entry_point},
            )
            for step in shader.plan.passes
        )
    except (wgpu.GPUError, RuntimeError) as error:
        raise CompileError("compile", f"{label}: {error}") from error
    return Compiled(shader, checks, pipelines, layout, time.perf_counter() - start)
