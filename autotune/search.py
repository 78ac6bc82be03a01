"""Search: Optuna proposes configs, each is compiled, verified and timed on the GPU.

The study is driven with ask/tell so that the tuner, not Optuna, decides what a trial
costs: a config that breaks a constraint or a device limit is told PRUNED before any
compile (the sampler learns to avoid it, the budget does not pay for it); a config
already measured in the study, by this process or another on the same storage, is told
its earlier result without touching the GPU. A candidate that fails to compile, exceeds
a limit, computes a wrong result or is hopelessly slow is a value with a reason
(`compile`, `limits`, `wrong`, `timeout`, `crashed`, `device-lost`), recorded on its
trial and told to Optuna as a failure, so the study never proposes it for measuring again.
Candidates run in a worker process (autotune.worker): a hang, a crash or a lost device
costs that one trial and a restart of the worker.

The budget (`trials`) counts measured trials of the whole study, so a killed `tune` on
a persistent storage resumes where it stopped, and several processes share one budget.
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import optuna

from .compile import CompileError, compile_shader
from .device import Gpu
from .measure import Measurement, TooSlow, measure
from .problem import Problem
from .render import render, template_hash
from .space import Config, load_space
from .verify import Reference, verify
from .worker import CANDIDATE_S, Worker

SAMPLERS = ("tpe", "random", "grid")
MAX_IDLE_ASKS = 50  # invalid proposals in a row before we pick a config ourselves
FINALISTS = 4  # the study's fastest configs, timed again back to back at the end of tune


@dataclass(frozen=True)
class Outcome:
    """What measuring one config gave: a time, or a failure reason."""

    config: Config
    measurement: Measurement | None = None
    reason: str = ""  # "" when it worked; else compile, limits, wrong, timeout, crashed,
    # device-lost
    detail: str = ""
    error: float = math.nan  # relative error at verification
    compile_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.measurement is not None


def evaluate(
    config: Config,
    problem: Problem,
    gpu: Gpu,
    *,
    checks: bool = True,
    max_dispatch_s: float | None = None,
    seed: int | None = None,
    reference: Reference | None = None,
    compiling: Future | None = None,
) -> Outcome:
    """Render, compile, verify and (only if correct) time one config.

    `reference`: the inputs and expected product to check against (shared by the
    candidates of one search); without it, fresh random data for this call.
    `compiling`: this config's compile, started earlier in another thread.
    """
    try:
        if compiling is not None:
            compiled = compiling.result()
        else:
            compiled = compile_shader(render(config, problem), gpu, checks=checks)
    except CompileError as error:
        return Outcome(config, reason=error.reason, detail=str(error)[:500])
    reference = reference or Reference(problem, seed)
    try:
        verdict = verify(compiled, gpu, reference=reference)
        if not verdict.ok:
            return Outcome(
                config,
                reason="wrong",
                detail=verdict.reason,
                error=verdict.error,
                compile_s=compiled.seconds,
            )
        measurement = measure(
            compiled, gpu, max_dispatch_s=max_dispatch_s, operands=(reference.A, reference.B)
        )
    except TooSlow as error:
        return Outcome(config, reason="timeout", detail=str(error), compile_s=compiled.seconds)
    except Exception as error:  # a driver or wgpu error while running: this trial only
        return Outcome(
            config,
            reason="crashed",
            detail=f"{type(error).__name__}: {error}"[:500],
            compile_s=compiled.seconds,
        )
    return Outcome(config, measurement, error=verdict.error, compile_s=compiled.seconds)


def retime(
    configs: Sequence[Config], problem: Problem, gpu: Gpu, checks: bool, reference: Reference
) -> Outcome | None:
    """Time the search's finalists again, back to back, and return the fastest.

    Each candidate of the search was timed once, after host-side work (compile,
    verification) that lets the GPU's clocks drop; on the H200 a config sometimes
    measured at half its speed. Here the finalists are compiled and verified first, the
    GPU is kept busy, and each is timed in two rounds; its time is the faster round.
    """
    ready = []
    for config in configs:
        try:
            compiled = compile_shader(render(config, problem), gpu, checks=checks)
        except CompileError:
            continue
        verdict = verify(compiled, gpu, reference=reference)
        if verdict.ok:  # verified during the search too: this is a second look
            ready.append((config, compiled, verdict.error))
    if not ready:
        return None
    operands = (reference.A, reference.B)
    measure(ready[0][1], gpu, operands=operands, warmup_s=0.3)  # clocks up; not used
    fastest: dict[Config, Measurement] = {}
    for _ in range(2):
        for config, compiled, _ in ready:
            m = measure(compiled, gpu, operands=operands)
            if config not in fastest or m.median_s < fastest[config].median_s:
                fastest[config] = m
    config, compiled, error = min(ready, key=lambda item: fastest[item[0]].median_s)
    return Outcome(config, fastest[config], error=error, compile_s=compiled.seconds)


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


def study_name(
    problem: Problem, templates: Sequence[str], checks: bool, gpu: Gpu, portable: bool = False
) -> str:
    """One study per device, problem, template set (and their content), check mode and
    space (the device's limits or WebGPU's defaults)."""
    parts = [
        gpu.fingerprint.slug,
        str(gpu.fingerprint.device_id),
        problem.shape,
        problem.dtype_text,
        problem.layout,
        "checks" if checks else "nochecks",
    ]
    if problem.batch > 1 or problem.epilogue != "none":  # plain names stay as they were
        parts[5:5] = [problem.batch_text, problem.epilogue]
    parts += ["portable"] if portable else []
    parts += [f"{t}-{template_hash(t)}" for t in templates]
    return ":".join(parts)


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        # multivariate + group model the parameters jointly per template; constant_liar
        # keeps processes sharing a study from proposing the same point at once.
        with warnings.catch_warnings():  # group and constant_liar are "experimental"
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=8
            )
    if name in ("random", "grid"):  # grid: the tuner enqueues configs in order itself
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"sampler {name!r} is unknown; known: {', '.join(SAMPLERS)}")


def _config_from_trial(trial: optuna.Trial, templates: Sequence[str]) -> Config:
    template = (
        trial.suggest_categorical("template", list(templates))
        if len(templates) > 1
        else templates[0]
    )
    space = load_space(template)
    params = {
        name: trial.suggest_categorical(f"{template}.{name}", list(values))
        for name, values in space.params.items()
    }
    return Config.make(template, params)


def _trial_params(config: Config, templates: Sequence[str]) -> dict:
    params = {f"{config.template}.{k}": v for k, v in config.params}
    if len(templates) > 1:
        params["template"] = config.template
    return params


Progress = Callable[[dict], None]


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
    evaluator: Callable[[Config], Outcome] | None = None,
    limits: dict | None = None,
    worker: Worker | None = None,
    candidate_timeout: float = CANDIDATE_S,
    compile_ahead: int | None = None,
) -> SearchResult:
    """Search the templates' spaces for the fastest correct kernel of `problem`.

    `storage` is an Optuna storage (object or URL; None keeps the study in memory).
    A candidate whose one dispatch takes longer than `max_dispatch_s` (default: 50x the
    best so far, at least 1 s) is recorded as a timeout. `evaluator` replaces the GPU
    (render, compile, verify, time) by another source of Outcomes, e.g. a recorded table
    replayed to compare samplers; `gpu` then only lends its limits and fingerprint.
    `limits` narrows the space to configs within them (e.g. WebGPU's defaults).
    Candidates run in `worker` (prepared for this problem and check mode; without one, a
    worker is started here and stopped at the end); one that gives no answer within
    `candidate_timeout` seconds is a `timeout` and the worker is restarted.
    `compile_ahead`: how many of the next configs the worker compiles (in threads) while
    it verifies and times the current one; default 1, or 0 on a CPU adapter (lavapipe),
    where compiling would slow the kernel being timed.
    """
    arguments = dict(locals())
    if trials is None and timeout is None:
        raise ValueError("give trials, timeout or both: the search needs a budget")
    if evaluator is None and worker is None:
        # our own worker, stopped when the search ends (however it ends)
        with Worker(gpu.fingerprint.as_dict()) as own:
            own.prepare(problem, reference_seed(seed), checks)
            return search(**(arguments | {"worker": own}))
    if worker is not None and (worker.setup is None or worker.setup[::2] != (problem, checks)):
        raise ValueError(f"the worker is not prepared for {problem} with checks={checks}")
    start = time.monotonic()
    limits = limits or gpu.limits
    valid = [c for t in templates for c in load_space(t).configs(problem, limits)]
    if not valid:
        raise ValueError(f"no config of {', '.join(templates)} is valid for {problem} here")
    name = study_name(problem, templates, checks, gpu, portable=limits != gpu.limits)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        direction="minimize",
        sampler=make_sampler(sampler, seed),
        load_if_exists=True,
    )
    _fail_interrupted(study)
    if not study.trials:  # a new study: try the known-good configs first
        for template in templates:
            for config in load_space(template).seed_configs(problem, limits):
                study.enqueue_trial(_trial_params(config, templates))
    rng = np.random.default_rng(seed)
    grid = iter(valid) if sampler == "grid" else None
    result = SearchResult(problem, None, 0, 0, study_name=name)
    state = {"history": {}, "refreshed": -math.inf, "idle": 0, "repeat": None, "full": False}
    if compile_ahead is None:  # on a CPU adapter compiling would disturb the timing
        compile_ahead = 0 if evaluator is not None or gpu.fingerprint.adapter_type == "CPU" else 1

    def claim() -> tuple[optuna.Trial, Config] | None:
        """The next config to measure, its trial claimed in the study; None: stop."""
        while True:
            # Re-read the study (other processes' results) at most once a second: with
            # many pruned proposals, reading it on every ask would cost more than the search.
            if time.monotonic() - state["refreshed"] > 1.0:
                state["history"], state["refreshed"] = _history(study), time.monotonic()
            history = state["history"]
            result.study_trials = len(history)
            if state["full"] or (trials is not None and len(history) + len(pending) >= trials):
                return None
            if timeout is not None and time.monotonic() - start >= timeout:
                return None
            if len(history) + len(pending) >= len(valid):
                return None  # the whole space is measured
            repeat = state["repeat"]
            neighbour = repeat and _unmeasured_neighbour(repeat, valid, history, rng)
            if grid is not None or state["idle"] >= MAX_IDLE_ASKS or (repeat and not neighbour):
                # Choose an unmeasured valid config ourselves: in order for grid, at random
                # when the sampler keeps proposing invalid points or measured ones with no
                # unmeasured neighbour.
                pool = grid if grid is not None else iter(rng.permutation(len(valid)).tolist())
                for item in pool:
                    config = item if grid is not None else valid[item]
                    if str(config) not in history:
                        study.enqueue_trial(_trial_params(config, templates))
                        break
                state["idle"] = 0
            elif neighbour:
                # The sampler proposed a measured config (TPE does, once it converges):
                # measure an unmeasured neighbour instead, a config differing in one
                # parameter.
                study.enqueue_trial(_trial_params(neighbour, templates))
            state["repeat"] = None
            trial = study.ask()
            config = _config_from_trial(trial, templates)
            reason = load_space(config.template).why_invalid(config, problem, limits)
            if reason:
                _owned(
                    study.tell, trial, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True
                )
                state["idle"] += 1
                continue
            if str(config) in history:  # measured before: its result, no GPU time
                _owned(_tell, study, trial, history[str(config)])
                state["repeat"] = config
                continue
            # Claim the config, then look again: of two claims of one config at once (by
            # two processes, or by this one for a config it is already compiling), the
            # later trial backs off.
            worker_id = f"{socket.gethostname()}:{os.getpid()}"
            if not (
                _owned(trial.set_user_attr, "config", str(config))
                and _owned(trial.set_user_attr, "worker", worker_id)
            ):
                continue
            if _claimed_elsewhere(study, trial, config):
                if _owned(trial.set_user_attr, "duplicate", True):
                    _owned(_tell, study, trial, None)
                state["idle"] += 1
                continue
            if trials is not None and not _within_budget(study, trial, trials):
                _release(study, trial)  # the others' claims fill the budget
                state["full"] = True
                return None
            if not _owned(trial.set_user_attr, "admitted", True):
                continue
            state["idle"] = 0
            return trial, config

    # Claimed configs waiting their turn: with compile_ahead, the worker compiles the
    # next ones while it times the current one (never two timings at once).
    pending: deque[tuple[optuna.Trial, Config]] = deque()
    try:
        while True:
            while len(pending) < 1 + compile_ahead:
                claimed = claim()
                if claimed is None:
                    break
                pending.append(claimed)
                if len(pending) > 1:
                    worker.compile_ahead(claimed[1])
            if not pending:
                break
            trial, config = pending.popleft()
            if timeout is not None and time.monotonic() - start >= timeout:
                pending.appendleft((trial, config))
                break  # out of time: claimed but unmeasured configs are released below
            best_s = result.best.measurement.median_s if result.best else None
            limit = max_dispatch_s or (max(1.0, 50 * best_s) if best_s else None)
            if evaluator is not None:
                outcome = evaluator(config)
            else:
                outcome = worker.evaluate(config, max_dispatch_s=limit, timeout_s=candidate_timeout)
            _owned(_record, trial, outcome)
            state["history"][str(config)] = outcome.measurement.median_s if outcome.ok else None
            result.measured += 1
            if not outcome.ok:
                result.failures[outcome.reason] += 1
            elif result.best is None or outcome.measurement.median_s < best_s:
                result.best = outcome
            # The caller stores a new best (tune: in the cache) before the trial is told
            # finished: killed in between, the trial counts as interrupted and is measured
            # again, so no finished result is ever missing from the cache.
            if on_trial:
                on_trial(
                    {"outcome": outcome, "result": result, "elapsed": time.monotonic() - start}
                )
            _owned(_tell, study, trial, outcome.measurement.median_s if outcome.ok else None)
    finally:
        for trial, _ in pending:  # claimed, never measured: free for a later run
            _release(study, trial)
    result.study_trials = len(_history(study))
    result.best = _study_best(study, result.best, problem)
    seeds = [c for t in templates for c in load_space(t).seed_configs(problem, limits)]
    result.finalists = _finalists(study, problem, FINALISTS, seeds)
    result.seconds = time.monotonic() - start
    return result


def _finalists(study: optuna.Study, problem: Problem, count: int, seeds) -> list[Config]:
    """The study's `count` fastest configs, best first, then the seeds it measured: a
    candidate timed while the GPU's clocks were down can rank far below its speed, and
    the seeds are the configs most likely to be the fastest."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    fastest, measured = [], set()
    for trial in sorted(complete, key=lambda t: t.value):
        try:
            outcome = _outcome_of(trial, problem)
        except (KeyError, TypeError, ValueError):
            continue  # a crafted or malformed trial of a shared study
        if outcome is not None:
            measured.add(outcome.config)
            if len(fastest) < count and outcome.config not in fastest:
                fastest.append(outcome.config)
    return fastest + [c for c in seeds if c in measured and c not in fastest]


def reference_seed(seed: int | None) -> int:
    """The seed of the verification data: given, or random (kept across worker restarts)."""
    return seed if seed is not None else secrets.randbits(32)


def _unmeasured_neighbour(config: Config, valid, history, rng) -> Config | None:
    """A random unmeasured valid config that differs from `config` in one parameter."""
    params = config.as_dict()
    near = [
        c
        for c in valid
        if c.template == config.template
        and str(c) not in history
        and sum(v != params[k] for k, v in c.params) == 1
    ]
    return near[rng.integers(len(near))] if near else None


def _history(study: optuna.Study) -> dict[str, float | None]:
    """config text -> seconds (None if it failed), over the study's measured trials."""
    history = {}
    for trial in study.get_trials(deepcopy=False):
        config = trial.user_attrs.get("config")
        if config is None or "interrupted" in trial.user_attrs or "duplicate" in trial.user_attrs:
            continue
        if trial.state == optuna.trial.TrialState.COMPLETE:
            history[config] = trial.value
        elif trial.state == optuna.trial.TrialState.FAIL:
            history.setdefault(config, None)
    return history


def _fail_interrupted(study: optuna.Study) -> None:
    """Trials left RUNNING by a killed process of this machine: mark them interrupted
    (failed, and not counted as measured) so their configs can be measured again."""
    host = socket.gethostname()
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = str(trial.user_attrs.get("worker", ""))
        name, _, pid = worker.rpartition(":")
        if name == host and pid.isdigit() and not _alive(int(pid)):
            study._storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)


