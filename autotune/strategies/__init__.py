"""Strategies: which config a search measures next.

A strategy has two verbs: `propose` (a trial of the study and the config it names) and
`observe` (what became of that proposal). The search loop (autotune.search) handles
everything else: configs that break a constraint, were measured before, or are claimed
by another process. A new strategy is one module here, added to STRATEGIES.

    strategy = make_strategy(DEFAULT_STRATEGY, seed=0)
    study = Study(name, storage, strategy.sampler, problem, templates)
    trial, config = strategy.propose(study, valid)
    strategy.observe(config, "claimed")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import optuna

from ..space import Config
from ..study import Study
from .climb import Climb
from .grid import Grid
from .sampled import Sampled

# What became of a proposal, as the search tells the strategy.
EVENTS = ("invalid", "known", "taken", "claimed")


class Strategy(Protocol):
    sampler: optuna.samplers.BaseSampler  # the study's sampler (the strategy may defer to it)

    def propose(self, study: Study, valid: Sequence[Config]) -> tuple[optuna.Trial, Config]:
        """A trial of `study` and the config it names (`valid`: every valid config)."""

    def observe(self, config: Config, event: str) -> None:
        """What became of the proposal of `config`: one of EVENTS."""


STRATEGIES = {"tpe": Sampled.tpe, "random": Sampled.random, "grid": Grid, "climb": Climb}
# The climb by default: its short tunes came closer to long ones than TPE's did
# (measured in benchmarks/NOTES.md, "The climb against TPE").
DEFAULT_STRATEGY = "climb"


def make_strategy(name: str, seed: int | None) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"sampler {name!r:.40} is unknown; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[name](seed)
