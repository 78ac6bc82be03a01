"""Test-only fault injection, planted through the worker's seam (Worker.child and the
`evaluate` that autotune.worker.serve is handed) and the cache's (DeviceCache._replace):
how the tests make a worker abort or lose its GPU device, or pause a process inside a
cache write, a candidate or a proposal so that they can kill it there. Nothing of it is in
autotune/.

AUTOTUNE_TEST_FAULTS holds a JSON object, point -> action:

    "<config>" (e.g. "faulty MODE=0")  -> "abort": the worker calls os.abort() instead
                                          "lose-device": the worker destroys its device
                                          first (as a driver reset would)
    "evaluate" (any candidate)          -> same actions as above, or "pause:<file>"
    "cache-write" (between writing the  -> "pause:<file>": write the pid to <file>, then
    temp file and replacing the cache)     sleep a minute (the test kills us meanwhile)
    "ask" (after Optuna hands out a     -> "pause:<file>", as above
    trial, before it names its process)
    "proposal" (after a trial is asked  -> "pause:<file>", as above
    and names its process, before its
    config is asked and claimed)

The worker runs `python -c "from faults import main; ..."` with this folder on
PYTHONPATH (`plant` arranges both, for this process and the processes it starts).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import optuna

from autotune import cache, worker
from autotune.evaluate import evaluate

ENV = "AUTOTUNE_TEST_FAULTS"
FOLDER = Path(__file__).resolve().parent
PAUSE_S = 60.0


def planned(*points: str) -> str | None:
    """The action planned for the first of `points` that has one (None: run normally)."""
    plan = json.loads(os.environ.get(ENV) or "{}")  # a malformed plan fails loudly
    return next((plan[p] for p in points if isinstance(plan.get(p), str)), None)


def pause(action: str | None) -> None:
    """For a "pause:<file>" action: say where we are (our pid in <file>) and wait."""
    if action and action.startswith("pause:"):
        Path(action.removeprefix("pause:")).write_text(str(os.getpid()))
        time.sleep(PAUSE_S)


def evaluate_with_faults(config, problem, gpu, **options):
    action = planned(str(config), "evaluate")
    if action == "abort":
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from a planned abort
        os.abort()
    elif action == "lose-device":
        gpu.device.destroy()
    else:
        pause(action)
    return evaluate(config, problem, gpu, **options)


def main(argv: list[str]) -> int:
    """The worker process, with the planned faults."""
    return worker.main(argv, evaluate_with_faults)


_replace = cache.DeviceCache._replace


def _replace_with_pause(self, temp) -> None:
    pause(planned("cache-write"))  # killed right here: the temp file is written, not in place
    _replace(self, temp)


_set_user_attr = optuna.Trial.set_user_attr


def _set_user_attr_with_pause(self, key, value) -> None:
    asked = key == "worker" and not self.user_attrs  # (Study.ask's first write)
    if asked:
        pause(planned("ask"))  # killed right here: a trial handed out, naming no process
    _set_user_attr(self, key, value)
    if asked:
        pause(planned("proposal"))  # killed right here: a trial asked, its config not claimed


def plant(monkeypatch=None) -> None:
    """Route workers through `main` above and cache writes through the pause: for this
    process and the ones it starts (undone with the test, given its monkeypatch)."""
    path = os.pathsep.join(filter(None, [str(FOLDER), os.environ.get("PYTHONPATH", "")]))
    if monkeypatch is None:
        os.environ["PYTHONPATH"] = path
        worker.Worker.child = "faults"
        cache.DeviceCache._replace = _replace_with_pause
        optuna.Trial.set_user_attr = _set_user_attr_with_pause
        return
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setattr(worker.Worker, "child", "faults")
    monkeypatch.setattr(cache.DeviceCache, "_replace", _replace_with_pause)
    monkeypatch.setattr(optuna.Trial, "set_user_attr", _set_user_attr_with_pause)


if __name__ == "__main__":  # python tests/faulty/faults.py tune ...: the CLI, faults planted
    from autotune.__main__ import main as cli

    plant()
    sys.exit(cli(sys.argv[1:]))
