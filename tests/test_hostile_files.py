"""Hostile files and folders: special files, uncreatable folders, odd locks, symlinks.

Every file autotune reads (cache files, --shapes-from and --model files, merge inputs) is
a regular file read with a bounded read: /dev/zero and a FIFO report a size of 0, so a
size check bounds nothing, and opening a FIFO blocks. A folder that cannot be made, or a
lock that cannot be taken, is an error naming its argument (exit 2 on the command line),
never a traceback or a hang. Each test here runs under a deadline, and whatever touches
/dev/zero runs in a child process with a memory limit: a regression fails, it does not
hang the suite or fill the machine's memory.
"""

import fcntl
import json
import os
import resource
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from entries import seed_entry

import autotune
from autotune import cache
from autotune.__main__ import main
from autotune.arguments import ArgumentError
from autotune.data import data_path
from autotune.device import versions
from autotune.export import ExportWarning
from autotune.files import FileRefused, read_limited
from autotune.problem import Problem, ProblemError, problems_from_file

ROOT = Path(__file__).parent.parent
PROBLEM = autotune.Problem(64, 64, 64)
MEMORY_LIMIT = 3 * 2**30  # a child reading /dev/zero without bound fails at this size


class Blocked(Exception):
    """A test ran past its deadline (not an OSError, which the code under test may catch)."""


@pytest.fixture(autouse=True)
def deadline():
    """Fails a test that blocks (e.g. on opening a FIFO) instead of hanging the suite."""

    def expire(signum, frame):
        raise Blocked("blocked for 60 s: a special file read without bound?")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def run_cli(*args, cwd):
    """`python -m autotune ARGS` in a child process, limited in time and memory."""

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(
        [sys.executable, "-m", "autotune", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=45,
        cwd=cwd,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        preexec_fn=limit_memory,
    )


def assert_refused(done, option: str, *words: str):
    """Exit 2 with one line naming the option (and `words`), no traceback."""
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"autotune: error: argument {option}: "), done.stderr
    assert all(word in done.stderr for word in words), done.stderr


def store_for(folder, gpu=None):
    fingerprint = gpu.fingerprint.as_dict() if gpu else {"device": "test", "backend": "none"}
    return cache.DeviceCache(folder, fingerprint, versions())


def good_entry():
    return seed_entry(PROBLEM)


def a_cache_file(folder) -> Path:
    store = store_for(folder)
    store.put(good_entry())
    return store.path


def fifo(path) -> Path:
    os.mkfifo(path)
    return Path(path)


def zero_link(path) -> Path:
    Path(path).symlink_to("/dev/zero")
    return Path(path)


SPECIAL = {"FIFO": fifo, "symlink to /dev/zero": zero_link}


# --- folders that cannot be made -------------------------------------------------------


@pytest.fixture(params=["/proc/1", "under a file"])
def uncreatable(request, tmp_path) -> Path:
    """A folder path that cannot be made, even by root: under /proc/1, or under a file."""
    if request.param == "/proc/1":
        if not Path("/proc/1").is_dir():
            pytest.skip("no /proc on this system")
        folder = Path("/proc/1/nope")
    else:
        (tmp_path / "file").write_text("")
        folder = tmp_path / "file" / "sub"
    with pytest.raises(OSError):
        folder.mkdir(parents=True)
    with pytest.raises(OSError):  # nor a file next to it
        (folder.parent / "x.json").write_text("")
    return folder


def test_tune_into_an_uncreatable_cache_folder_names_the_argument(uncreatable):
    with pytest.raises(ArgumentError) as caught:
        autotune.tune(4, 4, 4, trials=1, cache_dir=uncreatable)
    assert caught.value.field == "cache_dir" and str(uncreatable) in str(caught.value)


