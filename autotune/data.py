"""Where the data folders are: next to the package in a checkout, inside it when installed.

AUTOTUNE_TEMPLATE_PATH adds folders of one's own templates (os.pathsep-separated), each
holding NAME.wgsl.j2 and its search space NAME.toml side by side. They may include the
built-in `_bindings.wgsl.j2`; one that shadows a built-in template (or one of an earlier
folder) is ignored, with a warning.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
TEMPLATE_PATH_ENV = "AUTOTUNE_TEMPLATE_PATH"
# The built-in templates, in the order they are tried for a default kernel: the one list
# of them (tune searches those that compute the problem; lookup, demo and the benchmarks
# take theirs from here). blockedx computes the variant problems, gemv every problem of
# M <= 16 (decoding), splitk (K cut into ranges, summed by a second pass) both kinds,
# the others the plain one. With quantized weights (and nothing else): qgemv decodes
# (M <= 32) and qgemm computes any M, dequantizing in registers; qdotv (M <= 32) and qdot
# quantize the activations too and multiply int8 codes. qsplitk and qdotsplitk are qgemm
# and qdot with K cut into ranges, for a few dozen rows.
BUILT_IN = (
    "blocked", "blockedx", "gemv", "splitk", "tiled", "naive", "qgemv", "qgemm", "qsplitk",
    "qdot", "qdotsplitk", "qdotv",
)  # fmt: skip


@functools.cache
def data_path(name: str) -> Path:
    """templates/, search_spaces/ or cache/: the checkout's copy if there, else the wheel's
    (remembered, as in_checkout is: one lookup asks for it hundreds of times)."""
    checkout = PACKAGE.parent / name
    if in_checkout():
        return checkout
    return PACKAGE / name


@functools.cache
def in_checkout() -> bool:
    """True when running from a source checkout (editable install or plain PYTHONPATH);
    asked once per process (lookup asks for every template's files on every call)."""
    return (PACKAGE.parent / "pyproject.toml").is_file() and (PACKAGE.parent / "templates").is_dir()


def extra_template_folders() -> list[Path]:
    value = os.environ.get(TEMPLATE_PATH_ENV, "")
    return [Path(p) for p in value.split(os.pathsep) if p]


def template_sources() -> dict[str, tuple[Path, Path]]:
    """Template name -> (its .wgsl.j2 file, its search-space .toml file)."""
    folders = [data_path("search_spaces"), *extra_template_folders()]
    listings = tuple((str(folder), _toml_names(folder)) for folder in folders)
    return dict(_sources(str(data_path("templates")), listings))


def _toml_names(folder: Path) -> tuple[str, ...]:
    """The names of a folder's *.toml entries, sorted (none where it cannot be listed). A
    listing, not a glob: lookup reads it for every template on every call."""
    try:
        names = os.listdir(folder)
    except OSError:
        return ()
    return tuple(sorted(n.removesuffix(".toml") for n in names if n.endswith(".toml")))


@functools.lru_cache(maxsize=64)
def _sources(templates: str, listings: tuple) -> dict[str, tuple[Path, Path]]:
    # Keyed on the listings themselves: a file added or removed is seen on the next call.
    (spaces, builtin), *extra = listings
    sources = {n: (Path(templates, f"{n}.wgsl.j2"), Path(spaces, f"{n}.toml")) for n in builtin}
    for folder, names in extra:
        for name in names:
            if not name.isidentifier():
                _ignored(folder, name, "its name is not a Python identifier")
            elif name in sources:
                _ignored(folder, name, f"it shadows {sources[name][1]}")
            else:
                sources[name] = (Path(folder, f"{name}.wgsl.j2"), Path(folder, f"{name}.toml"))
    return sources


def _ignored(folder: str, name: str, why: str) -> None:
    # Said once per listing (_sources is cached on it): a file one meant as a template,
    # left out in silence, would look like a template that tunes nothing.
    warnings.warn(
        f"{TEMPLATE_PATH_ENV}: {Path(folder, name + '.toml')} is ignored: {why}", stacklevel=2
    )
