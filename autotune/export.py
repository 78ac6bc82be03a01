"""Export: a kernel as files other projects drop in: NAME.wgsl, NAME.json, NAME.js.

The manifest (NAME.json) is all a consumer needs: entry point, workgroup size, bindings,
the uniform layout, dispatch size, required features and limits beyond WebGPU's defaults,
the shape it is for, and where it came from. With quantized weights (`weights`), B,
`scales` and `zeros` are `array<u32>` (B also `array<vec4<u32>>`, four words an element)
holding exactly the bytes of docs/QUANTIZED.md's files (QuantizedWeight.save's
WEIGHT.data.bin, WEIGHT.scales.bin, WEIGHT.zeros.bin):
`packing` says how ("codes"; "f16 pairs", scale e in the low half of word e / 2 when e is
even, else the high half; "zero-point nibbles"), `shape` and `element` are the saved
array's, `layout` the weight manifest's line; the WGSL language features the kernel uses
(packed_4x8_integer_dot_product for unpack4xU8) are `required_language_features`.
An f16 operand a kernel reads as words (gemv's H8: `array<vec4<u32>>`) is marked `packing`
"f16 pairs" too, element e of the array in the low half of word e / 2 when e is even,
else the high half; its `element` is "f16" and its `shape` the problem's, in halves
(its `vector_width`, 4, counts words: eight halves).

NAME.js is an ES module embedding the WGSL and the manifest, with `createGemm(device)`.
The kernel is verified on this device at its shape before anything is written: a wrong
kernel is never exported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

from .arguments import NAME, ArgumentError, check_folder
from .cache import MergeError, today
from .candidates import choose
from .compile import CompileError, compile_shader
from .device import WEBGPU_DEFAULT_LIMITS, required_features, versions
from .files import write_whole
from .kernel import Kernel
from .plan import uniform_layout
from .quantize import file_layouts, file_name
from .render import jinja_environment
from .verify import verify
from .version import __version__ as autotune_version

FORMAT = 2  # 2: `passes` and `buffers` (launch plans), workspaces allocated by createGemm


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
        name += "" if p.weights == "none" else f"_{p.weights}"
        name += "" if p.activations == "none" else "_a8"
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
    if problem.quantized:
        text, batch = text.replace("op(B)", "W'^T"), batch.replace("one B", "one weight")
        weights = _weights_text(problem) + _activations_text(problem)
        return f"C = {text}; {a}, C is M x N, all row-major; {weights}{batch}{bias}"
    return f"C = {text}; {a}, {b}, C is M x N, all row-major{batch}{bias}"


def _weights_text(problem) -> str:
    """The quantized weight W' in words (computes), by the format's names in
    docs/QUANTIZED.md."""
    bits, group, zero_points = problem.weight_format
    if bits == 8:
        how = "int8 codes, one f16 scale per row: W'[n, k] = code * scale[n]"
    else:
        zero = "a zero point (zeros)" if zero_points else "the zero point 8"
        how = (
            f"4-bit codes, per {group} K of a row one f16 scale and {zero}: "
            f"W'[n, k] = (code - zero) * scale"
        )
    return (
        f"W' is the N x K weight dequantized from {problem.weights} (docs/QUANTIZED.md; B "
        f"holds its packed codes, scales its scales): {how}"
    )


def _activations_text(problem) -> str:
    """What the kernel does to A first where it quantizes it (activations "q8")."""
    if problem.activations != "q8":
        return ""
    return (
        "; A's rows are quantized first, as the kernel multiplies them: code = clamp(rint(a "
        "* 2^(7 - e)), -127, 127) with max |row| = f * 2^e, f in [0.5, 1), times the row's "
        "scale 2^(e - 7) (docs/QUANTIZED.md, int8 dot products)"
    )


# A quantized weight's buffers (docs/QUANTIZED.md): binding name -> the weight file's
# role (QuantizedWeight.files, NAME.<suffix>.bin) and how its u32 words are packed.
WEIGHT_BUFFERS = {
    "B": ("data", "codes"),
    "scales": ("scales", "f16 pairs"),
    "zeros": ("zero_points", "zero-point nibbles"),
}


# A storage binding's declaration: `@binding(N) var<storage, ...> NAME: array<TYPE>;`
_DECLARED = re.compile(
    r"@binding\((\d+)\)\s*var<storage[^>]*>\s*(\w+)\s*:\s*array<(?:vec([234])<)?(\w+)>?>"
)


def operand_types(kernel: Kernel) -> dict[str, tuple[str, int]]:
    """Each operand binding's (WGSL scalar type, vector width), as the WGSL declares it:
    the one source of the manifest's `type`. An operand's width is the template's VEC,
    or 1 where it binds the operand as scalars (the register-blocked families at a size
    VEC does not divide; qgemv's AV); quantized weights are u32 words (B, scales, zeros;
    templates/_bindings_quantized.wgsl.j2)."""
    names = kernel.problem.matrix_shapes()
    declared = {
        name: (scalar, int(width or 1))
        for _, name, width, scalar in _DECLARED.findall(kernel.shader.wgsl)
    }
    missing = sorted(set(names) - set(declared))
    if missing:
        raise ExportError("kernel", f"the WGSL declares no storage array for {missing}")
    return {name: declared[name] for name in names}


def _weight_buffer(problem, name: str) -> dict:
    """What a quantized weight's buffer holds: its values' type, packing and layout."""
    role, packing = WEIGHT_BUFFERS[name]
    layout = file_layouts(*problem.weight_format)[role]
    element = "f16" if name == "scales" else "u32"
    return dict(element=element, packing=packing, layout=layout, file=file_name("WEIGHT", role))


def buffers(kernel: Kernel) -> list[dict]:
    """The manifest's `buffers`: every binding of the plan, with its size in bytes; the
    problem's arrays with their WGSL type, element type and shape (in elements of the
    array QuantizedWeight holds, for a quantized weight's), workspaces marked as such."""
    plan, problem = kernel.shader.plan, kernel.problem
    shapes, types = problem.matrix_shapes(), operand_types(kernel)
    described = []
    for binding in plan.bindings:
        entry = {"binding": binding.number, "name": binding.name, "kind": binding.kind}
        entry["size_bytes"] = binding.size
        if binding.kind == "uniform":
            entry.update(role="uniform", type="Dims")
        elif binding.workspace:
            entry.update(role="workspace")
        else:
            scalar, vector = types[binding.name]
            element = scalar if vector == 1 else f"vec{vector}<{scalar}>"
            entry.update(role="operand", type=f"array<{element}>", element=scalar)
            entry.update(vector_width=vector, shape=list(shapes[binding.name]))
            if problem.quantized and binding.name in WEIGHT_BUFFERS:
                entry.update(_weight_buffer(problem, binding.name))
            elif scalar == "u32" and problem.dtype == "f16":
                # halves read as words (gemv's 16-byte loads): the same bytes, two a word
                entry.update(element="f16", packing="f16 pairs")
        described.append(entry)
    return described


