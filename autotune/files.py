"""Files: read only regular files, never more than a limit; write each file whole.

Cache files, --shapes-from and --model files and cache merge inputs all come through
`read_limited`. A size check by path bounds nothing: `stat().st_size` is 0 for
/dev/zero, a FIFO or a file in /proc, which then read without end or block forever. So
the file must be a regular file (symlinks resolved), is opened without blocking (a FIFO
with no writer would block the open itself), is checked again on the open descriptor
(the path may have been swapped in between), and is read at most one byte past the limit.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

_KINDS = {
    stat.S_ISDIR: "a folder",
    stat.S_ISFIFO: "a FIFO (named pipe)",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISSOCK: "a socket",
}
# no blocking on a FIFO, no controlling terminal from a tty (where the system has them)
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


class FileRefused(ValueError):
    """Not a regular file, or larger than the limit: not a file we would have written."""


def _refuse_special(mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS.items() if test(mode)), "a special file")
        raise FileRefused(f"{kind}, not a regular file")


def read_limited(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them.

    Raises FileRefused (a ValueError) for anything but a regular file or a larger one, and
    OSError (FileNotFoundError, PermissionError, ...) when it cannot be opened.
    """
    path = Path(path)
    _refuse_special(os.stat(path).st_mode)  # before opening: opening a device can act
    with open(os.open(path, _FLAGS), "rb") as file:
        _refuse_special(os.fstat(file.fileno()).st_mode)
        data = file.read(limit + 1)
    if len(data) > limit:
        raise FileRefused(f"larger than {limit} bytes")
    return data


def write_whole(
    path: Path, text: str | bytes, commit: Callable[[Path], None] | None = None
) -> None:
    """Write `text` (as UTF-8; bytes as they are) to `path` whole or not at all: into a
    new temp file beside it, named `<name>.<random>.tmp` and created exclusively (never
    through a link; mode 0o666 less the umask), flushed to disk, then renamed over `path`
    by `commit(temp)` (default: os.replace). A temp file left by a
    kill is its writer's to clean up."""
    temp = path.with_name(f"{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        with open(os.open(temp, flags, 0o666), "wb") as file:
            file.write(text.encode() if isinstance(text, str) else text)
            file.flush()
            os.fsync(file.fileno())
        commit(temp) if commit else os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
