"""Search: a strategy proposes configs, the study claims them, an evaluator measures them.

The study is driven with ask/tell so that the tuner, not Optuna, decides what a trial
costs: a config that breaks a constraint or a device limit is told PRUNED before any
compile (the sampler learns to avoid it, the budget does not pay for it); a config
already measured in the study, by this process or another on the same storage, is told
its earlier result without touching the GPU. A candidate that fails to compile, exceeds
a limit, computes a wrong result or is hopelessly slow is a value with a reason
(`compile`, `limits`, `wrong`, `timeout`, `crashed`, `device-lost`), recorded on its
trial and told to Optuna as a failure, so the study never proposes it for measuring again.

    strategy (autotune.strategies)   study (autotune.study)   evaluator (autotune.evaluate)
    propose ──────────────────────►  claim ─────────────────► evaluate: an Outcome
    observe ◄─ invalid/known/taken/claimed   finish ◄──────── (Worker, Replay, ...)

Candidates run in a worker process by default (autotune.worker): a hang, a crash or a
lost device costs that one trial and a restart of the worker. The budget (`trials`)
counts measured trials of the whole study, so a killed `tune` on a persistent storage
resumes where it stopped, and several processes share one budget.
"""

from __future__ import annotations

import functools
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import optuna

from .compile import missing_features
from .device import Gpu
from .evaluate import Evaluator, Outcome, reference_seed
from .problem import Problem
from .space import Config, load_space
from .strategies import STRATEGIES, make_strategy
from .study import Study, study_attrs, study_name
from .worker import Worker

SAMPLERS = tuple(STRATEGIES)
FINALISTS = 4  # the study's fastest configs, timed again back to back at the end of tune

Progress = Callable[[dict], None]


@dataclass
class SearchResult:
    problem: Problem
    best: Outcome | None
    measured: int  # trials measured by this process
    study_trials: int  # measured trials in the whole study (all processes)
    failures: Counter = field(default_factory=Counter)  # reason -> count, this process
    seconds: float = 0.0
    study_name: str = ""
    finalists: list[Config] = field(default_factory=list)  # to time again (tune: retime)


def search(
    problem: Problem,
    gpu: Gpu,
    *,
    templates: Sequence[str] = ("blocked",),
    trials: int | None = 30,
    timeout: float | None = None,
    checks: bool = True,
    sampler: str = "tpe",
    storage=None,
    seed: int | None = None,
    max_dispatch_s: float | None = None,
    on_trial: Progress | None = None,
    evaluator: Evaluator | None = None,
    limits: dict | None = None,
    compile_ahead: int | None = None,
) -> SearchResult:
    """Search the templates' spaces for the fastest correct kernel of `problem`.

    `storage` is an Optuna storage (object or URL; None keeps the study in memory).
    `sampler` names the strategy (autotune.strategies: tpe, random, grid).
    A candidate whose one dispatch takes longer than `max_dispatch_s` (default: 50x the
    best so far, at least 1 s) is recorded as a timeout. `evaluator` measures the
    configs (autotune.evaluate.Evaluator): without one, a Worker is started for this
    problem and stopped at the end; a Replay answers from a recording, `gpu` then only
    lends its limits and fingerprint. `limits` narrows the space to configs within them
    (e.g. WebGPU's defaults). `compile_ahead`: how many of the next configs the
    evaluator may compile while it measures the current one; default 1, or 0 on a CPU
    adapter (lavapipe), where compiling would slow the kernel being timed.
    """
    if trials is None and timeout is None:
        raise ValueError("give trials, timeout or both: the search needs a budget")
    arguments = dict(locals())
    if evaluator is None:  # our own worker, stopped when the search ends (however it ends)
        features = tuple(sorted(gpu.kernel_features))
        with Worker(gpu.fingerprint.as_dict(), features=features) as worker:
            worker.prepare(problem, reference_seed(seed), checks)
            return search(**(arguments | {"evaluator": worker}))
    if isinstance(evaluator, Worker) and not evaluator.prepared_for(problem, checks):
        raise ValueError(f"the worker is not prepared for {problem} with checks={checks}")
    if compile_ahead is None:  # on a CPU adapter compiling would disturb the timing
        cpu = gpu.fingerprint.adapter_type == "CPU"
        compile_ahead = 0 if cpu or not isinstance(evaluator, Worker) else 1
    return _Search(**(arguments | {"compile_ahead": compile_ahead})).run()


class _Valid(Sequence):
    """Every valid config of the templates, listed on first use. A large space takes
    seconds to list (split-K's: about 100,000 configs), which a short tune should not
    spend unless its strategy needs the list (grid; a sampler's fallback)."""

    def __init__(self, templates: tuple[str, ...], problem: Problem, limits: dict):
        self.templates, self.problem, self.limits = templates, problem, limits

    @functools.cached_property
    def configs(self) -> list[Config]:
        return [c for t in self.templates for c in load_space(t).configs(self.problem, self.limits)]

    def __len__(self) -> int:
        return len(self.configs)

    def __getitem__(self, index):
        return self.configs[index]

    def at_most(self) -> int:
        """How many there are, or a bound (the raw parameter combinations) before listing."""
        if "configs" in self.__dict__:
            return len(self.configs)
        return sum(load_space(t).size for t in self.templates)


