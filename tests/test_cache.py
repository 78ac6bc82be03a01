"""The on-disk cache: keys, validation, corrupt files, concurrent writers."""

import json
import multiprocessing
import warnings
from dataclasses import replace

import pytest

from autotune import cache
from autotune.__main__ import main
from autotune.arguments import ArgumentError
from autotune.data import data_path
from autotune.key import Key
from autotune.problem import Problem
from autotune.render import kernel_id
from autotune.space import load_space, template_names

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


def entry(M=64, N=64, K=64, median_s=1e-3, checks=True, seed=0, template="blocked", **variant):
    problem = Problem(M, N, K, **variant)
    config = load_space(template).seed_configs(problem)[seed]
    return cache.Entry(
        key=cache.Key.of(problem, config, checks),
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


def test_a_reader_sees_every_write_and_every_template_added(tmp_path, monkeypatch):
    """A reader sees another process's write at its next read, and a template added to
    the template path at the next listing (the listing is cached on its contents)."""
    reader = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    writer = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    assert writer.put(entry(seed=0)) and len(reader.entries()) == 1
    assert writer.put(entry(seed=0, template="tiled")) and len(reader.entries()) == 2
    mine = tmp_path / "templates"
    mine.mkdir()
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(mine))
    assert "mine" not in template_names()
    _template_mine(mine)
    assert "mine" in template_names() and load_space("mine").params == load_space("naive").params


def _template_mine(folder):
    """A copy of `naive` named `mine` in `folder` (put on the template path)."""
    folder.mkdir(exist_ok=True)
    (folder / "mine.toml").write_text((data_path("search_spaces") / "naive.toml").read_text())
    (folder / "mine.wgsl.j2").write_text((data_path("templates") / "naive.wgsl.j2").read_text())


def _store_of_mine(tmp_path, monkeypatch):
    """(the folder of template `mine`, put on the template path; a cache in tmp_path)"""
    mine = tmp_path / "templates"
    _template_mine(mine)
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(mine))
    return mine, cache.DeviceCache(tmp_path / "cache", FINGERPRINT, VERSIONS)


def _forbid_the_seeds_of_mine(mine):
    space = mine / "mine.toml"
    space.write_text(space.read_text().replace("WX * WY >= 32", "WX * WY >= 512"))


def test_an_entry_its_space_no_longer_allows_is_dropped_though_the_file_is_unchanged(
    tmp_path, monkeypatch
):
    mine, store = _store_of_mine(tmp_path, monkeypatch)
    assert store.put(entry(template="mine")) and len(store.entries()) == 1
    before = store.path.read_bytes()
    _forbid_the_seeds_of_mine(mine)
    with pytest.warns(cache.CacheWarning, match="invalid"):
        assert store.entries() == {}
    assert store.path.read_bytes() == before


def test_a_broken_or_stray_template_leaves_every_other_entry_readable(tmp_path, monkeypatch):
    """A .toml without its template, or one that is not TOML, on the template path is
    refused where it is named; the entries of the other templates are still read."""
    store = cache.DeviceCache(tmp_path / "cache", FINGERPRINT, VERSIONS)
    kept = entry()
    assert store.put(kept) and list(store.entries().values()) == [kept]
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "stray.toml").write_text((data_path("search_spaces") / "naive.toml").read_text())
    (folder / "broken.toml").write_text("[params\n")
    (folder / "broken.wgsl.j2").write_text("{% if %}")
    (folder / "deep.toml").write_text("a = " + "[" * 5000 + "]" * 5000)
    (folder / "deep.wgsl.j2").write_text("")
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(folder))
    assert {"stray", "broken", "deep"} <= set(template_names())
    assert list(store.entries().values()) == [kept]
    assert store.get(kept.key) == kept


