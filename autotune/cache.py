"""Cache: the best verified kernel per device and problem, as JSON files on disk.

One file per device: fingerprint + software versions + format name it, so another GPU,
driver or wgpu build reads another file. Inside, each entry is keyed by the components
of autotune/key.py (template, kernel identity, check mode, problem, space); a change in
any of them is a miss. One entry per slot (the key without the kernel identity): the
fastest stays, and an entry whose config no longer renders the kernel it was measured as
is stale and never served.
Writes are atomic (temp file + os.replace) and happen under a file lock, re-reading the
file first, so concurrent tuners lose nothing. A file that is corrupt or has a newer
schema is moved aside with a warning and treated as empty.
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import hashlib
import json
import os
import re
import socket
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import filelock
import platformdirs

from .arguments import ArgumentError, check_folder, shown
from .data import data_path, in_checkout
from .evaluate import REASONS
from .files import FileRefused, read_limited, write_whole
from .key import Key
from .measure import METHODS
from .problem import Problem
from .render import TEMPLATE_ERRORS, kernel_id, template_stamp
from .space import Config, SpaceError, load_space, template_names

SCHEMA = 2  # 2: keys name the kernel identity (key.py) rather than the template text
CACHE_ENV = "AUTOTUNE_CACHE"


class CacheWarning(UserWarning):
    """A cache file could not be used (corrupt, newer schema) and was set aside."""


_READ: dict[str, tuple] = {}  # path -> (the file's and templates' stamp, its valid entries)
MAX_FILES_READ = 64
_WARNED: set[str] = set()  # the CacheWarnings shown: one lookup or tune reads a file often


def warn_once(message: str, stacklevel: int = 2) -> None:
    """Warn with `message` (which names the file and the cause) once per process."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, CacheWarning, stacklevel=stacklevel + 1)


class CacheError(ArgumentError):
    """A cache file cannot be written (its lock cannot be taken); `field` names the
    argument that chose its folder."""


def default_cache_dir() -> Path:
    """$AUTOTUNE_CACHE, else the checkout's cache/ (the shipped database), else the
    user's cache folder."""
    if os.environ.get(CACHE_ENV):
        # checked as --cache is: a file there would fail only at the first write
        return check_folder(CACHE_ENV, os.environ[CACHE_ENV], writable=False)
    if in_checkout():
        return data_path("cache")
    return Path(platformdirs.user_cache_dir("autotune"))


def lookup_folders(cache_dir=None) -> list[Path]:
    """The folders lookup reads, in order: `cache_dir` (default: default_cache_dir()),
    then the shipped cache/ where it is another folder."""
    folders = [Path(cache_dir) if cache_dir else default_cache_dir()]
    shipped = shipped_cache_dir()
    if shipped.resolve() != folders[0].resolve():
        folders.append(shipped)
    return folders


def shipped_cache_dir() -> Path:
    return data_path("cache")


