"""Grid: every valid config in enumeration order, each once."""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from ..space import Config
from ..study import Study


class Grid:
    def __init__(self, seed: int | None = None):
        # the study's own proposals are never asked for; its sampler only fills a trial
        # with the enqueued config's values
        self.sampler = optuna.samplers.RandomSampler(seed=seed)
        self._next = 0  # every config before this one is measured or proposed
        self._proposed: set[str] = set()

    def propose(self, study: Study, valid: Sequence[Config]) -> tuple[optuna.Trial, Config]:
        history = study.history()
        while self._next < len(valid) and self._taken(valid[self._next], history):
            self._next += 1
        if self._next == len(valid):
            # Every config is measured or was proposed: one that came back taken may have
            # been given back since (its claim released), so look again from the start.
            self._next, self._proposed = 0, set()
            while self._next < len(valid) - 1 and str(valid[self._next]) in history:
                self._next += 1
        self._proposed.add(str(valid[self._next]))
        return study.ask_for(valid[self._next])  # queued configs come first (seeds, given back)

    def observe(self, config: Config, event: str) -> None:
        pass

    def _taken(self, config: Config, history) -> bool:
        text = str(config)
        return text in history or text in self._proposed