class _Search:
    """One run of the search loop (see search())."""

    def __init__(self, problem, gpu, *, templates, trials, timeout, checks, sampler, storage,
                 seed, max_dispatch_s, on_trial, evaluator, limits, compile_ahead):  # fmt: skip
        self.start = time.monotonic()
        self.problem, self.templates = problem, tuple(templates)
        self.trials, self.timeout, self.max_dispatch_s = trials, timeout, max_dispatch_s
        self.on_trial, self.evaluator, self.compile_ahead = on_trial, evaluator, compile_ahead
        self.limits, self.gpu = limits or gpu.limits, gpu
        self.valid = _Valid(self.templates, problem, self.limits)
        if not any(load_space(t).first_config(problem, self.limits) for t in self.templates):
            raise ValueError(f"no config of {', '.join(templates)} is valid for {problem} here")
        self.strategy = make_strategy(sampler, seed)
        portable = self.limits != gpu.limits
        subject = (problem, self.templates, checks, gpu, portable)
        name = study_name(*subject)
        self.study = Study(
            name, storage, self.strategy.sampler, problem, self.templates, study_attrs(*subject)
        )
        if not self.study.optuna.trials:  # a new study: try the known-good configs first
            for config in self._seeds():
                self.study.enqueue(config)
        self.result = SearchResult(problem, None, 0, 0, study_name=name)
        # Claimed configs waiting their turn: with compile_ahead, the evaluator compiles
        # the next ones while it times the current one (never two timings at once).
        self.pending: deque[tuple[optuna.Trial, Config]] = deque()
        self.full = False  # the study's budget is taken (by claims of other processes too)

    def _seeds(self) -> list[Config]:
        spaces = [load_space(t) for t in self.templates]
        seeds = [c for space in spaces for c in space.seed_configs(self.problem, self.limits)]
        return [c for c in seeds if not self._lacking(c)]

    def _lacking(self, config: Config) -> str | None:
        """Why the device cannot run `config` for want of a feature (a caller's device
        requested without subgroups), or None."""
        missing = missing_features(config, self.problem, self.gpu)
        return f"needs {', '.join(missing)}, which the device lacks" if missing else None

    def run(self) -> SearchResult:
        try:
            while self._fill() and not self._out_of_time():
                self._measure(*self.pending.popleft())
        finally:
            for trial, _ in self.pending:  # claimed, never measured: free for a later run
                self.study.release(trial)
        result, study = self.result, self.study
        result.study_trials = study.measured_count()
        result.best = study.best(result.best)
        result.finalists = study.finalists(FINALISTS, self._seeds())
        result.seconds = time.monotonic() - self.start
        return result

    def _fill(self) -> bool:
        """Claim configs until compile_ahead of them wait behind the next; False: none."""
        while len(self.pending) < 1 + self.compile_ahead:
            claimed = self._claim()
            if claimed is None:
                break
            self.pending.append(claimed)
            if len(self.pending) > 1:
                self.evaluator.compile_ahead(claimed[1])
        return bool(self.pending)

    def _out_of_time(self) -> bool:
        return self.timeout is not None and time.monotonic() - self.start >= self.timeout

    def _exhausted(self) -> bool:
        """The budget is spent, the time is up, or every valid config is measured."""
        measured = len(self.study.history()) + len(self.pending)
        self.result.study_trials = len(self.study.history())
        spent = self.full or (self.trials is not None and measured >= self.trials)
        return spent or self._out_of_time() or measured >= self.valid.at_most()

    def _claim(self) -> tuple[optuna.Trial, Config] | None:
        """The next config to measure, its trial claimed in the study; None: stop."""
        while not self._exhausted():
            trial, config = self.strategy.propose(self.study, self.valid)
            event = self._judge(trial, config)
            self.strategy.observe(config, event)
            if event != "claimed":
                continue
            if not self.study.admit(trial, self.trials):  # others claimed the rest meanwhile
                self.study.release(trial)
                self.full = True
                return None
            return trial, config
        return None

    def _judge(self, trial: optuna.Trial, config: Config) -> str:
        """Settle a proposal: invalid (pruned), known (told its earlier result), taken
        (another trial holds it) or claimed (ours to measure)."""
        why = load_space(config.template).why_invalid(config, self.problem, self.limits)
        why = why or self._lacking(config)
        if why:
            self.study.prune(trial, config, why)
            return "invalid"
        history = self.study.history()
        if str(config) in history:  # measured before: its result, no GPU time
            self.study.answer_known(trial, config, history[str(config)])
            return "known"
        return "claimed" if self.study.claim(trial, config) else "taken"

    def _measure(self, trial: optuna.Trial, config: Config) -> None:
        result = self.result
        best_s = result.best.measurement.median_s if result.best else None
        limit = self.max_dispatch_s or (max(1.0, 50 * best_s) if best_s else None)
        outcome = self.evaluator.evaluate(config, max_dispatch_s=limit)
        result.measured += 1
        if not outcome.ok:
            result.failures[outcome.reason] += 1
        elif best_s is None or outcome.measurement.median_s < best_s:
            result.best = outcome
        # The caller stores a new best (tune: in the cache) before the trial is told
        # finished: killed in between, the trial counts as interrupted and is measured
        # again, so no finished result is ever missing from the cache.
        if self.on_trial:
            elapsed = time.monotonic() - self.start
            self.on_trial({"outcome": outcome, "result": result, "elapsed": elapsed})
        self.study.finish(trial, outcome)
