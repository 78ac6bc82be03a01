"""Study: the Optuna study a search keeps its trials in, shared by every process (and
machine) tuning one problem on one kind of device.

A trial is one proposed config, claimed before it is measured. The claim is made in
the study, so that two processes on one storage never measure one config twice: the
later claim backs off (`duplicate`).
A measured trial carries what was measured in user attributes (`record`), and the
study says what it tunes (`study_attrs`), so that optuna-dashboard shows a useful view
of a study (docs/DASHBOARD.md). A trial whose process was killed (left RUNNING by a
process of this machine that is gone) is failed as interrupted when the study is next
opened, and its config queued to be measured again; so is the config of an enqueued
trial handed out to a process killed before the trial named it. The budget is the
study's: configs measured by any process, plus those claimed by live trials and
admitted to the budget (Study.admit).
"""

from __future__ import annotations

import math
import os
import socket
import time
import warnings
from collections.abc import Sequence

import optuna

from .device import Fingerprint, Gpu, one_line
from .evaluate import Outcome
from .measure import Measurement
from .problem import Problem
from .render import template_hash
from .space import Config, load_space
from .version import __version__

TrialState = optuna.trial.TrialState
REFRESH_S = 1.0  # other processes' results are read at most this often
DIGITS = 4  # significant digits of the readable numbers (GFLOP/s, ms); exact: measurement
TEMPLATE = "template"  # the param that picks the template, where a study searches several


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
    if own := _limited(gpu, portable):  # a caller's device below its adapter: its own space
        parts.append(f"limited-{own}")
    parts += [f"{t}-{template_hash(t)}" for t in templates]
    return ":".join(parts)


def _device_text(fp: Fingerprint) -> str:
    """The device and driver in words, from the fingerprint alone (all a stand-in Gpu
    of a replayed search has), e.g. "llvmpipe (...) (CPU) via Vulkan, Mesa 22.3.6"."""
    driver = f", {fp.description}" if fp.description else ""
    return one_line(f"{fp.device} ({fp.adapter_type}) via {fp.backend}{driver}")


def _limited(gpu: Gpu, portable: bool) -> str | None:
    """The digest of a caller's device below its adapter (Gpu.limited_as), else None (a
    replayed search's stand-in Gpu has none)."""
    limited_as = getattr(gpu, "limited_as", None)
    return limited_as(portable) if limited_as else None


def _space_text(gpu: Gpu, portable: bool) -> str:
    if own := _limited(gpu, portable):
        return f"a device's own lower limits or features (limited-{own})"
    return "WebGPU's default limits" if portable else "the device's limits"


def study_attrs(
    problem: Problem, templates: Sequence[str], checks: bool, gpu: Gpu, portable: bool = False
) -> dict:
    """What a study tunes, in words, as its user attributes: the study list of
    optuna-dashboard says what each (long, coded) study name stands for."""
    return {
        "problem": str(problem),
        "device": _device_text(gpu.fingerprint),
        "checks": "on" if checks else "off",
        "space": _space_text(gpu, portable),
        "templates": ", ".join(templates),
        "autotune_version": __version__,
    }


