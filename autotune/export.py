"""Export: a kernel as files other projects drop in: NAME.wgsl, NAME.json, NAME.js.

The manifest (NAME.json) is all a consumer needs: entry point, workgroup size, bindings,
the uniform layout, dispatch size, required features and limits beyond WebGPU's defaults,
the shape it is for, and where it came from. NAME.js is an ES module embedding the WGSL
and the manifest, with `createGemm(device)`. The kernel is verified on this device at its
shape before anything is written: a wrong kernel is never exported.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from pathlib import Path

from .arguments import ArgumentError, check_folder
from .cache import today
from .compile import CompileError, compile_shader
from .device import WEBGPU_DEFAULT_LIMITS, required_features, versions
from .files import write_whole
from .kernel import Kernel
from .plan import uniform_layout
from .render import jinja_environment
from .verify import verify
from .version import __version__ as autotune_version

FORMAT = 2  # 2: `passes` and `buffers` (launch plans), workspaces allocated by createGemm
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,99}")  # fullmatch: `$` passes "x\n"


class ExportWarning(UserWarning):
    """export() replaced files of an earlier bundle (the message names them)."""


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


def buffers(kernel: Kernel) -> list[dict]:
    """The manifest's `buffers`: every binding of the plan, with its size in bytes; the
    problem's matrices with their element type and shape, workspaces marked as such."""
    plan, problem = kernel.shader.plan, kernel.problem
    vector = plan.vector_width
    element = problem.wgsl_type if vector == 1 else f"vec{vector}<{problem.wgsl_type}>"
    shapes = problem.matrix_shapes()
    described = []
    for binding in plan.bindings:
        entry = {"binding": binding.number, "name": binding.name, "kind": binding.kind}
        entry["size_bytes"] = binding.size
        if binding.kind == "uniform":
            entry.update(role="uniform", type="Dims")
        elif binding.workspace:
            entry.update(role="workspace")
        else:
            entry.update(role="operand", type=f"array<{element}>", element=problem.wgsl_type)
            entry.update(vector_width=vector, shape=list(shapes[binding.name]))
        described.append(entry)
    return described


def manifest(kernel: Kernel, name: str) -> dict:
    """The manifest of `kernel`: see the module doc."""
    plan, problem = kernel.shader.plan, kernel.problem
    fields, uniform_size = uniform_layout(problem)
    needs = plan.needs()
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
        # in order, in one compute pass: each pass sees what the one before it wrote
        "passes": [
            {
                "entry_point": step.entry_point,
                "workgroup_size": list(step.workgroup_size),
                "dispatch": list(step.grid),
            }
            for step in plan.passes
        ],
        "buffers": buffers(kernel),
        "uniform": {
            "binding": plan.binding("dims").number,
            "size": uniform_size,
            "fields": [{"name": f, "offset": o, "type": t} for f, o, t in fields],
        },
        # WebGPU's names, from the kernel's `enable` directives (f16: "shader-f16")
        "required_features": list(required_features(kernel.shader.wgsl)),
        "required_limits": required,
        "workgroup_storage_bytes": plan.workgroup_storage,
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


def _one_line(what: str, value: object) -> str:
    """`value` as text for a `//` comment, refused if it has a line break: WGSL ends a
    comment at LF, VT, FF, CR, NEL, U+2028 and U+2029, and str.splitlines splits at each."""
    text = str(value)
    if text.splitlines() not in ([], [text]):
        raise ExportError("kernel", f"the kernel's {what} {text!r:.60} has a line break")
    return text


