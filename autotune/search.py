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

Several evaluators (a worker on each GPU of a host, autotune.gpus) can measure for one
search at once: each is a `Lane`, driven by a thread of its own through `Search.work`.
Proposing, claiming and recording are done one lane at a time (under the search's
lock); the measuring runs side by side, each lane on its own evaluator, and so does
each result's report (on_trial, where tune stores a new best in the cache, then the
trial told finished). A lane whose worker cannot be restarted leaves the search
(`Lane.out` says why) and gives back its claims; the other lanes go on. A crash or a
lost device is usually the candidate's fault, and samplers propose alike configs
together: a lane's crashed or device-lost trials are held, and after LOST_AFTER in a
row its GPU is checked with a known-good config (the best so far, else the
baseline's). Still good: the held trials are recorded as the failures they are. Not:
the lane leaves, and its held trials go back to the study, for another GPU to measure.
"""

from __future__ import annotations

import functools
import threading
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
from .strategies import DEFAULT_STRATEGY, STRATEGIES, make_strategy
from .study import Study, study_attrs, study_name
from .worker import Worker, WorkerError

SAMPLERS = tuple(STRATEGIES)
FINALISTS = 4  # the study's fastest configs, timed again back to back at the end of tune
LOST_AFTER = 3  # a lane's crashed or device-lost candidates in a row: check its GPU
GPU_FAULTS = ("crashed", "device-lost")

Progress = Callable[[dict], None]


@dataclass
class SearchResult:
    problem: Problem
    best: Outcome | None
    measured: int  # trials measured by this process
    study_trials: int  # measured trials in the whole study (all processes)
    failures: Counter = field(default_factory=Counter)  # reason -> count, this process
    seconds: float = 0.0  # this process's search
    study_seconds: float = 0.0  # the whole study's: this process's and the others'
    study_name: str = ""
    finalists: list[Config] = field(default_factory=list)  # to time again (tune: retime)
    first: tuple[Config, ...] = ()  # tried before the known-good configs (tune: neighbours)


def search(
    problem: Problem,
    gpu: Gpu,
    *,
    templates: Sequence[str] = ("blocked",),
    trials: int | None = 30,
    timeout: float | None = None,
    checks: bool = True,
    sampler: str = DEFAULT_STRATEGY,
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
    `sampler` names the strategy (autotune.strategies: climb, the default; tpe, random,
    grid).
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
        with Worker.for_gpu(gpu) as worker:
            worker.prepare(problem, reference_seed(seed), checks)
            return search(**(arguments | {"evaluator": worker}))
    return Search.of(**arguments).run()


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


@dataclass(eq=False)
class Lane:
    """One evaluator's share of a search that several measure for at once (a worker on
    each GPU); `label` names it in trial events and on its trials (None: the only one)."""

    evaluator: Evaluator
    label: str | None = None
    pending: deque = field(default_factory=deque)  # its claimed configs, next first
    out: str | None = None  # why it left the search for good (its GPU is gone)
    # Its crashed or device-lost trials in a row (trial, outcome, started, ended), held
    # until a known-good config tells whether they are the candidates' fault or the GPU's.
    faults: list = field(default_factory=list)
    # Its recorded trials (trial, outcome, event) waiting for on_trial and to be told
    # finished, which happen outside the search's lock (the cache write of a new best
    # would pause the other lanes).
    reports: deque = field(default_factory=deque)
    measured: int = 0  # candidates it measured (over every search it took part in)

    def held(self, outcome: Outcome) -> bool:
        """Whether this outcome is held with the lane's faults (not the only lane's)."""
        return self.label is not None and outcome.reason in GPU_FAULTS


class Search:
    """One search of a problem (see search()): `run` with its one evaluator, or `work`
    from a thread per Lane, then `conclude` once every lane is done."""

    @classmethod
    def of(cls, problem: Problem, gpu: Gpu, **arguments) -> Search:
        """search()'s arguments checked, its evaluator's compile_ahead chosen."""
        evaluator, checks = arguments["evaluator"], arguments["checks"]
        if isinstance(evaluator, Worker) and not evaluator.prepared_for(problem, checks):
            raise ValueError(f"the worker is not prepared for {problem} with checks={checks}")
        if arguments["compile_ahead"] is None:  # on a CPU adapter it would disturb timing
            cpu = gpu.fingerprint.adapter_type == "CPU"
            arguments["compile_ahead"] = 0 if cpu or not isinstance(evaluator, Worker) else 1
        return cls(problem, gpu, **arguments)

    def __init__(self, problem, gpu, *, templates, trials, timeout, checks, sampler, storage,
                 seed, max_dispatch_s, on_trial, evaluator, limits, compile_ahead,
                 stopping: threading.Event | None = None,
                 known_good: Config | None = None, first: Sequence[Config] = ()):  # fmt: skip
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
        if not self.study.optuna.trials:  # a new study: `first` (tune: configs measured
            # nearby), then the spaces' known-good configs, before the strategy's own
            for config in dict.fromkeys([*first, *self._seeds()]):
                self.study.enqueue(config)
        self.result = SearchResult(problem, None, 0, 0, study_name=name, first=tuple(first))
        # Each lane's claimed configs wait their turn in Lane.pending: with compile_ahead,
        # its evaluator compiles the next ones while it times the current one (never two
        # timings at once on one evaluator).
        self.full = False  # the study's budget is taken (by claims of other processes too)
        self.lock = threading.RLock()  # proposing, claiming, recording: one lane at a time
        self.lanes: set[Lane] = set()  # those working now
        self.in_flight = 0  # claimed configs being measured now
        # Set (by the pool of GPUs, for all its searches at once): nothing more is claimed
        # or recorded, what is being measured is given back when it returns.
        self.stopping = stopping if stopping is not None else threading.Event()
        self.known_good = known_good  # runs on this GPU (the baseline): checks a lane's GPU

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
        """The search with its one evaluator, to its budget."""
        self.work(Lane(self.evaluator))
        return self.conclude()

    def work(self, lane: Lane) -> None:
        """Measure claimed configs on `lane` until the budget or the time is spent, the
        search is stopped, or the lane is out (a lane of its own: its evaluator's
        WorkerError is raised, as one evaluator's failure is the search's)."""
        with self.lock:
            self.lanes.add(lane)
        try:
            while self._going(lane) and self._fill(lane) and not self._out_of_time():
                with self.lock:
                    trial, config = lane.pending.popleft()
                    self.in_flight += 1
                self._measure(lane, trial, config)
        finally:
            with self.lock:
                for trial, config in lane.pending:  # claimed, never measured: queued again
                    self.study.release(trial, config)
                lane.pending.clear()
                self._settle(lane, record=not (lane.out or self.stopping.is_set()))
            try:
                self._report(lane)
            finally:
                with self.lock:
                    self.lanes.discard(lane)

    def wants_more(self) -> bool:
        """Whether another lane joining now would find configs to measure."""
        with self.lock:
            return not self.stopping.is_set() and not self._exhausted()

    def conclude(self) -> SearchResult:
        """The result, once no lane works any more: the study's best and finalists."""
        result, study = self.result, self.study
        result.study_trials = study.measured_count()
        result.best = study.best(result.best)
        result.finalists = study.finalists(FINALISTS, self._seeds())
        result.seconds = time.monotonic() - self.start
        result.study_seconds = result.seconds + study.others_seconds()
        return result

    def _going(self, lane: Lane) -> bool:
        return not lane.out and not self.stopping.is_set()

    def _fill(self, lane: Lane) -> bool:
        """Claim configs until compile_ahead of them wait behind the lane's next; False:
        none."""
        with self.lock:
            while not self.stopping.is_set() and len(lane.pending) < 1 + self.compile_ahead:
                claimed = self._claim()
                if claimed is None:
                    break
                lane.pending.append(claimed)
                if len(lane.pending) > 1:
                    lane.evaluator.compile_ahead(claimed[1])
            return bool(lane.pending)

    def _out_of_time(self) -> bool:
        return self.timeout is not None and time.monotonic() - self.start >= self.timeout

    def _exhausted(self) -> bool:
        """The budget is spent, the time is up, or every valid config is measured."""
        waiting = sum(len(ln.pending) + len(ln.faults) + len(ln.reports) for ln in self.lanes)
        waiting += self.in_flight
        measured = len(self.study.history()) + waiting
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
                self.study.release(trial)  # (not queued again: the budget is spent)
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

    def _measure(self, lane: Lane, trial: optuna.Trial, config: Config) -> None:
        result = self.result
        with self.lock:
            best_s = result.best.measurement.median_s if result.best else None
        limit = self.max_dispatch_s or (max(1.0, 50 * best_s) if best_s else None)
        started = time.monotonic()
        try:
            outcome = lane.evaluator.evaluate(config, max_dispatch_s=limit)
        except WorkerError as error:
            if lane.label is None:  # the search's only evaluator
                raise
            if not self.stopping.is_set():  # (stopping: its worker was killed, not lost)
                lane.out = str(error)
            outcome = None
        ended = time.monotonic()
        with self.lock:
            self.in_flight -= 1
            if outcome is None or self.stopping.is_set():  # not measured: for another lane
                self.study.release(trial, config)
                self.full = False  # (the budget may have been full of this claim)
                return
            held = lane.held(outcome)
            if not held:
                self._settle(lane, record=True)  # the faults before it were the candidates'
                self._record(lane, trial, outcome, started, ended)
            else:
                lane.faults.append((trial, outcome, started, ended))
        self._report(lane)
        if held and len(lane.faults) >= LOST_AFTER:
            self._check(lane)

    def _check(self, lane: Lane) -> None:
        """LOST_AFTER faults in a row on this lane: a known-good config tells whether its
        GPU is still good (the faults are recorded) or gone (the lane leaves, and the
        faulted trials go back to the study, for another GPU)."""
        with self.lock:
            config = self.result.best.config if self.result.best else self.known_good
        why = "no known-good config to check the GPU with"
        if config is not None:
            try:
                check = lane.evaluator.evaluate(config)
                why = None if check.ok else f"and so did a known-good config: {check.failure}"
            except WorkerError as error:
                why = f"and the worker cannot be restarted: {error}"
        with self.lock:
            if why is not None and not self.stopping.is_set():
                last = lane.faults[-1][1]
                lane.out = (
                    f"{len(lane.faults)} candidates in a row lost the device or crashed the "
                    f"worker (the last: {last.failure}), {why}"
                )
            self._settle(lane, record=lane.out is None and not self.stopping.is_set())
        self._report(lane)

    def _settle(self, lane: Lane, record: bool) -> None:
        """The lane's held faults recorded (the candidates' own) or released (its GPU's:
        another measures them); under the lock."""
        faults, lane.faults = lane.faults, []
        for trial, outcome, started, ended in faults:
            if record:
                self._record(lane, trial, outcome, started, ended)
            else:
                self.study.release(trial, outcome.config)
                self.full = False

    def _record(self, lane: Lane, trial, outcome: Outcome, started: float, ended: float) -> None:
        result = self.result
        best_s = result.best.measurement.median_s if result.best else None
        result.measured += 1
        lane.measured += 1
        if not outcome.ok:
            result.failures[outcome.reason] += 1
        elif best_s is None or outcome.measurement.median_s < best_s:
            result.best = outcome
        event = {
            "outcome": outcome, "result": result, "elapsed": time.monotonic() - self.start,
            "gpu": lane.label, "started": started, "ended": ended, "evaluator": lane.evaluator,
            "trial": trial.number,  # its number in the study
            "new_best": outcome is result.best,  # as recorded: another lane may beat it since
        }  # fmt: skip
        lane.reports.append((trial, outcome, event))

    def _report(self, lane: Lane) -> None:
        """The lane's recorded trials passed to on_trial, then told finished; outside the
        lock. The caller stores a new best (tune: in the cache) before the trial is told
        finished: killed in between, the trial counts as interrupted and is measured
        again, so no finished result is ever missing from the cache."""
        while lane.reports:
            trial, outcome, event = lane.reports.popleft()
            if self.on_trial:
                self.on_trial(event)
            with self.lock:
                self.study.finish(trial, outcome, lane.label)
