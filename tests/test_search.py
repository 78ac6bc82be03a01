"""The search on the real adapter: budgets, failures as values, resume, shared studies."""

import math
import os
import socket
import subprocess
import sys
import time
from collections import Counter

import optuna
import pytest
from trials import enqueued_config

import autotune
from autotune import cache
from autotune.__main__ import main
from autotune.device import versions
from autotune.problem import Problem
from autotune.search import FINALISTS, search, study_name
from autotune.space import Config, load_space

WAITING = optuna.trial.TrialState.WAITING


def measured_trials(study):
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if "reason" in t.user_attrs and not t.user_attrs.get("interrupted")
    ]


@pytest.mark.parametrize("ahead", [0, 2], ids=["one at a time", "compiling ahead"])
def test_failures_are_recorded_with_their_reason_and_the_search_goes_on(
    gpu, faulty_templates, ahead
):
    problem = Problem(24, 20, 16)
    storage = optuna.storages.InMemoryStorage()
    result = search(
        problem,
        gpu,
        templates=["faulty"],
        trials=6,
        sampler="grid",
        storage=storage,
        max_dispatch_s=0.01,
        compile_ahead=ahead,  # a compile error found ahead is still that trial's
    )
    assert result.measured == 6
    assert result.failures == Counter({"wrong": 2, "compile": 2, "timeout": 1})
    assert result.best.config == Config.make("faulty", {"MODE": 0})
    study = optuna.load_study(study_name=result.study_name, storage=storage)
    reasons = {
        t.user_attrs["params"]["MODE"]: t.user_attrs["reason"] for t in measured_trials(study)
    }
    assert reasons == {0: "ok", 1: "compile", 2: "wrong", 3: "wrong", 4: "timeout", 5: "compile"}


@pytest.mark.parametrize("budget", ["trials", "timeout"])
@pytest.mark.slow
def test_compiling_ahead_measures_each_config_once_and_releases_what_it_did_not_measure(
    gpu, budget
):
    problem = Problem(40, 36, 20)
    storage = optuna.storages.InMemoryStorage()
    limits = dict(trials=7) if budget == "trials" else dict(trials=None, timeout=6.0)
    result = search(
        problem, gpu, templates=["blocked"], seed=4, storage=storage, compile_ahead=2, **limits
    )
    study = optuna.load_study(study_name=result.study_name, storage=storage)
    measured = measured_trials(study)
    configs = [t.user_attrs["config"] for t in measured]
    assert len(configs) == len(set(configs)) == result.measured
    if budget == "trials":
        assert result.measured == 7
    states = Counter(t.state for t in study.get_trials(deepcopy=False))
    assert states[optuna.trial.TrialState.RUNNING] == 0
    released = [t for t in study.trials if t.user_attrs.get("interrupted")]
    assert all(t.state == optuna.trial.TrialState.FAIL for t in released)
    assert not {t.user_attrs["config"] for t in released} & set(configs)
    assert result.best is not None and result.best.ok
    queued = [enqueued_config(t) for t in study.get_trials(deepcopy=False, states=(WAITING,))]
    assert [t.user_attrs["config"] for t in released] == queued[len(queued) - len(released) :]
    if budget == "timeout":  # time ran out with configs compiled ahead: they wait
        assert released
    again = search(  # released configs are queued for the next run; measured ones are not
        problem, gpu, templates=["blocked"], seed=4, storage=storage, trials=result.measured + 2
    )
    assert again.measured == 2
    study = optuna.load_study(study_name=result.study_name, storage=storage)
    unmeasured = [config for config in queued if config not in configs]
    assert {t.user_attrs["config"] for t in measured_trials(study)} >= set(unmeasured[:2])


@pytest.mark.slow
def test_wrong_kernel_is_never_cached(gpu, faulty_templates, cache_dir):
    # MODE 2 and 3 compute wrong results; only MODE 0 may end up in the cache
    result = autotune.tune(
        24, 20, 16, templates=["faulty"], trials=6, sampler="grid", cache_dir=cache_dir
    )
    assert result.entry.config == Config.make("faulty", {"MODE": 0})
    assert '"MODE": 2' not in result.cache_path.read_text()


