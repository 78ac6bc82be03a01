"""Export: a kernel as files other projects drop in: NAME.wgsl, NAME.json, NAME.js.

The manifest (NAME.json) is all a consumer needs: entry point, workgroup size, bindings,
the uniform layout, dispatch size, required features and limits beyond WebGPU's defaults,
the shape it is for, and where it came from. NAME.js is an ES module embedding the WGSL
and the manifest, with `createGemm(device)`. The kernel is verified on this device at its
shape before anything is written: a wrong kernel is never exported.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from . import __version__ as autotune_version
from .arguments import ArgumentError, check_folder
from .cache import today
from .device import WEBGPU_DEFAULT_LIMITS, versions
from .kernel import Kernel
from .render import ENTRY_POINT, bindings, jinja_environment, uniform_layout
from .verify import verify

FORMAT = 1
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,99}$")


class ExportError(ArgumentError):
    """The kernel cannot be exported (bad argument, or it failed verification); `field`
    names the argument."""


def _camel(limit: str) -> str:
    """'max-compute-workgroup-storage-size' -> 'maxComputeWorkgroupStorageSize' (JS names)."""
    first, *rest = limit.split("-")
    return first + "".join(word.capitalize() for word in rest)


def default_name(kernel: Kernel) -> str:
    p = kernel.problem
    name = f"gemm_{p.M}x{p.N}x{p.K}_{p.dtype}"
    if not p.plain:
        name += f"_{p.layout}_{p.batch_text}" + "".join(f"_{op}" for op in p.ops)
        name += "" if p.accumulate == "auto" else f"_acc{p.accumulate[1:]}"
    return name


def computes(problem) -> str:
    """What the kernel computes, in words (the manifest's "computes")."""
    if problem.plain:
        return "C = A * B; A is M x K, B is K x N, C is M x N, all row-major"
    ops = problem.ops
    text = ("alpha * " if "alpha" in ops else "") + "op(A) * op(B)"
    text += (" + beta * C" if "beta" in ops else "") + (" + bias" if "bias" in ops else "")
    if problem.activation:
        text = f"{problem.activation}({text})"
    a = "A is K x M (op(A) = A^T)" if problem.trans_a else "A is M x K"
    b = "B is N x K (op(B) = B^T)" if problem.trans_b else "B is K x N"
    batch = ""
    if problem.batch > 1:
        batch = f"; {problem.batch} of each, one after another" + (
            " (one B for all)" if problem.shared_b else ""
        )
    bias = "; bias has N values, added to each row" if "bias" in ops else ""
    return f"C = {text}; {a}, {b}, C is M x N, all row-major{batch}{bias}"


def manifest(kernel: Kernel, name: str) -> dict:
    """The manifest of `kernel`: see the module doc."""
    shader, problem = kernel.shader, kernel.problem
    vector = shader.vector_width
    element = problem.wgsl_type if vector == 1 else f"vec{vector}<{problem.wgsl_type}>"
    shapes = problem.matrix_shapes()
    # bytes per buffer; WebGPU binds storage in whole 4-byte words (an odd count of f16)
    sizes = {n: -(-math.prod(shape) * problem.itemsize // 4) * 4 for n, shape in shapes.items()}
    fields, uniform_size = uniform_layout(problem)
    binding_list = []
    for number, binding_name, kind in bindings(problem):
        entry = {"binding": number, "name": binding_name, "kind": kind}
        if kind == "uniform":
            entry.update(type="Dims", size_bytes=uniform_size)
        else:
            entry.update(
                type=f"array<{element}>",
                element=problem.wgsl_type,
                vector_width=vector,
                size_bytes=sizes[binding_name],
                shape=list(shapes[binding_name]),
            )
        binding_list.append(entry)
    needs = {
        "max-compute-workgroup-storage-size": shader.workgroup_storage,
        "max-compute-invocations-per-workgroup": shader.invocations,
        "max-compute-workgroup-size-x": shader.workgroup_size[0],
        "max-compute-workgroup-size-y": shader.workgroup_size[1],
        "max-compute-workgroups-per-dimension": max(shader.dispatch),
        "max-storage-buffer-binding-size": max(sizes.values()),
        "max-buffer-size": max(sizes.values()),
    }
    required = {_camel(k): v for k, v in needs.items() if v > WEBGPU_DEFAULT_LIMITS[k]}
    entry = kernel.entry
    gpu = kernel.gpu
    variant = {
        "layout": problem.layout,
        "batch": problem.batch,
        "shared_b": problem.shared_b,
        "epilogue": {
            "ops": list(problem.ops),
            "activation": problem.activation,
            # alpha and beta are uniforms: createGemm(device, {alpha, beta}), setScalars
            "scalars": "uniform" if {"alpha", "beta"} & set(problem.ops) else None,
        },
        "accumulation": "f16" if kernel.config.as_dict().get("ACC") else "f32",
    }
    shape = {"M": problem.M, "N": problem.N, "K": problem.K}
    return {
        "name": name,
        "format": FORMAT,
        "computes": computes(problem),
        "dtype": problem.dtype,
        **variant,
        "shape": shape,
        "valid_for": [shape | {k: variant[k] for k in ("layout", "batch", "shared_b")}],
        "entry_point": ENTRY_POINT,
        "workgroup_size": list(shader.workgroup_size),
        "dispatch": list(shader.dispatch),
        "bindings": binding_list,
        "uniform": {
            "binding": next(n for n, _, kind in bindings(problem) if kind == "uniform"),
            "size": uniform_size,
            "fields": [{"name": f, "offset": o, "type": t} for f, o, t in fields],
        },
        "required_features": ["shader-f16"] if problem.dtype == "f16" else [],
        "required_limits": required,
        "workgroup_storage_bytes": shader.workgroup_storage,
        "config": {"template": kernel.config.template, "params": kernel.config.as_dict()},
        "provenance": {
            "source": kernel.source,
            "device": gpu.summary,
            "fingerprint": gpu.fingerprint.as_dict(),
            "driver": gpu.fingerprint.description,
            "versions": versions() | {"autotune": autotune_version},
            "runtime_checks": kernel.checks,
            "tuned_for": entry.key.problem.shape if entry else None,
            "gflops": entry.gflops if entry and kernel.source == "exact" else None,
            "tuned_on": entry.date if entry else None,
            "exported_on": today(),
        },
    }


def _template(name: str):
    return jinja_environment().get_template(name)


def export(kernel: Kernel, out_dir: str | Path, name: str | None = None) -> dict[str, Path]:
    """Write NAME.wgsl, NAME.json and NAME.js for `kernel` into `out_dir`; return the paths."""
    if not isinstance(kernel, Kernel):
        raise ExportError("kernel", f"kernel must be an autotune.Kernel, got {kernel!r:.60}")
    name = name or default_name(kernel)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ExportError(
            "name", f"name {name!r:.60} must be a letter then letters, digits, '_' or '-'"
        )
    check_folder("out_dir", out_dir, writable=False, error=ExportError)
    if out_dir is None:
        raise ExportError("out_dir", "out_dir must be a folder path, got None")
    verdict = verify(kernel.compiled, kernel.gpu)
    if not verdict.ok:
        raise ExportError(
            "kernel", f"{kernel.config} is wrong at {kernel.problem}: {verdict.reason}"
        )
    data = manifest(kernel, name)
    provenance = data["provenance"]
    header = _template("_export_header.wgsl.j2").render(
        name=name,
        computes=None if kernel.problem.plain else data["computes"],
        dtype=kernel.problem.dtype,
        config=str(kernel.config),
        dispatch=data["dispatch"],
        workgroup_size=data["workgroup_size"],
        source=kernel.source,
        device=provenance["device"],
        gflops=provenance["gflops"],
        checks=kernel.checks,
        date=provenance["tuned_on"],
        version=autotune_version,
        **data["shape"],
    )
    wgsl = kernel.wgsl
    # `enable` must come before any declaration: the header goes after it
    enable = re.match(r"(enable [^;]*;\n)", wgsl)
    wgsl = (enable[1] + header + wgsl[enable.end() :]) if enable else header + wgsl
    module = _template("_export.js.j2").render(
        name=name,
        computes=data["computes"],
        dtype=kernel.problem.dtype,
        manifest_json=json.dumps(data, indent=1),
        wgsl_json=json.dumps(wgsl),
        **data["shape"],
    )
    out = Path(out_dir)
    paths = {"wgsl": out / f"{name}.wgsl", "json": out / f"{name}.json", "js": out / f"{name}.js"}
    try:  # out_dir may lie below a file, or a bundle's name be a folder's already
        out.mkdir(parents=True, exist_ok=True)
        paths["wgsl"].write_text(wgsl)
        paths["json"].write_text(json.dumps(data, indent=1) + "\n")
        paths["js"].write_text(module)
    except OSError as error:
        raise ExportError(
            "out_dir", f"out_dir {str(out)!r:.80} cannot be written: {error}"
        ) from None
    return paths