@dataclass(frozen=True)
class Entry:
    """The best verified config found for one key, and how it measured."""

    key: Key
    params: dict  # the config's parameters
    median_s: float  # seconds per dispatch
    p20_s: float
    p80_s: float
    method: str  # "timestamp" or "wall"
    gflops: float
    error: float  # relative error at verification
    baseline_s: float | None = None  # the tutorial tiled 16x16 kernel on this device
    trials: int = 0
    failures: dict = field(default_factory=dict)  # reason -> count
    tuning_s: float = 0.0
    date: str = ""
    origin: str = ""  # where it was measured: the tuning machine's host name, or a file
    # Chosen by lookup among a few configs timed at this shape, not searched: a tuned
    # entry of the problem replaces it in its slot and is served before it.
    estimated: bool = False

    @property
    def config(self) -> Config:
        return Config.make(self.key.template, self.params)

    @classmethod
    def measured(cls, key: Key, config: Config, measurement, error: float, **fields) -> Entry:
        """The entry of `config` measured on this machine now (a measure.Measurement and
        its verification error); `fields` fill the rest (trials, tuning_s, ...)."""
        m = measurement
        return cls(
            key=key,
            params=config.as_dict(),
            median_s=m.median_s,
            p20_s=m.p20_s,
            p80_s=m.p80_s,
            method=m.method,
            gflops=m.gflops(key.problem.flops),
            error=error,
            date=today(),
            origin=this_machine(),
            **fields,
        )

    def to_json(self) -> dict:
        data = asdict(self)
        data["key"] = str(self.key)
        return data

    @classmethod
    def from_json(cls, text_key: str, data: object) -> Entry:
        """Parse and validate one entry; raise ValueError on anything unexpected.

        Only known fields of the right types and within plausible ranges pass; the
        template must be a known one and the config valid in its space, so nothing from
        a file reaches Jinja, the file system or WGSL other than checked integers and a
        known template's name.
        """
        if not isinstance(data, dict):
            raise ValueError("entry is not an object")
        unknown = set(data) - _FIELDS
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)[:5]}")
        key = Key.parse(text_key)
        if data.get("key") != text_key:
            raise ValueError("entry key does not match its position")
        params = data.get("params")
        if not isinstance(params, dict) or not all(
            isinstance(k, str) and type(v) is int for k, v in params.items()
        ):
            raise ValueError("params must map names to integers")
        config = Config.make(key.template, params)
        reason = load_space(key.template).why_invalid(config, key.problem)
        if reason:
            raise ValueError(f"config {config} is invalid: {reason}")
        numbers = {name: _number(name, data.get(name, 0.0)) for name in _RANGES}
        baseline = data.get("baseline_s")
        if baseline is not None:
            baseline = _number("baseline_s", baseline)
        method = data.get("method")
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}")
        failures = data.get("failures", {})
        if not isinstance(failures, dict) or not all(
            k in REASONS and type(v) is int and 0 <= v <= MAX_COUNT for k, v in failures.items()
        ):
            raise ValueError(f"failures must map reasons ({', '.join(REASONS)}) to counts")
        trials = data.get("trials", 0)
        if type(trials) is not int or not 0 <= trials <= MAX_COUNT:
            raise ValueError(f"trials must be an integer from 0 to {MAX_COUNT}")
        date = data.get("date", "")
        if not isinstance(date, str) or not _DATE.fullmatch(date):
            raise ValueError("date must be empty or YYYY-MM-DDTHH:MM:SSZ")
        estimated = data.get("estimated", False)
        if type(estimated) is not bool:
            raise ValueError("estimated must be true or false")
        origin = data.get("origin", "")
        if not isinstance(origin, str) or not _ORIGIN.fullmatch(origin):
            raise ValueError("origin must be up to 200 letters, digits and . _ : @ / -")
        return cls(
            key=key,
            params=config.as_dict(),
            method=method,
            baseline_s=baseline,
            failures=dict(failures),
            trials=trials,
            date=date,
            origin=origin,
            estimated=estimated,
            **numbers,
        )


# Entry fields -> the range a real measurement lies in; outside it a file is damaged or
# crafted (1e308 seconds, 10**400 GFLOP/s).
_RANGES = {
    "median_s": (1e-12, 3600.0),
    "p20_s": (0.0, 3600.0),
    "p80_s": (0.0, 3600.0),
    "gflops": (0.0, 1e9),
    "error": (0.0, 1.0),
    "tuning_s": (0.0, 1e8),
}
_BASELINE_RANGE = (1e-12, 3600.0)
_FIELDS = {f.name for f in fields(Entry)}
MAX_COUNT = 10**9
# Whole-string patterns, used with fullmatch: `$` also matches before a final "\n", and
# a date or origin with a line break would end the comment an export writes it into.
_DATE = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)?", re.ASCII)
_ORIGIN = re.compile(r"[\w.:@/-]{0,200}", re.ASCII)
MAX_FILE_BYTES = 64 * 2**20  # ~100,000 entries; a larger file is not one of ours
# A write holds its lock for well under a second (a 64 MiB file: a few); a lock held far
# longer is stuck or not ours, and waiting on it without end would hang the tuner.
LOCK_TIMEOUT_S = 120.0


def _number(name: str, value: object) -> float:
    low, high = _RANGES.get(name, _BASELINE_RANGE)
    # ints compare exactly (no float conversion that 10**400 would overflow)
    if type(value) not in (int, float) or not low <= value <= high:
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}")
    return float(value)


