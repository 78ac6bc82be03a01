"""Evaluate: one config on one problem becomes an Outcome (a time, or why not).

`evaluate` renders, compiles, verifies against float64 and, only if correct, times one
config; `retime` times a search's finalists again, back to back. Both run where the GPU
is: in the tuner's worker process (autotune.worker) by default.

How a search has its configs evaluated is the `Evaluator` protocol: the `Worker` is the
default, `Replay` answers from a recorded table (tests and search studies without a
GPU), and another timing backend is one more class with these three verbs.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from .compile import CompileError, compile_shader
from .device import Gpu, one_line
from .measure import Measurement, TooSlow, measure, time_back_to_back
from .problem import Problem
from .render import render
from .space import Config
from .verify import Reference, verify

REASONS = ("compile", "limits", "wrong", "timeout", "crashed", "device-lost")
FAILURE_CHARS = 300  # a failure's one line: enough for wgpu's message, short for a table
# wgpu's framing around the message of an error: its heading, the cause chain's labels,
# the call it came from, and the source excerpt drawn under a shader error.
_FRAMING = re.compile(r"(?:.*: )?Validation Error$|Caused by:$|In wgpu[A-Za-z]+\b|\d*\s*[│┌└├─^|=]")


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

    @property
    def failure(self) -> str:
        """Why it failed, in one line a person scans (a dashboard's table): the message of
        `detail` without wgpu's framing, cut to FAILURE_CHARS; "" when it worked."""
        if self.ok:
            return ""
        lines = [one_line(line) for line in self.detail.splitlines()]
        kept = [line for line in lines if line and not _FRAMING.match(line)]
        text = ": ".join(kept) or one_line(self.detail) or self.reason
        return text if len(text) <= FAILURE_CHARS else text[: FAILURE_CHARS - 3] + "..."


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
        compiled = compiling.result() if compiling is not None else None
        compiled = compiled or compile_shader(render(config, problem), gpu, checks=checks)
    except CompileError as error:
        return Outcome(config, reason=error.reason, detail=str(error)[:500])
    reference = reference or Reference(problem, seed)
    failed = {"compile_s": compiled.seconds}
    try:
        verdict = verify(compiled, gpu, reference=reference)
        if not verdict.ok:
            return Outcome(
                config, reason="wrong", detail=verdict.reason, error=verdict.error, **failed
            )
        operands = (reference.A, reference.B)
        measurement = measure(compiled, gpu, max_dispatch_s=max_dispatch_s, operands=operands)
    except TooSlow as error:
        return Outcome(config, reason="timeout", detail=str(error), **failed)
    except Exception as error:  # a driver or wgpu error while running: this trial only
        detail = f"{type(error).__name__}: {error}"[:500]
        return Outcome(config, reason="crashed", detail=detail, **failed)
    return Outcome(config, measurement, error=verdict.error, compile_s=compiled.seconds)


def retime(
    configs: Sequence[Config], problem: Problem, gpu: Gpu, checks: bool, reference: Reference
) -> Outcome | None:
    """Time the search's finalists again, back to back, and return the fastest.

    Each candidate of the search was timed once, after host-side work (compile,
    verification) that lets the GPU's clocks drop; on the H200 a config sometimes
    measured at half its speed. Here the finalists are compiled and verified first, then
    timed back to back (measure.time_back_to_back).
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
    kernels = [compiled for _, compiled, _ in ready]
    times = time_back_to_back(kernels, gpu, operands=(reference.A, reference.B))
    timed = zip(ready, times, strict=True)  # no kernel dropped (no drop_slower): no None
    (config, compiled, error), fastest = min(timed, key=lambda item: item[1].median_s)
    return Outcome(config, fastest, error=error, compile_s=compiled.seconds)


def reference_seed(seed: int | None) -> int:
    """The seed of the verification data: given, or random (kept across worker restarts)."""
    return seed if seed is not None else secrets.randbits(32)


class Evaluator(Protocol):
    """How a search has its configs measured; it never knows how they are timed."""

    def evaluate(self, config: Config, *, max_dispatch_s: float | None = None) -> Outcome:
        """Measure one config (render, compile, verify, time): an Outcome, always."""

    def compile_ahead(self, config: Config) -> None:
        """A hint: `config` is evaluated soon (an evaluator may start compiling it)."""

    def retime(self, configs: Sequence[Config]) -> Outcome | None:
        """The fastest of `configs`, timed again back to back (None: keep the search's)."""


class Replay:
    """An Evaluator that answers from a recording: a table of config text -> Outcome, or
    a function of the config. Tests and search studies replay a search with it."""

    def __init__(self, outcomes: Mapping[str, Outcome] | Callable[[Config], Outcome]):
        self._outcomes = outcomes
        self.evaluated: list[Config] = []  # in order, as the search asked

    def evaluate(self, config: Config, *, max_dispatch_s: float | None = None) -> Outcome:
        self.evaluated.append(config)
        if callable(self._outcomes):
            return self._outcomes(config)
        return self._outcomes.get(
            str(config), Outcome(config, reason="crashed", detail="not recorded")
        )

    def compile_ahead(self, config: Config) -> None:
        pass

    def retime(self, configs: Sequence[Config]) -> Outcome | None:
        """The recording's fastest of `configs` (its times do not change when asked again)."""
        outcomes = [o for o in map(self._recorded, configs) if o.ok]
        return min(outcomes, key=lambda o: o.measurement.median_s, default=None)

    def _recorded(self, config: Config) -> Outcome:
        if callable(self._outcomes):
            return self._outcomes(config)
        return self._outcomes.get(str(config), Outcome(config, reason="crashed"))
