"""Render: a config and a problem become WGSL text, from the Jinja2 templates.

WGSL lives only in `templates/`; Python hands the template integers (parameters, the
derived values of the search space) and type names. StrictUndefined makes a parameter
the template expects but the space does not define an error, not an empty string.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import jinja2
import jinja2.meta

from .data import data_path, extra_template_folders, template_sources
from .files import read_limited
from .plan import Plan
from .problem import Problem
from .space import Config, load_space, space_files


@dataclass(frozen=True)
class Shader:
    """A rendered kernel: WGSL text and its launch plan at the problem."""

    config: Config
    problem: Problem
    wgsl: str
    plan: Plan


def jinja_environment() -> jinja2.Environment:
    folders = (data_path("templates"), *extra_template_folders())
    return _environment_for(tuple(str(f) for f in folders))


MAX_TEMPLATE_BYTES = 4 * 2**20  # a template file larger than this is not one of ours


class _RegularFileLoader(jinja2.FileSystemLoader):
    """Jinja's loader, reading as every file autotune reads: regular files only, bounded
    (a FIFO or /dev/zero among one's own templates is refused, never waited on)."""

    def get_source(self, environment, template):
        for folder in self.searchpath:
            path = Path(folder, *jinja2.loaders.split_template_path(template))
            if os.path.lexists(path):
                text = read_limited(path, MAX_TEMPLATE_BYTES).decode()
                mtime = path.stat().st_mtime_ns
                return text, str(path), lambda p=path, m=mtime: p.stat().st_mtime_ns == m
        raise jinja2.TemplateNotFound(template)


@functools.cache
def _environment_for(folders: tuple[str, ...]) -> jinja2.Environment:
    return jinja2.Environment(
        loader=_RegularFileLoader(list(folders)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )


def template_hash(template: str) -> str:
    """Hash of a template's text, the files it includes, and its search space: names the
    tuning studies of a template, and tells when a kernel must be rendered again.

    Remembered per file set until one of the files changes (size or modification time),
    so that lookup can afford to check it on every call.
    """
    wgsl, space = template_sources()[template]
    memo = _hashes.get(template)
    if memo is not None and memo[0][:2] == [wgsl, space] and memo[1] == _stamps(memo[0]):
        return memo[2]
    paths = [wgsl, *space_files(template), *_included(wgsl)]
    stamps = _stamps(paths)
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + read_limited(path, MAX_TEMPLATE_BYTES))
    _hashes[template] = (paths, stamps, digest.hexdigest()[:16])
    return _hashes[template][2]


# What reading or rendering a template of the template path may raise (FileRefused,
# SpaceError and TOML errors are ValueErrors): a user's folder may hold anything.
TEMPLATE_ERRORS = (OSError, ValueError, KeyError, RecursionError, jinja2.TemplateError)


def template_stamp(template: str) -> str:
    """template_hash, or where it cannot be taken (a stray .toml on the template path, a
    file unreadable or broken) its two files' sizes and times: such a template is
    refused where it is used, and must not break what only checks whether a template
    changed, nor hide an edit of it."""
    try:
        return template_hash(template)
    except TEMPLATE_ERRORS:
        return str([_stamp_or_none(path) for path in template_sources().get(template, ())])


def _stamp_or_none(path: Path) -> tuple | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


_hashes: dict[str, tuple] = {}  # template -> (its files, their stamps, hash)


def _stamps(paths) -> list:
    return [(p.stat().st_mtime_ns, p.stat().st_size) for p in paths]


def _included(path) -> list:
    """The template files `path` includes, directly or not, in name order."""
    environment = jinja_environment()
    found, todo = {}, [read_limited(path, MAX_TEMPLATE_BYTES).decode()]
    while todo:
        for name in jinja2.meta.find_referenced_templates(environment.parse(todo.pop())):
            if name and name not in found:
                source = environment.loader.get_source(environment, name)
                found[name] = source[1]
                todo.append(source[0])
    return [Path(found[name]) for name in sorted(found)]


def render(config: Config, problem: Problem) -> Shader:
    """Render `config` for `problem`. The config must be valid in its space."""
    space = load_space(config.template)  # only known templates (file names we listed)
    reason = space.why_invalid(config, problem)
    if reason:
        raise ValueError(f"config {config} is invalid for {problem}: {reason}")
    values = space.context(config, problem)
    # What reaches the template: integers, and the element type's name from our table.
    for name, value in values.items():
        if type(value) is not int:
            raise ValueError(f"template value {name} must be an integer, got {value!r:.40}")
    wgsl = (
        jinja_environment()
        .get_template(f"{config.template}.wgsl.j2")
        .render(elem=problem.wgsl_type, **values)
    )
    return Shader(config, problem, wgsl, space.plan(config, problem))


def kernel_id(config: Config, problem: Problem) -> str:
    """The identity of the kernel `config` renders for `problem`: a hash of its WGSL, its
    launch plan and its space's version (part of every cache key). Templates can be
    refactored freely: what renders the same kernel keeps its identity."""
    return _kernel_id(config, problem, template_hash(config.template))


@functools.lru_cache(maxsize=4096)
def _kernel_id(config: Config, problem: Problem, sources: str) -> str:
    # `sources` (the template files' hash) is part of the memo's key only: an edited
    # template is rendered again
    shader = render(config, problem)
    digest = hashlib.sha256()
    for part in (shader.wgsl, shader.plan.text(), str(load_space(config.template).version)):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]