def test_an_entry_of_a_template_broken_since_is_not_served_and_its_edits_are_seen(
    tmp_path, monkeypatch
):
    mine, store = _store_of_mine(tmp_path, monkeypatch)
    stored = entry(template="mine")
    assert store.put(stored) and store.get(stored.key) == stored
    (mine / "mine.wgsl.j2").write_text("{% if %}")
    assert store.get(stored.key) is None and store.best(stored.key.problem, True) is None
    (mine / "mine.wgsl.j2").unlink()
    assert store.get(stored.key) is None and len(store.entries()) == 1
    _forbid_the_seeds_of_mine(mine)
    with pytest.warns(cache.CacheWarning, match="invalid"):
        assert store.entries() == {}


def test_an_edit_to_an_entry_read_does_not_reach_the_next_read(tmp_path):
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    stored = entry()
    store.put(stored)
    first = store.entries()[str(stored.key)]
    first.params["BM"] = 1
    first.failures["compile"] = 3
    again = store.entries()[str(stored.key)]
    assert again.params == stored.params and again.failures == {}


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


KEY_FIELDS = ("template", "kernel", "checks", "space")  # the rest is the problem's


def changed(key, **change):
    """`key` with some of its components changed (problem fields name the problem's)."""
    own = {k: v for k, v in change.items() if k in KEY_FIELDS}
    problem = replace(key.problem, **{k: v for k, v in change.items() if k not in KEY_FIELDS})
    return replace(key, problem=problem, **own)


@pytest.mark.parametrize(
    "change",
    [
        dict(M=65),
        dict(N=32),
        dict(K=128),
        dict(checks=False),
        dict(template="tiled"),
        dict(kernel="f" * 16),
        dict(space="portable"),
    ],
)
def test_problem_or_mode_change_is_a_miss(tmp_path, change):
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    store.put(entry())
    key = changed(entry().key, **change)
    assert store.get(key) is None or "kernel" in change  # the same slot: the stored entry
    if not {"template", "kernel", "space"} & set(change):
        assert store.best(key.problem, key.checks) is None


# A variant problem (f16, B stored transposed, a batch of 4, bias and GELU fused), stored
# with blockedx (the template that computes variants); each row changes one field.
VARIANT = dict(dtype="f16", layout="nt", batch=4, epilogue="bias,gelu")


@pytest.mark.parametrize(
    "change",
    [
        dict(dtype="f32"),
        dict(accumulate="f32"),
        dict(accumulate="f16"),
        dict(layout="nn"),
        dict(layout="tt"),
        dict(batch=1),
        dict(batch=8),
        dict(shared_b=True),
        dict(epilogue="bias"),
        dict(epilogue="bias,relu"),
        dict(epilogue="alpha,bias,gelu"),
        dict(epilogue="none"),
        dict(checks=False),
        dict(space="portable"),
    ],
    ids=lambda change: " ".join(f"{k}={v}" for k, v in change.items()),
)
def test_variant_change_is_a_miss(tmp_path, change):
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    stored = entry(template="blockedx", **VARIANT)
    store.put(stored)
    assert store.get(stored.key) == stored  # the unchanged key is a hit
    assert store.best(stored.key.problem, checks=True) == stored
    key = changed(stored.key, **change)
    assert str(key) != str(stored.key)
    assert store.get(key) is None
    if "space" not in change:  # best() serves either space (lookup filters by space)
        assert store.best(key.problem, key.checks) is None


