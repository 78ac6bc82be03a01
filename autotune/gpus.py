"""Several GPUs of one host tune together: a worker process per GPU, all on one study.

    autotune.tune(4096, 4096, 4096, trials=200, gpus="all")
    python -m autotune tune --shape 4096x4096x4096 --trials 200 --gpus all

`choose` turns a `gpus` value (all, a count, adapter indices) into adapter indices and
refuses GPUs that are not identical to the tuner's: identical GPUs have one fingerprint,
so one study and one cache file, whose entries are valid on each. `Pool` runs a thread
per GPU, each driving that GPU's worker (a search.Lane): a thread begins a problem no
GPU has begun (the worker's float64 reference, the baseline), else joins the begun
problem with the fewest GPUs while its study wants more trials, else waits. The last
GPU to leave a problem times its finalists again and keeps the best. What tuning a
problem is (a Job) is tune.py's; this module decides only which GPU does what.
A GPU times one candidate at a time: its thread waits for its worker's answer before
it takes the next.

A GPU whose worker cannot be restarted, or that fails a known-good config after its
candidates lost the device or crashed the worker search.LOST_AFTER times in a row, is
taken out with a line on stderr; its claims go back to the study and the other GPUs go
on. Only when every GPU is out does the tune fail (WorkerError). A failure in any
thread, or Ctrl-C, stops them all (`Pool.stopping`, the workers abandoned) before the
tune raises.

Repeating an index (`repeat=True`; TuneOptions.repeat_gpus) is a testing aid: lavapipe
is one adapter, and [0, 0] stands in for two GPUs. On a real host it would put two
timings on one GPU at once, so it is refused unless asked for.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Protocol

from .arguments import ArgumentError, is_integer, shown
from .device import (
    Fingerprint,
    Gpu,
    adapter_index,
    adapters_text,
    get_gpu,
    gpu_at,
    list_adapters,
    one_line,
)
from .problem import Problem
from .search import Lane, Search
from .worker import Worker, WorkerError

ALL = "all"
WAIT_S = 0.25  # an idle GPU looks again this often (a study's time runs out unannounced)


# --- which GPUs ---------------------------------------------------------------------------


def choose(
    value: object, gpu: Gpu | None = None, repeat: bool = False, error=ArgumentError
) -> tuple[int, ...] | None:
    """The adapter indices (in device.list_adapters()) that `value` names: "all" (every
    adapter of the tuner's backend), a count N (the tuner's adapter and the next ones of
    its backend), or indices (a list, or text such as "0,2,5"; one index: one GPU, which
    tune.py tunes on alone); None for one GPU, the tuner's own (a tune as ever). `gpu`:
    the tuner's (None: get_gpu()'s, opened only once `value` is known to be good).
    `error(field, message)` refuses a bad value, GPUs unlike the tuner's, and (unless
    `repeat`) an index given twice."""
    if value is None:
        return None
    parsed = _parsed(value, error)
    if isinstance(parsed, tuple) and not repeat and len(set(parsed)) < len(parsed):
        raise error(
            "gpus",
            f"gpus {shown(value)} names an adapter twice: that would time two candidates "
            f"on one GPU at once",
        )
    adapters = list_adapters()
    for index in parsed if isinstance(parsed, tuple) else ():
        if not 0 <= index < len(adapters):
            raise error(
                "gpus",
                f"gpus {shown(value)}: there is no adapter {index}; adapters: "
                f"{adapters_text(adapters)}",
            )
    gpu = gpu or get_gpu()
    indices = _indices(parsed, value, gpu, adapters, error)
    if indices is None:
        return None
    named = [(str(i), one_line(adapters[i].summary), Fingerprint.of(adapters[i])) for i in indices]
    refuse_mixed(named, gpu.fingerprint, value, error)
    return indices


def alone(index: int, gpu: Gpu | None) -> Gpu:
    """The Gpu of the one adapter chosen (identical to the tuner's `gpu`): `gpu` itself
    when it is that adapter, so a caller's device keeps its own limits and features."""
    gpu = gpu or get_gpu()
    return gpu if adapter_index(gpu, list_adapters()) == index else gpu_at(index)


def _parsed(value: object, error) -> str | int | tuple[int, ...]:
    """ "all", a count, or indices, from the value as given."""
    if is_integer(value) and value >= 1:
        return int(value)
    if isinstance(value, list | tuple) and value and all(is_integer(i) for i in value):
        return tuple(int(i) for i in value)
    text = value.strip().lower() if isinstance(value, str) else ""
    if text == ALL:
        return ALL
    if text.isdigit() and int(text) >= 1:
        return int(text)
    parts = [part.strip() for part in text.split(",")]
    if "," in text and all(part.isdigit() for part in parts):
        return tuple(int(part) for part in parts)
    raise error(
        "gpus",
        f"gpus must be 'all', a count >= 1 or adapter indices such as '0,2,5', got {shown(value)}",
    )


def _indices(parsed, value, gpu: Gpu, adapters, error) -> tuple[int, ...] | None:
    if isinstance(parsed, tuple):
        return parsed
    own = adapter_index(gpu, adapters)
    backend = gpu.fingerprint.backend
    same = [i for i, a in enumerate(adapters) if str(a.info["backend_type"]) == backend]
    if own is None or own not in same:
        raise error("gpus", f"gpus {shown(value)}: the tuner's adapter is not listed here")
    same = same[same.index(own) :] + same[: same.index(own)]  # the tuner's first
    count = len(same) if parsed == ALL else parsed
    if count > len(same):
        raise error(
            "gpus",
            f"gpus {shown(value)}: there are {len(same)} adapter(s) of {backend} here; "
            f"adapters: {adapters_text(adapters)}",
        )
    return None if count == 1 else tuple(same[:count])


def refuse_mixed(
    named: Sequence[tuple[str, str, Fingerprint]],
    wanted: Fingerprint,
    value: object = None,
    error=ArgumentError,
) -> None:
    """Refuse GPUs (index, name, fingerprint) whose fingerprint is not `wanted` (the
    tuner's): one study, one cache file, for one kind of GPU and driver."""
    unlike = [(index, name, fp) for index, name, fp in named if fp != wanted]
    if not unlike:
        return
    differences = "; ".join(
        f"adapter {index}: {name} (its {', '.join(_differing(fp, wanted))} differ)"
        for index, name, fp in unlike
    )
    raise error(
        "gpus",
        f"gpus {shown(value)} mixes GPUs that are not identical: the tuner's is "
        f"{wanted.device} via {wanted.backend}, {differences}; one study is for one kind "
        f"of GPU (python -m autotune devices lists them)",
    )


def _differing(fp: Fingerprint, wanted: Fingerprint) -> list[str]:
    return [f.name for f in fields(Fingerprint) if getattr(fp, f.name) != getattr(wanted, f.name)]


def lanes(indices: Sequence[int], gpu: Gpu, candidate_timeout: float, stack) -> list[Lane]:
    """A lane per index, each with a worker on that adapter (closed with `stack`),
    measuring with the features of the tuner's device; a repeated index is labelled
    "0", "0.1", "0.2"."""
    made, seen = [], {}
    for index in indices:
        seen[index] = seen.get(index, -1) + 1
        worker = Worker.for_gpu(gpu, candidate_timeout, index)
        label = str(index) if not seen[index] else f"{index}.{seen[index]}"
        made.append(Lane(stack.enter_context(worker), label))
    return made


# --- who does what ------------------------------------------------------------------------


class Job(Protocol):
    """One problem's tune as the pool runs it (tune.py's), made by the pool's `job_of(
    problem, stopping)`: its search stops when the pool's `stopping` Event is set."""

    search: Search  # made by begin

    def prepare(self, evaluator) -> None:
        """Make a GPU's evaluator ready for this problem (WorkerError: it cannot be)."""

    def begin(self, evaluator) -> None:
        """Prepare, measure the baseline and set up the search, on this evaluator."""

    def end(self, evaluator) -> object:
        """The finalists timed again on this evaluator, the best kept: the result."""


class _Run:
    """A problem of the pool: begun by one GPU, joined by others, ended by one."""

    def __init__(self, index: int, problem: Problem):
        self.index, self.problem = index, problem
        self.job: Job | None = None
        self.lanes: set[Lane] = set()  # those working on it now
        self.open = False  # begun: GPUs may join while its study wants more
        self.ending = False  # ended, or being ended: none joins
        self.orphaned = False  # to be ended by any GPU (its last one is out)
        self.warmed: set[Lane] = set()  # GPUs that prepared for it while it was begun


class Pool:
    """A thread per lane (GPU), all tuning a list of problems together."""

    def __init__(self, lanes: Sequence[Lane]):
        self.lanes = list(lanes)
        self.changed = threading.Condition()
        self.failure: BaseException | None = None
        self.stopping = threading.Event()  # set on a failure or Ctrl-C: every search stops
        self.queue: deque[tuple[int, Problem]] = deque()
        self.runs: list[_Run] = []
        self.results: dict[int, object] = {}

    def tune(
        self,
        problems: Sequence[Problem],
        job_of: Callable[[Problem, threading.Event], Job],
        on_start: Callable[[Problem, int], None] | None = None,
    ) -> list:
        """Each problem's job's result, in order. `on_start(problem, index)` as each
        is begun, one call at a time."""
        self.job_of, self.on_start = job_of, on_start
        self.queue.extend(enumerate(problems))
        self.started: set[int] = set()
        threads = [
            threading.Thread(target=self._drive, args=(lane,), name=f"gpu {lane.label}")
            for lane in self.lanes
        ]
        self.running = len(threads)
        for thread in threads:
            thread.daemon = True  # (a hard exit does not wait for a worker's answer)
            thread.start()
        try:
            self._wait()
        except BaseException:  # Ctrl-C: stop every GPU now
            self._fail(KeyboardInterrupt())
            self._wait()  # (their workers are killed: each thread's answer comes at once)
            raise
        return self._results(len(problems))

    def _wait(self) -> None:
        """Until every thread is done. (Not Thread.join: on Python 3.11 a Ctrl-C inside
        join marks the thread stopped while it still runs, so a later join returns.)"""
        with self.changed:
            while self.running:
                self.changed.wait(WAIT_S)

    def _results(self, count: int) -> list:
        if self.failure is not None:
            raise self.failure
        if len(self.results) < count:
            gone = "; ".join(f"gpu {lane.label}: {lane.out}" for lane in self.lanes)
            raise WorkerError(f"every GPU is out ({gone})")
        return [self.results[index] for index in range(count)]

    def _drive(self, lane: Lane) -> None:
        """One GPU's thread: the next step until there is none."""
        try:
            while (step := self._next(lane)) is not None:
                step[0](lane, step[1])
        except BaseException as error:  # a bug or a bad problem: the tune fails
            self._fail(error)
        finally:
            with self.changed:
                self.running -= 1
                self.changed.notify_all()

    def _fail(self, error: BaseException) -> None:
        """Stop every GPU: no search claims or records more (a job being begun too, as
        its search is made with `stopping`), and each worker is killed, not restarted
        (its thread sees it dead and gives its trial back)."""
        with self.changed:
            self.failure = self.failure or error
            self.stopping.set()
            for lane in self.lanes:
                with contextlib.suppress(OSError, AttributeError):
                    lane.evaluator.abandon()
            self.changed.notify_all()

    def _next(self, lane: Lane):
        """(what to do, the run) for this GPU, or None: it is out, the tune failed, or
        every problem is ended or being ended."""
        with self.changed:
            while True:
                if self.failure is not None or lane.out:
                    return None
                orphaned = next((run for run in self.runs if run.orphaned), None)
                if orphaned is not None:
                    orphaned.orphaned = False
                    return self._end, orphaned
                if self.queue:
                    return self._begin, self._take()
                for run in self.runs:  # being begun: prepare meanwhile (start a worker)
                    if run.job is not None and not run.open and lane not in run.warmed:
                        run.warmed.add(lane)
                        return self._warm, run
                joinable = [run for run in self.runs if self._joinable(run)]
                if joinable:
                    run = min(joinable, key=lambda run: len(run.lanes))
                    run.lanes.add(lane)
                    return self._join, run
                if all(run.ending for run in self.runs):
                    return None
                self.changed.wait(WAIT_S)

    def _take(self) -> _Run:
        index, problem = self.queue.popleft()
        run = _Run(index, problem)
        self.runs.append(run)
        if self.on_start and index not in self.started:  # (once, if begun again)
            self.started.add(index)
            self.on_start(problem, index)
        return run

    def _joinable(self, run: _Run) -> bool:
        return run.open and not run.ending and run.job.search.wants_more()

    def _live(self) -> list[Lane]:
        return [lane for lane in self.lanes if not lane.out]

    def _begin(self, lane: Lane, run: _Run) -> None:
        job = self.job_of(run.problem, self.stopping)
        with self.changed:
            run.job = job
            self.changed.notify_all()
        try:
            job.begin(lane.evaluator)
        except WorkerError as error:  # this GPU is gone: another begins the problem
            self._lose(lane, error)
            with self.changed:
                self.runs.remove(run)
                self.queue.appendleft((run.index, run.problem))
                self.changed.notify_all()
            self._announce(lane)
            return
        with self.changed:
            run.open = True
            run.lanes.add(lane)
            self.changed.notify_all()
        self._work(lane, run)

    def _warm(self, lane: Lane, run: _Run) -> None:
        """Prepare this GPU's worker for a problem another GPU is beginning."""
        try:
            run.job.prepare(lane.evaluator)
        except WorkerError as error:
            self._lose(lane, error)
            self._announce(lane)

    def _join(self, lane: Lane, run: _Run) -> None:
        try:
            run.job.prepare(lane.evaluator)
        except WorkerError as error:
            self._lose(lane, error)
        else:
            run.job.search.work(lane)
        self._leave(lane, run)

    def _work(self, lane: Lane, run: _Run) -> None:
        run.job.search.work(lane)
        self._leave(lane, run)

    def _leave(self, lane: Lane, run: _Run) -> None:
        """The last GPU out of a problem whose study wants no more ends it (any GPU does,
        where this one is out)."""
        if lane.out:
            self._announce(lane)
        with self.changed:
            run.lanes.discard(lane)
            ends = self.failure is None and not run.lanes and not run.ending
            ends = ends and not run.job.search.wants_more()
            if ends:
                run.ending = True
                run.orphaned = bool(lane.out)
            self.changed.notify_all()
        if ends and not lane.out:
            self._end(lane, run)

    def _end(self, lane: Lane, run: _Run) -> None:
        result = run.job.end(lane.evaluator)
        with self.changed:
            self.results[run.index] = result
            self.changed.notify_all()

    def _lose(self, lane: Lane, error: WorkerError) -> None:
        """This GPU is out, unless the tune is stopping (then its worker was killed)."""
        if not self.stopping.is_set():
            lane.out = str(error)

    def _announce(self, lane: Lane) -> None:
        if self.stopping.is_set() or not lane.out:  # (a Ctrl-C killed it: no GPU is lost)
            return
        with self.changed:
            live = len(self._live())
        print(
            f"autotune: gpu {lane.label} is out: {one_line(lane.out)[:300]}; "
            f"{live} of {len(self.lanes)} GPUs go on",
            file=sys.stderr,
            flush=True,
        )