def _release(study: optuna.Study, trial: optuna.Trial) -> None:
    """Give back a claimed trial that was not measured: failed, marked interrupted, so it
    neither counts as measured nor keeps its config from being measured later."""
    if _owned(trial.set_user_attr, "interrupted", True):
        _owned(_tell, study, trial, None)


def _owned(write, *args, **kwargs) -> bool:
    """Write to a trial of ours; False when it is already finished. Optuna's SQLite storage
    can hand one waiting (enqueued) trial to two processes at once (its pop is not atomic
    there), and the other process may finish it first: its result stands, ours (of the
    same config) is still reported to our caller."""
    try:
        write(*args, **kwargs)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != os.getpid()


def _claimed_elsewhere(study, trial, config: Config) -> bool:
    """True when another trial holds this config: finished, or running with a lower number."""
    for other in study.get_trials(deepcopy=False):
        if (
            other.number != trial.number
            and other.user_attrs.get("config") == str(config)
            and "interrupted" not in other.user_attrs
            and "duplicate" not in other.user_attrs
            and (other.state != optuna.trial.TrialState.RUNNING or other.number < trial.number)
        ):
            return True
    return False


def _within_budget(study, trial, trials: int, wait_s: float = 10.0) -> bool:
    """After `trial` is claimed: whether the study's budget still has room for it.

    Processes claim at the same time, so each counts after writing its claim: the configs
    measured, and those claimed by live trials that were admitted (passed this count) or
    have a lower number. An undecided claim of a higher number is waited for when it
    could tip the count (it decides at once, without waiting on lower numbers): of two
    claims for the last place, the lower is admitted. The last trial to count sees every
    other admitted claim, so the study never measures more than `trials` configs.
    """
    deadline = time.monotonic() + wait_s
    while True:
        counted, undecided = set(), set()
        for other in study.get_trials(deepcopy=False):
            config = other.user_attrs.get("config")
            if other.number == trial.number or config is None or not _counts(other):
                continue
            finished = other.state != optuna.trial.TrialState.RUNNING
            if finished or "admitted" in other.user_attrs or other.number < trial.number:
                counted.add(config)
            else:
                undecided.add(config)
        if len(counted) >= trials:
            return False
        if len(counted | undecided) < trials:
            return True
        if time.monotonic() > deadline:  # a claimer that never decides: count it
            return False
        time.sleep(0.05)


