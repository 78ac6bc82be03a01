"""Tune: search a problem, measure the tutorial baseline, keep the best in the cache.

The cache is written each time the search finds a new best, not only at the end, so a
killed tune keeps every result it had finished. `tune_many` tunes a list of problems,
or a model's representatives (autotune.model), with every argument checked first.
With `gpus`, a worker on each GPU of the host measures for one study, and a list of
problems is spread over the GPUs as well (autotune.gpus).

    result = autotune.tune(1024, 1024, 1024, trials=30)
    results = autotune.tune_many(problems, radius=1.0, timeout=20)
    result = autotune.tune(4096, 4096, 4096, trials=200, gpus="all")
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import optuna

from . import cache, gpus
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
from .data import BUILT_IN
from .device import Gpu, get_gpu, given_gpu, portable_limits, versions
from .evaluate import Evaluator, Outcome, reference_seed
from .kernel import check_fits
from .lookup import neighbours
from .model import choose_representatives
from .problem import VARIANT_KEYS, Problem
from .render import TEMPLATE_ERRORS, template_hash
from .search import DEFAULT_STRATEGY, SAMPLERS, Lane, Search, SearchResult
from .space import check_runnable, load_space, template_names
from .worker import CANDIDATE_S, Worker, WorkerError

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


@dataclass(frozen=True)
class TuneOptions:
    """How to tune, checked once (TuneOptions.checked) for any number of problems."""

    trials: int | None = 30  # measured trials of the study (None: until `timeout`)
    timeout: float | None = None  # seconds of search per problem
    templates: tuple[str, ...] | None = None  # None: the built-in ones that compute it
    checks: bool = True  # wgpu's runtime checks on (as in browsers) or off
    sampler: str = DEFAULT_STRATEGY  # climb, tpe, random or grid (autotune.strategies)
    storage: object = None  # an Optuna storage (URL or object): shared, resumable studies
    cache_dir: Path | None = None  # None: cache.default_cache_dir()
    seed: int | None = None  # the sampler's and the verification data's
    gpu: Gpu | None = None  # None: autotune.get_gpu()
    device: object = None  # a caller's wgpu.GPUDevice: its limits bound the search (as gpu)
    on_trial: Callable[[dict], None] | None = None  # called after each measured trial
    portable: bool = False  # only configs within WebGPU's default limits (for export)
    candidate_timeout: float = CANDIDATE_S  # seconds a candidate may take, compile to time
    compile_ahead: int | None = None  # candidates compiled while one is timed (None: auto)
    # How candidates are measured: makes the Evaluator of each problem (None: a Worker
    # process on `gpu`); a timing backend of one's own, or a Replay of a recording.
    evaluator: Callable[[Problem], Evaluator] | None = None
    # GPUs measuring together (autotune.gpus): None or 1, the tuner's alone; a count,
    # "all" (every adapter of the tuner's backend) or adapter indices ([0, 2, 5],
    # "0,2,5"), each identical to the tuner's: a worker on each, one study per problem.
    # Checked: the indices of two GPUs or more, else None (one index: `gpu` is its).
    gpus: object = None
    repeat_gpus: bool = False  # a testing aid: an index may repeat (two timings on one GPU)

    @classmethod
    def checked(cls, **options) -> TuneOptions:
        """The options with every value checked; TuneError names a bad one."""
        o = cls(**options)
        trials, timeout = check_budget(o.trials, o.timeout)
        gpu = given_gpu(o.gpu, o.device, TuneError)
        for name in ("on_trial", "evaluator"):
            if getattr(o, name) is not None and not callable(getattr(o, name)):
                value = shown(getattr(o, name))
                raise TuneError(name, f"{name} must be callable or None, got {value}")
        if not isinstance(o.sampler, str) or o.sampler not in SAMPLERS:
            known = ", ".join(SAMPLERS)
            raise TuneError("sampler", f"sampler {shown(o.sampler)} is unknown; known: {known}")
        repeat = check_flag("repeat_gpus", o.repeat_gpus, TuneError)
        chosen = None
        if o.gpus is not None:
            chosen = gpus.choose(o.gpus, gpu, repeat, TuneError)
        if chosen is not None and len(chosen) == 1:  # one GPU: a tune as ever, on that one
            gpu, chosen = gpus.alone(chosen[0], gpu), None
        if chosen and o.evaluator is not None:
            raise TuneError(
                "gpus", f"gpus {shown(o.gpus)} starts a worker on each GPU: not with an evaluator"
            )
        return cls(
            trials=trials,
            timeout=timeout,
            templates=check_templates(o.templates, default=None),
            checks=check_flag("checks", o.checks, TuneError),
            sampler=o.sampler,
            storage=check_storage(o.storage),
            cache_dir=check_folder("cache_dir", o.cache_dir, writable=True, error=TuneError),
            seed=check_seed(o.seed, TuneError),
            gpu=gpu,
            on_trial=o.on_trial,
            portable=check_flag("portable", o.portable, TuneError),
            candidate_timeout=check_seconds("candidate_timeout", o.candidate_timeout, TuneError),
            compile_ahead=check_count("compile_ahead", o.compile_ahead, 4, TuneError),
            evaluator=o.evaluator,
            gpus=chosen,
            repeat_gpus=repeat,
        )


def check_templates(templates: Sequence[str] | None, default=BUILT_IN) -> tuple[str, ...]:
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
        try:  # a user's template may be broken: say so now, not as a worker's traceback
            template_hash(name)
            load_space(name)
        except TEMPLATE_ERRORS as error:
            raise TuneError("template", f"template {name!r} cannot be used: {error}") from None
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


def default_templates(problem: Problem) -> tuple[str, ...]:
    """The built-in families with a config at `problem`: what a tune searches unless told."""
    return tuple(t for t in BUILT_IN if load_space(t).first_config(problem) is not None)


def baseline(problem: Problem, gpu: Gpu, evaluator: Evaluator) -> Outcome | None:
    """The tutorial tiled 16x16 kernel, measured like any candidate."""
    seeds = load_space(BASELINE_TEMPLATE).seed_configs(problem, gpu.limits)
    return evaluator.evaluate(seeds[0]) if seeds else None


def tune(M: int, N: int, K: int, dtype: str = "f32", **options) -> TuneResult:
    """Find the fastest correct kernel for this problem on this device and cache it.

    `options`: the variant (`layout`, `batch`, `shared_b`, `epilogue`, `accumulate`,
    `weights`, `activations`) as
    in autotune.lookup, and TuneOptions' fields (trials=30, timeout, templates, checks,
    sampler, storage, cache_dir, seed, gpu or device, on_trial, portable,
    candidate_timeout, compile_ahead, gpus). Without `templates`, the built-in ones that
    compute the problem are searched. `portable` searches only configs within WebGPU's
    default limits (for export to any browser); lookup(portable=True) finds them.
    `device`, a caller's wgpu.GPUDevice: only configs within its limits and features
    are searched, into its adapter's cache file; the candidates run in the worker
    process, on a device of the same adapter with the same features. `gpus` ("all", a
    count, adapter indices): a worker on each of these GPUs, identical to the tuner's,
    all measuring for the problem's one study.
    """
    variant = {k: options.pop(k) for k in VARIANT_KEYS if k in options}
    problem = Problem(M, N, K, dtype, **variant)
    return tune_problem(problem, _options(options))


def tune_many(
    problems: Sequence[Problem],
    *,
    radius: float | None = None,
    on_start: Callable[[Problem, int], None] | None = None,
    **options,
) -> list[TuneResult]:
    """Tune each problem (each once, in order), every argument checked before the first
    starts. With `radius`, only a model's representatives are tuned (model.
    choose_representatives): lookup serves the others from the tuned kernels.
    `on_start(problem, index)` is called as each problem starts; `options` as in tune().
    With `gpus`, the problems are spread over the GPUs too (autotune.gpus.Pool): several
    are tuned at once, and a GPU whose problem is done joins another's study.
    """
    if (
        not isinstance(problems, list | tuple)
        or not problems
        or not all(isinstance(p, Problem) for p in problems)
    ):  # (checked before dict.fromkeys, which hashes each item)
        raise TuneError(
            "problems",
            f"problems must be a non-empty list of autotune.Problem, got {shown(problems)}",
        )
    problems = list(dict.fromkeys(problems))
    if on_start is not None and not callable(on_start):
        raise TuneError("on_start", f"on_start must be callable or None, got {shown(on_start)}")
    if radius is not None:
        assignments = choose_representatives(problems, radius)
        problems = list(dict.fromkeys(a.representative for a in assignments))
    checked = _options(options)
    if checked.templates:  # e.g. a plain-only template asked for a variant of the list
        for problem in problems:
            check_runnable(problem, None, checked.templates)
    if checked.gpus is not None:
        return _tune_on_gpus(problems, checked, on_start)
    results = []
    for index, problem in enumerate(problems):
        if on_start:
            on_start(problem, index)
        results.append(tune_problem(problem, checked))
    return results


def _options(options: dict) -> TuneOptions:
    unknown = sorted(set(options) - set(TuneOptions.__dataclass_fields__))
    if unknown:
        raise TuneError(unknown[0], f"{unknown[0]} is not an option of tune")
    return TuneOptions.checked(**options)


def tune_problem(problem: Problem, options: TuneOptions) -> TuneResult:
    """tune() for a Problem, with checked options."""
    if options.gpus is not None:
        return _tune_on_gpus([problem], options, None)[0]
    tuning = _Tuning(problem, options)
    with contextlib.ExitStack() as stack:
        evaluator = _evaluator(problem, options, tuning.gpu, stack)
        tuning.begin(evaluator)
        return tuning.end(evaluator, tuning.search.run())


class _Tuning:
    """One problem's tune in steps: `begin` (the baseline, the search set up), the search
    (run on one evaluator, or worked by several: autotune.gpus), `end` (the finalists
    timed again, the best kept). A Job of autotune.gpus.Pool."""

    def __init__(self, problem: Problem, options: TuneOptions, stopping=None):
        o = self.options = options
        self.stopping = stopping  # the pool's Event: set, the search stops (None: its own)
        self.problem = problem
        self.templates = o.templates or default_templates(problem)
        gpu = self.gpu = o.gpu or get_gpu()
        self.limits = portable_limits(gpu.limits) if o.portable else gpu.limits
        check_fits(problem, gpu, self.limits)
        check_runnable(problem, self.limits, self.templates)
        self.store = cache.DeviceCache(
            o.cache_dir or cache.default_cache_dir(), gpu.fingerprint.as_dict(), versions()
        )
        self.store.check_writable()  # a lock that cannot be taken fails now, not after a trial
        self.seed = reference_seed(o.seed)  # one reference for every worker of the problem
        self.search: Search | None = None

    def prepare(self, evaluator: Evaluator) -> None:
        if isinstance(evaluator, Worker):
            evaluator.prepare(self.problem, self.seed, self.options.checks)

    def begin(self, evaluator: Evaluator) -> None:
        o, problem, gpu = self.options, self.problem, self.gpu
        self.prepare(evaluator)
        base = baseline(problem, gpu, evaluator)
        self.keeper = _Keeper(problem, o, self.store, base, gpu)
        self.search = Search.of(
            problem,
            gpu,
            templates=self.templates,
            trials=o.trials,
            timeout=o.timeout,
            checks=o.checks,
            sampler=o.sampler,
            storage=o.storage,
            seed=o.seed,
            max_dispatch_s=None,
            on_trial=self.keeper.on_trial,
            limits=self.limits,
            evaluator=evaluator,
            compile_ahead=o.compile_ahead,
            stopping=self.stopping,
            known_good=base.config if base and base.ok else None,
            first=neighbours(problem, o.checks, gpu, o.cache_dir, self.templates, self.limits),
        )

    def end(self, evaluator: Evaluator, result: SearchResult | None = None) -> TuneResult:
        """The result (`result`: the search's, run on `evaluator`; else concluded here,
        from a search that several GPUs worked, whose retime may meet a lost GPU)."""
        if result is None:
            result = self.search.conclude()
            if len(result.finalists) > 1:
                try:
                    self.prepare(evaluator)
                    result.best = evaluator.retime(result.finalists) or result.best
                except WorkerError:  # this GPU is gone too: the search's timings stand
                    pass
        elif len(result.finalists) > 1:
            result.best = evaluator.retime(result.finalists) or result.best
        entry = self.keeper.keep(result)
        from .lookup import forget  # the in-process lookup memo must see the new entry

        forget()
        o = self.options
        return TuneResult(
            self.problem, o.checks, entry, result, self.keeper.baseline, self.store.path
        )


def _tune_on_gpus(problems, options: TuneOptions, on_start) -> list[TuneResult]:
    """The problems tuned by a worker on each of options.gpus (autotune.gpus.Pool); the
    callbacks are called one at a time."""
    one_at_a_time = threading.Lock()
    options = replace(options, on_trial=_serialized(options.on_trial, one_at_a_time))
    gpu = options.gpu or get_gpu()
    with contextlib.ExitStack() as stack:
        lanes: list[Lane] = gpus.lanes(options.gpus, gpu, options.candidate_timeout, stack)
        pool = gpus.Pool(lanes)
        on_start = _serialized(on_start, one_at_a_time)
        job_of = lambda problem, stopping: _Tuning(problem, options, stopping)  # noqa: E731
        return pool.tune(problems, job_of, on_start)


def _serialized(callback, lock: threading.Lock):
    if callback is None:
        return None

    def call(*arguments):
        with lock:
            return callback(*arguments)

    return call


def _evaluator(problem: Problem, o: TuneOptions, gpu: Gpu, stack) -> Evaluator:
    """The options' evaluator for `problem`, or a Worker (prepared by _Tuning.begin: one
    float64 reference for the baseline and the search); closed with `stack`."""
    if o.evaluator is not None:
        evaluator = o.evaluator(problem)
        if isinstance(evaluator, contextlib.AbstractContextManager):
            stack.enter_context(evaluator)
        return evaluator
    return stack.enter_context(Worker.for_gpu(gpu, o.candidate_timeout))


class _Keeper:
    """Stores each new best of a search in the cache as it is found, and the final best
    (timed again) at the end, superseding the provisional ones."""

    def __init__(self, problem: Problem, options: TuneOptions, store, base: Outcome | None, gpu):
        self.problem, self.options, self.store = problem, options, store
        self.limited = gpu.limited_as(options.portable)  # below its adapter: own slots
        self.baseline = base
        self.provisional: list[dict] = []  # params of the bests stored while searching

    def entry(self, outcome: Outcome, result: SearchResult) -> cache.Entry:
        base, o = self.baseline, self.options
        return cache.Entry.measured(
            cache.Key.of(self.problem, outcome.config, o.checks, o.portable, self.limited),
            outcome.config,
            outcome.measurement,
            outcome.error,
            baseline_s=base.measurement.median_s if base and base.ok else None,
            trials=result.study_trials,
            failures=dict(result.failures),
            tuning_s=result.study_seconds,
        )

    def on_trial(self, event: dict) -> None:
        outcome, result = event["outcome"], event["result"]
        # A best when recorded, stored even if another lane has beaten it since: where the
        # faster one is stored already, put() refuses it.
        if outcome.ok and event["new_best"]:
            self.store.put(self.entry(outcome, result))
            self.provisional.append(outcome.config.as_dict())
        if self.options.on_trial:
            self.options.on_trial(event)

    def keep(self, result: SearchResult) -> cache.Entry | None:
        if result.best is None:
            return None
        entry = self.entry(result.best, result)
        self.store.put(entry, replacing=self.provisional)
        return self.store.get(entry.key) or entry  # a faster config stored earlier stays
