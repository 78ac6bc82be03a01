"""Test-only fault injection: how the tests make a worker abort or lose its GPU device,
or pause a process inside a cache write or a candidate so that they can kill it there.

Production never sets AUTOTUNE_TEST_FAULTS, and with it unset every hook here does
nothing. Its value is a JSON object, point -> action:

    "<config>" (e.g. "faulty MODE=0")  -> "abort": the worker calls os.abort() instead
                                          "lose-device": the worker destroys its device
                                          first (as a driver reset would)
    "evaluate" (any candidate)          -> same actions as above, or "pause:<file>"
    "cache-write" (between writing the  -> "pause:<file>": write the pid to <file>, then
    temp file and replacing the cache)     sleep a minute (the test kills us meanwhile)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENV = "AUTOTUNE_TEST_FAULTS"
PAUSE_S = 60.0


def planned(*points: str) -> str | None:
    """The action planned for the first of `points` that has one (None: run normally)."""
    text = os.environ.get(ENV)
    if not text:
        return None
    plan = json.loads(text)  # a malformed plan is a broken test: fail loudly
    for point in points:
        action = plan.get(point)
        if isinstance(action, str):
            return action
    return None


def pause(action: str | None) -> None:
    """For a "pause:<file>" action: say where we are (our pid in <file>) and wait."""
    if action and action.startswith("pause:"):
        Path(action.removeprefix("pause:")).write_text(str(os.getpid()))
        time.sleep(PAUSE_S)