# WGSL language features (navigator.gpu.wgslLanguageFeatures) and the builtins that need
# them: a browser without one refuses the module, so createGemm checks first.
LANGUAGE_FEATURES = {
    "packed_4x8_integer_dot_product": re.compile(
        r"\b(?:unpack4x[IU]8|pack4x[IU]8(?:Clamp)?|dot4[IU]8Packed)\s*\("
    ),
}


def _language_features(wgsl: str) -> dict:
    """{"required_language_features": [...]} for the WGSL language features `wgsl` uses;
    {} where it uses none (the manifests of kernels without them keep their fields)."""
    used = [name for name, call in LANGUAGE_FEATURES.items() if call.search(wgsl)]
    return {"required_language_features": used} if used else {}


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
    # only where quantized: every other manifest stays as it was
    quantized = ("weights", "activations") if problem.quantized else ()
    variant |= {key: getattr(problem, key) for key in quantized}
    valid_keys = ("layout", "batch", "shared_b") + quantized
    shape = {"M": problem.M, "N": problem.N, "K": problem.K}
    return {
        "name": name,
        "format": FORMAT,
        "computes": computes(problem),
        "dtype": problem.dtype,
        **variant,
        "shape": shape,
        "valid_for": [shape | {k: variant[k] for k in valid_keys}],
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
        **_language_features(kernel.shader.wgsl),
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


def _weight_usage(problem) -> dict:
    """The JS module's usage lines for quantized weights: the named buffers and files."""
    if not problem.quantized:
        return {"weights": None}
    names = [name for name in WEIGHT_BUFFERS if name != "B" and name in problem.matrix_shapes()]
    files = ", ".join(
        f"{name}: {file_name('WEIGHT', WEIGHT_BUFFERS[name][0])}" for name in ["B", *names]
    )
    return {"weights": problem.weights, "weight_buffers": names, "weight_files": files}


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


def bundle_texts(kernel: Kernel, name: str) -> tuple[dict, str]:
    """`kernel`'s manifest and the WGSL to write (with its header), verified as written:
    compiled as a browser does and run at its shape on its device. ExportError when it
    fails."""
    data = manifest(kernel, name)
    wgsl = _with_header(kernel, data, name)
    _verify_text(kernel, wgsl)  # the text written, header included, before any file
    return data, wgsl


def export(
    kernel: Kernel,
    out_dir: str | Path,
    name: str | None = None,
    *,
    candidates: int | None = None,
    cache_dir: str | Path | None = None,
    caches: Sequence[str | Path] = (),
) -> dict[str, Path]:
    """Write NAME.wgsl, NAME.json and NAME.js for `kernel` into `out_dir`; return the paths
    by kind ("wgsl", "json", "js").

    `candidates=K`: a candidate set instead (NAME.js, NAME.json and NAME_c<i>.wgsl, the
    paths' kinds "js", "json", "c0", "c1", ...): up to K verified kernels for the
    problem, `kernel` first, chosen to suit different GPUs (autotune/candidates.py) from
    the caches lookup reads (`cache_dir`, the shipped one) and `caches`, cache files or
    folders of other machines; the module's createGemm times them on the visitor's
    device and keeps the fastest (docs/ARCHITECTURE.md, "Candidate sets")."""
    if not isinstance(kernel, Kernel):
        raise ExportError("kernel", f"kernel must be an autotune.Kernel, got {kernel!r:.60}")
    if name is None or (isinstance(name, str) and not name):  # (an array has no truth value)
        name = default_name(kernel)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ExportError(
            "name", f"name {name!r:.60} must be a letter then letters, digits, '_' or '-'"
        )
    check_folder("out_dir", out_dir, writable=False, error=ExportError)
    if out_dir is None:
        raise ExportError("out_dir", "out_dir must be a folder path, got None")
    if candidates is not None:
        files = candidate_files(kernel, name, _count(candidates), cache_dir, _paths(caches))
        return _write_bundle(Path(out_dir), files)
    data, wgsl = bundle_texts(kernel, name)
    module = _template("_export.js.j2").render(
        name=name,
        computes=data["computes"],
        dtype=kernel.problem.dtype,
        manifest_json=json.dumps(data, indent=1),
        **_weight_usage(kernel.problem),
        wgsl_json=json.dumps(wgsl),
        **data["shape"],
    )
    files = {"wgsl": (f"{name}.wgsl", wgsl), "json": (f"{name}.json", _json(data))}
    files["js"] = (f"{name}.js", module)
    return _write_bundle(Path(out_dir), files)


def _json(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"


MAX_CANDIDATES = 16  # each is compiled on every visitor's device: a handful is the point


def _count(candidates: object) -> int:
    if type(candidates) is not int or not 1 <= candidates <= MAX_CANDIDATES:
        raise ExportError(
            "candidates",
            f"candidates must be a whole number from 1 to {MAX_CANDIDATES}, got {candidates!r:.60}",
        )
    return candidates


def _paths(caches: object) -> list[Path]:
    """`caches` as paths, each an existing file or folder (named in the error if not)."""
    if isinstance(caches, str | Path):
        caches = [caches]
    paths = []
    for item in caches:
        if not isinstance(item, str | Path) or not Path(item).exists():
            raise ExportError("caches", f"caches: {item!r:.80} is not a cache file or folder")
        paths.append(Path(item))
    return paths


def candidate_files(kernel, name, count, cache_dir, caches) -> dict[str, tuple[str, str]]:
    """The candidate set's files by kind: NAME.js, NAME.json and NAME_c<i>.wgsl."""
    bundles = {}

    def verified(candidate_kernel: Kernel, index: int) -> tuple[dict, str]:
        return bundle_texts(candidate_kernel, f"{name}_c{index}")

    try:
        chosen = choose(kernel, count, verified, cache_dir=cache_dir, caches=caches)
    except MergeError as error:  # a file named in `caches` is not a cache file
        raise ExportError("caches", str(error)) from None
    for index, (candidate, _, (data, wgsl)) in enumerate(chosen.taken):
        data["provenance"] |= _chosen_provenance(candidate)
        bundles[f"c{index}"] = (data, wgsl)
    texts = [wgsl for _, wgsl in bundles.values()]
    data = candidate_manifest(kernel, name, [d for d, _ in bundles.values()], chosen.left_out)
    data["hash"] = bundle_hash(texts)
    module = _template("_export_candidates.js.j2").render(
        name=name,
        computes=data["computes"],
        dtype=kernel.problem.dtype,
        count=len(texts),
        manifest_json=json.dumps(data, indent=1),
        **_weight_usage(kernel.problem),
        wgsl_json=json.dumps(texts, indent=1),
        **data["shape"],
    )
    files = {kind: (f"{name}_{kind}.wgsl", wgsl) for kind, (_, wgsl) in bundles.items()}
    files["json"] = (f"{name}.json", _json(data))
    files["js"] = (f"{name}.js", module)
    return files


def _chosen_provenance(candidate) -> dict:
    """Why a candidate is in the set and, from another device's cache, how it measured
    there."""
    chosen = {"chosen_as": candidate.chosen_as}
    entry = candidate.entry
    if entry is not None and not candidate.chosen_as.startswith("exported"):
        chosen["measured"] = {
            "device": candidate.device or None,
            "shape": entry.key.problem.shape,
            "gflops": entry.gflops,
            "date": entry.date,
        }
    return chosen


def candidate_manifest(kernel, name: str, manifests: list[dict], left_out: list) -> dict:
    """The set's manifest: what every candidate computes, the candidates' own manifests
    in order (the exported kernel first) and the configs left out, with why."""
    first = manifests[0]
    shared = ("computes", "dtype", "layout", "batch", "shared_b", "epilogue", "shape")
    return {
        "name": name,
        "format": FORMAT,
        "kind": "candidates",
        **{key: first[key] for key in shared},
        **{key: first[key] for key in ("weights", "activations") if key in first},
        "valid_for": first["valid_for"],
        "candidates": manifests,
        "left_out": left_out,
    }


def bundle_hash(texts: list[str]) -> str:
    """What a browser keys its stored choice by, with the adapter: another set of kernels
    is another hash, so a choice among the old set is never reused."""
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:16]


def _write_bundle(out: Path, files: dict[str, tuple[str, str]]) -> dict[str, Path]:
    """Write each kind's (file name, text) into `out`; return the paths by kind; warn
    (ExportWarning) with the files replaced.

    Never through a symlink (an existing one could point anywhere, e.g. outside `out`)
    nor over a folder or special file: each is refused before anything is written. Each
    file is written whole to a temp file in `out` and renamed over its name, so a reader
    sees the old bundle file or the new one, and a link swapped in meanwhile is replaced,
    not followed.
    """
    paths = {kind: out / file for kind, (file, _) in files.items()}
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
            write_whole(path, files[kind][1])
    except OSError as error:
        raise ExportError("out_dir", f"out_dir {str(out)!r} cannot be written: {error}") from None
    if replaced:
        warnings.warn(
            f"replaced the earlier {', '.join(map(str, replaced))}", ExportWarning, stacklevel=3
        )
    return paths
