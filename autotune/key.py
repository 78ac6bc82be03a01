"""Cache key: everything that can change which kernel is right and fastest, as one list.

A key is written as its components joined by ":" and read back from the same list,
so a change to what the key holds is a change to `Key.components` and `Key.parse`:

    blockedx:3f9c0e1d22a4b6c8:nochecks:f16-acc32:nt:device:64x4096x4096:b8s:bias,gelu
    template  kernel identity  checks   dtype     layout space shape   batch epilogue

The space: "device" (within the adapter's limits), "portable" (WebGPU's defaults) or
"limited-<digest>" (a caller's device of lower limits or fewer kernel features).

The device (adapter fingerprint), the wgpu versions and the file format name the cache
file itself (cache.device_file_name). The kernel identity is a hash of the WGSL the
config renders for the problem, its launch plan and the space's version: a template
refactor that renders the same kernel keeps its entries, any change to the kernel
makes them stale (never served). Entries of one template, problem, mode and space
compete for one slot (the key without the identity): the fastest stays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .problem import Problem, ProblemError
from .render import kernel_id
from .space import Config, template_names

MODES = {True: "checks", False: "nochecks"}  # wgpu's runtime checks on (as browsers) / off
SPACES = ("device", "portable")  # within the device's limits / WebGPU's default limits
# within a caller's device of lower limits or fewer kernel features than its adapter's
# (device.Gpu.limited_as): entries of its own slots, never replacing the adapter's
_LIMITED = re.compile(r"limited-[0-9a-f]{12}", re.ASCII)
_SIZE = r"[1-9][0-9]{0,9}"  # ASCII digits, no leading zero: one text for one number
_SHAPE = re.compile(rf"({_SIZE})x({_SIZE})x({_SIZE})", re.ASCII)
_BATCH = re.compile(rf"b({_SIZE})(s?)", re.ASCII)
_DTYPE = re.compile(r"(f16|f32)(?:-acc(16|32))?(?:\.(q8|q4g(?:32|64|128)z?)(\.a8)?)?", re.ASCII)
_KERNEL = re.compile(r"[0-9a-f]{16}", re.ASCII)


@dataclass(frozen=True)
class Key:
    """A cache entry's key: template, kernel identity, check mode, problem and space."""

    template: str
    kernel: str  # render.kernel_id of the entry's config at the problem
    checks: bool
    problem: Problem
    space: str = "device"

    @classmethod
    def of(
        cls,
        problem: Problem,
        config: Config,
        checks: bool,
        portable: bool = False,
        limited: str | None = None,
    ) -> Key:
        """The key of `config` at `problem`; `limited`: the digest of a caller's device
        below its adapter (Gpu.limited_as, portable or not), its space then."""
        space = f"limited-{limited}" if limited else SPACES[bool(portable)]
        return cls(config.template, kernel_id(config, problem), bool(checks), problem, space)

    def components(self) -> tuple[str, ...]:
        """The key's parts in order: the one list that a key is written from."""
        p = self.problem
        return (
            self.template,
            self.kernel,
            MODES[self.checks],
            p.dtype_text,
            p.layout,
            self.space,
            p.shape,
            p.batch_text,
            p.epilogue,
        )

    @property
    def slot(self) -> tuple[str, ...]:
        """The key without the kernel identity: entries of one slot compete."""
        template, _, *rest = self.components()
        return (template, *rest)

    def __str__(self) -> str:
        return ":".join(self.components())

    @classmethod
    def parse(cls, text: object) -> Key:
        """The key `text` names; ValueError unless it is a key in canonical form (the
        text this key is written as, character for character)."""
        parts = text.split(":") if isinstance(text, str) and len(text) <= 300 else []
        if len(parts) != 9:
            raise ValueError(f"malformed key {str(text)[:120]!r}")
        template, kernel, mode, dtype, layout, space, shape, batch, epilogue = parts
        if template not in template_names():
            raise ValueError(f"unknown template {template[:40]!r}")
        if not _KERNEL.fullmatch(kernel):
            raise ValueError("the kernel identity must be 16 hex digits")
        if mode not in MODES.values() or not (space in SPACES or _LIMITED.fullmatch(space)):
            raise ValueError(f"bad check mode {mode[:20]!r} or space {space[:20]!r}")
        sizes, items, element = (
            _SHAPE.fullmatch(shape),
            _BATCH.fullmatch(batch),
            _DTYPE.fullmatch(dtype),
        )
        if not (sizes and items and element):
            raise ValueError(f"bad shape, batch or dtype in {text[:120]!r}")
        accumulate = {None: "auto", "32": "f32", "16": "f16"}[element[2]]
        try:
            problem = Problem(
                *(int(s) for s in sizes.groups()),
                dtype=element[1],
                layout=layout,
                batch=int(items[1]),
                shared_b=items[2] == "s",
                epilogue=epilogue,
                accumulate=accumulate,
                weights=element[3] or "none",
                activations="q8" if element[4] else "none",
            )
        except ProblemError as error:
            raise ValueError(str(error)) from None
        key = cls(template, kernel, mode == "checks", problem, space)
        if str(key) != text:
            raise ValueError(f"key {text[:120]!r} is not in canonical form ({str(key)[:120]!r})")
        return key
