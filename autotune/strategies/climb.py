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
CLIMB_AFTER = 8  # configs this process measured before its first step (a best worth
# stepping from); the step comes at the first multiple of CLIMB_EVERY after them, and
# never while the study's queue (the seeds, a tune's first configs) is not yet asked.
# TPE's own startup (TPE_STARTUP) counts the study's trials, every process's and the
# pruned ones too, so the two counts are not the same.


class Climb(Sampled):
    def __init__(self, seed: int | None):
        super().__init__(tpe_sampler(seed), seed)
        self.claimed = 0  # proposals measured (claimed) so far
        self.steps: dict[str, list[Config]] = {}  # a best's steps not yet proposed
        self.stepped = False  # the last proposal was a step

    def due(self) -> bool:
        """Whether the next proposal is a step's turn (by this process's measured count)."""
        return self.claimed >= CLIMB_AFTER and self.claimed % CLIMB_EVERY == 0

    def propose(self, study: Study, valid: Sequence[Config]) -> tuple[optuna.Trial, Config]:
        step = self.due() and not study.queued() and self._step(study.history())
        self.stepped = bool(step)
        return study.ask_for(step) if step else super().propose(study, valid)

    def observe(self, config: Config, event: str) -> None:
        # A step that gave nothing to measure is the climb's, not the sampler's: it
        # does not count toward the sampler's idle asks (nor its repeats).
        if not self.stepped or event == "claimed":
            super().observe(config, event)
        self.claimed += event == "claimed"

    def _step(self, history: dict) -> Config | None:
        """A step from the fastest config measured so far, neither measured nor proposed
        before, or None. Steps are not checked here: an invalid one is pruned by the
        search (at no cost to the budget), which then asks again."""
        timed = {text: s for text, s in history.items() if s is not None}
        if not timed:
            return None
        best = min(timed, key=timed.get)
        if best not in self.steps:
            try:  # a shared study may hold a foreign trial's text: no steps from it
                found = steps_from(Config.parse(best))
            except (ValueError, KeyError):
                found = []
            self.steps[best] = [found[i] for i in self.rng.permutation(len(found))]
        pending = self.steps[best]
        while pending and str(pending[0]) in history:
            pending.pop(0)
        return pending.pop(0) if pending else None


def steps_from(config: Config) -> list[Config]:
    """The configs one step from `config`, valid or not: one parameter at the next value
    up or down its space's list of values, the others the same."""
    lists = load_space(config.template).params
    params = config.as_dict()
    found = []
    for name, value in params.items():
        values = lists[name]
        at = values.index(value)
        for moved in (at - 1, at + 1):
            if 0 <= moved < len(values):
                found.append(Config.make(config.template, params | {name: values[moved]}))
    return found
