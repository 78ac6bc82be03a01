"""The on-disk cache: keys, validation, corrupt files, concurrent writers."""

import json
import multiprocessing
import warnings
from dataclasses import replace

import pytest

from autotune import cache
from autotune.problem import Problem
from autotune.render import template_hash
from autotune.space import load_space

FINGERPRINT = {
    "backend": "Vulkan",
    "vendor": "test",
    "device": "Test GPU",
    "description": "d 1",
    "vendor_id": 1,
    "device_id": 2,
    "adapter_type": "DiscreteGPU",
}
VERSIONS = {"wgpu": "0.32.0", "wgpu_native": "29.0.1.1"}


def entry(M=64, N=64, K=64, median_s=1e-3, checks=True, seed=0, template="blocked"):
    problem = Problem(M, N, K)
    config = load_space(template).seed_configs(problem)[seed]
    return cache.Entry(
        key=cache.Key.of(problem, template, checks),
        params=config.as_dict(),
        median_s=median_s,
        p20_s=median_s,
        p80_s=median_s,
        method="timestamp",
        gflops=problem.flops / median_s / 1e9,
        error=1e-7,
        date=cache.today(),
    )


def test_round_trip_and_best(tmp_path):
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    fast, slow = entry(median_s=1e-3, seed=0), entry(median_s=2e-3, seed=0, template="tiled")
    assert store.put(fast) and store.put(slow)
    again = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    assert again.get(fast.key) == fast
    assert again.best(Problem(64, 64, 64), checks=True) == fast
    assert again.best(Problem(64, 64, 64), checks=False) is None


def test_faster_entry_of_another_config_is_kept(tmp_path):
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    store.put(entry(median_s=1e-3, seed=0))
    assert not store.put(entry(median_s=5e-3, seed=1))
    assert store.get(entry().key).median_s == 1e-3
    assert store.put(entry(median_s=2e-3, seed=0))  # same config re-measured: updated


def test_a_provisional_timing_gives_way_to_the_timing_that_supersedes_it(tmp_path):
    """tune stores each new best as it searches, then times the finalists again: its own
    provisional entry, even if its first number was lower, does not keep the result out."""
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    provisional = entry(median_s=1e-3, seed=0)
    store.put(provisional)
    final = entry(median_s=2e-3, seed=1)
    assert not store.put(final)
    assert store.put(final, replacing=[provisional.params])
    assert store.get(final.key).params == final.params


@pytest.mark.parametrize(
    "change",
    ["backend", "vendor", "device", "description", "vendor_id", "device_id", "wgpu", "wgpu_native"],
)
def test_device_or_version_change_is_a_miss(tmp_path, change):
    cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS).put(entry())
    fingerprint, versions = dict(FINGERPRINT), dict(VERSIONS)
    target = versions if change.startswith("wgpu") else fingerprint
    target[change] = target[change] + 1 if isinstance(target[change], int) else "other"
    assert (
        cache.DeviceCache(tmp_path, fingerprint, versions).best(Problem(64, 64, 64), True) is None
    )


@pytest.mark.parametrize(
    "change",
    [
        dict(M=65),
        dict(N=32),
        dict(K=128),
        dict(checks=False),
        dict(template="tiled"),
        dict(template_hash="f" * 16),
        dict(space="portable"),
    ],
)
def test_problem_or_mode_change_is_a_miss(tmp_path, change):
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    store.put(entry())
    key = replace(entry().key, **change)
    assert store.get(key) is None
    if not {"template", "template_hash", "space"} & set(change):
        assert store.best(key.problem, key.checks) is None


def test_changed_template_is_never_served(tmp_path):
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    stale = entry()
    stale = replace(stale, key=replace(stale.key, template_hash="0" * 16))
    store.put(stale)
    assert stale.key.template_hash != template_hash("blocked")
    assert store.best(Problem(64, 64, 64), True) is None


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    "text", ["{not json", "[]", '{"schema": 99, "entries": {}}', '{"schema": "1"}', ""]
)
def test_corrupt_or_newer_file_is_moved_aside_with_a_warning(tmp_path, text):
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    _write(store.path, text)
    with pytest.warns(cache.CacheWarning, match="moved to"):
        assert store.best(Problem(64, 64, 64), True) is None
    assert list(tmp_path.glob("*.bad-*"))[0].read_text() == text
    store.put(entry())  # and the cache works again
    assert store.best(Problem(64, 64, 64), True) is not None


@pytest.mark.parametrize(
    "mangle",
    [
        lambda e: e.update(params={"BM": "64; rm -rf /"}),
        lambda e: e.update(params={"BM": 10**30}),
        lambda e: e.update(median_s=-1),
        lambda e: e.update(median_s="fast"),
        lambda e: e.update(method="guess"),
        lambda e: e.update(key="something else"),
    ],
)
def test_bad_entries_are_skipped_not_served(tmp_path, mangle):
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    good = entry()
    store.put(good)
    data = json.loads(store.path.read_text())
    mangle(data["entries"][str(good.key)])
    store.path.write_text(json.dumps(data))
    with pytest.warns(cache.CacheWarning, match="ignored"):
        assert store.entries() == {}


@pytest.mark.parametrize(
    "key",
    [
        "../../etc:x:checks:f32:nn:device:1x1x1",
        "blocked:h:checks:f32:nn:device:1x1x1x1",
        "blocked:h:checks:f32:nn:1x1x1",
        "blocked:h:checks:f32:nn:anywhere:1x1x1",
        "blocked:h:maybe:f32:nn:device:1x1x1",
        "blocked:h:checks:f64:nn:device:1x1x1",
    ],
)
def test_malformed_keys_are_refused(key):
    with pytest.raises(ValueError):
        cache._parse_key(key)


def _writer(folder, index, count):
    store = cache.DeviceCache(folder, FINGERPRINT, VERSIONS)
    for i in range(count):
        store.put(entry(M=index * 100 + i + 1))


def test_concurrent_writers_lose_nothing(tmp_path):
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_writer, args=(tmp_path, w, 15)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        entries = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS).entries()
    assert len(entries) == 60
    assert not list(tmp_path.glob("*.tmp"))


def test_default_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    assert cache.default_cache_dir() == tmp_path
    monkeypatch.delenv(cache.CACHE_ENV)
    assert cache.default_cache_dir() == cache.shipped_cache_dir()  # in the checkout
