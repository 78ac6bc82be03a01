"""Argument checks shared by the public API: each names the argument and what it allows.

The CLI maps `field` to its option (`cache_dir` -> `--cache`), so a bad value gives the
same sentence from Python and from the command line.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

# a file name stem of bundles and quantized weights; fullmatch: `$` passes "x\n"
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,99}")


def name_from(text: str) -> str:
    """A NAME made of `text` (a file's stem: "layer.0.weight" -> "layer_0_weight",
    "1w" -> "w_1w"), for a default the user did not choose."""
    if NAME.fullmatch(text):
        return text
    name = re.sub(r"[^A-Za-z0-9_-]", "_", text)[:100]
    return name if NAME.fullmatch(name) else f"w_{name}"[:100]


class ArgumentError(ValueError):
    """A bad argument; `field` names it (e.g. "checks", "cache")."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def shown(value: object, width: int = 60) -> str:
    """repr(value) cut to `width` characters, for messages: never fails (an int of
    5,000 digits has no repr, an object's __repr__ may raise)."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


def is_number(value: object) -> bool:
    """An int or float, NumPy's included; never a bool (True is not a count of 1)."""
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def as_float(value: int | float) -> float:
    """A number as a float; an int beyond any float is infinite (float() raises there)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def is_integer(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def check_flag(field: str, value: object, error=ArgumentError) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise error(field, f"{field} must be True or False, got {shown(value)}")
    return bool(value)


def check_seed(value: object, error=ArgumentError) -> int | None:
    if value is not None and not is_integer(value):
        raise error("seed", f"seed must be an integer or None, got {shown(value)}")
    if value is not None and not 0 <= value < 2**32:
        raise error("seed", f"seed must be from 0 to 2**32 - 1, got {shown(value)}")
    return None if value is None else int(value)


def check_count(field: str, value: object, most: int, error=ArgumentError) -> int | None:
    """None (the default), or a whole number from 0 to `most`."""
    if value is None:
        return None
    if not is_integer(value) or not 0 <= value <= most:
        raise error(field, f"{field} must be None or an integer 0..{most}, got {shown(value)}")
    return int(value)


def check_seconds(field: str, value: object, error=ArgumentError) -> float:
    """A finite number of seconds > 0 (an int too large for a float is not finite)."""
    if is_number(value) and 0 < as_float(value) < math.inf:
        return as_float(value)
    raise error(field, f"{field} must be a number of seconds > 0, got {shown(value)}")


def check_folder(field: str, value: object, *, writable: bool, error=ArgumentError) -> Path | None:
    """A folder path (None passes): not a file; when `writable`, made now if missing, so
    a tuning run fails at once rather than when it stores its first result."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise error(field, f"{field} must be a folder path, got {shown(value)}")
    if "\0" in str(value):  # no file name has one (Python raises a bare ValueError)
        raise error(field, f"{field} {shown(value)} contains a NUL character")
    folder = Path(value)
    try:
        not_a_folder = folder.exists() and not folder.is_dir()
    except OSError as reason:  # a name too long, a folder it may not search
        raise error(field, f"{field} {shown(str(folder))} cannot be read: {reason}") from None
    if not_a_folder:
        raise error(field, f"{field} {str(folder)!r} exists and is not a folder")
    if writable:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as reason:  # (not `as error`: that is the class to raise)
            raise error(field, f"{field} {str(folder)!r} cannot be made: {reason}") from None
        if not os.access(folder, os.W_OK):
            raise error(field, f"{field} {str(folder)!r} is not writable")
    return folder
