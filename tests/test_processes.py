"""Real `tune` processes: killed at several points, and two writing one cache at once.

Killing `tune` (SIGINT or SIGKILL) between trials, inside a cache write, as Optuna hands
it a trial (before the trial names the process), between asking for a trial and claiming
its config, or while its worker runs a candidate leaves a valid cache holding every
finished result, stops the worker, and a second run on the same storage resumes the
study to its budget, measuring first what the killed run had claimed or was asked.
"""

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
import pytest
from faulty import faults
from trials import enqueued_config

import autotune
from autotune import cache
from autotune.device import versions
from autotune.problem import Problem
from autotune.search import study_name
from autotune.space import load_space
from autotune.study import Study

pytestmark = pytest.mark.slow

TRIALS = 6


def tune_command(tmp_path, shape, *extra):
    """`python -m autotune tune ...`, run as faults.py (the CLI with faults planted)."""
    return [
        sys.executable, faults.__file__, "tune", "--shape", shape, "--template", "naive",
        "--cache", str(tmp_path / "cache"), *extra,
    ]  # fmt: skip


def trials_in(url, name, state):
    """The study's trials in `state` (none before the study is made)."""
    try:
        study = optuna.load_study(study_name=name, storage=url)
    except KeyError:
        return []
    return study.get_trials(deepcopy=False, states=(state,))


def finished_trials(url, name):
    complete = trials_in(url, name, optuna.trial.TrialState.COMPLETE)
    return [t for t in complete if "measurement" in t.user_attrs]  # measured, not repeats


def running_claims(url, name):
    """The configs claimed by trials still RUNNING (of a killed process: interrupted),
    and those of enqueued trials it had asked but not yet claimed."""
    running = trials_in(url, name, optuna.trial.TrialState.RUNNING)
    return {t.user_attrs.get("config") or enqueued_config(t) for t in running} - {None}


def device_cache(gpu, tmp_path):
    return cache.DeviceCache(tmp_path / "cache", gpu.fingerprint.as_dict(), versions())


def valid_entries(store):
    """The cache's entries, failing on any warning (a corrupt file would give one)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return store.entries()


def wait_for(predicate, seconds=120):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
@pytest.mark.parametrize(
    "point",
    ["between trials", "in a cache write", "in a candidate", "in an ask", "in a proposal"],
)
def test_killed_tune_loses_nothing_and_resumes(gpu, tmp_path, how, point):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    problem = Problem(32, 32, 32)
    name = study_name(problem, ["naive"], True, gpu)
    store = device_cache(gpu, tmp_path)
    # An entry of another shape, written before: a killed write must not lose it.
    earlier = Problem(16, 16, 16)
    config = load_space("naive").seed_configs(earlier)[0]
    store.put(
        cache.Entry(
            cache.Key.of(earlier, config, True), config.as_dict(), 1e-3, 1e-3, 1e-3,
            "wall", earlier.flops / 1e-3 / 1e9, 0.0,
        )
    )  # fmt: skip
    marker = tmp_path / "paused"
    env = dict(os.environ)
    if point == "in a cache write":
        env[faults.ENV] = json.dumps({"cache-write": f"pause:{marker}"})
    elif point == "in a candidate":
        env[faults.ENV] = json.dumps({"evaluate": f"pause:{marker}"})
    elif point == "in an ask":  # the first seed handed out by Optuna, no process named yet
        env[faults.ENV] = json.dumps({"ask": f"pause:{marker}"})
    elif point == "in a proposal":  # asked, not claimed: no place in the budget, no seed lost
        env[faults.ENV] = json.dumps({"proposal": f"pause:{marker}"})
    command = tune_command(tmp_path, "32x32x32", "--trials", str(TRIALS), "--storage", url)
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        # SIGINT as a terminal would send it, even where pytest itself was started in the
        # background of a script (which leaves SIGINT ignored, and children inherit that).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    if point == "between trials":
        wait_for(lambda: len(finished_trials(url, name)) >= 3)
    else:
        wait_for(marker.exists)
        time.sleep(0.2)  # the pid is written just before the pause
    os.kill(process.pid, how)
    assert process.wait(30) == (-signal.SIGKILL if how == signal.SIGKILL else 130)
    if point == "in a candidate":  # the worker does not outlive the tuner
        worker = int(marker.read_text())
        wait_for(lambda: not alive(worker), seconds=10)
    interrupted = running_claims(url, name)
    if point in ("in an ask", "in a proposal"):  # the next process to open it queues the seed
        Study(name, url, None, problem, ["naive"])
        waiting = trials_in(url, name, optuna.trial.TrialState.WAITING)
        assert interrupted and interrupted <= {enqueued_config(t) for t in waiting}
    # The cache is valid, keeps the earlier entry and holds the best finished result.
    entries = valid_entries(store)
    assert store.best(earlier, True) is not None
    finished = finished_trials(url, name)
    if finished:
        best = store.best(problem, True)
        assert best is not None and best.median_s <= min(t.value for t in finished)
    if point == "in a cache write" and how == signal.SIGKILL:
        assert list((tmp_path / "cache").glob("*.tmp"))  # the write really was cut short
    # A second run on the same storage resumes and finishes the study.
    measured_before = {t.number for t in finished}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(finished_trials(url, name)) == TRIALS
    # What the killed run had claimed (measuring, or compiled ahead) is measured now, and
    # first: a resume with a small budget redoes the interrupted work before anything new.
    resumed = [t for t in finished_trials(url, name) if t.number not in measured_before]
    resumed.sort(key=lambda t: t.datetime_start)
    assert {t.user_attrs["config"] for t in resumed[: len(interrupted)]} == interrupted
    if point in ("in a cache write", "in an ask", "in a proposal"):  # a new best; a seed
        assert interrupted
    entries = valid_entries(store)
    assert len(entries) == 2 and not list((tmp_path / "cache").glob("*.tmp"))
    kernel = autotune.lookup(32, 32, 32, cache_dir=tmp_path / "cache")
    assert kernel.source == "exact"


def test_two_tune_processes_writing_one_cache_lose_no_entry(gpu, tmp_path):
    shapes = ["24x24x24", "40x24x24", "24x40x24"]
    processes = [
        subprocess.Popen(
            tune_command(tmp_path, shape, "--trials", "4", "--seed", "1"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for shape in shapes
    ]
    for process in processes:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    entries = valid_entries(device_cache(gpu, tmp_path))
    assert sorted(e.key.problem.shape for e in entries.values()) == sorted(shapes)
