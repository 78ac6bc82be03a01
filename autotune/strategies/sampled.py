"""Sampled: Optuna's samplers (TPE, random) propose; the strategy steps in when they
stall. A sampler that keeps proposing invalid points gets a random unmeasured config
instead; one that proposes a measured config (TPE does, once it converges) gets an
unmeasured neighbour of it, a config differing in one parameter."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import optuna

from ..space import Config
from ..study import Study

MAX_IDLE_ASKS = 50  # invalid or taken proposals in a row before we pick a config ourselves
TPE_STARTUP = 8  # TPE's random proposals before its model takes over


class Sampled:
    def __init__(self, sampler: optuna.samplers.BaseSampler, seed: int | None):
        self.sampler = sampler
        self.rng = np.random.default_rng(seed)
        self.idle = 0  # proposals in a row that gave nothing to measure
        self.repeat: Config | None = None  # the last proposal, when it was measured before

    @classmethod
    def tpe(cls, seed: int | None) -> Sampled:
        return cls(tpe_sampler(seed), seed)

    @classmethod
    def random(cls, seed: int | None) -> Sampled:
        return cls(optuna.samplers.RandomSampler(seed=seed), seed)

    def propose(self, study: Study, valid: Sequence[Config]) -> tuple[optuna.Trial, Config]:
        history, repeat, self.repeat = study.history(), self.repeat, None
        neighbour = repeat and self._unmeasured_neighbour(repeat, valid, history)
        if self.idle >= MAX_IDLE_ASKS or (repeat and not neighbour):
            self.idle = 0
            unmeasured = [c for c in valid if str(c) not in history]
            if unmeasured:
                return study.ask_for(unmeasured[self.rng.integers(len(unmeasured))])
        if neighbour:
            return study.ask_for(neighbour)
        return study.ask()

    def observe(self, config: Config, event: str) -> None:
        self.idle = 0 if event == "claimed" else self.idle + (event in ("invalid", "taken"))
        self.repeat = config if event == "known" else None

    def _unmeasured_neighbour(self, config: Config, valid, history) -> Config | None:
        """A random unmeasured valid config that differs from `config` in one parameter."""
        params = config.as_dict()
        near = [
            c
            for c in valid
            if c.template == config.template
            and str(c) not in history
            and sum(v != params[k] for k, v in c.params) == 1
        ]
        return near[self.rng.integers(len(near))] if near else None


def tpe_sampler(seed: int | None) -> optuna.samplers.TPESampler:
    # multivariate + group model the parameters jointly per template; constant_liar
    # keeps processes sharing a study from proposing the same point at once.
    with warnings.catch_warnings():  # group and constant_liar are "experimental"
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, constant_liar=True,
            n_startup_trials=TPE_STARTUP,
        )  # fmt: skip