def test_changed_kernel_is_never_served(tmp_path):
    """An entry whose config renders another kernel than it was measured as is stale."""
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    stale = entry()
    stale = replace(stale, key=replace(stale.key, kernel="0" * 16))
    store.put(stale)
    assert stale.key.kernel != kernel_id(stale.config, stale.key.problem)
    assert store.best(Problem(64, 64, 64), True) is None and store.get(stale.key) is None


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
        "../../etc:0123456789abcdef:checks:f32:nn:device:1x1x1:b1:none",
        "blocked:h:checks:f32:nn:device:1x1x1:b1:none",
        "blocked:0123456789abcdef:checks:f32:nn:device:1x1x1x1:b1:none",
        "blocked:0123456789abcdef:checks:f32:nn:device:1x1x1",
        "blocked:0123456789abcdef:checks:f32:nn:anywhere:1x1x1:b1:none",
        "blocked:0123456789abcdef:maybe:f32:nn:device:1x1x1:b1:none",
        "blocked:0123456789abcdef:checks:f64:nn:device:1x1x1:b1:none",
        "blocked:0123456789abcdef:checks:f32:nn:device:032x32x32:b1:none",
        "blocked:0123456789abcdef:checks:f32:nn:device:\uff13\uff12x32x32:b1:none",
        "blocked:0123456789abcdef:checks:f32:nn:device:32x32x32:b1:none\n",
        "blocked:0123456789abcdef:checks:f32:nn:device:32x32x32:b1s:none",
        "blocked:0123456789abcdef:checks:f32:nn:device:32x32x32:b1:gelu,bias",
    ],
)
def test_malformed_keys_are_refused(key):
    with pytest.raises(ValueError):
        Key.parse(key)


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
    file = tmp_path / "a-file"
    file.write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, str(file))  # refused as --cache is, not at a write
    with pytest.raises(ArgumentError, match=r"AUTOTUNE_CACHE .* is not a folder") as raised:
        cache.default_cache_dir()
    assert raised.value.field == "AUTOTUNE_CACHE"  # (the CLI names no option for it)


# --- merging the caches of several machines (python -m autotune cache merge) ------------


def machine_file(folder, *entries, fingerprint=FINGERPRINT, versions=VERSIONS):
    """A cache file as one machine's tune leaves it."""
    store = cache.DeviceCache(folder, fingerprint, versions)
    for e in entries:
        store.put(e)
    return store.path


def read(path):
    data = json.loads(path.read_text())
    return {k: cache.Entry.from_json(k, v) for k, v in data["entries"].items()}


def test_disjoint_and_conflicting_entries_merge_to_the_fastest(tmp_path, capsys):
    shared_slow = replace(entry(64, 64, 64, median_s=3e-3, seed=0), origin="gpu-a")
    shared_fast = replace(entry(64, 64, 64, median_s=2e-3, seed=1), origin="gpu-b")
    only_a = replace(entry(128, 64, 64, median_s=1e-3), origin="gpu-a")
    only_b = entry(64, 128, 64, median_s=1e-3)  # written before entries had an origin
    a = machine_file(tmp_path / "a", shared_slow, only_a)
    b = machine_file(tmp_path / "b", shared_fast, only_b)
    before = a.read_bytes(), b.read_bytes()
    out = tmp_path / "merged.json"
    assert main(["cache", "merge", str(a), str(b), "--out", str(out)]) == 0
    merged = read(out)
    assert len(merged) == 3
    kept = merged[str(shared_fast.key)]
    assert kept.params == shared_fast.params and kept.origin == "gpu-b"
    assert merged[str(only_a.key)].origin == "gpu-a"
    assert merged[str(only_b.key)].origin == b.name  # no origin: the file it came from
    assert "1 keys with different configs" in capsys.readouterr().out
    assert (a.read_bytes(), b.read_bytes()) == before  # inputs untouched
    # the merged file serves as a device cache when named as one
    served = cache.DeviceCache(tmp_path / "served", FINGERPRINT, VERSIONS)
    served.folder.mkdir()
    served.path.write_bytes(out.read_bytes())
    assert served.best(Problem(64, 64, 64), checks=True).params == shared_fast.params


def test_out_folder_gets_the_device_file_name_and_may_be_an_input(tmp_path):
    a = machine_file(tmp_path / "a", entry(64, 64, 64, median_s=3e-3))
    b = machine_file(tmp_path / "b", entry(64, 64, 64, median_s=1e-3, seed=1))
    report = cache.merge([a, b], a.parent)  # into a's own file
    assert report.out == a and report.entries == 1 and len(report.conflicts) == 1
    assert read(a)[str(entry(64, 64, 64, seed=1).key)].median_s == 1e-3