class Study:
    """The trials of one search, in an Optuna study (in memory, SQLite or a server)."""

    def __init__(
        self,
        name: str,
        storage,
        sampler,
        problem: Problem,
        templates: Sequence[str],
        attrs: dict | None = None,
    ):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna.create_study(
            study_name=name,
            storage=storage,
            direction="minimize",
            sampler=sampler,
            load_if_exists=True,
        )
        self.name, self.problem, self.templates = name, problem, tuple(templates)
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self._history: dict[str, float | None] = {}
        self._read_at = -math.inf
        self._describe(attrs or {})
        self._fail_interrupted()

    def _describe(self, attrs: dict) -> None:
        """The study's user attributes (study_attrs) and its objective's name, written by
        the process that creates the study or first opens it without them: the facts stay
        those of their first writer (its autotune version, say)."""
        have = self.optuna.user_attrs
        for key, value in attrs.items():
            if key not in have:  # (two first writers at once: the storage keeps one)
                self.optuna.set_user_attr(key, value)
        if self.optuna.metric_names is None:
            with warnings.catch_warnings():  # set_metric_names is experimental in Optuna
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self.optuna.set_metric_names(["seconds"])

    # --- what has been measured ------------------------------------------------------

    def history(self) -> dict[str, float | None]:
        """config text -> seconds (None: it failed), over every process's measured trials;
        re-read at most once a second (with many pruned proposals, reading the study on
        every ask would cost more than the search)."""
        if time.monotonic() - self._read_at > REFRESH_S:
            self._history, self._read_at = self._measured(), time.monotonic()
        return self._history

    def _measured(self) -> dict[str, float | None]:
        history = {}
        for trial in self.optuna.get_trials(deepcopy=False):
            config = trial.user_attrs.get("config")
            if config is None or not _claimed(trial) or trial.state == TrialState.RUNNING:
                continue  # not a claim, interrupted, a duplicate, or still being measured
            if trial.state == TrialState.COMPLETE:
                history[config] = trial.value
            else:
                history.setdefault(config, None)
        return history

    def measured_count(self) -> int:
        self._read_at = -math.inf
        return len(self.history())

    def others_seconds(self) -> float:
        """Seconds the study's other processes (earlier ones, killed ones, those of other
        machines) spent on it: each one's span from its first trial's start to its last
        trial's end, read from the trials, so that a process killed mid-search counts."""
        spans: dict[str, list] = {}
        for trial in self.optuna.get_trials(deepcopy=False):
            worker, end = trial.user_attrs.get("worker"), trial.datetime_complete
            if worker is None or worker == self.worker_id or end is None:
                continue
            if trial.user_attrs.get("interrupted"):  # ended when found, by the next process
                continue
            first, last = spans.setdefault(worker, [trial.datetime_start, end])
            spans[worker] = [min(first, trial.datetime_start), max(last, end)]
        return sum((last - first).total_seconds() for first, last in spans.values())

    def admit(self, trial: optuna.Trial, trials: int | None, wait_s: float = 10.0) -> bool:
        """After `trial` is claimed: whether the budget of `trials` has room for it (it is
        then marked admitted); False: the caller releases it.

        Processes claim at the same time, so each counts after writing its claim: the
        configs measured, and those claimed by live trials that were admitted (passed
        this count) or have a lower number. An undecided claim of a higher number is
        waited for when it could tip the count (it decides at once, without waiting on
        lower numbers): of two claims for the last place, the lower is admitted. The
        last trial to count sees every other admitted claim, so the study never
        measures more than `trials` configs.
        """
        deadline = time.monotonic() + wait_s
        while trials is not None:
            counted, undecided = set(), set()
            for other in self.optuna.get_trials(deepcopy=False):
                config = other.user_attrs.get("config")
                if other.number == trial.number or config is None or not _counts(other):
                    continue
                if (
                    other.state != TrialState.RUNNING
                    or "admitted" in other.user_attrs
                    or other.number < trial.number
                ):
                    counted.add(config)
                else:
                    undecided.add(config)
            if len(counted) >= trials:
                return False
            if len(counted | undecided) < trials:
                break
            if time.monotonic() > deadline:  # a claimer that never decides: count it
                return False
            time.sleep(0.05)
        _owned(trial.set_user_attr, "admitted", True)  # (finished elsewhere: its result)
        return True

    # --- asking and claiming ---------------------------------------------------------

    def ask(self) -> tuple[optuna.Trial, Config]:
        """A trial and the config the study's sampler proposes for it. The trial names
        its process at once: one killed before it claims the config (or prunes it) leaves
        a RUNNING trial that the next process to open the study can see is dead, fail,
        and whose config (an enqueued seed, say) it queues again (_claim_text); one
        killed before even that write, an enqueued config all the same (_queue_unnamed)."""
        trial = self.optuna.ask()
        _owned(trial.set_user_attr, "worker", self.worker_id)
        return trial, self._config_of(trial)

    def ask_for(self, config: Config) -> tuple[optuna.Trial, Config]:
        """A trial for `config` (enqueued, then asked: the sampler sees it like its own)."""
        self.enqueue(config)
        return self.ask()

    def queued(self) -> bool:
        """Whether enqueued configs wait to be asked (ask_for's config comes after them)."""
        return bool(self.optuna.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def enqueue(self, config: Config) -> None:
        self.optuna.enqueue_trial(self._fixed_params(config))

    def _fixed_params(self, config: Config) -> dict:
        """The params an enqueued trial of `config` holds (Optuna's fixed params)."""
        params = {_param(config.template, k): v for k, v in config.params}
        if len(self.templates) > 1:
            params[TEMPLATE] = config.template
        return params

    def _config_of(self, trial: optuna.Trial) -> Config:
        templates = list(self.templates)
        template = (
            trial.suggest_categorical(TEMPLATE, templates) if len(templates) > 1 else templates[0]
        )
        params = {
            name: trial.suggest_categorical(_param(template, name), list(values))
            for name, values in load_space(template).params.items()
        }
        return Config.make(template, params)

    def prune(self, trial: optuna.Trial, config: Config, why: str) -> None:
        """An invalid proposal: pruned, so the sampler learns to avoid it; costs nothing.
        Its `note` says why, for people (a proposal holds no claim: no `config`)."""
        if _owned(trial.set_user_attr, "note", f"{config} is invalid here: {why}"):
            _owned(self.optuna.tell, trial, state=TrialState.PRUNED, skip_if_finished=True)

    def answer_known(self, trial: optuna.Trial, config: Config, seconds: float | None) -> None:
        """A proposal measured before: told its earlier result, without the GPU."""
        if _owned(trial.set_user_attr, "note", f"{config} was measured before: its result"):
            _owned(self._tell, trial, seconds)

    def claim(self, trial: optuna.Trial, config: Config) -> bool:
        """Claim `config` for this process; False when another trial holds it (this one
        then backs off as a duplicate). The claim is written, then checked: of two claims
        of one config at once, the one that kept it first stands (_claimed_elsewhere)."""
        # The worker is written at ask: one write claims, and a claim never holds a config
        # without a process to see as dead (it would keep its place in the budget for ever).
        if not _owned(trial.set_user_attr, "config", str(config)):
            return False
        if self._claimed_elsewhere(trial, config):
            if _owned(trial.set_user_attr, "duplicate", True):
                _owned(self._tell, trial, None)
            return False
        return True

    def _claimed_elsewhere(self, trial: optuna.Trial, config: Config, wait_s=10.0) -> bool:
        """Whether another trial holds `config`: one measured, a live claim of a lower
        number, or one of a higher number that was admitted. A higher one may have
        checked before our claim was written, and kept it; one not yet admitted is
        waited for until it backs off (ours stands) or is admitted (it stands). Past
        `wait_s` undecided, ours backs off: a config is never measured twice."""
        deadline = time.monotonic() + wait_s
        while True:
            undecided = False
            for other in self.optuna.get_trials(deepcopy=False):
                mine = other.number == trial.number
                if mine or other.user_attrs.get("config") != str(config) or not _counts(other):
                    continue
                if (
                    other.state != TrialState.RUNNING
                    or other.number < trial.number
                    or "admitted" in other.user_attrs
                ):
                    return True
                undecided = True
            if not undecided:
                return False
            if time.monotonic() > deadline:
                return True
            time.sleep(0.05)

    def finish(self, trial: optuna.Trial, outcome: Outcome, gpu: str | None = None) -> None:
        """Record what was measured on the trial (and on which GPU, where several measure
        for it), then tell it finished."""
        _owned(record, trial, outcome, self.problem, gpu)
        seconds = outcome.measurement.median_s if outcome.ok else None
        self._history[str(outcome.config)] = seconds
        _owned(self._tell, trial, seconds)

    def release(self, trial: optuna.Trial, config: Config | None = None) -> None:
        """Give back a claimed trial whose result is not recorded: failed and marked
        interrupted, so it neither counts as measured nor keeps its config from being
        measured later. Given its `config`, that is queued again (once, _queue_once): a
        search that stopped, ran out of time or lost a GPU leaves the configs it had
        chosen to the next one to measure."""
        if _owned(trial.set_user_attr, "interrupted", True) and _owned(self._tell, trial, None):
            if config is not None:
                self._queue_once(config, trial.number)

    def _tell(self, trial, seconds: float | None) -> None:
        if seconds is None:
            self.optuna.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        else:
            self.optuna.tell(trial, seconds, skip_if_finished=True)

    def _fail_interrupted(self) -> None:
        """Trials left RUNNING by a killed process of this machine: failed, as interrupted
        (not counted as measured), and the configs they had claimed or been asked for
        queued again; and the enqueued configs of trials that name no process."""
        for trial in self.optuna.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if "worker" not in trial.user_attrs:
                self._queue_unnamed(trial)
                continue
            pid = _holder(trial)  # (this process's own: left by an earlier search of it)
            if pid is not None and not _alive(pid):
                try:  # (not skip_if_finished: of two processes opening the study, one queues)
                    self.optuna.tell(trial.number, state=TrialState.FAIL)
                except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
                    continue  # told by another process meanwhile
                if config := self._config_claimed(trial):
                    self._queue_once(config, trial.number)

    def _queue_unnamed(self, trial: optuna.trial.FrozenTrial) -> None:
        """A running trial that names no process: Optuna handed it out (took it from the
        queue, or made it) and its process was killed before Study.ask named it, or is
        between the two now. Nothing tells which, so the trial is left as it is, and
        the config it was enqueued with (a seed, say) is queued again unless it was
        taken up since: a live process's claim of it stands (the copy is then answered
        without the GPU), and the copy keeps later openings from queueing another."""
        config = self._ours(self._asked_text(trial))
        if config is not None and not self._taken_up(config, trial.number):
            self._queue_once(config, trial.number)

    def _taken_up(self, config: Config, number: int) -> bool:
        """Whether `config` is claimed by a trial (measured, say), or enqueued again
        since trial `number` was handed out: waiting, or asked (what became of that
        trial decides whether it is queued again)."""
        text, params = str(config), self._fixed_params(config)
        for trial in self.optuna.get_trials(deepcopy=False):
            if trial.user_attrs.get("config") == text and _claimed(trial):
                return True
            later = trial.number > number or trial.state == TrialState.WAITING
            if later and trial.system_attrs.get("fixed_params") == params:
                return True
        return False

    def _config_claimed(self, trial: optuna.trial.FrozenTrial) -> Config | None:
        """The config a trial claimed (or was claiming, _claim_text); None where it has
        none, or one of another space (a shared storage may hold anything)."""
        return self._ours(self._claim_text(trial))

    def _ours(self, text: str | None) -> Config | None:
        """The config `text` names, where it is one of this study's, valid here."""
        if text is None:
            return None
        try:
            config = Config.parse(text)
        except (ValueError, AttributeError):  # (SpaceError is a ValueError)
            return None
        ours = config.template in self.templates
        if not ours or load_space(config.template).why_invalid(config, self.problem):
            return None
        return config

    def _claim_text(self, trial: optuna.trial.FrozenTrial) -> str | None:
        """The config a trial claimed, as written; for a proposal cut short (its process
        killed after ask, before the claim: a worker, no config) the one it was asked
        for, so that an enqueued seed it was claiming is not lost. A proposal pruned or
        answered without the GPU (its `note`) claimed nothing."""
        attrs = trial.user_attrs
        if "config" in attrs or "worker" not in attrs or "note" in attrs:
            return attrs.get("config")
        return self._asked_text(trial)

    def _asked_text(self, trial: optuna.trial.FrozenTrial) -> str | None:
        """The config a trial was asked for (an enqueued one's, before its params were
        asked), as text; None where its params do not make one of this study's."""
        params = _asked_params(trial)
        several = len(self.templates) > 1
        template = params.get(TEMPLATE) if several else self.templates[0]
        if template not in self.templates:
            return None  # (never asked, or another study's)
        names = load_space(template).params
        try:
            return str(Config.make(template, {n: params[_param(template, n)] for n in names}))
        except (KeyError, ValueError, TypeError):  # a param never asked, or not this space's
            return None

    def _queue_once(self, config: Config, number: int) -> None:
        """Queue `config` again, unless it was interrupted twice while claimed (trial
        `number` included): a config whose measurement takes its process or GPU down
        with it is queued once, not first on every resume. A proposal cut short (the
        config never claimed) does not count: it never reached the GPU."""
        text = str(config)
        trials = self.optuna.get_trials(deepcopy=False)
        claimed = [t for t in trials if t.user_attrs.get("config") == text]
        earlier = [t for t in claimed if t.number != number and _interrupted(t)]
        this_one = any(t.number == number for t in claimed)
        if len(earlier) + this_one < 2:
            self.enqueue(config)

    # --- results ----------------------------------------------------------------------

    def best(self, own: Outcome | None) -> Outcome | None:
        """The best measured trial of the whole study (other processes' included). A
        shared storage is written by other processes and users: a trial whose config is
        not valid here or whose measurement is malformed is passed over, never trusted."""
        best = own
        for trial in self.optuna.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if best is not None and best.measurement.median_s <= trial.value:
                continue
            outcome = outcome_of(trial, self.problem)
            if outcome is not None:
                best = outcome
        return best

    def finalists(self, count: int, seeds: Sequence[Config]) -> list[Config]:
        """The study's `count` fastest configs, best first, then the seeds it measured: a
        candidate timed while the GPU's clocks were down can rank far below its speed,
        and the seeds are the configs most likely to be the fastest."""
        complete = self.optuna.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        fastest, measured = [], set()
        for trial in sorted(complete, key=lambda t: t.value):
            outcome = outcome_of(trial, self.problem)
            if outcome is not None:
                measured.add(outcome.config)
                if len(fastest) < count and outcome.config not in fastest:
                    fastest.append(outcome.config)
        return fastest + [c for c in seeds if c in measured and c not in fastest]


def _claimed(trial: optuna.trial.FrozenTrial) -> bool:
    """A trial that holds its config: neither given back nor a duplicate claim."""
    attrs = trial.user_attrs
    if "interrupted" in attrs or "duplicate" in attrs:
        return False
    # Failed without a failure's reason: interrupted (given back, or its process killed
    # while record() wrote it: reason "ok" set, the value never told).
    return trial.state != TrialState.FAIL or attrs.get("reason", "ok") != "ok"


def _asked_params(trial: optuna.trial.FrozenTrial) -> dict:
    """The params a trial was asked for: an enqueued trial whose process was killed before
    they were suggested holds them only as Optuna's fixed params (enqueue_trial's system
    attribute; a shared storage may hold anything there)."""
    fixed = trial.system_attrs.get("fixed_params")
    return {**(fixed if isinstance(fixed, dict) else {}), **trial.params}


def _param(template: str, name: str) -> str:
    """The name of a template's parameter among the trial's params (one study may search
    several templates; which one is the param TEMPLATE)."""
    return f"{template}.{name}"


def _interrupted(trial: optuna.trial.FrozenTrial) -> bool:
    """A claim (or a proposal) that ended without a result: given back, or its process
    killed."""
    finished = trial.state != TrialState.RUNNING
    return finished and not _claimed(trial) and "duplicate" not in trial.user_attrs


def _counts(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a claimed trial counts toward the budget: measured (complete or failed),
    or running in a live process (one of this machine that died holds nothing; another
    machine's counts until that machine opens the study again)."""
    if not _claimed(trial) or trial.state not in (
        TrialState.COMPLETE,
        TrialState.FAIL,
        TrialState.RUNNING,
    ):
        return False
    pid = _holder(trial)
    return trial.state != TrialState.RUNNING or pid in (None, os.getpid()) or _alive(pid)


def _holder(trial: optuna.trial.FrozenTrial) -> int | None:
    """The pid of the process of this machine that asked for `trial` (its "worker" is
    host:pid); None for another machine's, whose processes cannot be seen from here."""
    name, _, pid = str(trial.user_attrs.get("worker", "")).rpartition(":")
    return int(pid) if name == socket.gethostname() and pid.isdigit() else None


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


def record(trial: optuna.Trial, outcome: Outcome, problem: Problem, gpu: str | None = None) -> None:
    """What was measured, as the trial's user attributes: for people (optuna-dashboard's
    trial table) config, reason ("ok" or the failure's), gflops and median_ms, or
    failure (one line), and the GPU that measured it where several did; for the tuner
    (outcome_of) template, params, measurement, error, compile_s, and the failure's
    whole detail."""
    trial.set_user_attr("config", str(outcome.config))
    if gpu is not None:
        trial.set_user_attr("gpu", gpu)
    trial.set_user_attr("template", outcome.config.template)
    trial.set_user_attr("params", outcome.config.as_dict())
    trial.set_user_attr("reason", outcome.reason or "ok")
    trial.set_user_attr("compile_s", outcome.compile_s)
    if outcome.detail:
        trial.set_user_attr("detail", outcome.detail)
    if outcome.ok:
        m = outcome.measurement
        trial.set_user_attr("gflops", _rounded(m.gflops(problem.flops)))
        trial.set_user_attr("median_ms", _rounded(m.median_s * 1e3))
        trial.set_user_attr("measurement", m.as_dict())
        trial.set_user_attr("error", outcome.error)
    else:
        trial.set_user_attr("failure", outcome.failure)


def _rounded(value: float) -> float:
    return float(f"{value:.{DIGITS}g}")


def outcome_of(trial: optuna.trial.FrozenTrial, problem: Problem) -> Outcome | None:
    """The Outcome a measured trial records; None for anything malformed or not valid
    for `problem` (a shared study may hold crafted trials)."""
    try:
        attrs = trial.user_attrs
        config = Config.make(attrs["template"], attrs["params"])
        if load_space(config.template).why_invalid(config, problem) is not None:
            return None
        measurement = Measurement.from_dict(attrs["measurement"])
        error = float(attrs.get("error", 0.0))
        compile_s = float(attrs.get("compile_s", 0.0))
    except (KeyError, TypeError, ValueError, ArithmeticError):  # 10**400, Infinity
        return None
    if not 0 <= error <= 1:
        return None
    return Outcome(config, measurement, error=error, compile_s=compile_s)