def _counts(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a claimed trial counts toward the budget: measured (complete or failed),
    or running in a live process (one of this machine that died holds nothing)."""
    attrs = trial.user_attrs
    if "interrupted" in attrs or "duplicate" in attrs:
        return False
    if trial.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL):
        return True
    if trial.state != optuna.trial.TrialState.RUNNING:
        return False
    name, _, pid = str(attrs.get("worker", "")).rpartition(":")
    if name != socket.gethostname() or not pid.isdigit():
        return True  # another machine's claim: it counts until that machine resumes
    return int(pid) == os.getpid() or _alive(int(pid))


def _record(trial: optuna.Trial, outcome: Outcome) -> None:
    trial.set_user_attr("config", str(outcome.config))
    trial.set_user_attr("template", outcome.config.template)
    trial.set_user_attr("params", outcome.config.as_dict())
    trial.set_user_attr("reason", outcome.reason)
    trial.set_user_attr("compile_s", outcome.compile_s)
    if outcome.detail:
        trial.set_user_attr("detail", outcome.detail)
    if outcome.ok:
        m = outcome.measurement
        trial.set_user_attr(
            "measurement",
            {
                "median_s": m.median_s,
                "p20_s": m.p20_s,
                "p80_s": m.p80_s,
                "method": m.method,
                "repeats": m.repeats,
                "passes": m.passes,
                "wall_median_s": m.wall_median_s,
            },
        )
        trial.set_user_attr("error", outcome.error)


def _tell(study, trial, seconds: float | None) -> None:
    """Finish a trial: its seconds, or failed (None); skipped if it is finished already."""
    if seconds is None:
        study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    else:
        study.tell(trial, seconds, skip_if_finished=True)


def _study_best(study: optuna.Study, own: Outcome | None, problem: Problem) -> Outcome | None:
    """The best measured trial of the whole study (other processes' included).

    A shared storage is written by other processes and users: a trial whose config is
    not valid here or whose measurement is malformed is passed over, never trusted.
    """
    best = own
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if best is not None and best.measurement.median_s <= trial.value:
            continue
        try:
            outcome = _outcome_of(trial, problem)
        except (KeyError, TypeError, ValueError):
            continue
        if outcome is not None:
            best = outcome
    return best


def _outcome_of(trial: optuna.trial.FrozenTrial, problem: Problem) -> Outcome | None:
    attrs = trial.user_attrs
    if "measurement" not in attrs:
        return None
    config = Config.make(attrs["template"], attrs["params"])
    if load_space(config.template).why_invalid(config, problem) is not None:
        return None
    m = attrs["measurement"]
    seconds = [float(m[k]) for k in ("median_s", "p20_s", "p80_s", "wall_median_s")]
    error = float(attrs.get("error", 0.0))
    if not all(0 < s < 3600 for s in seconds) or m["method"] not in ("timestamp", "wall"):
        return None
    if not 0 <= error <= 1:
        return None
    return Outcome(
        config,
        Measurement(
            passes=int(m["passes"]),
            repeats=int(m["repeats"]),
            median_s=seconds[0],
            p20_s=seconds[1],
            p80_s=seconds[2],
            method=m["method"],
            wall_median_s=seconds[3],
        ),
        error=error,
        compile_s=float(attrs.get("compile_s", 0.0)),
    )
