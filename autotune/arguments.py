"""Argument checks shared by the public API: each names the argument and what it allows.

The CLI maps `field` to its option (`cache_dir` -> `--cache`), so a bad value gives the
same sentence from Python and from the command line.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np


class ArgumentError(ValueError):
    """A bad argument; `field` names it (e.g. "checks", "cache")."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def check_flag(field: str, value: object, error=ArgumentError) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise error(field, f"{field} must be True or False, got {value!r:.60}")
    return bool(value)


def check_seed(value: object, error=ArgumentError) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | np.integer)):
        raise error("seed", f"seed must be an integer or None, got {value!r:.60}")
    if value is not None and not 0 <= value < 2**32:
        raise error("seed", f"seed must be from 0 to 2**32 - 1, got {value}")
    return None if value is None else int(value)


def check_count(field: str, value: object, most: int, error=ArgumentError) -> int | None:
    """None (the default), or a whole number from 0 to `most`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= value <= most:
        raise error(field, f"{field} must be None or an integer 0..{most}, got {value!r:.60}")
    return int(value)


def check_seconds(field: str, value: object, error=ArgumentError) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise error(field, f"{field} must be a number of seconds > 0, got {value!r:.60}")
    return float(value)


def check_folder(field: str, value: object, *, writable: bool, error=ArgumentError) -> Path | None:
    """A folder path (None passes): not a file; when `writable`, made now if missing, so
    a tuning run fails at once rather than when it stores its first result."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise error(field, f"{field} must be a folder path, got {value!r:.60}")
    if "\0" in str(value):  # no file name has one (Python raises a bare ValueError)
        raise error(field, f"{field} {value!r:.60} contains a NUL character")
    folder = Path(value)
    if folder.exists() and not folder.is_dir():
        raise error(field, f"{field} {str(folder)!r} exists and is not a folder")
    if writable:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as reason:  # (not `as error`: that is the class to raise)
            raise error(field, f"{field} {str(folder)!r} cannot be made: {reason}") from None
        if not os.access(folder, os.W_OK):
            raise error(field, f"{field} {str(folder)!r} is not writable")
    return folder
