"""Cache: the best verified kernel per device and problem, as JSON files on disk.

One file per device: fingerprint + software versions name it, so another GPU, driver or
wgpu build reads another file. Inside, each entry is keyed by template (name and content
hash), runtime-check mode, dtype, layout, M, N, K, and for batched or fused problems the
batch (count, B shared) and the epilogue; a change in any of them is a miss. Keys of
unbatched problems without an epilogue have the 7 parts they had before those existed:
`blocked:<hash>:checks:f32:nn:device:MxNxK`; the others add two,
`...:MxNxK:b8s:bias,gelu` (8 matrices, one B shared; "b1", "none" where absent).
Writes are atomic (temp file + os.replace) and happen under a file lock, re-reading the
file first, so concurrent tuners lose nothing. A file that is corrupt or has a newer
schema is moved aside with a warning and treated as empty.
"""

from __future__ import annotations

import datetime
import glob
import hashlib
import json
import os
import re
import socket
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import filelock
import platformdirs

from . import faults
from .data import data_path, in_checkout
from .problem import Problem, ProblemError
from .render import template_hash
from .space import Config, SpaceError, load_space, template_names

SCHEMA = 1
CACHE_ENV = "AUTOTUNE_CACHE"


class CacheWarning(UserWarning):
    """A cache file could not be used (corrupt, newer schema) and was set aside."""