def device_file_name(fingerprint: dict, versions: dict) -> str:
    """<device-backend>-<hash of fingerprint, versions, schema>.json"""
    identity = json.dumps(
        {"fingerprint": fingerprint, "versions": versions, "schema": SCHEMA}, sort_keys=True
    )
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    slug = "".join(
        c if c.isalnum() else "-"
        for c in f"{fingerprint.get('device', '')}-{fingerprint.get('backend', '')}".lower()
    )
    return f"{slug.strip('-')[:60]}-{digest}.json"


class DeviceCache:
    """The cache file of one device (fingerprint + versions) in one folder."""

    def __init__(self, folder: Path | str, fingerprint: dict, versions: dict):
        self.folder = Path(folder)
        self.fingerprint = dict(fingerprint)
        self.versions = dict(versions)
        self.path = self.folder / device_file_name(self.fingerprint, self.versions)

    @classmethod
    def at(cls, path: Path, header: dict) -> DeviceCache:
        """The cache of the file at `path`, whatever its name, its header (read_header)
        read already: a merge input, another machine's file."""
        store = cls(path.parent, header["fingerprint"], header["versions"])
        store.path = path
        return store

    # --- reading ---------------------------------------------------------------------

    def entries(self) -> dict[str, Entry]:
        """All valid entries, current or stale (is_current tells; only current entries
        are served as exact, a stale one's config may still be tried as a neighbour).

        Remembered per file until its bytes or a template's files change: one lookup
        reads the file several times, and checking every entry against its space costs
        more than the lookup's own work. A file set aside or unreadable is never
        remembered, so the next read tries it again."""
        raw = self._read()
        if raw is None:
            return {}
        stamp = (hashlib.sha256(raw).digest(), self._identity, _templates_stamp())
        known = _READ.get(str(self.path))
        if known is None or known[0] != stamp:
            data = self._parse(raw)
            if data is None:
                return {}
            if len(_READ) >= MAX_FILES_READ:
                _READ.clear()
            _READ[str(self.path)] = known = (stamp, self._valid_entries(data))
        return {text: _copied(entry) for text, entry in known[1].items()}

    @property
    def _identity(self) -> str:
        return json.dumps([self.fingerprint, self.versions], sort_keys=True)

    def _valid_entries(self, data: dict) -> dict[str, Entry]:
        entries = {}
        for text_key, value in data["entries"].items():
            try:
                entries[text_key] = Entry.from_json(text_key, value)
            except (ValueError, SpaceError) as error:
                warn_once(f"{self.path}: entry {text_key[:80]!r} ignored: {error}", stacklevel=3)
        return entries

    def get(self, key: Key) -> Entry | None:
        """The current entry of `key`'s slot, if any."""
        return next(
            (e for e in self.entries().values() if e.key.slot == key.slot and is_current(e)), None
        )

    def best(self, problem: Problem, checks: bool, accept=None) -> Entry | None:
        """The fastest current entry over all templates for this exact problem and mode
        (among those `accept(entry)` allows, when given). An f16 problem with its
        accumulation left to the tuner is also answered by entries tuned with it pinned."""
        problems = problem.answered_by
        matching = [
            e
            for e in self.entries().values()
            if e.key.problem in problems
            and e.key.checks == checks
            and (not accept or accept(e))
            and is_current(e)
        ]
        return min(matching, key=lambda e: e.median_s, default=None)

    def _load(self) -> dict:
        """The file's contents, checked to be this device's cache file; {} where there
        is none or it was set aside."""
        raw = self._read()
        return (raw is not None and self._parse(raw)) or {}

    def _read(self) -> bytes | None:
        try:
            return read_limited(self.path, MAX_FILE_BYTES)
        except FileNotFoundError:
            return None
        except FileRefused as error:  # a FIFO, /dev/zero, a folder, too large: not ours
            self._set_aside(error)
            return None
        except OSError as error:
            warn_once(f"{self.path}: unreadable ({error}); ignored", stacklevel=3)
            return None

    def _parse(self, raw: bytes) -> dict | None:
        try:
            data = json.loads(raw.decode())  # UnicodeDecodeError is a ValueError too
            if not isinstance(data, dict) or type(data.get("schema")) is not int:
                raise ValueError("not a cache file")
            if data["schema"] > SCHEMA:
                raise ValueError(f"schema {data['schema']} is newer than {SCHEMA}")
            if set(data) != {"schema", "fingerprint", "versions", "entries"}:
                raise ValueError(f"fields {sorted(data)[:8]} are not a cache file's")
            if (
                data["schema"] < SCHEMA
                or data["fingerprint"] != self.fingerprint
                or data["versions"] != self.versions
            ):
                raise ValueError("schema, fingerprint or versions do not match the file name")
            if not isinstance(data["entries"], dict):
                raise ValueError("entries is not an object")
        except (ValueError, RecursionError) as error:
            # (JSONDecodeError is a ValueError; nesting a thousand deep is a RecursionError)
            self._set_aside(ValueError(str(error)[:200]))
            return None
        return data

    def _set_aside(self, error: Exception) -> None:
        stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S%f")
        aside = self.path.with_name(f"{self.path.name}.bad-{stamp}")
        try:
            os.replace(self.path, aside)
            where = f"moved to {aside.name}"
        except OSError:
            where = "left in place (read-only)"
        warn_once(f"{self.path}: {error}; {where}, starting empty", stacklevel=4)

    # --- writing ---------------------------------------------------------------------

    def put(self, entry: Entry, replacing: Sequence[dict] = ()) -> bool:
        """Store `entry` unless another config is stored for its key and is faster.

        `replacing`: params whose stored timing `entry` supersedes (a tuner's own
        provisional bests, timed again at its end): they never keep `entry` out.
        """
        with locked(self.path, "cache_dir"):
            self._remove_stale_temps()
            data = self._load() or {}
            entries = data.get("entries", {})
            rivals = [text for text in entries if _slot(text) == entry.key.slot]
            if any(_is_faster(text, entries[text], entry, replacing) for text in rivals):
                return False
            for text in rivals:  # one entry per slot: the new one replaces slower or stale ones
                del entries[text]
            if entry.estimated:
                _drop_oldest_estimates(entries, MAX_ESTIMATES - 1)
            entries[str(entry.key)] = entry.to_json()
            data = {
                "schema": SCHEMA,
                "fingerprint": self.fingerprint,
                "versions": self.versions,
                "entries": dict(sorted(entries.items())),
            }
            self._write_atomic(data)
        return True

    def check_writable(self, field: str = "cache_dir") -> None:
        """Take the file's lock once: a lock that cannot be taken fails now, before any
        tuning, rather than when the first result is stored."""
        with locked(self.path, field):
            pass

    def _remove_stale_temps(self) -> None:
        """Temp files are made only under the lock: one seen while we hold it was left by a
        writer that was killed before its os.replace."""
        for temp in self.folder.glob(glob.escape(self.path.name) + "*.tmp"):
            temp.unlink(missing_ok=True)

    def _write_atomic(self, data: dict) -> None:
        write_whole(self.path, json.dumps(data, indent=1), commit=self._replace)

    def _replace(self, temp: Path) -> None:
        """The written temp file becomes the cache file, whole or not at all."""
        os.replace(temp, self.path)


