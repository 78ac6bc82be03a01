"""Hostile and damaged files: refused, with a warning, and without side effects.

A cache file that is not one of ours (not JSON, nested a thousand deep, too large, unknown
fields, another device's) is moved aside, byte for byte, and the cache starts empty. An
entry with anything unexpected (unknown fields, wrong types, 1e308 or 10**400, a template
name that is a path or Jinja, parameters that are strings of WGSL) is skipped, the file
left as it is. Nothing from a file reaches Jinja, the file system or WGSL: rendering takes
integers and known template names only.
"""

import json

import optuna
import pytest
from entries import seed_entry

import autotune
from autotune import cache
from autotune.device import versions
from autotune.evaluate import Outcome
from autotune.lookup import forget
from autotune.measure import Measurement
from autotune.problem import Problem
from autotune.render import kernel_id, render
from autotune.space import Config, SpaceError, load_space
from autotune.study import Study

PROBLEM = Problem(64, 64, 64)


def store_for(folder, gpu=None):
    fingerprint = gpu.fingerprint.as_dict() if gpu else {"device": "test", "backend": "none"}
    return cache.DeviceCache(folder, fingerprint, versions())


def good_entry(problem=PROBLEM, template="naive"):
    return seed_entry(problem, template)


def files(folder):
    return sorted(p.name for p in folder.iterdir())


BAD_FILES = {
    "not json": "{'schema': 1}",
    "nested a thousand deep": "[" * 5000 + "]" * 5000,
    "unknown top-level field": "EXTRA",
    "other versions": "VERSIONS",
    "entries not an object": "ENTRIES",
    "binary": b"\xff\xfe\x00garbage",
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_crafted_file_is_moved_aside_untouched(tmp_path, name):
    store = store_for(tmp_path)
    store.put(good_entry())
    data = json.loads(store.path.read_text())
    text = BAD_FILES[name]
    if text == "EXTRA":
        text = json.dumps(data | {"__class__": "os.system"})
    elif text == "VERSIONS":
        text = json.dumps(data | {"versions": {"wgpu": "0.0.1"}})
    elif text == "ENTRIES":
        text = json.dumps(data | {"entries": ["../../etc/passwd"]})
    raw = text if isinstance(text, bytes) else text.encode()
    store.path.write_bytes(raw)
    with pytest.warns(cache.CacheWarning, match="moved to"):
        assert store.entries() == {}
    (aside,) = tmp_path.glob("*.bad-*")
    assert aside.read_bytes() == raw
    assert files(tmp_path) == sorted([aside.name, store.path.name + ".lock"])


def test_oversized_file_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "MAX_FILE_BYTES", 1000)
    store = store_for(tmp_path)
    store.path.write_text(json.dumps({"schema": 1, "padding": "x" * 2000}))
    with pytest.warns(cache.CacheWarning, match="larger than 1000 bytes"):
        assert store.entries() == {}


def mangle_key(template=None, digest=None):
    def change(key, value):
        parts = key.split(":")
        parts[0] = template if template is not None else parts[0]
        parts[1] = digest if digest is not None else parts[1]
        new = ":".join(parts)
        return new, dict(value, key=new)

    return change


def mangle_shape(shape):
    """The key with another spelling of its shape (64x64x64 is PROBLEM's)."""

    def change(key, value):
        new = key.replace(":64x64x64", f":{shape}")
        return new, dict(value, key=new)

    return change


def mangle(**fields):
    return lambda key, value: (key, dict(value, **fields))


BAD_ENTRIES = {
    "unknown field": mangle(shell="rm -rf /"),
    "median 1e308": mangle(median_s=1e308),
    "gflops 10**400": mangle(gflops=10**400),
    "trials 10**400": mangle(trials=10**400),
    "median NaN": mangle(median_s=float("nan")),
    "median a string": mangle(median_s="0.001"),
    "params a string": mangle(params="{{7*7}}"),
    "param a WGSL string": mangle(params={"WX": "16u; } fn evil() {", "WY": 16}),
    "param a Jinja string": mangle(params={"WX": "{{ 7*7 }}", "WY": 16}),
    "param a float": mangle(params={"WX": 16.0, "WY": 16}),
    "param a bool": mangle(params={"WX": True, "WY": 16}),
    "shape with a leading zero": mangle_shape("064x64x64"),
    "shape in full-width digits": mangle_shape("６４x64x64"),
    "shape in Arabic-Indic digits": mangle_shape("64x٦٤x64"),
    "extra param": mangle(params={"WX": 16, "WY": 16, "EVIL": 1}),
    "param value not in the space": mangle(params={"WX": 48, "WY": 16}),
    "date with WGSL after a newline": mangle(date="2026\n@compute fn main() {}"),
    "date with a trailing newline": mangle(date="2026-01-02T03:04:05Z\n"),
    "origin with a trailing newline": mangle(origin="host\n"),
    "failures of an unknown reason": mangle(failures={"{{7*7}}": 1}),
    "template a path": mangle_key(template="../../etc/passwd"),
    "template Jinja": mangle_key(template="{{7*7}}"),
    "hash not hex": mangle_key(digest="{{7*7}}"),
}