@pytest.mark.slow
def test_tune_times_its_finalists_again_and_caches_the_fastest(gpu, cache_dir):
    storage = optuna.storages.InMemoryStorage()
    result = autotune.tune(
        48, 40, 32, templates=["blocked"], trials=6, seed=2, cache_dir=cache_dir, storage=storage
    )
    finalists = result.search.finalists
    assert len(finalists) >= FINALISTS and len(set(finalists)) == len(finalists)
    study = optuna.load_study(study_name=result.search.study_name, storage=storage)
    searched = {t.user_attrs["config"]: t.value for t in measured_trials(study) if t.value}
    fastest, others = finalists[:FINALISTS], finalists[FINALISTS:]
    assert [searched[str(c)] for c in fastest] == sorted(searched.values())[:FINALISTS]
    # then the seeds the search measured, whatever their first timing
    seeds = load_space("blocked").seed_configs(Problem(48, 40, 32), gpu.limits)
    assert others and set(others) <= set(seeds) and all(str(c) in searched for c in others)
    assert result.entry.config in finalists
    # the cached time is the second look, not the search's first one
    assert result.entry.median_s != searched[str(result.entry.config)]
    assert (
        cache.DeviceCache(cache_dir, gpu.fingerprint.as_dict(), versions()).get(result.entry.key)
        == result.entry
    )


@pytest.mark.slow
def test_invalid_configs_cost_nothing_and_nothing_is_measured_twice(gpu):
    problem = Problem(40, 36, 20)  # N, K multiples of 4 but not of 8 or 16: many invalid
    storage = optuna.storages.InMemoryStorage()
    result = search(
        problem, gpu, templates=["blocked", "tiled"], trials=10, seed=3, storage=storage
    )
    study = optuna.load_study(study_name=result.study_name, storage=storage)
    measured = measured_trials(study)
    assert len(measured) == result.measured == 10
    configs = [t.user_attrs["config"] for t in measured]
    assert len(set(configs)) == len(configs)
    for trial in measured:
        config = Config.make(trial.user_attrs["template"], trial.user_attrs["params"])
        assert load_space(config.template).why_invalid(config, problem, gpu.limits) is None
    pruned = study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
    assert all("reason" not in t.user_attrs for t in pruned)


@pytest.mark.slow
def test_whole_small_space_is_exhausted_then_stops(gpu):
    problem = Problem(8, 8, 8)
    size = len(load_space("naive").configs(problem, gpu.limits))
    result = search(problem, gpu, templates=["naive"], trials=size + 50, sampler="tpe")
    assert result.study_trials == size and result.measured == size


@pytest.mark.slow
def test_study_resumes_from_sqlite(gpu, tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    problem = Problem(32, 32, 32)
    first = search(problem, gpu, templates=["blocked"], trials=3, storage=url, seed=1)
    second = search(problem, gpu, templates=["blocked"], trials=5, storage=url, seed=1)
    assert (first.measured, second.measured, second.study_trials) == (3, 2, 5)


def _tune_command(cache_dir, shape, trials, storage, *extra):
    return [
        sys.executable, "-m", "autotune", "tune", "--shape", shape, "--trials", str(trials),
        "--storage", storage, "--cache", str(cache_dir), "--template", "blocked", *extra,
    ]  # fmt: skip


POSTGRES = os.environ.get(
    "AUTOTUNE_TEST_POSTGRES", "postgresql+psycopg://autotune:autotune@127.0.0.1:5432/postgres"
)


@pytest.fixture
def postgres_url():
    """A fresh database on the PostgreSQL server that .ci/setup starts, dropped after the
    test. Where no server answers the test is skipped, except in CI (CI=true), where
    that is a failure: the shared-study test must run there."""
    import sqlalchemy

    name = f"autotune_test_{os.getpid()}_{int(time.time())}"
    admin = sqlalchemy.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    except Exception as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no PostgreSQL server at {POSTGRES} ({type(error).__name__})")
    yield POSTGRES.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f"DROP DATABASE {name} WITH (FORCE)"))
    admin.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.slow