@pytest.mark.parametrize(
    "command, option",
    [
        (["tune", "--shape", "32x32x32", "--cache"], "--cache"),
        (["export", "--shape", "32x32x32", "--out"], "--out"),
    ],
)
def test_uncreatable_folder_exits_2_naming_the_option(uncreatable, capsys, command, option):
    assert main([*command, str(uncreatable)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"autotune: error: argument {option}: ")
    assert str(uncreatable) in err


def test_export_into_an_uncreatable_folder_names_the_argument(gpu, uncreatable):
    kernel = autotune.lookup(4, 4, 4)
    with pytest.raises(autotune.ExportError) as caught:
        autotune.export(kernel, uncreatable)
    assert caught.value.field == "out_dir" and str(uncreatable) in str(caught.value)


@pytest.mark.parametrize("where", ["in its parent", "in itself"])
def test_merge_into_an_uncreatable_folder_is_refused_at_once(tmp_path, uncreatable, where):
    # e.g. --out /proc/1/x.json: its lock could not be made and the merge waited forever
    out = (uncreatable.parent if where == "in its parent" else uncreatable) / "x.json"
    done = run_cli("cache", "merge", a_cache_file(tmp_path / "a"), "--out", out, cwd=tmp_path)
    assert_refused(done, "--out")


def test_merge_and_export_refuse_an_empty_out(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # '' wrote the merged file here
    a = a_cache_file(tmp_path / "a")
    with pytest.raises(cache.MergeError) as caught:
        cache.merge([a], "")
    assert caught.value.field == "out"
    assert main(["cache", "merge", str(a), "--out", ""]) == 2
    assert main(["export", "--shape", "4x4x4", "--out", ""]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(e.startswith("autotune: error: argument --out: ") for e in err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


# --- locks ----------------------------------------------------------------------------


def test_a_lock_held_too_long_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "LOCK_TIMEOUT_S", 0.3)
    store = store_for(tmp_path)
    lock = store.path.with_name(store.path.name + ".lock")
    with open(lock, "w") as holder:  # another process's lock, as the OS sees it
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(cache.CacheError, match="not released") as caught:
            store.put(good_entry())
        assert caught.value.field == "cache_dir" and str(lock) in str(caught.value)
        source = a_cache_file(tmp_path / "a")
        with pytest.raises(cache.MergeError, match="not released") as caught:
            cache.merge([source], store.path)
        assert caught.value.field == "out"
    assert not store.path.exists()


def _symlink_out(lock: Path, tmp_path: Path):
    (tmp_path / "outside.txt").write_text("precious")
    lock.symlink_to(tmp_path / "outside.txt")


LOCKS = {
    "symlink": _symlink_out,
    "dangling symlink": lambda lock, tmp_path: lock.symlink_to(tmp_path / "nowhere"),
    "folder": lambda lock, tmp_path: lock.mkdir(),
}


@pytest.mark.parametrize("kind", list(LOCKS))
def test_a_lock_that_is_not_a_file_is_refused_by_name(tmp_path, kind):
    folder = tmp_path / "cache"
    folder.mkdir()
    store = store_for(folder)
    lock = store.path.with_name(store.path.name + ".lock")
    LOCKS[kind](lock, tmp_path)
    with pytest.raises(cache.CacheError, match="cannot be used") as caught:
        store.put(good_entry())
    assert caught.value.field == "cache_dir" and str(lock) in str(caught.value)
    assert not store.path.exists()
    if kind == "symlink":
        assert (tmp_path / "outside.txt").read_text() == "precious"


def test_tune_with_a_symlinked_lock_stops_before_its_first_trial(gpu, tmp_path, capsys):
    folder = tmp_path / "cache"
    folder.mkdir()
    lock = store_for(folder, gpu).path
    lock = lock.with_name(lock.name + ".lock")
    _symlink_out(lock, tmp_path)
    trials = []
    with pytest.raises(cache.CacheError) as caught:
        autotune.tune(4, 4, 4, trials=2, cache_dir=folder, on_trial=trials.append)
    assert caught.value.field == "cache_dir" and str(lock) in str(caught.value)
    assert trials == []
    assert main(["tune", "--shape", "4x4x4", "--trials", "2", "--cache", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autotune: error: argument --cache: ")
    assert str(lock) in err and (tmp_path / "outside.txt").read_text() == "precious"


# --- special files --------------------------------------------------------------------


def test_read_limited_reads_regular_files_up_to_the_limit(tmp_path):
    (tmp_path / "exact").write_bytes(b"x" * 100)
    (tmp_path / "link").symlink_to(tmp_path / "exact")  # symlinks are resolved
    assert read_limited(tmp_path / "exact", 100) == read_limited(tmp_path / "link", 100)
    with pytest.raises(FileRefused, match="larger than 99 bytes"):
        read_limited(tmp_path / "exact", 99)
    with pytest.raises(FileRefused, match="a FIFO"):
        read_limited(fifo(tmp_path / "fifo"), 100)
    with pytest.raises(FileRefused, match="a folder"):
        read_limited(tmp_path, 100)
    with pytest.raises(FileRefused, match="a character device"):
        read_limited(zero_link(tmp_path / "zero"), 100)  # refused before it is read
    with pytest.raises(FileNotFoundError):
        read_limited(tmp_path / "nope", 100)


@pytest.mark.parametrize("kind", ["FIFO", "folder"])
def test_a_cache_file_that_is_not_a_regular_file_is_moved_aside(tmp_path, kind):
    store = store_for(tmp_path)
    fifo(store.path) if kind == "FIFO" else store.path.mkdir()
    with pytest.warns(cache.CacheWarning, match="not a regular file.*moved to"):
        assert store.entries() == {}
    (aside,) = tmp_path.glob("*.bad-*")
    assert not store.path.exists() and not aside.is_file() and not aside.is_symlink()
    store.put(good_entry())  # and the cache starts again, empty
    assert list(store.entries()) == [str(good_entry().key)]


@pytest.mark.parametrize("kind", list(SPECIAL))
def test_lookup_with_a_special_cache_file_moves_it_aside(gpu, tmp_path, kind):
    # a FIFO hung lookup; a symlink to /dev/zero read until memory ran out
    folder = tmp_path / "cache"
    folder.mkdir()
    path = SPECIAL[kind](store_for(folder, gpu).path)
    # (untimed: an estimate would be written to a new file at the same path)
    done = run_cli("lookup", "--shape", "4x4x4", "--cache", folder, "--no-estimate", cwd=tmp_path)
    assert done.returncode == 0 and "not a regular file" in done.stderr, done.stderr
    (aside,) = folder.glob("*.bad-*")
    assert not path.exists() and not path.is_symlink() and not aside.is_file()


CLI_READS = {
    "--shapes-from /dev/zero": (["tune", "--shapes-from", "ZERO"], "--shapes-from"),
    "--shapes-from FIFO": (["tune", "--shapes-from", "FIFO"], "--shapes-from"),
    "--model FIFO": (["tune", "--model", "FIFO"], "--model"),
    "--model /dev/zero": (["tune", "--model", "ZERO"], "--model"),
    "merge /dev/zero": (["cache", "merge", "ZERO", "--out", "m.json"], "FILE"),
    "merge FIFO": (["cache", "merge", "GOOD", "FIFO", "--out", "m.json"], "FILE"),
}


@pytest.mark.parametrize("case", list(CLI_READS))
def test_special_files_given_to_the_cli_are_refused(tmp_path, case):
    args, option = CLI_READS[case]
    paths = {
        "ZERO": "/dev/zero",
        "FIFO": fifo(tmp_path / "problems.json"),
        "GOOD": a_cache_file(tmp_path / "a"),
    }
    done = run_cli(*(paths.get(a, a) for a in args), cwd=tmp_path)
    assert_refused(done, option, "not a regular file")
    assert not (tmp_path / "m.json").exists()


def test_a_fifo_problem_file_is_refused(tmp_path):
    # (/dev/zero only in a child process, CLI_READS above: a regression would fill memory)
    with pytest.raises(ProblemError, match="a FIFO"):
        problems_from_file(fifo(tmp_path / "problems.json"))


def test_problem_files_are_read_through_symlinks_and_up_to_the_limit(tmp_path, monkeypatch):
    text = json.dumps([{"shape": "4x4x4"}])
    (tmp_path / "real.json").write_text(text)
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert problems_from_file(tmp_path / "link.json") == [autotune.Problem(4, 4, 4)]
    monkeypatch.setattr("autotune.problem.MAX_PROBLEMS_FILE_BYTES", len(text) - 1)
    with pytest.raises(ProblemError, match=f"larger than {len(text) - 1} bytes"):
        problems_from_file(tmp_path / "link.json")


# --- export: no writing through symlinks, and what it replaces is said --------------


@pytest.fixture(scope="module")
def kernel(gpu):
    return autotune.lookup(4, 4, 4)


@pytest.mark.parametrize("kind", ["symlink", "folder", "FIFO"])
def test_export_refuses_to_write_through_what_is_not_a_file(kernel, tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "outside.txt").write_text("precious")
    target = out / "gemm.js"
    if kind == "symlink":
        target.symlink_to(tmp_path / "outside.txt")
    elif kind == "folder":
        target.mkdir()
    else:
        fifo(target)
    with pytest.raises(autotune.ExportError, match="not a regular file") as caught:
        autotune.export(kernel, out, name="gemm")
    assert caught.value.field == "out_dir" and str(target) in str(caught.value)
    assert (tmp_path / "outside.txt").read_text() == "precious"
    assert [p.name for p in out.iterdir()] == ["gemm.js"]  # nothing written, nothing left


def test_export_says_which_files_it_replaces(kernel, tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)  # none the first time
        first = autotune.export(kernel, tmp_path, name="gemm")
    first["json"].write_text("an older bundle")
    with pytest.warns(ExportWarning, match="replaced") as caught:
        again = autotune.export(kernel, tmp_path, name="gemm")
    assert again == first and first["json"].read_text().startswith("{")
    assert all(str(path) in str(caught[0].message) for path in first.values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemm.js", "gemm.json", "gemm.wgsl"]
    assert main(["export", "--shape", "4x4x4", "--out", str(tmp_path)]) == 0
    main(["export", "--shape", "4x4x4", "--out", str(tmp_path)])
    assert "replaced" in capsys.readouterr().out


def test_a_template_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path, monkeypatch):
    """One's own template folder: a FIFO named as a template is refused at once."""
    from autotune.render import render
    from autotune.space import Config

    (tmp_path / "mine.toml").write_text((data_path("search_spaces") / "naive.toml").read_text())
    os.mkfifo(tmp_path / "mine.wgsl.j2")
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    signal.alarm(30)  # a hang fails the test rather than the run
    try:
        with pytest.raises(ValueError, match="FIFO"):
            render(Config.make("mine", {"WX": 16, "WY": 16}), Problem(8, 8, 8))
    finally:
        signal.alarm(0)


def test_a_malformed_space_of_one_s_own_is_one_line_naming_template(tmp_path, monkeypatch, capsys):
    (tmp_path / "bad.toml").write_text("params = 3\n")
    (tmp_path / "bad.wgsl.j2").write_text("")
    monkeypatch.setenv("AUTOTUNE_TEMPLATE_PATH", str(tmp_path))
    argv = ["tune", "--shape", "4x4x4", "--template", "bad", "--cache", str(tmp_path / "c")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("autotune: error: argument --template:") and err.count("\n") == 1
