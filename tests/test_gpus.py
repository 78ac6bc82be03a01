"""Choosing adapters, and several GPUs tuning one study (autotune/gpus.py).

lavapipe is one Vulkan adapter: the runs of two GPUs here are lavapipe twice ([0, 0],
allowed only with repeat_gpus, a testing aid: on a real host it would put two timings
on one GPU). What is checked comes from the runs' own records (the study, the cache, the
start and end time of every candidate on each GPU), not from how the pool is written.
"""

import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace

import optuna
import pytest
from faulty import faults
from rich.console import Console
from test_faults import workers_of_this_process

import autotune
from autotune import device, gpus
from autotune.__main__ import _TuneDisplay, main
from autotune.compile import compile_shader
from autotune.device import AdapterChoice, AdapterError
from autotune.evaluate import Outcome, Replay
from autotune.measure import Measurement
from autotune.problem import Problem
from autotune.render import render
from autotune.search import LOST_AFTER, Lane, Search
from autotune.space import load_space
from autotune.tune import TuneError, TuneOptions
from autotune.verify import verify
from autotune.worker import Worker, WorkerError

TUNE = sys.modules["autotune.tune"]  # (autotune.tune is the function)

PROBLEM = Problem(64, 64, 64)
TWO = dict(gpus=[0, 0], repeat_gpus=True, templates=["tiled"], seed=1)


# --- choosing an adapter ------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, choice",
    [
        (None, AdapterChoice()),
        ("", AdapterChoice()),
        ("1", AdapterChoice(index=1)),
        (0, AdapterChoice(index=0)),
        (" NVIDIA ", AdapterChoice("nvidia")),
        ("nvidia:1", AdapterChoice("nvidia", 1)),
        ("vulkan:0", AdapterChoice("vulkan", 0)),
    ],
)
def test_adapter_choice_is_an_index_a_word_or_both(value, choice):
    assert AdapterChoice.parse(value) == choice
    assert AdapterChoice.parse(str(choice)) == choice  # (as it is shown in messages)


@pytest.mark.parametrize(
    "value", ["a:b", ":1", "nvidia:", "a:b:1", "-1:", "1:2", -1, True, 1.5, []]
)
def test_bad_adapter_choice_names_the_field(value):
    with pytest.raises(AdapterError, match="^adapter must be an index") as raised:
        AdapterChoice.parse(value)
    assert raised.value.field == "adapter" and isinstance(raised.value, ValueError)


def test_adapter_by_index_and_word_index(gpu):
    adapters = device.list_adapters()
    first = device.gpu_at(0)
    assert first.index == 0 and first.fingerprint == device.Fingerprint.of(adapters[0])
    assert device.gpu_at("llvmpipe:0") is first  # one Gpu per adapter
    word = gpu.fingerprint.backend.lower()
    same = [i for i, a in enumerate(adapters) if device.AdapterChoice(word).matches(a)]
    for position, index in enumerate(same):  # the n-th of those matching, found untouched
        assert device.choose_adapter(AdapterChoice(word, position))[1] == index
    for bad, why in [(len(adapters), "out of range"), ("no-such-gpu:0", "matches no adapter")]:
        with pytest.raises(AdapterError, match=why) as raised:
            device.gpu_at(bad)
        assert raised.value.field == "adapter" and "0: llvmpipe" in str(raised.value)


def test_bad_adapter_in_the_environment_names_the_variable(gpu, monkeypatch):
    monkeypatch.setenv(device.ADAPTER_ENV, "llvmpipe:99")
    with pytest.raises(AdapterError, match="AUTOTUNE_ADAPTER 'llvmpipe:99' is out of range"):
        device.get_gpu()


def test_worker_opens_the_adapter_of_its_index(gpu):
    fingerprint = gpu.fingerprint.as_dict()
    with Worker(fingerprint, index=0) as worker:
        worker.prepare(PROBLEM, 1, True)  # the fingerprint at index 0 is the tuner's
    missing = len(device.list_adapters())
    with Worker(fingerprint, index=missing) as worker:
        with pytest.raises(WorkerError, match=f"adapter {missing} here is not"):
            worker.prepare(PROBLEM, 1, True)