def test_two_machines_share_one_study_and_their_caches_merge(gpu, tmp_path, backend, request):
    """Two `tune` processes (as on two machines: each its own cache) on one study."""
    url = (
        f"sqlite:///{tmp_path / 'study.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    problem = Problem(48, 48, 48)
    caches = [tmp_path / "machine-a", tmp_path / "machine-b"]
    workers = [
        subprocess.Popen(
            _tune_command(folder, "48x48x48", 8, url, "--seed", str(seed)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed, folder in enumerate(caches, start=1)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err
    study = optuna.load_study(study_name=study_name(problem, ["blocked"], True, gpu), storage=url)
    measured = measured_trials(study)
    assert len(measured) == 8  # the budget holds across processes (it once ran 9)
    by_worker = Counter(t.user_attrs["worker"] for t in measured)
    assert len(by_worker) == 2, by_worker  # both processes contributed
    configs = [t.user_attrs["config"] for t in measured]
    assert len(set(configs)) == len(configs)  # no config measured twice
    # each machine cached its own best; merged, the faster of the two is served
    files = [cache.DeviceCache(f, gpu.fingerprint.as_dict(), versions()).path for f in caches]
    own = [cache.DeviceCache(f, gpu.fingerprint.as_dict(), versions()) for f in caches]
    bests = [store.best(problem, checks=True) for store in own]
    assert all(bests)
    merged = tmp_path / "merged"
    merged.mkdir()
    assert main(["cache", "merge", *map(str, files), "--out", str(merged)]) == 0
    kernel = autotune.lookup(48, 48, 48, cache_dir=merged)
    fastest = min(bests, key=lambda e: e.median_s)
    assert kernel.source == "exact" and kernel.config == fastest.config
    assert str(kernel.config) in configs  # a config the study measured
    from autotune.verify import verify

    assert verify(kernel.compiled, gpu).ok


class _Recorded:
    """Stands in for the Gpu when the evaluator replaces it: limits and fingerprint only."""

    def __init__(self):
        from autotune.device import WEBGPU_DEFAULT_LIMITS, Fingerprint

        self.limits = dict(WEBGPU_DEFAULT_LIMITS)
        self.fingerprint = Fingerprint("Test", "test", "replay", "none", 0, 0, "CPU")


def _synthetic_seconds(config):
    """A smooth made-up cost with one best config, to replay searches without a GPU."""
    p = config.as_dict()
    return 1e-3 * (
        1
        + abs(p["BM"] - 64) / 64
        + abs(p["BN"] - 64) / 64
        + abs(p["TM"] - 4) / 4
        + abs(p["TN"] - 4) / 4
        + (p["VEC"] != 4)
        + p["PAD"] * 0.1
    )


@pytest.mark.parametrize("sampler", ["tpe", "random"])
@pytest.mark.slow
def test_replayed_search_is_frugal_with_proposals(sampler):
    """No GPU: a recorded cost replaces it. The sampler's repeats are replaced by
    unmeasured neighbours, so proposals stay few per measured trial and none is measured
    twice, and TPE gets close to the best."""
    from autotune.evaluate import Outcome, Replay
    from autotune.measure import Measurement

    def recorded(config):
        s = _synthetic_seconds(config)
        return Outcome(config, Measurement(s, s, s, "timestamp", 1, 1, s), error=0.0)

    problem = Problem(256, 256, 256)
    storage = optuna.storages.InMemoryStorage()
    result = search(
        problem,
        _Recorded(),
        templates=["blocked"],
        trials=80,
        sampler=sampler,
        seed=0,
        storage=storage,
        evaluator=Replay(recorded),
    )
    study = optuna.load_study(study_name=result.study_name, storage=storage)
    measured = [t.user_attrs["config"] for t in measured_trials(study)]
    assert len(measured) == len(set(measured)) == result.measured == 80
    if sampler == "tpe":  # learns where the valid configs are
        assert len(study.trials) < 4 * 80
    else:  # proposes blindly: invalid points in proportion to the space's shape
        space = load_space("blocked")
        points = math.prod(len(values) for values in space.params.values())
        valid = space.configs(problem, _Recorded().limits)  # what the search could measure
        assert len(study.trials) < 2 * 80 * points / len(valid)
    if sampler == "tpe":
        assert result.best.measurement.median_s <= 1.3e-3


@pytest.mark.slow
def test_climb_steps_from_the_best_config_measured_so_far():
    """With the climb, each CLIMB_EVERY-th measured proposal after CLIMB_AFTER is one
    parameter of the best config so far moved one value along its list (while the best
    has such a step unmeasured); a step is never measured twice."""
    from autotune.evaluate import Outcome, Replay
    from autotune.measure import Measurement
    from autotune.strategies.climb import CLIMB_AFTER, CLIMB_EVERY, steps_from

    def recorded(config):
        s = _synthetic_seconds(config)
        return Outcome(config, Measurement(s, s, s, "timestamp", 1, 1, s), error=0.0)

    problem, gpu = Problem(256, 256, 256), _Recorded()
    replay = Replay(recorded)
    search(problem, gpu, templates=["blocked"], trials=40, sampler="climb", seed=1,
           evaluator=replay)  # fmt: skip
    order = replay.evaluated
    valid = set(load_space("blocked").configs(problem, gpu.limits))
    assert len(order) == len(set(order)) == 40
    climbed = 0
    seeds = len(load_space("blocked").seed_configs(problem, gpu.limits))
    first_turn = -(-max(CLIMB_AFTER, seeds) // CLIMB_EVERY) * CLIMB_EVERY  # the queue asked
    for turn in range(first_turn, len(order), CLIMB_EVERY):
        best = min(order[:turn], key=_synthetic_seconds)
        steps = [c for c in steps_from(best) if c in valid and c not in order[:turn]]
        if steps:
            assert order[turn] in steps, (turn, best, order[turn])
            climbed += 1
    assert climbed >= 5
    text = "blocked BM=64 BN=64 TM=4"
    assert str(Config.parse(text)) == text


def test_the_climbs_steps_that_give_nothing_are_not_the_samplers_idle_asks():
    """An invalid or taken step leaves the sampler's count of idle asks (after
    MAX_IDLE_ASKS of those it picks a random config itself) as it was; the sampler's
    own invalid proposals, once the steps are spent, still count. Driven through
    propose() on a real study with one measured config."""
    from autotune.evaluate import Outcome
    from autotune.measure import Measurement
    from autotune.strategies.climb import Climb, steps_from
    from autotune.study import Study

    problem = Problem(256, 256, 256)
    space = load_space("blocked")
    valid = space.configs(problem, _Recorded().limits)
    best = space.seed_configs(problem, _Recorded().limits)[0]
    climb = Climb(seed=0)
    study = Study("climb-idle", None, climb.sampler, problem, ["blocked"])
    trial, _ = study.ask_for(best)
    assert study.claim(trial, best)
    study.finish(trial, Outcome(best, Measurement(*[1e-3] * 3, "timestamp", 1, 1, 1e-3), 0.0))
    while not climb.due():
        climb.observe(best, "claimed")  # until the turn of a step has come
    steps = steps_from(best)
    for event in ["invalid", "taken"] * len(steps):
        _, config = climb.propose(study, valid)
        if config not in steps:
            break  # the steps are spent: this is the sampler's proposal
        steps.remove(config)
        climb.observe(config, event)
        assert climb.idle == 0
    assert not steps
    climb.observe(config, "invalid")
    assert climb.idle == 1
    climb.observe(config, "claimed")
    assert climb.idle == 0


def test_a_step_moves_one_parameter_to_the_next_value_of_its_list():
    from autotune.strategies.climb import steps_from

    problem = Problem(256, 256, 256)
    space = load_space("blocked")
    valid = set(space.configs(problem, _Recorded().limits))
    config = space.seed_configs(problem, _Recorded().limits)[0]
    steps = steps_from(config)
    assert config not in steps and len(steps) == len(set(steps))
    assert 0 < len(valid & set(steps)) < len(steps)  # invalid steps are the search's to prune
    for step in steps:
        moved = [(k, v) for k, v in step.params if v != config[k]]
        assert len(moved) == 1
        name, value = moved[0]
        values = space.params[name]
        assert abs(values.index(value) - values.index(config[name])) == 1
    far = [c for c in valid if sum(v != config[k] for k, v in c.params) == 1]
    assert len(far) > len(valid & set(steps))  # one parameter moved further is not a step


def test_a_trial_another_process_finished_first_is_left_to_it(tmp_path):
    """Optuna's SQLite storage can hand one enqueued trial to two processes (its pop of a
    waiting trial is not atomic there; seen with two `tune` processes starting together).
    Played here: while a seed is measured, "the other process" finishes its trial. The
    search leaves that result standing and goes on (it used to crash on its own tell)."""
    from autotune.evaluate import Outcome, Replay
    from autotune.measure import Measurement

    url = f"sqlite:///{tmp_path / 'study.db'}"
    taken = []

    def evaluator(config):
        if len(taken) < 3:  # the first three candidates, all seeds (enqueued trials)
            (name,) = optuna.get_all_study_names(storage=url)
            other = optuna.load_study(study_name=name, storage=url)
            running = other.get_trials(states=(optuna.trial.TrialState.RUNNING,))
            (trial,) = [t for t in running if t.user_attrs.get("config") == str(config)]
            other.tell(trial.number, 1.0)  # its result: 1 s
            taken.append(trial.number)
        s = _synthetic_seconds(config)
        return Outcome(config, Measurement(s, s, s, "timestamp", 1, 1, s), error=0.0)

    result = search(
        Problem(256, 256, 256), _Recorded(), templates=["blocked"], trials=8, seed=0,
        storage=url, evaluator=Replay(evaluator),
    )  # fmt: skip
    assert result.measured == 8 and len(taken) == 3
    study = optuna.load_study(study_name=result.study_name, storage=url)
    for number in taken:
        trial = study.trials[number]
        assert trial.state == optuna.trial.TrialState.COMPLETE and trial.value == 1.0
    # ours are recorded in full; the three the stand-in finished carry only its value
    assert len(measured_trials(study)) == 8 - len(taken)


def _replayed(config):
    from autotune.evaluate import Outcome
    from autotune.measure import Measurement

    seconds = _synthetic_seconds(config)
    return Outcome(config, Measurement(seconds, seconds, seconds, "timestamp", 1, 1, seconds))


def _foreign_claim(study, config, admitted=False, worker="another-machine:1"):
    """A trial claimed by another process, as Study.claim leaves it (then admitted)."""
    trial = study.ask()
    trial.set_user_attr("config", str(config))
    trial.set_user_attr("worker", worker)
    if admitted:
        trial.set_user_attr("admitted", True)
    return trial


def _measured_and_free(tmp_path, trials):
    """A study on SQLite with `trials` configs measured, and configs still free."""
    from autotune.evaluate import Replay

    url = f"sqlite:///{tmp_path / 'study.db'}"
    problem, recorded = Problem(256, 256, 256), _Recorded()
    first = search(problem, recorded, templates=["blocked"], trials=trials, seed=0,
                   storage=url, evaluator=Replay(_replayed))  # fmt: skip
    study = optuna.load_study(study_name=first.study_name, storage=url)
    measured = {t.user_attrs["config"] for t in measured_trials(study)}
    free = [c for c in load_space("blocked").configs(problem, recorded.limits)
            if str(c) not in measured]  # fmt: skip
    return url, first.study_name, free


@pytest.mark.slow
def test_the_budget_counts_the_claims_of_other_processes(tmp_path):
    """Two processes on one study each saw 7 of 8 trials measured and both measured one
    more (9 for --trials 8): the last place, claimed elsewhere, is not taken again."""
    from autotune.evaluate import Replay

    url, name, free = _measured_and_free(tmp_path, 7)
    study = optuna.load_study(study_name=name, storage=url)
    other = _foreign_claim(study, free[0], admitted=True)
    again = search(Problem(256, 256, 256), _Recorded(), templates=["blocked"], trials=8,
                   seed=0, storage=url, evaluator=Replay(_replayed))  # fmt: skip
    assert again.measured == 0  # the other process holds the 8th place
    study.tell(other, 1e-3)
    assert len(measured_trials(study)) + 1 == 8  # (the stand-in records no reason)


def test_a_config_given_back_is_queued_again_once():
    """A claim given back (a search stopped, out of time, a GPU lost) is queued for the
    next search; given back again, it is not: a config that takes its process or GPU
    down with it would otherwise come first on every resume."""
    from autotune.study import Study

    problem = Problem(64, 64, 64)
    study = Study("given-back", optuna.storages.InMemoryStorage(), None, problem, ["blocked"])
    config = load_space("blocked").seed_configs(problem)[0]
    trial, asked = study.ask_for(config)
    assert asked == config and study.claim(trial, config)
    study.release(trial, config)
    assert study.queued()
    trial, asked = study.ask()
    assert asked == config and study.claim(trial, config)
    study.release(trial, config)
    assert not study.queued()


def test_a_proposal_cut_short_leaves_its_config_queued_once():
    """A process killed after asking for a trial, before it claimed the config (here an
    enqueued seed, killed before even its params were asked), leaves a trial that holds
    nothing but names its process: the next process fails it and queues the config
    again, read back from what it was asked with. A proposal never reaches the GPU, so
    it never counts: the config is queued again after its first kill while measuring,
    after proposals cut short before or after that, and not after its second kill while
    measuring."""
    from autotune.study import Study

    problem = Problem(64, 64, 64)
    storage = optuna.storages.InMemoryStorage()

    def opened():
        return Study("cut-short", storage, None, problem, ["blocked", "tiled"])

    config = load_space("tiled").seed_configs(problem)[0]  # (the template is a param too)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    worker = f"{socket.gethostname()}:{dead.pid}"
    first = opened()
    first.enqueue(config)
    first.optuna.ask().set_user_attr("worker", worker)  # Study.ask's first write; killed
    study = opened()
    for killed_in, queued_again in [("claim", True), ("proposal", True), ("claim", False)]:
        assert study.queued()
        trial, asked = study.ask()
        assert asked == config and trial.user_attrs["worker"] == study.worker_id
        if killed_in == "claim":
            assert study.claim(trial, config)
        trial.set_user_attr("worker", worker)  # killed measuring it, or asking for it
        study = opened()
        assert study.queued() == queued_again, killed_in


def test_a_seed_handed_out_to_a_process_killed_before_naming_it_is_queued_again_once(
    tmp_path,
):
    """A process killed between Optuna handing it an enqueued trial and Study.ask naming
    the process on it leaves a running trial that names nobody: the next process to open
    the study queues its config again, once however often the study is opened, and not
    after it is measured. A trial Optuna made for its sampler holds no config to queue."""
    from autotune.study import Study

    problem = Problem(64, 64, 64)
    url = f"sqlite:///{tmp_path / 'study.db'}"

    def opened():
        return Study("unnamed", url, None, problem, ["blocked"])

    def waiting():
        return opened().optuna.get_trials(states=(optuna.trial.TrialState.WAITING,))

    config = load_space("blocked").seed_configs(problem)[0]
    first = opened()
    first.enqueue(config)
    first.optuna.ask()  # handed out from the queue; killed before naming its process
    assert len(waiting()) == 1 and len(waiting()) == 1
    study = opened()
    trial, asked = study.ask()
    assert asked == config and study.claim(trial, config)
    study.finish(trial, _replayed(config))
    assert not waiting()
    first.optuna.ask()  # made for the sampler (nothing waits); killed before naming it
    assert not waiting()


def test_of_two_claims_of_one_config_the_one_kept_first_stands():
    """Two processes claim one config in trials n and n + 1. Where n + 1 checked before
    n's claim was written, it kept the config; n, checking after, once ignored a
    higher number's claim, and both measured it."""
    from autotune.study import Study

    problem = Problem(64, 64, 64)
    study = Study("two-claims", optuna.storages.InMemoryStorage(), None, problem, ["blocked"])
    config, other = load_space("blocked").seed_configs(problem)[:2]
    lower, higher = study.optuna.ask(), _foreign_claim(study.optuna, config)
    # higher, not yet admitted: it may still back off; lower waits, then backs off
    started = time.monotonic()
    assert study._claimed_elsewhere(lower, config, wait_s=0.3)
    assert time.monotonic() - started >= 0.3
    higher.set_user_attr("admitted", True)  # higher kept it and went on: lower backs off
    assert not study.claim(lower, config)
    # a higher claim that backed off (a duplicate) holds nothing: the lower one stands
    lower, higher = study.optuna.ask(), _foreign_claim(study.optuna, other)
    higher.set_user_attr("duplicate", True)
    study.optuna.tell(higher, state=optuna.trial.TrialState.FAIL)
    assert study.claim(lower, other)


@pytest.mark.slow
def test_of_two_claims_for_the_last_place_the_lower_number_is_admitted(tmp_path):
    from autotune.study import Study

    url, name, free = _measured_and_free(tmp_path, 3)
    study = Study(name, url, None, Problem(256, 256, 256), ["blocked"])
    lower, higher = (_foreign_claim(study.optuna, config) for config in free[:2])
    # the higher counts the lower's undecided claim: no room left for it
    assert not study.admit(higher, trials=4)
    # the lower waits for the higher to decide; undecided, it counts it (to be safe)
    started = time.monotonic()
    assert not study.admit(lower, trials=4, wait_s=0.3)
    assert time.monotonic() - started >= 0.3
    study.release(higher)  # the higher backed off: the lower goes on
    assert study.admit(lower, trials=4, wait_s=0.3)
    # with room for both, a claim does not wait for a higher undecided one
    third, fourth = (_foreign_claim(study.optuna, config) for config in free[2:4])
    started = time.monotonic()
    assert study.admit(third, trials=6, wait_s=60)
    assert time.monotonic() - started < 30
    assert not study.admit(fourth, trials=5)  # 3 measured, lower and third admitted


@pytest.mark.slow
def test_a_claim_admitted_before_a_lower_one_was_written_counts(tmp_path):
    """A process asks trial n, and before it writes its claim another process's trial
    n + 1 is claimed and counted (n not yet visible to it). Counting only the claims
    of lower numbers, both went on: n must count n + 1."""
    from autotune.study import Study

    url, name, free = _measured_and_free(tmp_path, 3)
    study = Study(name, url, None, Problem(256, 256, 256), ["blocked"])
    ours = study.optuna.ask()
    theirs = _foreign_claim(study.optuna, free[1], admitted=True)
    assert theirs.number > ours.number
    assert study.claim(ours, free[0])
    assert not study.admit(ours, trials=4)
    assert study.admit(ours, trials=5)


@pytest.mark.slow
def test_a_trial_killed_while_its_result_was_recorded_is_measured_again(tmp_path):
    """A process killed inside record(), after the reason "ok" and before the value was
    told, leaves a running trial that the next run fails as interrupted: its config is
    neither counted against the budget nor taken for a failure."""
    from autotune.evaluate import Replay
    from autotune.study import Study

    url, name, free = _measured_and_free(tmp_path, 3)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    study = optuna.load_study(study_name=name, storage=url)
    killed = _foreign_claim(study, free[0], admitted=True,
                            worker=f"{socket.gethostname()}:{dead.pid}")  # fmt: skip
    killed.set_user_attr("reason", "ok")
    assert str(free[0]) not in Study(name, url, None, Problem(256, 256, 256), ["blocked"]).history()
    again = search(Problem(256, 256, 256), _Recorded(), templates=["blocked"], trials=4,
                   seed=0, storage=url, evaluator=Replay(_replayed))  # fmt: skip
    assert again.measured == 1 and again.study_trials == 4


@pytest.mark.slow
def test_the_second_look_returns_the_fastest_finalist_not_the_first(gpu, faulty_templates):
    """tune times its finalists again in the worker and keeps the fastest. Here the
    first finalist is known to be slow: faulty MODE 4 repeats the whole product 2000
    times, MODE 0 computes it once; both are correct."""
    from autotune.worker import Worker

    problem = Problem(24, 20, 16)
    slow, fast = (Config.make("faulty", {"MODE": mode}) for mode in (4, 0))
    with Worker(gpu.fingerprint.as_dict()) as worker:
        worker.prepare(problem, seed=1, checks=True)
        best = worker.retime([slow, fast])
        assert best is not None and best.config == fast
        slow_s = worker.evaluate(slow).measurement.median_s
    assert best.ok and best.measurement.median_s < slow_s / 10


def test_tune_measures_through_the_evaluator_it_is_given(gpu, tmp_path):
    """A timing backend of one's own is one class: here a Replay of made-up times, which
    tune uses for the baseline, the search and the second look (no worker is started)."""
    from autotune.evaluate import Outcome, Replay
    from autotune.measure import Measurement

    def recorded(config):  # the baseline (tiled) is slow; naive: small WX, large WY fastest
        s = 1e-3 * config["WX"] / config["WY"] if config.template == "naive" else 1.0
        return Outcome(config, Measurement(s, s, s, "timestamp", 1, 1, s), error=0.0)

    replays = []

    def make(problem):
        replays.append(Replay(recorded))
        return replays[-1]

    result = autotune.tune(
        64, 64, 64, templates=["naive"], trials=12, sampler="random", seed=0,
        cache_dir=tmp_path, gpu=gpu, evaluator=make,
    )  # fmt: skip
    (replay,) = replays
    assert replay.evaluated[0].template == "tiled"  # the baseline, then the search
    searched = [c for c in replay.evaluated if c.template == "naive"]
    measured = {str(c): recorded(c).measurement.median_s for c in searched}
    assert (
        len(measured) == 12
        and result.baseline.measurement.median_s == 1.0
        and result.entry.median_s == min(measured.values())
    )
    assert str(result.entry.config) == min(measured, key=measured.get)


def test_a_new_shape_is_searched_first_with_the_configs_measured_nearby(gpu, cache_dir):
    """A tune starts from the configs this device measured at other shapes, best
    predicted first, then the space's known-good configs: a short tune begins where a
    neighbour's long one ended."""
    from entries import seed_entry

    from autotune.lookup import neighbours

    problem, nearby = Problem(40, 36, 32), Problem(48, 36, 32)
    seeds = load_space("blocked").seed_configs(problem, gpu.limits)
    flipped = [Config.make("blocked", dict(s.as_dict(), PAD=1 - s["PAD"])) for s in seeds]
    tuned = next(c for c in flipped if c not in seeds)  # valid at both, no space's seed
    store = cache.DeviceCache(cache_dir, gpu.fingerprint.as_dict(), versions())
    store.put(seed_entry(nearby, config=tuned))
    store.put(seed_entry(problem, "blocked"))  # the shape's own entry is not a neighbour
    assert neighbours(problem, True, gpu, cache_dir, ("blocked",), gpu.limits) == [tuned]
    assert neighbours(problem, True, gpu, cache_dir, ("splitk",), gpu.limits) == []

    storage = optuna.storages.InMemoryStorage()
    result = autotune.tune(
        40, 36, 32, templates=["blocked"], trials=2, cache_dir=cache_dir,
        storage=storage,
    )  # fmt: skip
    study = optuna.load_study(study_name=result.search.study_name, storage=storage)
    order = [t.user_attrs["config"] for t in sorted(measured_trials(study), key=lambda t: t.number)]
    assert order == [str(tuned), str(seeds[0])]


def test_the_study_s_time_counts_every_other_process_s_span(tmp_path):
    """Each other process's span, first trial's start to last trial's end, read from the
    trials (a killed one's too); not this process's own, nor a trial found interrupted
    (its end is when the next process failed it)."""
    from datetime import datetime, timedelta

    from autotune.study import Study

    t0 = datetime(2026, 1, 1)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = Study("spans", url, None, Problem(8, 8, 8), ["naive"])

    def add(worker, start_s, end_s, state=optuna.trial.TrialState.COMPLETE, **attrs):
        study.optuna.add_trial(
            optuna.trial.FrozenTrial(
                number=0, trial_id=0, state=state, value=1.0 if state.name == "COMPLETE" else None,
                values=None, datetime_start=t0 + timedelta(seconds=start_s),
                datetime_complete=None if end_s is None else t0 + timedelta(seconds=end_s),
                params={}, distributions={}, user_attrs={"worker": worker, **attrs},
                system_attrs={}, intermediate_values={},
            )
        )  # fmt: skip

    add("a:1", 0, 2)
    add("a:1", 5, 9)  # a:1 spans 0-9 s
    add("b:2", 100, 130)  # another machine's, 30 s
    add("a:1", 10, 5000, optuna.trial.TrialState.FAIL, interrupted=True)
    add(study.worker_id, 0, 1000)  # this process's own: counted by the search itself
    assert study.others_seconds() == pytest.approx(39.0)
