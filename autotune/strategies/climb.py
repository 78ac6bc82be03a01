"""Climb: TPE, with every CLIMB_EVERY-th measured proposal a step from the best config
so far: one parameter moved to the next value up or down its list (SPLIT 8 -> 16, TM
8 -> 4). TPE models each parameter's good values apart from the others and samples
them, so a short tune can end one step from a long one's answer and never try that
step; the climb tries the best's steps while the budget lasts, and the new best's once
one of them is faster."""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from ..space import Config, load_space
from ..study import Study
from .sampled import Sampled, tpe_sampler

CLIMB_EVERY = 3  # one measured proposal in three is a step from the best
CLIMB_AFTER = 8  # measured proposals before the first step (TPE's start); and never
# while the study's queue (the seeds, a tune's first configs) is not yet asked


class Climb(Sampled):
    def __init__(self, seed: int | None):
        super().__init__(tpe_sampler(seed), seed)
        self.claimed = 0  # proposals measured (claimed) so far
        self.steps: dict[str, list[Config]] = {}  # a best's steps not yet measured

    def propose(self, study: Study, valid: Sequence[Config]) -> tuple[optuna.Trial, Config]:
        due = self.claimed >= CLIMB_AFTER and self.claimed % CLIMB_EVERY == 0
        step = due and not study.queued() and self._step(study.history(), valid)
        return study.ask_for(step) if step else super().propose(study, valid)

    def observe(self, config: Config, event: str) -> None:
        super().observe(config, event)
        self.claimed += event == "claimed"

    def _step(self, history: dict, valid: Sequence[Config]) -> Config | None:
        """An unmeasured step from the fastest config measured so far, or None."""
        timed = {text: s for text, s in history.items() if s is not None}
        if not timed:
            return None
        best = min(timed, key=timed.get)
        if best not in self.steps:
            found = steps_from(parse_config(best), valid)
            self.steps[best] = [found[i] for i in self.rng.permutation(len(found))]
        self.steps[best] = [c for c in self.steps[best] if str(c) not in history]
        return self.steps[best][0] if self.steps[best] else None


def parse_config(text: str) -> Config:
    """The config of its text (Config.__str__: "template NAME=VALUE ...")."""
    template, *pairs = text.split()
    return Config.make(template, {k: int(v) for k, v in (p.split("=") for p in pairs)})


def steps_from(config: Config, valid: Sequence[Config]) -> list[Config]:
    """The valid configs one step from `config`: one parameter at the next value up or
    down its space's list of values, the others the same."""
    values = load_space(config.template).params
    at = {name: values[name].index(v) for name, v in config.params if v in values[name]}
    found = []
    for other in valid:
        if other.template != config.template:
            continue
        moved = [(name, v) for name, v in other.params if v != config[name]]
        if len(moved) == 1 and moved[0][0] in at:
            name, v = moved[0]
            if abs(values[name].index(v) - at[name]) == 1:
                found.append(other)
    return found