def test_cli_refuses_bad_adapters_and_gpus_by_name(gpu, capsys, monkeypatch):
    for argv, said in [
        (["devices", "--adapter", "99"], "argument --adapter: adapter '99' is out of range"),
        (["lookup", "--shape", "8x8x8", "--adapter", "a:b"], "argument --adapter: adapter must"),
        (["tune", "--shape", "8x8x8", "--gpus", "x"], "argument --gpus: gpus must be"),
        (["tune", "--shape", "8x8x8", "--gpus", "0,0"], "argument --gpus: gpus '0,0' names"),
        (["tune", "--shape", "8x8x8", "--gpus", "99"], "argument --gpus: gpus '99': there are"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"autotune: error: {said}") and err.count("\n") == 1, err
    monkeypatch.setenv(device.ADAPTER_ENV, "no-such-gpu:1")
    assert main(["devices"]) == 2
    assert capsys.readouterr().err.startswith("autotune: error: AUTOTUNE_ADAPTER 'no-such-gpu:1'")


def test_devices_lists_adapters_by_index_and_marks_the_chosen(gpu, capsys):
    assert main(["devices", "--adapter", "0"]) == 0
    out = capsys.readouterr().out
    assert "* 0: llvmpipe" in out
    assert main(["lookup", "--shape", "8x8x8", "--adapter", "0", "--no-estimate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["device"] == device.gpu_at(0).summary


# --- choosing GPUs ------------------------------------------------------------------------


def test_gpus_all_a_count_or_indices(gpu):
    vulkan = sum(a.info["backend_type"] == gpu.fingerprint.backend for a in device.list_adapters())
    assert vulkan == 1  # lavapipe: one adapter of its backend, so one GPU ...
    for one in (None, 1, "1", "all", " ALL "):
        assert gpus.choose(one, gpu) is None  # ... and a tune as ever
    assert gpus.choose([0, 0], gpu, repeat=True) == (0, 0)
    assert gpus.choose("0, 0", gpu, repeat=True) == (0, 0)
    for bad, why in [
        ([0, 0], "names an adapter twice"),
        (2, "there are 1 adapter"),
        ([99, 0], "there is no adapter 99"),
        (0, "gpus must be"),
        (True, "gpus must be"),
        ("0,x", "gpus must be"),
        ([], "gpus must be"),
    ]:
        with pytest.raises(TuneError, match=why) as raised:
            gpus.choose(bad, gpu, error=TuneError)
        assert raised.value.field == "gpus"
    with pytest.raises(TuneError, match=r"gpus \[0, 0\] starts .* not with an evaluator"):
        TuneOptions.checked(**TWO, evaluator=lambda problem: None)


def test_gpus_of_one_gpu_tune_as_ever(gpu, cache_dir, capsys, monkeypatch):
    """--gpus all on a host of one GPU, or gpus=[i]: one worker, on that adapter; the
    display of a tune without --gpus (one shape at a time)."""
    one = TuneOptions.checked(gpus=[0])
    assert one.gpus is None and device.adapter_index(one.gpu, device.list_adapters()) == 0
    shown, start = [], _TuneDisplay.start
    monkeypatch.setattr(
        _TuneDisplay, "start", lambda self, *a: (shown.append(self.sequential), start(self, *a))
    )
    for value in ("all", "1"):
        argv = ["tune", "--shape", "8x8x8", "--template", "tiled", "--trials", "1"]
        assert main([*argv, "--cache", str(cache_dir), "--gpus", value]) == 0
        assert "gpu 0" not in capsys.readouterr().out
    assert shown == [True] * 2


def test_gpus_unlike_the_tuners_are_refused_by_name(gpu):
    fingerprint = gpu.fingerprint
    other = replace(fingerprint, device="Another GPU", device_id=7)
    named = [("0", gpu.summary, fingerprint), ("3", "Another GPU (DiscreteGPU)", other)]
    with pytest.raises(TuneError, match="mixes GPUs that are not identical") as raised:
        gpus.refuse_mixed(named, fingerprint, "0,3", TuneError)
    message = str(raised.value)
    assert "adapter 3: Another GPU" in message and "device, device_id differ" in message
    assert "adapter 0" not in message and raised.value.field == "gpus"
    gpus.refuse_mixed(named[:1] * 2, fingerprint)  # identical ones pass


def test_cli_refuses_a_study_over_two_backends(gpu, capsys):
    """lavapipe is listed by Vulkan and by OpenGL: another fingerprint of this machine."""
    adapters = device.list_adapters()
    other = [i for i, a in enumerate(adapters) if device.Fingerprint.of(a) != gpu.fingerprint]
    if not other:
        pytest.skip("one adapter only: tests/test_gpus.py checks the refusal without it")
    argv = ["tune", "--shape", "8x8x8", "--adapter", "0", "--gpus", f"0,{other[0]}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "argument --gpus: gpus" in err and f"adapter {other[0]}:" in err, err


# --- several GPUs, one study ----------------------------------------------------------------


def per_gpu(events) -> dict[str, int]:
    """How many candidates each GPU measured."""
    labels = [event["gpu"] for event in events]
    return {label: labels.count(label) for label in dict.fromkeys(labels)}


def test_lanes_are_one_worker_per_adapter_index(gpu):
    """Each lane its own worker on its adapter; a repeated index (asked for only with
    repeat_gpus: gpus.choose refuses it otherwise) is labelled apart."""
    with contextlib.ExitStack() as stack:
        made = gpus.lanes((0, 2, 0), gpu, 5.0, stack)
        assert [lane.label for lane in made] == ["0", "2", "0.1"]
        assert [lane.evaluator.index for lane in made] == [0, 2, 0]
        assert len({id(lane.evaluator) for lane in made}) == 3
        assert all(lane.evaluator.process is None for lane in made)  # started when used
    with pytest.raises(TuneError, match="names an adapter twice"):
        gpus.choose([0, 0], gpu, error=TuneError)


def verified(problem, config, gpu) -> bool:
    return verify(compile_shader(render(config, problem), gpu), gpu).ok


@pytest.mark.slow
def test_two_gpus_share_one_study_and_lose_nothing(gpu, cache_dir, tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    events = []
    result = autotune.tune(
        *(PROBLEM.M, PROBLEM.N, PROBLEM.K), trials=8, storage=url, cache_dir=cache_dir,
        on_trial=events.append, **TWO,
    )  # fmt: skip
    counts = per_gpu(events)
    assert sorted(counts) == ["0", "0.1"] and sum(counts.values()) == 8
    assert {e["evaluator"].index for e in events} == {0}  # lavapipe twice (repeat_gpus)
    assert result.search.measured == result.search.study_trials == 8
    study = optuna.load_study(study_name=result.search.study_name, storage=url)
    measured = [t for t in study.trials if "reason" in t.user_attrs]
    assert len(measured) == 8 and len({t.user_attrs["config"] for t in measured}) == 8
    assert {t.user_attrs["gpu"] for t in measured} == {"0", "0.1"}  # who measured what
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in study.trials)
    stored = json.loads(result.cache_path.read_text())["entries"]
    assert [e["params"] for e in stored.values()] == [result.entry.config.as_dict()]
    assert verified(PROBLEM, result.entry.config, gpu)
    kernel = autotune.lookup(*(PROBLEM.M, PROBLEM.N, PROBLEM.K), cache_dir=cache_dir)
    assert kernel.source == "exact" and kernel.config == result.entry.config
    assert workers_of_this_process() == []


@pytest.mark.slow
def test_problems_are_spread_over_the_gpus_in_memory(gpu, cache_dir):
    """An in-memory study per problem; each GPU's row in the progress display."""
    problems = [Problem(64, 64, 64), Problem(32, 64, 48), Problem(48, 32, 32)]
    console = Console(width=200, record=True, force_terminal=False)
    display = _TuneDisplay(console, 4, "/4", sequential=False)
    display.count, events = len(problems), []

    def on_trial(event):
        events.append(event)
        display.trial(event)

    with display:
        results = autotune.tune_many(
            problems, trials=4, cache_dir=cache_dir, on_trial=on_trial, on_start=display.start,
            **TWO,
        )  # fmt: skip
        display.finish(results)
    assert [r.problem for r in results] == problems
    assert all(r.entry and r.search.study_trials == 4 for r in results)
    assert sum(per_gpu(events).values()) == 12  # across problems too
    assert {e["gpu"] for e in events} == {"0", "0.1"}
    by_problem = {p: [e for e in events if e["result"].problem == p] for p in problems[:2]}
    first, second = by_problem.values()  # tuned at once: begun by two GPUs, side by side
    apart = first[0]["gpu"] != second[0]["gpu"]
    assert apart or second[0]["started"] < first[-1]["ended"], "problems tuned one by one"
    for result in results:
        assert verified(result.problem, result.entry.config, gpu)
    shown = console.export_text()
    assert "gpu 0 " in shown and "gpu 0.1" in shown and "last 48x32x32" in shown


@pytest.fixture
def breakable(monkeypatch):
    """Workers through tests/faulty, none of them faulty until a test breaks one."""
    faults.plant(monkeypatch)
    monkeypatch.setenv(faults.ENV, "{}")


def break_gpu(event) -> None:
    """The worker that measured this candidate dies, and cannot be started again."""
    worker = event["evaluator"]
    worker.child = "gone"
    os.kill(worker.pid, signal.SIGKILL)
    worker.process.wait(10)  # dead before its next candidate (else that one is "crashed")


@pytest.mark.slow
def test_a_lost_gpu_leaves_and_the_other_finishes_the_study(
    gpu, cache_dir, breakable, capfd, tmp_path
):
    events, url = [], f"sqlite:///{tmp_path / 'study.db'}"

    def on_trial(event):
        events.append(event)
        if event["gpu"] == "0.1":
            break_gpu(event)

    # (12: more than GPU 0 can measure while GPU 0.1 measures its first, so 0.1 comes back)
    result = autotune.tune(
        *(PROBLEM.M, PROBLEM.N, PROBLEM.K), trials=12, cache_dir=cache_dir, on_trial=on_trial,
        storage=url, **TWO,
    )  # fmt: skip
    counts = per_gpu(events)
    assert counts.get("0.1", 0) <= 1 and sum(counts.values()) == 12
    study = optuna.load_study(study_name=result.search.study_name, storage=url)
    given_back = [t for t in study.trials if t.user_attrs.get("interrupted")]
    assert len(given_back) == 1 and "reason" not in given_back[0].user_attrs  # GPU 0.1's
    assert result.search.study_trials == 12 and result.entry is not None
    assert verified(PROBLEM, result.entry.config, gpu)
    err = capfd.readouterr().err
    assert "autotune: gpu 0.1 is out: " in err and "this GPU is gone" in err
    assert "1 of 2 GPUs go on" in err
    assert workers_of_this_process() == []


@pytest.mark.slow
def test_the_tune_fails_only_when_every_gpu_is_lost(gpu, cache_dir, breakable, capfd):
    with pytest.raises(WorkerError, match="every GPU is out .*gpu 0: .*gpu 0.1: "):
        autotune.tune(
            *(PROBLEM.M, PROBLEM.N, PROBLEM.K), trials=6, cache_dir=cache_dir,
            on_trial=break_gpu, **TWO,
        )  # fmt: skip
    assert capfd.readouterr().err.count(" is out: ") == 2
    assert workers_of_this_process() == []


def replayed(gpu, trials: int, known_good) -> Search:
    return Search.of(
        PROBLEM, gpu, templates=("tiled",), trials=trials, timeout=None, checks=True,
        sampler="grid", storage=None, seed=1, max_dispatch_s=None, on_trial=None,
        evaluator=None, limits=None, compile_ahead=0, known_good=known_good,
    )  # fmt: skip


def test_a_lanes_report_holds_no_other_lane(gpu):
    """on_trial (where tune writes a new best to the cache) runs outside the search's
    lock: while one lane's report waits, the other lane goes on measuring and recording;
    every trial is reported once, before it is told finished."""
    s = 1e-3
    ok = lambda config: Outcome(config, Measurement(s, s, s, "wall", 1, 1, s), error=0.0)  # noqa: E731
    search = replayed(gpu, 6, None)
    in_report, others_went_on = threading.Event(), threading.Event()
    reported, finished_before_report, went_on = [], [], []

    def on_trial(event):
        state = next(t.state for t in search.study.optuna.trials if t.number == event["trial"])
        finished_before_report.append(state.is_finished())
        reported.append(event["gpu"])
        if reported.count("1") == 2:
            others_went_on.set()
        if event["gpu"] == "0" and reported.count("0") == 1:  # a slow cache write
            in_report.set()
            went_on.append(others_went_on.wait(30))

    search.on_trial = on_trial
    lanes = [Lane(Replay(ok), "0"), Lane(Replay(ok), "1")]
    threads = [threading.Thread(target=search.work, args=(lane,)) for lane in lanes]
    threads[0].start()
    assert in_report.wait(30)  # lane 0 is in its first report: lane 1 starts now
    threads[1].start()
    for thread in threads:
        thread.join(60)
    assert went_on == [True], f"lane 1 waited for lane 0's report: {reported}"
    assert len(reported) == search.result.measured == 6 and not any(finished_before_report)
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in search.study.optuna.trials)


def test_faults_in_a_row_are_the_gpus_only_if_a_known_good_config_fails_too(gpu):
    """LOST_AFTER crashes in a row on a lane: its GPU is checked with a known-good config.
    It fails too: the lane is out and its crashed trials go back, for another lane. It
    runs: the crashes were the candidates', recorded as such, the lane goes on."""
    known = load_space("tiled").seed_configs(PROBLEM, gpu.limits)[0]
    s = 1e-3
    ok = lambda config: Outcome(config, Measurement(s, s, s, "wall", 1, 1, s), error=0.0)  # noqa: E731
    crashed = lambda config: Outcome(config, reason="crashed", detail="worker died")  # noqa: E731

    search = replayed(gpu, 6, known)
    broken, good = Lane(Replay(crashed), "0"), Lane(Replay(ok), "1")
    search.work(broken)
    assert broken.out.startswith(f"{LOST_AFTER} candidates in a row lost the device")
    assert "so did a known-good config" in broken.out
    assert broken.evaluator.evaluated[-1] == known and search.result.measured == 0
    trials = search.study.optuna.trials
    assert sum(bool(t.user_attrs.get("interrupted")) for t in trials) == LOST_AFTER  # back
    assert not any("reason" in t.user_attrs for t in trials)
    search.work(good)  # the budget is whole: the broken lane's trials were given back
    assert search.result.measured == 6 and not search.result.failures
    measured = [t for t in search.study.optuna.trials if "reason" in t.user_attrs]
    assert len(measured) == 6 and {t.user_attrs["gpu"] for t in measured} == {"1"}

    search = replayed(gpu, 2 * LOST_AFTER + 1, known)
    flaky = Lane(Replay(lambda config: ok(config) if config == known else crashed(config)), "0")
    search.work(flaky)  # (the known-good config is a seed, so measured first)
    assert flaky.out is None and search.result.measured == 2 * LOST_AFTER + 1
    assert search.result.failures == {"crashed": 2 * LOST_AFTER}
    assert flaky.evaluator.evaluated.count(known) == 3  # as a seed, then twice as a check


@pytest.mark.slow
def test_gpus_losing_their_device_leave_and_a_bad_problem_fails_the_tune(
    gpu, cache_dir, monkeypatch, capfd
):
    """Every candidate destroys its worker's device (as a driver reset would): each GPU
    leaves after search.LOST_AFTER in a row. A problem refused in one GPU's thread fails
    the whole tune with its own error."""
    faults.plant(monkeypatch)
    monkeypatch.setenv(faults.ENV, json.dumps({"evaluate": "lose-device"}))
    with pytest.raises(WorkerError, match="every GPU is out .*3 candidates in a row lost"):
        autotune.tune(*(PROBLEM.M, PROBLEM.N, PROBLEM.K), trials=12, cache_dir=cache_dir, **TWO)
    assert capfd.readouterr().err.count(" is out: 3 candidates in a row") == 2
    monkeypatch.setenv(faults.ENV, "{}")
    too_big = Problem(1, 2**16, 2**16)  # B alone is 16 GiB
    with pytest.raises(autotune.ProblemError, match="max"):
        autotune.tune_many([PROBLEM, too_big], trials=2, cache_dir=cache_dir, **TWO)
    assert workers_of_this_process() == []


def gpu_threads() -> list[str]:
    """The pool's threads still running (a moment after the tune returned: at most
    their last line is left)."""
    running = [t for t in threading.enumerate() if t.name.startswith("gpu ")]
    for thread in running:
        thread.join(2)
    return [t.name for t in running if t.is_alive()]


@pytest.fixture
def begun(monkeypatch):
    """tune.baseline of the first problem begun sets `begun["event"]`, then waits a
    second before measuring: whatever stops the tune meanwhile lands in its begin."""
    begun, original = {"event": threading.Event()}, TUNE.baseline

    def baseline(problem, gpu, evaluator):
        if problem == PROBLEM:
            begun["event"].set()
            time.sleep(1.0)
        elif "fail" in begun:  # the other problem: fails once the first is in its begin
            assert begun["event"].wait(60)
            raise RuntimeError("planted failure")
        return original(problem, gpu, evaluator)

    monkeypatch.setattr(TUNE, "baseline", baseline)
    return begun


def assert_nothing_measured_or_left(events, cache_dir, capfd):
    """A stopped tune: no trial after the stop, no GPU thread or worker left, no cache
    file written, and no GPU announced as lost."""
    assert events == [] and gpu_threads() == [] and workers_of_this_process() == []
    assert not any(cache_dir.glob("*.json"))
    assert " is out" not in capfd.readouterr().err


@pytest.mark.slow
def test_a_failure_stops_a_problem_being_begun(gpu, cache_dir, begun, capfd):
    """One GPU's thread fails while the other is in its problem's begin: that problem
    measures nothing after it, and nothing is left running."""
    events, begun["fail"] = [], True
    with pytest.raises(RuntimeError, match="planted failure"):
        autotune.tune_many(
            [PROBLEM, Problem(32, 32, 32)], trials=30, cache_dir=cache_dir,
            on_trial=events.append, **TWO,
        )  # fmt: skip
    assert_nothing_measured_or_left(events, cache_dir, capfd)


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt here, as in a terminal, even where the tests run in
    the background of a script (which leaves SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
def test_ctrl_c_while_a_problem_is_begun_stops_every_gpu(gpu, cache_dir, begun, capfd, ctrl_c):
    events = []

    def interrupt():  # Ctrl-C, once the first GPU is in its begin
        begun["event"].wait(60)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        autotune.tune(
            *(PROBLEM.M, PROBLEM.N, PROBLEM.K), trials=40, cache_dir=cache_dir,
            on_trial=events.append, **TWO,
        )  # fmt: skip
    assert_nothing_measured_or_left(events, cache_dir, capfd)


@pytest.mark.slow
def test_a_configs_own_crashes_take_no_gpu_out(gpu, tmp_path, faulty_templates, monkeypatch, capfd):
    """Every faulty MODE but 0 aborts its worker: the candidates' fault, not the GPU's
    (a known-good config still runs there), so two GPUs record each crash and go on, as
    one does (test_faults.py), and find MODE 0."""
    faults.plant(monkeypatch)
    monkeypatch.setenv(faults.ENV, json.dumps({f"faulty MODE={m}": "abort" for m in range(1, 13)}))
    result = autotune.tune(
        16, 16, 16, templates=["faulty"], sampler="grid", trials=13, seed=1,
        cache_dir=tmp_path, gpus=[0, 0], repeat_gpus=True,
    )  # fmt: skip
    # 12 crashes over two lanes, in at most three runs: one of four or more, so a lane
    # was checked with a known-good config
    assert result.search.study_trials == 13 and result.search.failures["crashed"] == 12
    assert result.entry and result.entry.config.as_dict() == {"MODE": 0}
    assert " is out" not in capfd.readouterr().err
    assert workers_of_this_process() == []
