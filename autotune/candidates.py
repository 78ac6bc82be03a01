"""Candidates: the few verified kernels for one problem that an exported set carries, so
that a visitor's browser can time them on its own GPU and keep the fastest.

The best config differs from GPU to GPU, and the ones a visitor has were never tuned on.
`choose` gathers configs meant to cover them, in this order, one of each config:
1. the kernel being exported;
2. each device's best for this problem in the cache files it can read (the user's
   cache, the shipped one, and any files or folders named in `caches`: merged caches
   of other machines), else that device's fastest tuned config that is valid here;
3. the portable best (lookup within WebGPU's default limits);
4. the tuning history of every device, fastest first, then each family's known-good
   configs: one per launch shape (template, workgroup size and grid), so that the set
   spans different tile shapes rather than variants of one.
Each is verified here at the problem, as export verifies (the WGSL a browser runs,
with its runtime checks); one that fails is left out with the reason.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import cache
from .cache import CacheWarning, DeviceCache, Entry
from .data import BUILT_IN
from .kernel import Kernel
from .lookup import lookup, runs_here
from .problem import Problem
from .space import Config, load_space


@dataclass(frozen=True)
class Candidate:
    """One config of a set, why it was chosen, and the entry it came from, if any."""

    config: Config
    chosen_as: str  # "exported", "best on NVIDIA H200", "portable best", "history", "seed"
    entry: Entry | None = None
    device: str = ""  # the device whose cache held `entry`


@dataclass
class Chosen:
    """The candidates verified here, the exported kernel first, each with what
    `verified` made of it; and those left out."""

    taken: list[tuple[Candidate, Kernel, object]] = field(default_factory=list)
    left_out: list[dict] = field(default_factory=list)  # config, chosen_as, why


def cache_files(folders: Iterable[Path], files: Iterable[Path] = ()) -> list[Path]:
    """The cache files to read candidates from: every *.json of `folders` (missing
    folders skipped) and `files`, each once."""
    found = [p for folder in folders if folder.is_dir() for p in sorted(folder.glob("*.json"))]
    return list(dict.fromkeys(p.resolve() for p in [*found, *files]))


def device_caches(paths: Sequence[Path], strict: bool) -> list[DeviceCache]:
    """The DeviceCache of each file; one that is not a cache file raises MergeError when
    `strict` (a file named explicitly), else it is skipped with a CacheWarning."""
    stores = []
    for path in paths:
        try:
            header = cache.read_header(path, field="caches")
        except cache.MergeError as reason:
            if strict:
                raise
            warnings.warn(f"{reason}; not read for candidates", CacheWarning, stacklevel=2)
            continue
        stores.append(DeviceCache.at(path, header))
    return stores


def _device_name(store: DeviceCache) -> str:
    return str(store.fingerprint.get("device", "")) or store.path.name


def _tuned(store: DeviceCache, problem: Problem) -> list[Entry]:
    """The store's current tuned entries of `problem`'s arithmetic, fastest first."""
    entries = [
        e
        for e in store.entries().values()
        if not e.estimated
        and cache.is_current(e)
        and e.key.problem.arithmetic == problem.arithmetic
    ]
    return sorted(entries, key=lambda e: -e.gflops)


def _device_bests(stores, problem, runs) -> list[Candidate]:
    """Each device's best for `problem` (checked mode first: browsers always check),
    else its fastest tuned config valid here."""
    bests = []
    for store in stores:
        device = _device_name(store)
        exact = [store.best(problem, checks, lambda e: runs(e.config)) for checks in (True, False)]
        entry = next((e for e in exact if e is not None), None)
        if entry is None:
            entry = next((e for e in _tuned(store, problem) if runs(e.config)), None)
        if entry is not None:
            bests.append(Candidate(entry.config, f"best on {device}", entry, device))
    return bests


def _history(stores, problem, runs) -> list[Candidate]:
    """Every device's tuned configs valid here, fastest first, then the families'
    known-good configs."""
    entries = sorted(
        (
            (e, _device_name(store))
            for store in stores
            for e in _tuned(store, problem)
            if runs(e.config)
        ),
        key=lambda pair: -pair[0].gflops,
    )
    history = [Candidate(e.config, "history", e, device) for e, device in entries]
    seeds = [c for t in BUILT_IN for c in load_space(t).seed_configs(problem) if runs(c)]
    return history + [Candidate(c, "seed") for c in seeds]


def launch_shape(config: Config, problem: Problem) -> tuple:
    """What makes two configs cover different tile shapes: the template and each pass's
    workgroup size and grid at `problem`."""
    plan = load_space(config.template).plan(config, problem)
    return (config.template,) + tuple((s.workgroup_size, s.grid) for s in plan.passes)


def _portable_best(kernel: Kernel, cache_dir) -> list[Candidate]:
    p = kernel.problem
    portable = lookup(
        **p.arguments, checks=True, cache_dir=cache_dir, gpu=kernel.gpu, portable=True
    )
    return [Candidate(portable.config, "portable best", portable.entry)]


def choose(
    kernel: Kernel,
    count: int,
    verified: Callable[[Kernel, int], object],
    *,
    cache_dir: str | Path | None = None,
    caches: Sequence[Path] = (),
) -> Chosen:
    """Up to `count` candidates for `kernel`'s problem (see the module doc), the exported
    kernel first. `verified(kernel, index)` verifies a kernel and returns what the caller
    keeps of it (the texts export writes), or raises with the reason to leave it out; a
    failure of the exported kernel itself is raised."""
    problem, gpu = kernel.problem, kernel.gpu
    runs = runs_here(gpu.limits, problem, gpu)  # (verified here before it is exported)
    folders = cache.lookup_folders(cache_dir) + [Path(c) for c in caches if Path(c).is_dir()]
    named = [Path(c) for c in caches if not Path(c).is_dir()]
    stores = device_caches(cache_files(folders), strict=False)
    stores += device_caches(cache_files((), named), strict=True)
    ordered = [Candidate(kernel.config, "exported", kernel.entry)]
    ordered += _device_bests(stores, problem, runs) + _portable_best(kernel, cache_dir)
    chosen, seen_shapes = Chosen(), set()
    for candidate in ordered + _history(stores, problem, runs):
        if len(chosen.taken) == count:
            break
        if _also(candidate, chosen):
            continue
        shape = launch_shape(candidate.config, problem)
        if candidate.chosen_as in ("history", "seed") and shape in seen_shapes:
            continue  # another variant of a tile shape the set has
        if _take(candidate, kernel, verified, chosen):
            seen_shapes.add(shape)
    return chosen


def _also(candidate: Candidate, chosen: Chosen) -> bool:
    """True when `candidate`'s config was met before (taken or left out); a taken one
    then also says this reason ("exported; best on NVIDIA H200")."""
    if any(item["config"] == str(candidate.config) for item in chosen.left_out):
        return True
    for i, (taken, kernel, kept) in enumerate(chosen.taken):
        if taken.config == candidate.config:
            if candidate.chosen_as not in ("history", "seed"):
                reason = f"{taken.chosen_as}; {candidate.chosen_as}"
                chosen.taken[i] = (replace(taken, chosen_as=reason), kernel, kept)
            return True
    return False


def _take(candidate: Candidate, exported: Kernel, verified, chosen: Chosen) -> bool:
    """Verify `candidate` (the exported kernel as it is) and add it, or leave it out;
    True when taken."""
    if candidate.chosen_as == "exported":
        kernel = exported
    else:
        kernel = Kernel(
            exported.problem, candidate.config, "predicted", checks=True,
            gpu=exported.gpu, entry=candidate.entry,
        )  # fmt: skip
    try:
        kept = verified(kernel, len(chosen.taken))
    except Exception as reason:  # noqa: BLE001 (any failure leaves the candidate out)
        if candidate.chosen_as == "exported":
            raise
        chosen.left_out.append(
            {"config": str(candidate.config), "chosen_as": candidate.chosen_as, "why": str(reason)}
        )
        return False
    chosen.taken.append((candidate, kernel, kept))
    return True
