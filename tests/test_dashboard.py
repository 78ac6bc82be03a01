"""A tune stored in SQLite, as optuna-dashboard shows it: every trial and study readable.

Two real tunes (the CLI on the real adapter) write one study file: the naive template's
measured trials, and the test-only faulty template's failures (MODE 1 does not compile,
MODE 2 and 3 compute wrong results; tests/faulty).
"""

import json
import threading
import urllib.request
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import pytest

from autotune.__main__ import main
from autotune.evaluate import FAILURE_CHARS, Outcome, Replay
from autotune.measure import Measurement
from autotune.problem import Problem
from autotune.search import search, study_name
from autotune.space import Config
from autotune.version import __version__

pytestmark = pytest.mark.slow

FAULTY = Path(__file__).parent / "faulty"
PROBLEM = Problem(24, 20, 16)
State = optuna.trial.TrialState


@pytest.fixture(scope="module")
def study_file(gpu, tmp_path_factory):
    """The storage URL of a SQLite file holding a naive tune and a faulty one, and the
    study name of each template."""
    folder = tmp_path_factory.mktemp("dashboard")
    url = f"sqlite:///{folder / 'study.db'}"
    tune = ["tune", "--shape", PROBLEM.shape, "--storage", url, "--cache", str(folder),
            "--seed", "1"]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTOTUNE_TEMPLATE_PATH", str(FAULTY))
        assert main([*tune, "--template", "naive", "--trials", "3"]) == 0
        assert main([*tune, "--template", "faulty", "--sampler", "grid", "--trials", "4"]) == 0
        names = {t: study_name(PROBLEM, [t], True, gpu) for t in ("naive", "faulty")}
    return url, names


def load(study_file, template):
    url, names = study_file
    return optuna.load_study(study_name=names[template], storage=url)


def parsed(text):
    """A config's text ("naive WX=16 WY=8") back to the Config."""
    template, *pairs = text.split(" ")
    return Config.make(template, {k: int(v) for k, v in (p.split("=") for p in pairs)})


def measured(study):
    return [t for t in study.get_trials(deepcopy=False) if "reason" in t.user_attrs]


def test_each_measured_trial_shows_its_config_rate_and_time(gpu, study_file):
    trials = measured(load(study_file, "naive"))
    assert len(trials) == 3
    for trial in trials:
        attrs = trial.user_attrs
        assert trial.state == State.COMPLETE and attrs["reason"] == "ok"
        assert parsed(attrs["config"]) == Config.make(attrs["template"], attrs["params"])
        assert "failure" not in attrs
        gflops, median_ms = attrs["gflops"], attrs["median_ms"]
        assert isinstance(gflops, float) and gflops > 0
        assert median_ms == pytest.approx(trial.value * 1e3, rel=1e-3)  # 4 digits
        assert gflops == pytest.approx(PROBLEM.flops / (median_ms * 1e-3) / 1e9, rel=2e-3)
        for number in (gflops, median_ms):  # rounded for people, not 17 digits
            assert number == float(f"{number:.4g}")


def test_each_failed_trial_shows_its_reason_and_one_line(gpu, study_file):
    trials = {t.user_attrs["params"]["MODE"]: t for t in measured(load(study_file, "faulty"))}
    assert sorted(trials) == [0, 1, 2, 3]
    assert trials[0].user_attrs["reason"] == "ok" and trials[0].user_attrs["gflops"] > 0
    failures = {mode: t.user_attrs["failure"] for mode, t in trials.items() if mode}
    assert {mode: t.user_attrs["reason"] for mode, t in trials.items() if mode} == {
        1: "compile",
        2: "wrong",
        3: "wrong",
    }
    for mode, failure in failures.items():
        assert trials[mode].state == State.FAIL
        assert failure and "\n" not in failure and len(failure) <= FAILURE_CHARS
        assert "gflops" not in trials[mode].user_attrs
    # the message itself, not wgpu's framing ("Validation Error", "Caused by:")
    assert "parsing error" in failures[1] and "Validation Error" not in failures[1]
    assert failures[2].startswith("relative error")
    assert "\n" in trials[1].user_attrs["detail"]  # the whole text stays for the tuner


def test_each_study_says_what_it_tunes(gpu, study_file):
    for template in ("naive", "faulty"):
        study = load(study_file, template)
        attrs = study.user_attrs
        assert attrs["problem"] == "24x20x16 f32 nn"
        assert gpu.fingerprint.device in attrs["device"]
        assert gpu.fingerprint.description in attrs["device"]
        assert attrs["checks"] == "on" and attrs["templates"] == template
        assert attrs["space"] == "the device's limits"
        assert attrs["autotune_version"] == __version__
        assert study.metric_names == ["seconds"]


def test_unmeasured_proposals_say_why(gpu, tmp_path):
    """Trials that measured nothing, invalid proposals and repeats of a measured config,
    carry a note naming the config (they hold no claim, so no `config`)."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    seconds = Measurement(1e-3, 1e-3, 1e-3, "wall", 1, 1, 1e-3)
    replay = Replay(lambda config: Outcome(config, seconds, error=0.0))
    result = search(PROBLEM, gpu, templates=["naive"], trials=12, sampler="random", seed=0,
                    storage=url, evaluator=replay)  # fmt: skip
    study = optuna.load_study(study_name=result.study_name, storage=url)
    finished = study.get_trials(deepcopy=False, states=(State.COMPLETE, State.PRUNED))
    notes = {
        state: [
            t.user_attrs["note"]
            for t in finished
            if t.state == state and not t.user_attrs.get("reason")
        ]
        for state in (State.COMPLETE, State.PRUNED)
    }
    assert notes[State.PRUNED] and notes[State.COMPLETE]
    for note in notes[State.PRUNED]:
        config, _, why = note.partition(" is invalid here: ")
        assert why == "enough_threads: WX * WY >= 32"
        assert parsed(config)["WX"] * parsed(config)["WY"] < 32
    for note in notes[State.COMPLETE]:
        config, _, why = note.partition(" was measured before: ")
        assert why == "its result" and parsed(config).template == "naive"


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def test_dashboard_serves_the_attributes(gpu, study_file):
    """optuna-dashboard's own server, on the study file: its JSON API has them."""
    dashboard = pytest.importorskip("optuna_dashboard")
    url, names = study_file
    server = make_server("127.0.0.1", 0, dashboard.wsgi(url), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}/api"
    try:
        with urllib.request.urlopen(f"{base}/studies", timeout=30) as response:
            studies = json.load(response)["study_summaries"]
        (study,) = [s for s in studies if s["study_name"] == names["faulty"]]
        attrs = {a["key"]: a["value"] for a in study["user_attrs"]}
        assert attrs["problem"] == str(PROBLEM) and attrs["checks"] == "on"
        with urllib.request.urlopen(f"{base}/studies/{study['study_id']}", timeout=30) as response:
            detail = json.load(response)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    rows = [{a["key"]: a["value"] for a in t["user_attrs"]} for t in detail["trials"]]
    shown = {row["config"]: row for row in rows if "reason" in row}
    assert float(shown["faulty MODE=0"]["gflops"]) > 0
    assert float(shown["faulty MODE=0"]["median_ms"]) > 0
    assert shown["faulty MODE=1"]["reason"] == "compile"
    assert "parsing error" in shown["faulty MODE=1"]["failure"]
    assert {"config", "gflops", "median_ms", "reason", "failure"} <= {
        column["key"] for column in detail["union_user_attrs"]
    }
