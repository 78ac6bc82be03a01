"""Tune: search a problem, measure the tutorial baseline, keep the best in the cache.

The cache is written each time the search finds a new best, not only at the end, so a
killed tune keeps every result it had finished.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna

from . import cache
from .arguments import (
    ArgumentError,
    check_count,
    check_flag,
    check_folder,
    check_seconds,
    check_seed,
    is_integer,
    shown,
)
from .device import Gpu, get_gpu, portable_limits, versions
from .kernel import check_fits
from .problem import Problem
from .search import SAMPLERS, Outcome, SearchResult, reference_seed, search
from .space import check_runnable, load_space, template_names
from .worker import CANDIDATE_S, Worker

# blockedx computes the variant problems, the others the plain one (see space.py)
TEMPLATES = ("blocked", "blockedx", "tiled", "naive")
BASELINE_TEMPLATE = "tiled"  # its first seed is the tutorial 16x16 kernel
MAX_TRIALS = 10**9  # as a cache entry's trial count


class TuneError(ArgumentError):
    """A bad tuning argument; `field` names it (e.g. "storage")."""


@dataclass
class TuneResult:
    problem: Problem
    checks: bool
    entry: cache.Entry | None  # the best verified kernel, as stored in the cache
    search: SearchResult
    baseline: Outcome | None  # the tutorial tiled 16x16 kernel on this device
    cache_path: Path


def check_templates(templates: Sequence[str] | None, default=TEMPLATES) -> tuple[str, ...]:
    """The template names, each once; `default` when none are given."""
    if templates is not None and (
        isinstance(templates, str) or not isinstance(templates, list | tuple)
    ):
        raise TuneError(
            "template", f"templates must be a list of template names, got {shown(templates)}"
        )
    if not templates:
        return default
    known = template_names()
    for name in templates:
        if not isinstance(name, str) or name not in known:
            raise TuneError(
                "template", f"template {shown(name)} is unknown; known: {', '.join(known)}"
            )
    return tuple(dict.fromkeys(templates))


def check_storage(storage: object, attempts: int = 5):
    """Open an Optuna storage now (None: in memory; a URL; or a storage object), so a
    bad one fails before any tuning.

    Workers started together on a new database race to create its tables (one of them
    fails on a unique constraint); a few retries let the loser open what the winner made.
    """
    if storage is None or isinstance(storage, optuna.storages.BaseStorage):
        return storage
    if not isinstance(storage, str):  # Optuna would take it for a storage object
        raise TuneError(
            "storage",
            f"storage must be None, a URL such as 'sqlite:///study.db' or an Optuna "
            f"storage, got {shown(storage)}",
        )
    for attempt in range(attempts):
        try:
            return optuna.storages.get_storage(storage)
        except Exception as error:
            if attempt == attempts - 1:
                message = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise TuneError(
                    "storage", f"storage {shown(storage)} cannot be opened: {message}"
                ) from None
            time.sleep(0.2 * 2**attempt)


def check_budget(trials: object, timeout: object) -> tuple[int | None, float | None]:
    """trials (a whole number >= 1) and timeout (seconds), at least one of them."""
    if trials is not None and not (is_integer(trials) and trials >= 1):
        raise TuneError("trials", f"trials must be an integer >= 1, got {shown(trials)}")
    if trials is not None and trials > MAX_TRIALS:
        raise TuneError("trials", f"trials must be at most {MAX_TRIALS}, got {shown(trials)}")
    if timeout is not None:
        timeout = check_seconds("timeout", timeout, TuneError)
    if trials is None and timeout is None:
        raise TuneError("trials", "give trials, timeout or both")
    return (None if trials is None else int(trials)), timeout


def baseline(problem: Problem, gpu: Gpu, worker: Worker, timeout_s: float) -> Outcome | None:
    """The tutorial tiled 16x16 kernel, measured like any candidate (in the worker)."""
    seeds = load_space(BASELINE_TEMPLATE).seed_configs(problem, gpu.limits)
    if not seeds:
        return None
    return worker.evaluate(seeds[0], timeout_s=timeout_s)


def tune(
    M: int,
    N: int,
    K: int,
    dtype: str = "f32",
    *,
    layout: str = "nn",
    batch: int = 1,
    shared_b: bool = False,
    epilogue: str | list | None = "none",
    accumulate: str = "auto",
    trials: int | None = 30,
    timeout: float | None = None,
    templates: Sequence[str] | None = None,
    checks: bool = True,
    sampler: str = "tpe",
    storage: str | None = None,
    cache_dir: str | Path | None = None,
    seed: int | None = None,
    gpu: Gpu | None = None,
    on_trial=None,
    portable: bool = False,
    candidate_timeout: float = CANDIDATE_S,
    compile_ahead: int | None = None,
) -> TuneResult:
    """Find the fastest correct kernel for this problem on this device and cache it.

    The variant (`layout`, `batch`, `shared_b`, `epilogue`, `accumulate`) is as in
    autotune.lookup; without `templates`, those that compute it are searched.
    `portable` searches only configs within WebGPU's default limits (for export to any
    browser); their entries sit in the same cache, and lookup(portable=True) finds them.
    Each candidate runs in a worker process; one that does not finish within
    `candidate_timeout` seconds is recorded as a `timeout` and the worker restarted.
    `compile_ahead` (None: 1 on a GPU, 0 on a CPU adapter) is how many of the next
    candidates the worker compiles while it times the current one.
    """
    problem = Problem(M, N, K, dtype, layout, batch, shared_b, epilogue, accumulate)
    templates = check_templates(templates, default=None)
    if templates is None:  # the defaults that compute this problem (plain or variant)
        templates = tuple(t for t in TEMPLATES if load_space(t).first_config(problem) is not None)
    trials, timeout = check_budget(trials, timeout)
    checks = check_flag("checks", checks, TuneError)
    portable = check_flag("portable", portable, TuneError)
    seed = check_seed(seed, TuneError)
    candidate_timeout = check_seconds("candidate_timeout", candidate_timeout, TuneError)
    compile_ahead = check_count("compile_ahead", compile_ahead, 4, TuneError)
    cache_dir = check_folder("cache_dir", cache_dir, writable=True, error=TuneError)
    if gpu is not None and not isinstance(gpu, Gpu):
        raise TuneError("gpu", f"gpu must be an autotune.Gpu or None, got {type(gpu).__name__}")
    if on_trial is not None and not callable(on_trial):
        raise TuneError("on_trial", f"on_trial must be callable or None, got {shown(on_trial)}")
    if not isinstance(sampler, str) or sampler not in SAMPLERS:
        raise TuneError(
            "sampler", f"sampler {shown(sampler)} is unknown; known: {', '.join(SAMPLERS)}"
        )
    storage_object = check_storage(storage)
    gpu = gpu or get_gpu()
    limits = portable_limits(gpu.limits) if portable else gpu.limits
    check_fits(problem, gpu, limits)
    check_runnable(problem, limits, templates)
    store = cache.DeviceCache(
        cache_dir or cache.default_cache_dir(), gpu.fingerprint.as_dict(), versions()
    )
    with Worker(gpu.fingerprint.as_dict()) as worker:
        # one float64 reference, in the worker, for the baseline and the search
        worker.prepare(problem, reference_seed(seed), checks)
        base = baseline(problem, gpu, worker, candidate_timeout)
        base_s = base.measurement.median_s if base and base.ok else None

        def entry_for(outcome: Outcome, result: SearchResult) -> cache.Entry:
            m = outcome.measurement
            return cache.Entry(
                key=cache.Key.of(problem, outcome.config.template, checks, portable),
                params=outcome.config.as_dict(),
                median_s=m.median_s,
                p20_s=m.p20_s,
                p80_s=m.p80_s,
                method=m.method,
                gflops=m.gflops(problem.flops),
                error=outcome.error,
                baseline_s=base_s,
                trials=result.study_trials,
                failures=dict(result.failures),
                tuning_s=result.seconds,
                date=cache.today(),
                origin=cache.this_machine(),
            )

        provisional: list[dict] = []  # params of the bests stored while searching

        def save_new_best(event: dict) -> None:
            outcome, result = event["outcome"], event["result"]
            if outcome.ok and outcome is result.best:
                store.put(entry_for(outcome, result))
                provisional.append(outcome.config.as_dict())
            if on_trial:
                on_trial(event)

        result = search(
            problem,
            gpu,
            templates=templates,
            trials=trials,
            timeout=timeout,
            checks=checks,
            sampler=sampler,
            storage=storage_object,
            seed=seed,
            on_trial=save_new_best,
            limits=limits,
            worker=worker,
            candidate_timeout=candidate_timeout,
            compile_ahead=compile_ahead,
        )
        entry = None
        if len(result.finalists) > 1:
            result.best = (
                worker.retime(result.finalists, timeout_s=candidate_timeout) or result.best
            )
        if result.best is not None:
            entry = entry_for(result.best, result)
            store.put(entry, replacing=provisional)
            entry = store.get(entry.key) or entry  # a faster config stored earlier stays
    from .lookup import forget  # the in-process lookup memo must see the new entry

    forget()
    return TuneResult(problem, checks, entry, result, base, store.path)