@contextlib.contextmanager
def locked(path: Path, field: str, error=CacheError):
    """Hold `path`.lock (made with its folder if missing), or raise `error` naming it: a
    lock that is a symlink or not a file (never followed), cannot be made, or stays held."""
    lock = path.with_name(path.name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if lock.is_symlink() or (lock.exists() and not lock.is_file()):
            raise error(
                field,
                f"lock file {lock} cannot be used: it is a symlink, a folder or a special "
                "file; remove it",
            )
        held = filelock.FileLock(str(lock), timeout=LOCK_TIMEOUT_S)
        held.acquire()
    except filelock.Timeout:  # (an OSError too: first)
        raise error(
            field,
            f"lock file {lock} was not released in {LOCK_TIMEOUT_S:g} s (held by another "
            "process, or it cannot be made)",
        ) from None
    except OSError as reason:
        raise error(field, f"lock file {lock} cannot be used: {reason}") from None
    try:
        yield
    finally:
        held.release()


def _templates_stamp() -> tuple:
    """What an entry's validity depends on besides the file: the templates known and
    their files (a space edited makes a config invalid)."""
    return tuple((name, template_stamp(name)) for name in template_names())


def _copied(entry: Entry) -> Entry:
    """A remembered entry with its dicts copied: a caller's edit never reaches the memo."""
    return replace(entry, params=dict(entry.params), failures=dict(entry.failures))


def is_current(entry: Entry) -> bool:
    """True while the entry's config still renders the kernel it was measured as (False
    for a config its space no longer holds, e.g. one of a space that gained a parameter)."""
    try:
        return entry.key.kernel == kernel_id(entry.config, entry.key.problem)
    except TEMPLATE_ERRORS:  # (its template since broken or gone: never served)
        return False


def _slot(text_key: str) -> tuple[str, ...] | None:
    try:
        return Key.parse(text_key).slot
    except ValueError:
        return None


# Estimates one file keeps: shapes that change on every call (a growing sequence) would
# otherwise grow the file, and the time of each write under the lock, without end. The
# oldest go first (an estimate costs a few seconds to make again).
MAX_ESTIMATES = 1000


def _drop_oldest_estimates(entries: dict, keep: int) -> None:
    estimated = [t for t, e in entries.items() if isinstance(e, dict) and e.get("estimated")]
    if len(estimated) > keep:
        estimated.sort(key=lambda t: str(entries[t].get("date", "")))
        for text in estimated[: len(estimated) - keep]:
            del entries[text]


def _is_faster(text_key: str, old: object, new: Entry, replacing: Sequence[dict] = ()) -> bool:
    """True when a stored entry of `new`'s slot stays: another current config that
    measured faster, or a tuned entry where `new` is an estimate."""
    try:
        stored = Entry.from_json(text_key, old)
    except (ValueError, SpaceError):
        return False
    if stored.estimated != new.estimated:  # a tuned entry always wins over an estimate
        return not stored.estimated and is_current(stored)
    return (
        stored.params != new.params
        and stored.params not in replacing
        and stored.median_s < new.median_s
        and is_current(stored)
    )


def this_machine() -> str:
    """The host name, as an entry's origin (so merged caches say where each was timed)."""
    return re.sub(r"[^\w.:@/-]", "-", socket.gethostname(), flags=re.ASCII)[:200]


def today() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- merging the caches of several machines -------------------------------------------


class MergeError(ArgumentError):
    """Cache files that cannot be merged (not cache files, or of different devices:
    `field` "paths"), or an `out` that cannot be written (`field` "out")."""


@dataclass
class MergeReport:
    out: Path
    entries: int  # in the merged file
    conflicts: list[str]  # slots where the inputs held different configs (the faster kept)
    skipped: int  # invalid or stale entries of the inputs, left out


def merge(paths: Sequence[Path | str], out: Path | str) -> MergeReport:
    """Merge cache files of one device (e.g. tuned on several identical machines) into
    `out` (a file, or a folder that gets the device's file name): per key the fastest
    verified current entry, with its origin. Files of different devices or software versions are
    refused: an entry is only meaningful for the device it was timed on. Inputs are never
    changed; `out` may be one of them, otherwise it must not exist yet."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise MergeError("paths", "no cache files to merge")
    if not isinstance(out, str | os.PathLike) or not str(out):  # '' is not "here"
        raise MergeError("out", f"out must be a file or folder path, got {out!r:.60}")
    if "\0" in str(out):  # no file name has one (Python raises a bare ValueError)
        raise MergeError("out", f"out {shown(str(out))} contains a NUL character")
    out = Path(out)
    try:
        is_folder = out.is_dir()
    except OSError as reason:  # a name too long, a folder it may not search
        raise MergeError("out", f"out {shown(str(out))} cannot be read: {reason}") from None
    # its folder is checked (and made) as tune checks its cache folder, before any work
    check_folder("out", out if is_folder else out.parent, writable=True, error=MergeError)
    headers = [read_header(p) for p in paths]
    for path, header in zip(paths[1:], headers[1:], strict=True):
        for part in ("fingerprint", "versions"):
            if header[part] != headers[0][part]:
                raise MergeError(
                    "paths",
                    f"{path} and {paths[0]} are of different devices ({part} "
                    f"{header[part]} vs {headers[0][part]}); merge only one device's files",
                )
    fingerprint, versions = headers[0]["fingerprint"], headers[0]["versions"]
    if is_folder:
        out = out / device_file_name(fingerprint, versions)
    if out.exists() and not any(out.resolve() == p.resolve() for p in paths):
        raise MergeError("out", f"{out} exists; name it among the inputs to merge into it")
    target = DeviceCache(out.parent, fingerprint, versions)
    target.path = out
    with locked(out, "out", MergeError):  # the inputs are read under it: `out` may be one
        merged, conflicts, skipped = _merged(paths, headers, fingerprint, versions)
        target._write_atomic(
            {
                "schema": SCHEMA,
                "fingerprint": fingerprint,
                "versions": versions,
                "entries": dict(sorted((str(e.key), e.to_json()) for e in merged.values())),
            }
        )
    return MergeReport(out, len(merged), sorted(conflicts), skipped)


def _merged(paths, headers, fingerprint: dict, versions: dict):
    """(slot -> the fastest current entry of the inputs, slots whose configs differ,
    how many entries were left out as invalid or stale)."""
    merged: dict[tuple, Entry] = {}
    conflicts, skipped = set(), 0
    for path, header in zip(paths, headers, strict=True):
        source = DeviceCache.at(path, header)
        with warnings.catch_warnings(record=True):  # counted as skipped instead
            warnings.simplefilter("always")
            entries = source.entries()
        current = [e for e in entries.values() if is_current(e)]
        skipped += len(header["entries"]) - len(current)
        for entry in current:
            entry = entry if entry.origin else replace(entry, origin=path.name[:200])
            old = merged.get(entry.key.slot)
            if old is not None and old.params != entry.params:
                conflicts.add(":".join(entry.key.slot))
            if old is None or entry.median_s < old.median_s:
                merged[entry.key.slot] = entry
    return merged, conflicts, skipped


def read_header(path: Path, field: str = "paths") -> dict:
    """A cache file's parsed top level (a merge input, or a file export reads candidates
    from), checked as the cache checks its own file; MergeError(field, why) otherwise."""
    try:
        data = json.loads(read_limited(path, MAX_FILE_BYTES).decode())
        if not isinstance(data, dict) or set(data) != {
            "schema",
            "fingerprint",
            "versions",
            "entries",
        }:
            raise ValueError("not a cache file")
        if data["schema"] != SCHEMA:
            raise ValueError(f"schema {data['schema']!r}, this autotune reads {SCHEMA}")
        for part in ("fingerprint", "versions"):
            if not isinstance(data[part], dict) or not all(
                isinstance(k, str) and type(v) in (str, int) for k, v in data[part].items()
            ):
                raise ValueError(f"{part} is not a map of names to values")
        if not isinstance(data["entries"], dict):
            raise ValueError("entries is not an object")
    except (OSError, ValueError, RecursionError) as reason:
        raise MergeError(field, f"{path}: {str(reason)[:200]}") from None
    return data


# What makes another GPU's cache a neighbour of this one's: a GPU of the same vendor,
# driver stack and kind (an H100 beside an H200); a CPU adapter's choices say nothing
# of a discrete GPU's, nor one vendor's of another's.
KIN_FIELDS = ("vendor", "vendor_id", "backend", "adapter_type")


def kin_devices(folders: Sequence[Path], fingerprint: dict, versions: dict) -> list[DeviceCache]:
    """The cache files in `folders` of other GPUs like this one (KIN_FIELDS), or of this
    GPU under other versions; a file that is not a cache file is passed over (lookup
    reads what it can; `merge` and the cache's own loading say what is wrong)."""
    own = device_file_name(fingerprint, versions)
    kin = []
    for folder in folders:
        for path in sorted(Path(folder).glob("*.json")):
            if path.name == own:
                continue
            try:
                header = read_header(path)
            except MergeError:
                continue
            other = header["fingerprint"]
            if all(other.get(name) == fingerprint.get(name) for name in KIN_FIELDS):
                kin.append(DeviceCache.at(path, header))
    return kin