def default_cache_dir() -> Path:
    """$AUTOTUNE_CACHE, else the checkout's cache/ (the shipped database), else the
    user's cache folder."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if in_checkout():
        return data_path("cache")
    return Path(platformdirs.user_cache_dir("autotune"))


def shipped_cache_dir() -> Path:
    return data_path("cache")


@dataclass(frozen=True)
class Key:
    """Everything inside one device file that can change the answer."""

    template: str
    template_hash: str
    checks: bool
    dtype: str
    layout: str
    M: int
    N: int
    K: int
    space: str = "device"  # "device": within the device's limits; "portable": WebGPU's
    batch: int = 1
    shared_b: bool = False
    epilogue: str = "none"
    accumulate: str = "auto"  # f16 only: pinned accumulation ("f16-acc32" in the text)

    @classmethod
    def of(cls, problem: Problem, template: str, checks: bool, portable: bool = False) -> Key:
        return cls(
            template,
            template_hash(template),
            checks,
            problem.dtype,
            problem.layout,
            problem.M,
            problem.N,
            problem.K,
            "portable" if portable else "device",
            problem.batch,
            problem.shared_b,
            problem.epilogue,
            problem.accumulate,
        )

    def __str__(self) -> str:
        checks = "checks" if self.checks else "nochecks"
        text = (
            f"{self.template}:{self.template_hash}:{checks}:{self.problem.dtype_text}:{self.layout}:"
            f"{self.space}:{self.M}x{self.N}x{self.K}"
        )
        if self.batch > 1 or self.epilogue != "none":
            text += f":{self.problem.batch_text}:{self.epilogue}"
        return text

    @property
    def problem(self) -> Problem:
        return Problem(
            self.M,
            self.N,
            self.K,
            self.dtype,
            self.layout,
            self.batch,
            self.shared_b,
            self.epilogue,
            self.accumulate,
        )


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

    @property
    def config(self) -> Config:
        return Config.make(self.key.template, self.params)

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
        key = _parse_key(text_key)
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
        if method not in ("timestamp", "wall"):
            raise ValueError("method must be 'timestamp' or 'wall'")
        failures = data.get("failures", {})
        if not isinstance(failures, dict) or not all(
            k in REASONS and type(v) is int and 0 <= v <= MAX_COUNT for k, v in failures.items()
        ):
            raise ValueError(f"failures must map reasons ({', '.join(REASONS)}) to counts")
        trials = data.get("trials", 0)
        if type(trials) is not int or not 0 <= trials <= MAX_COUNT:
            raise ValueError(f"trials must be an integer from 0 to {MAX_COUNT}")
        date = data.get("date", "")
        if not isinstance(date, str) or not _DATE.match(date):
            raise ValueError("date must be empty or YYYY-MM-DDTHH:MM:SSZ")
        origin = data.get("origin", "")
        if not isinstance(origin, str) or not _ORIGIN.match(origin):
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
REASONS = ("compile", "limits", "wrong", "timeout", "crashed", "device-lost")
MAX_COUNT = 10**9
_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)?$")
_ORIGIN = re.compile(r"^[\w.:@/-]{0,200}$", re.ASCII)
MAX_FILE_BYTES = 64 * 2**20  # ~100,000 entries; a larger file is not one of ours


def _number(name: str, value: object) -> float:
    low, high = _RANGES.get(name, _BASELINE_RANGE)
    # ints compare exactly (no float conversion that 10**400 would overflow)
    if type(value) not in (int, float) or not low <= value <= high:
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}")
    return float(value)


def _parse_key(text: str) -> Key:
    parts = text.split(":") if isinstance(text, str) else []
    if len(parts) not in (7, 9):
        raise ValueError(f"malformed key {text!r:.120}")
    template, digest, checks, dtype, layout, space, shape = parts[:7]
    batch_text, epilogue = parts[7:] if len(parts) == 9 else ("b1", "none")
    dtype, _, acc = dtype.partition("-acc")
    accumulate = {"": "auto", "32": "f32", "16": "f16"}.get(acc, acc)
    batch = re.fullmatch(r"b([1-9][0-9]{0,9})(s?)", batch_text)
    if not batch:
        raise ValueError(f"bad batch {batch_text[:20]!r}")
    if template not in template_names():
        raise ValueError(f"unknown template {template[:40]!r}")
    if not re.fullmatch(r"[0-9a-f]{16}", digest):
        raise ValueError("the template hash must be 16 hex digits")
    if checks not in ("checks", "nochecks"):
        raise ValueError(f"bad check mode {checks!r}")
    if space not in ("device", "portable"):
        raise ValueError(f"bad space {space!r}")
    sizes = shape.split("x")
    if len(sizes) != 3 or not all(s.isdigit() and len(s) < 11 for s in sizes):
        raise ValueError(f"bad shape {shape!r}")
    try:
        problem = Problem(
            *(int(s) for s in sizes),
            dtype=dtype,
            layout=layout,
            batch=int(batch.group(1)),
            shared_b=batch.group(2) == "s",
            epilogue=epilogue,
            accumulate=accumulate,
        )
    except ProblemError as error:
        raise ValueError(str(error)) from None
    if (problem.epilogue, problem.batch_text, problem.dtype_text) != (
        epilogue,
        batch_text,
        parts[3],
    ):
        raise ValueError(f"key {text[:120]!r} is not in canonical form")
    key = Key(
        template,
        digest,
        checks == "checks",
        problem.dtype,
        problem.layout,
        problem.M,
        problem.N,
        problem.K,
        space,
        problem.batch,
        problem.shared_b,
        problem.epilogue,
        problem.accumulate,
    )
    if str(key) != text:  # one text per key: "...:1x1x1:b1:none" is "...:1x1x1"
        raise ValueError(f"key {text[:120]!r} is not in canonical form {str(key)!r}")
    return key


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

    # --- reading ---------------------------------------------------------------------

    def entries(self) -> dict[str, Entry]:
        """All valid entries; entries of changed templates are left out (never served)."""
        data = self._load()
        entries = {}
        for text_key, value in data.get("entries", {}).items():
            try:
                entry = Entry.from_json(text_key, value)
            except (ValueError, SpaceError) as error:
                warnings.warn(
                    f"{self.path}: entry {text_key[:80]!r} ignored: {error}",
                    CacheWarning,
                    stacklevel=2,
                )
                continue
            if entry.key.template_hash == template_hash(entry.key.template):
                entries[text_key] = entry
        return entries

    def get(self, key: Key) -> Entry | None:
        return self.entries().get(str(key))

    def best(self, problem: Problem, checks: bool, accept=None) -> Entry | None:
        """The fastest entry over all templates for this exact problem and mode (among
        those `accept(entry)` allows, when given). An f16 problem with its accumulation
        left to the tuner is also answered by entries tuned with it pinned."""
        problems = problem.answered_by
        matching = [
            e
            for e in self.entries().values()
            if e.key.problem in problems and e.key.checks == checks and (not accept or accept(e))
        ]
        return min(matching, key=lambda e: e.median_s, default=None)

    def _load(self) -> dict:
        try:
            if self.path.stat().st_size > MAX_FILE_BYTES:
                self._set_aside(ValueError(f"larger than {MAX_FILE_BYTES} bytes"))
                return {}
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as error:
            warnings.warn(f"{self.path}: unreadable ({error}); ignored", CacheWarning, stacklevel=3)
            return {}
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
            return {}
        return data

    def _set_aside(self, error: Exception) -> None:
        stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S%f")
        aside = self.path.with_name(f"{self.path.name}.bad-{stamp}")
        try:
            os.replace(self.path, aside)
            where = f"moved to {aside.name}"
        except OSError:
            where = "left in place (read-only)"
        warnings.warn(f"{self.path}: {error}; {where}, starting empty", CacheWarning, stacklevel=4)

    # --- writing ---------------------------------------------------------------------

    def put(self, entry: Entry, replacing: Sequence[dict] = ()) -> bool:
        """Store `entry` unless another config is stored for its key and is faster.

        `replacing`: params whose stored timing `entry` supersedes (a tuner's own
        provisional bests, timed again at its end): they never keep `entry` out.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(self.path) + ".lock"):
            self._remove_stale_temps()
            data = self._load() or {}
            entries = data.get("entries", {})
            old = entries.get(str(entry.key))
            if isinstance(old, dict) and _is_faster(old, entry, replacing):
                return False
            entries[str(entry.key)] = entry.to_json()
            data = {
                "schema": SCHEMA,
                "fingerprint": self.fingerprint,
                "versions": self.versions,
                "entries": dict(sorted(entries.items())),
            }
            self._write_atomic(data)
        return True

    def _remove_stale_temps(self) -> None:
        """Temp files are made only under the lock: one seen while we hold it was left by a
        writer that was killed before its os.replace."""
        for temp in self.folder.glob(glob.escape(self.path.name) + "*.tmp"):
            temp.unlink(missing_ok=True)

    def _write_atomic(self, data: dict) -> None:
        handle, temp = tempfile.mkstemp(dir=self.folder, prefix=self.path.name, suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as file:
                json.dump(data, file, indent=1)
                file.flush()
                os.fsync(file.fileno())
            faults.pause(faults.planned("cache-write"))  # test-only: killed right here
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise


def _is_faster(old: dict, new: Entry, replacing: Sequence[dict] = ()) -> bool:
    """True when the stored entry is another config that measured faster (it stays)."""
    try:
        stored = Entry.from_json(str(new.key), old)
    except (ValueError, SpaceError):
        return False
    return (
        stored.params != new.params
        and stored.params not in replacing
        and stored.median_s < new.median_s
    )


def this_machine() -> str:
    """The host name, as an entry's origin (so merged caches say where each was timed)."""
    return re.sub(r"[^\w.:@/-]", "-", socket.gethostname(), flags=re.ASCII)[:200]


def today() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- merging the caches of several machines -------------------------------------------


class MergeError(ValueError):
    """Cache files that cannot be merged: not cache files, or of different devices."""


@dataclass
class MergeReport:
    out: Path
    entries: int  # in the merged file
    conflicts: list[str]  # keys where the inputs held different configs (the faster kept)
    skipped: int  # invalid or stale entries of the inputs, left out


def merge(paths: Sequence[Path | str], out: Path | str) -> MergeReport:
    """Merge cache files of one device (e.g. tuned on several identical machines) into
    `out` (a file, or a folder that gets the device's file name): per key the fastest
    verified entry, with its origin. Files of different devices or software versions are
    refused: an entry is only meaningful for the device it was timed on. Inputs are never
    changed; `out` may be one of them, otherwise it must not exist yet."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise MergeError("no cache files to merge")
    headers = [_merge_header(p) for p in paths]
    for path, header in zip(paths[1:], headers[1:], strict=True):
        for part in ("fingerprint", "versions"):
            if header[part] != headers[0][part]:
                raise MergeError(
                    f"{path} and {paths[0]} are of different devices ({part} "
                    f"{header[part]} vs {headers[0][part]}); merge only one device's files"
                )
    fingerprint, versions = headers[0]["fingerprint"], headers[0]["versions"]
    if "\0" in str(out):  # no file name has one (Python raises a bare ValueError)
        raise MergeError(f"out {str(out)!r:.80} contains a NUL character")
    out = Path(out)
    if out.is_dir():
        out = out / device_file_name(fingerprint, versions)
    if out.exists() and not any(out.resolve() == p.resolve() for p in paths):
        raise MergeError(f"{out} exists; name it among the inputs to merge into it")
    merged: dict[str, Entry] = {}
    conflicts, skipped = set(), 0
    for path, header in zip(paths, headers, strict=True):
        source = DeviceCache(path.parent, fingerprint, versions)
        source.path = path  # any file name: the header was checked above
        with warnings.catch_warnings(record=True):  # counted as skipped instead
            warnings.simplefilter("always")
            entries = source.entries()
        skipped += len(header["entries"]) - len(entries)
        for text_key, entry in entries.items():
            entry = entry if entry.origin else replace(entry, origin=path.name[:200])
            old = merged.get(text_key)
            if old is not None and old.params != entry.params:
                conflicts.add(text_key)
            if old is None or entry.median_s < old.median_s:
                merged[text_key] = entry
    target = DeviceCache(out.parent, fingerprint, versions)
    target.path = out
    target.folder.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(out) + ".lock"):
        target._write_atomic(
            {
                "schema": SCHEMA,
                "fingerprint": fingerprint,
                "versions": versions,
                "entries": {k: merged[k].to_json() for k in sorted(merged)},
            }
        )
    return MergeReport(out, len(merged), sorted(conflicts), skipped)


def _merge_header(path: Path) -> dict:
    """A merge input's parsed top level, checked as the cache checks its own file."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
        data = json.loads(path.read_bytes().decode())
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
    except (OSError, ValueError, RecursionError) as error:
        raise MergeError(f"{path}: {str(error)[:200]}") from None
    return data