@pytest.mark.parametrize("name", list(BAD_ENTRIES))
def test_crafted_entry_is_skipped_and_the_file_left_alone(tmp_path, name):
    store = store_for(tmp_path)
    entry = good_entry()
    store.put(entry)
    data = json.loads(store.path.read_text())
    key, value = BAD_ENTRIES[name](str(entry.key), data["entries"].pop(str(entry.key)))
    data["entries"][key] = value
    text = json.dumps(data)  # (json writes NaN and 10**400 as Python reads them back)
    store.path.write_text(text)
    with pytest.warns(cache.CacheWarning, match="ignored"):
        assert store.entries() == {}
    assert store.path.read_text() == text and files(tmp_path) == [
        store.path.name,
        store.path.name + ".lock",
    ]


def test_each_problem_of_a_file_is_warned_once_per_process(tmp_path):
    """One lookup or tune reads the cache file several times (the exact entry, the
    nearest shapes, the stored result): each bad entry is reported once."""
    import warnings

    store = store_for(tmp_path)
    entry = good_entry()
    store.put(entry)
    data = json.loads(store.path.read_text())
    data["entries"][str(entry.key)]["median_s"] = "fast"
    store.path.write_text(json.dumps(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.entries() == {} and store.get(entry.key) is None
        assert store.best(PROBLEM, True) is None
        assert store_for(tmp_path).entries() == {}  # another reader of the same file
    assert [str(w.message).count("median_s") for w in caught] == [1]


def test_lookup_never_serves_a_stale_or_no_longer_valid_entry(gpu, tmp_path, monkeypatch):
    # a user template (a copy of naive) whose file changes after tuning
    mine = tmp_path / "templates"
    mine.mkdir()
    source = load_space("naive")
    (mine / "mine.toml").write_text((cache.data_path("search_spaces") / "naive.toml").read_text())
    wgsl = (cache.data_path("templates") / "naive.wgsl.j2").read_text()
    (mine / "mine.wgsl.j2").write_text(wgsl)
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(mine))
    store = store_for(tmp_path / "cache", gpu)
    entry = good_entry(template="mine")
    store.put(entry)
    assert autotune.lookup(64, 64, 64, cache_dir=tmp_path / "cache").source == "exact"
    (mine / "mine.wgsl.j2").write_text(wgsl + "// edited\n")
    assert kernel_id(entry.config, PROBLEM) != entry.key.kernel
    assert autotune.lookup(64, 64, 64, cache_dir=tmp_path / "cache").source != "exact"
    # a config the space no longer allows (its kernel unchanged): skipped with a warning
    (mine / "mine.wgsl.j2").write_text(wgsl)
    toml = (mine / "mine.toml").read_text().replace("WX = [8, 16, 32, 64]", "WX = [8, 32, 64]")
    (mine / "mine.toml").write_text(toml)
    assert source.params["WX"] == (8, 16, 32, 64) and entry.params["WX"] == 16
    forget()  # as a new process would: no memo of the lookup above
    with pytest.warns(cache.CacheWarning, match="WX=16 is not one of"):
        assert autotune.lookup(64, 64, 64, cache_dir=tmp_path / "cache").source != "exact"


@pytest.mark.parametrize(
    "template, params, words",
    [
        ("../../etc/passwd", {"WX": 16}, "not an identifier"),
        ("{{7*7}}", {"WX": 16}, "not an identifier"),
        ("naive", {"WX": "16", "WY": 16}, "WX must be an integer"),
        ("naive", {"WX": 16.0, "WY": 16}, "WX must be an integer"),
        ("naive", {"WX": True, "WY": 16}, "WX must be an integer"),
        ("naive", {"WX}}{{": 16}, "not an identifier"),
    ],
)
def test_configs_take_integers_and_names_only(template, params, words):
    with pytest.raises(SpaceError, match=words):
        Config.make(template, params)


@pytest.mark.parametrize(
    "config",
    [
        Config("naive", (("WX", "16u; } fn evil() {"), ("WY", 16))),
        Config("naive", (("WX", 16), ("WY", 16), ("EVIL", 1))),
        Config("nosuch", (("WX", 16),)),
    ],
    ids=["string parameter", "extra parameter", "unknown template"],
)
def test_render_refuses_anything_but_a_valid_config(config):
    with pytest.raises(ValueError):
        render(config, PROBLEM)


def test_shared_study_with_crafted_trials_is_not_trusted():
    """Another user's trial in a shared storage: a config that is a path, or a
    measurement that is not numbers, is passed over, never rendered or cached."""
    study = Study("shared", None, optuna.samplers.RandomSampler(), PROBLEM, ["naive"])
    for attrs in (
        {"template": "../../etc/passwd", "params": {"WX": 16}},
        {"template": "naive", "params": {"WX": "{{7*7}}", "WY": 16}},
        {"template": "naive", "params": {"WX": 16, "WY": 16}, "error": 1e308},
        {"template": "naive", "params": {"WX": 16, "WY": 16}, "error": 10**400},
        {"template": "naive", "params": {"WX": 16, "WY": 16}, "compile_s": 10**400},
    ):
        trial = optuna.trial.create_trial(
            value=1e-9,
            params={},
            distributions={},
            user_attrs=attrs | {"measurement": {"median_s": 1e-9, "p20_s": 1e-9, "p80_s": 1e-9,
                                "method": "wall", "repeats": 1, "passes": 1,
                                "wall_median_s": 1e-9}},
        )  # fmt: skip
        study.optuna.add_trial(trial)
    assert study.best(None) is None
    seconds = Measurement(1e-3, 1e-3, 1e-3, "wall", 1, 3, 1e-3)
    own = Outcome(Config.make("naive", {"WX": 16, "WY": 16}), seconds)
    assert study.best(own) is own