def _with_header(kernel: Kernel, data: dict, name: str) -> str:
    """The kernel's WGSL with the comment header that says what it is and where from."""
    provenance = data["provenance"]
    header = _template("_export_header.wgsl.j2").render(
        name=name,
        computes=None if kernel.problem.plain else data["computes"],
        dtype=kernel.problem.dtype,
        config=_one_line("config", kernel.config),
        passes=data["passes"],
        source=_one_line("source", kernel.source),
        device=_one_line("device", provenance["device"]),
        gflops=provenance["gflops"],
        checks=kernel.checks,
        date=_one_line("date", provenance["tuned_on"] or ""),
        version=autotune_version,
        **data["shape"],
    )
    wgsl = kernel.wgsl
    # `enable` directives must come before any declaration: the header goes after them
    enable = re.match(r"(?:enable [^;]*;\n)*", wgsl)
    return enable[0] + header + wgsl[enable.end() :]


def _verify_text(kernel: Kernel, wgsl: str) -> None:
    """Compile exactly `wgsl` as a browser does (runtime checks on) and verify it at the
    kernel's shape on its device; refuse the export otherwise. (The one line naga is
    spared is `enable subgroups;`, which browsers require and naga does not implement
    yet: Gpu.create_shader_module removes it, and compiles the rest as written.)"""
    shader = dataclasses.replace(kernel.shader, wgsl=wgsl)
    try:
        verdict = verify(compile_shader(shader, kernel.gpu, checks=True), kernel.gpu)
    except CompileError as error:
        raise ExportError("kernel", f"the WGSL to write does not compile: {error}") from error
    if not verdict.ok:
        raise ExportError(
            "kernel", f"{kernel.config} is wrong at {kernel.problem}: {verdict.reason}"
        )


def export(kernel: Kernel, out_dir: str | Path, name: str | None = None) -> dict[str, Path]:
    """Write NAME.wgsl, NAME.json and NAME.js for `kernel` into `out_dir`; return the paths."""
    if not isinstance(kernel, Kernel):
        raise ExportError("kernel", f"kernel must be an autotune.Kernel, got {kernel!r:.60}")
    if name is None or (isinstance(name, str) and not name):  # (an array has no truth value)
        name = default_name(kernel)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ExportError(
            "name", f"name {name!r:.60} must be a letter then letters, digits, '_' or '-'"
        )
    check_folder("out_dir", out_dir, writable=False, error=ExportError)
    if out_dir is None:
        raise ExportError("out_dir", "out_dir must be a folder path, got None")
    data = manifest(kernel, name)
    wgsl = _with_header(kernel, data, name)
    _verify_text(kernel, wgsl)  # the text written, header included, before any file
    module = _template("_export.js.j2").render(
        name=name,
        computes=data["computes"],
        dtype=kernel.problem.dtype,
        manifest_json=json.dumps(data, indent=1),
        wgsl_json=json.dumps(wgsl),
        **data["shape"],
    )
    texts = {"wgsl": wgsl, "json": json.dumps(data, indent=1) + "\n", "js": module}
    return _write_bundle(Path(out_dir), name, texts)


def _write_bundle(out: Path, name: str, texts: dict[str, str]) -> dict[str, Path]:
    """Write out/NAME.<kind> for each text; warn (ExportWarning) with the files replaced.

    Never through a symlink (an existing one could point anywhere, e.g. outside `out`)
    nor over a folder or special file: each is refused before anything is written. Each
    file is written whole to a temp file in `out` and renamed over its name, so a reader
    sees the old bundle file or the new one, and a link swapped in meanwhile is replaced,
    not followed.
    """
    paths = {kind: out / f"{name}.{kind}" for kind in texts}
    replaced = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for path in paths.values():
            if path.is_symlink() or (path.exists() and not path.is_file()):
                raise ExportError(
                    "out_dir",
                    f"{path} exists and is not a regular file (a symlink, folder or special "
                    "file); nothing written",
                )
            replaced += [path] if path.exists() else []
        for kind, path in paths.items():
            write_whole(path, texts[kind])
    except OSError as error:
        raise ExportError("out_dir", f"out_dir {str(out)!r} cannot be written: {error}") from None
    if replaced:
        warnings.warn(
            f"replaced the earlier {', '.join(map(str, replaced))}", ExportWarning, stacklevel=3
        )
    return paths
