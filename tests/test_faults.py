"""Faults during tuning cost one trial each: a hang, a crashed worker, a lost device.

The faults are real: the test-only `faulty` template (tests/faulty) hangs the GPU with
MODE=6 (65535 x 65535 workgroups), and the test-only hooks of tests/faulty/faults.py
(planted through the worker's seam) make the worker process abort (SIGABRT) or destroy
its own device before a candidate.
"""

import json
import os
import time
from pathlib import Path

import optuna
import pytest
from faulty import faults

import autotune
from autotune.lookup import forget
from autotune.problem import Problem
from autotune.search import search
from autotune.space import Config
from autotune.worker import Worker, WorkerError

PROBLEM = Problem(20, 20, 16)  # M not a multiple of the 8x8 tile: MODE 7 writes past C


def faulty(mode: int) -> Config:
    return Config.make("faulty", {"MODE": mode})


# what a worker process runs: autotune's own, or the one with faults planted
WORKER_ENTRIES = (b"from autotune.worker import main", b"from faults import main")


def workers_of_this_process() -> list[int]:
    """Live worker processes started by this test process (Linux /proc)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        is_worker = any(entry in command for entry in WORKER_ENTRIES)
        if int(status[1]) == os.getpid() and status[0] != "Z" and is_worker:
            found.append(int(pid))
    return found


@pytest.fixture
def planned_faults(monkeypatch):
    """Plan worker faults by config (see tests/faulty/faults.py)."""
    faults.plant(monkeypatch)

    def plan(**by_config):
        monkeypatch.setenv(faults.ENV, json.dumps(by_config))

    return plan


@pytest.mark.slow
def test_hang_crash_and_lost_device_each_cost_one_trial(
    gpu, faulty_templates, planned_faults, tmp_path
):
    planned_faults(**{"faulty MODE=11": "abort", "faulty MODE=12": "lose-device"})
    url = f"sqlite:///{tmp_path / 'study.db'}"
    started = time.monotonic()
    with Worker(gpu.fingerprint.as_dict(), candidate_timeout=5.0) as worker:
        worker.prepare(PROBLEM, 1, True)
        result = search(PROBLEM, gpu, templates=["faulty"], trials=13, sampler="grid",
                        storage=url, max_dispatch_s=0.01, evaluator=worker)  # fmt: skip
    assert result.measured == 13 and result.best.config == faulty(0)
    study = optuna.load_study(study_name=result.study_name, storage=url)
    trials = {t.user_attrs["params"]["MODE"]: t for t in study.trials if "reason" in t.user_attrs}
    reasons = {mode: trial.user_attrs["reason"] for mode, trial in trials.items()}
    assert reasons == {
        0: "ok",
        1: "compile",
        2: "wrong",
        3: "wrong",
        4: "timeout",  # too slow: cut by max_dispatch_s
        5: "compile",
        6: "timeout",  # no answer: the worker was killed
        7: "wrong",
        8: "wrong",
        9: "wrong",
        10: "wrong",
        11: "crashed",
        12: "device-lost",
    }
    assert "SIGABRT" in trials[11].user_attrs["detail"]
    assert "lost" in trials[12].user_attrs["detail"]
    failed = [t for mode, t in trials.items() if mode != 0]
    assert all(t.state == optuna.trial.TrialState.FAIL for t in failed)
    hang = trials[6]
    assert (hang.datetime_complete - hang.datetime_start).total_seconds() < 5.0 + 5.0
    assert time.monotonic() - started < 60
    assert workers_of_this_process() == []  # the search stopped its worker
    # The study never proposes a failed config again: a second run measures nothing.
    again = search(PROBLEM, gpu, templates=["faulty"], trials=30, sampler="tpe", storage=url)
    assert again.measured == 0 and again.best.config == faulty(0)


@pytest.mark.slow
def test_faulty_candidates_never_reach_the_cache(gpu, faulty_templates, planned_faults, cache_dir):
    planned_faults(**{"faulty MODE=11": "abort", "faulty MODE=12": "lose-device"})
    result = autotune.tune(
        *(PROBLEM.M, PROBLEM.N, PROBLEM.K),
        templates=["faulty"],
        trials=13,
        sampler="grid",
        cache_dir=cache_dir,
        candidate_timeout=5.0,
    )
    assert result.entry.config == faulty(0)
    assert result.search.failures["timeout"] >= 1  # MODE 6 at least (4 may pass here)
    assert result.search.failures["wrong"] >= 6  # MODEs 2, 3, 7, 8, 9, 10 (and maybe 4)
    assert {"crashed", "device-lost", "compile"} <= set(result.search.failures)
    stored = json.loads(result.cache_path.read_text())["entries"]
    assert [e["params"] for e in stored.values()] == [{"MODE": 0}]
    kernel = autotune.lookup(*(PROBLEM.M, PROBLEM.N, PROBLEM.K), cache_dir=cache_dir)
    assert kernel.source == "exact" and kernel.config == faulty(0)


@pytest.mark.slow
def test_worker_restarts_after_each_fault_and_keeps_working(gpu, faulty_templates, planned_faults):
    planned_faults(**{"faulty MODE=11": "abort", "faulty MODE=12": "lose-device"})
    with Worker(gpu.fingerprint.as_dict()) as worker:
        worker.prepare(PROBLEM, 1, True)
        first = worker.pid
        assert workers_of_this_process() == [first]  # (the check below can see a worker)
        for mode, reason in ((6, "timeout"), (11, "crashed"), (12, "device-lost")):
            worker.candidate_timeout = 2.0
            assert worker.evaluate(faulty(mode)).reason == reason
            assert worker.process is None  # gone: stopped or died, never left spinning
            worker.candidate_timeout = 30.0
            outcome = worker.evaluate(faulty(0))
            assert outcome.ok, outcome.detail
        assert worker.starts == 4 and worker.pid != first
    assert workers_of_this_process() == []


def test_worker_on_another_adapter_is_refused(gpu):
    """The worker opens the tuner's adapter by its fingerprint: one not on this machine
    is refused by name."""
    other = dict(gpu.fingerprint.as_dict(), device="Some Other GPU")
    with (
        Worker(other) as worker,
        pytest.raises(WorkerError, match="no adapter here is 'Some Other"),
    ):
        worker.prepare(PROBLEM, 1, True)


def test_nearest_and_exported_kernels_are_verified_at_their_shape(gpu, faulty_templates, tmp_path):
    """A cached kernel of another shape is verified at the new shape before lookup hands
    it out, and export verifies before writing: a wrong one goes no further."""
    from autotune import cache
    from autotune.device import versions
    from autotune.kernel import Kernel

    store = cache.DeviceCache(tmp_path / "cache", gpu.fingerprint.as_dict(), versions())

    def cached(mode, problem):
        config = faulty(mode)
        store.put(
            cache.Entry(
                cache.Key.of(problem, config, True), config.as_dict(), 1e-6, 1e-6, 1e-6,
                "wall", 1.0, 0.0,
            )
        )  # fmt: skip

    cached(2, Problem(24, 20, 16))  # wrong (drops the last k), and the nearest shape
    kernel = autotune.lookup(28, 20, 16, cache_dir=tmp_path / "cache", estimate=False)
    assert kernel.source == "predicted" and kernel.config.template != "faulty"
    cached(0, Problem(24, 24, 16))  # correct, one step further away
    forget()  # (a new process would not remember the lookup above)
    kernel = autotune.lookup(28, 20, 16, cache_dir=tmp_path / "cache", estimate=False)
    assert kernel.source == "predicted" and kernel.config == faulty(0)  # ranked first
    wrong = Kernel(Problem(28, 20, 16), faulty(2), "exact", gpu=gpu)
    with pytest.raises(autotune.ExportError, match="is wrong at"):
        autotune.export(wrong, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_worker_that_cannot_start_is_an_error_not_a_trial(gpu):
    # the worker opens the tuner's adapter by its fingerprint: here one on no machine
    nowhere = dict(gpu.fingerprint.as_dict(), device="no-such-gpu-anywhere")
    with Worker(nowhere) as worker:
        with pytest.raises(WorkerError, match="could not prepare.*no-such-gpu-anywhere"):
            worker.prepare(PROBLEM, 1, True)
        assert worker.process is None