def test_mixed_devices_are_refused_and_nothing_is_written(tmp_path, capsys):
    other = dict(FINGERPRINT, device="Other GPU")
    a = machine_file(tmp_path / "a", entry())
    b = machine_file(tmp_path / "b", entry(seed=1), fingerprint=other)
    out = tmp_path / "merged.json"
    assert main(["cache", "merge", str(a), str(b), "--out", str(out)]) == 2
    message = capsys.readouterr().err
    assert "different devices" in message and "Other GPU" in message
    assert not out.exists()
    c = machine_file(tmp_path / "c", entry(seed=1), versions=dict(VERSIONS, wgpu="9.9"))
    with pytest.raises(cache.MergeError, match="versions"):
        cache.merge([a, c], out)


@pytest.mark.parametrize(
    "content, words",
    [
        (b"not json", "Expecting value"),
        (b'{"schema": 2}', "not a cache file"),
        (b'{"schema": 99, "fingerprint": {}, "versions": {}, "entries": {}}', "schema 99"),
        (b'{"schema": 2, "fingerprint": {"a": [1]}, "versions": {}, "entries": {}}', "map"),
    ],
)
def test_a_file_that_is_not_a_cache_is_refused(tmp_path, content, words):
    good = machine_file(tmp_path / "a", entry())
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(cache.MergeError, match=words):
        cache.merge([good, bad], tmp_path / "merged.json")
    assert bad.read_bytes() == content and not (tmp_path / "merged.json").exists()


def test_invalid_entries_are_left_out_and_counted(tmp_path):
    a = machine_file(tmp_path / "a", entry(), entry(128, 64, 64))
    data = json.loads(a.read_text())
    first = next(iter(data["entries"]))
    data["entries"][first]["median_s"] = 1e308  # damaged or crafted
    a.write_text(json.dumps(data))
    report = cache.merge([a], tmp_path / "merged.json")
    assert report.entries == 1 and report.skipped == 1
    assert first not in read(report.out)


def test_out_that_exists_must_be_an_input(tmp_path, capsys):
    a = machine_file(tmp_path / "a", entry())
    out = tmp_path / "precious.json"
    out.write_text("{}")
    assert main(["cache", "merge", str(a), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == "{}"


def test_merge_out_with_a_nul_character_is_refused(tmp_path):
    a = machine_file(tmp_path / "a", entry())
    for out in (tmp_path / "m\0.json", f"{tmp_path}/d\0/m.json"):
        with pytest.raises(cache.MergeError, match="contains a NUL character"):
            cache.merge([a], out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_a_tuned_entry_replaces_an_estimate_and_an_estimate_never_a_tuned_one(tmp_path):
    from entries import seed_entry

    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    problem = Problem(16, 16, 16)
    blocked = load_space("blocked").seed_configs(problem)
    fast, slow = (seed_entry(problem, config=c) for c in blocked[-2:])
    assert store.put(replace(fast, median_s=1e-6, estimated=True))
    assert store.put(replace(slow, median_s=1e-3))  # slower, but tuned: it replaces
    assert not store.put(replace(fast, median_s=1e-7, estimated=True))  # faster, estimated
    (only,) = store.entries().values()
    assert not only.estimated and only.params == slow.params


def test_a_file_keeps_its_newest_estimates_only(tmp_path, monkeypatch):
    """Shapes that change on every call must not grow the file without end; tuned entries
    are never dropped for an estimate."""
    from entries import seed_entry

    monkeypatch.setattr(cache, "MAX_ESTIMATES", 3)
    store = cache.DeviceCache(tmp_path, FINGERPRINT, VERSIONS)
    store.put(seed_entry(Problem(16, 16, 16)))
    for m in range(1, 6):
        date = f"2026-12-01T00:00:0{m}Z"
        store.put(seed_entry(Problem(m, 16, 16), estimated=True, date=date))
    kept = sorted(e.key.problem.M for e in store.entries().values() if e.estimated)
    assert kept == [3, 4, 5] and len(store.entries()) == 4
