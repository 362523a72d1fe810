"""Atomic file writes: a reader sees the old file or the new one, never a part of either."""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
import threading
from collections.abc import Callable
from typing import BinaryIO

# The temporary file's flags: created here or not at all (`O_EXCL`: another writer's file is never
# opened), never through a link; Python's descriptors are not inherited by child processes.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
_NUMBERS = itertools.count()  # with the pid and the thread: no two writers share a name


def write_atomically(
    path: str | os.PathLike[str], write: Callable[[BinaryIO], None], *, durable: bool = False
) -> None:
    """Write to a temporary file beside `path`, then `os.replace` it into place.

    `durable`: also fsync the file and the folder, so the new contents survive a power loss (for
    checkpoints; status files and tables only need atomicity).

    In `os` calls on strings, not `pathlib` and `tempfile` (a status file is written at every
    run's start and end and once a second: `Path` arithmetic, `mkstemp`'s random names and a
    `mkdir` each time were about 3,500 Python opcodes of every run, issue 15). The folder is made
    only when it is missing. The temporary file is made with mode 0666, which the umask narrows
    as `open()` would; a replaced file's own mode is kept.
    """
    target = os.fspath(path)
    folder, name = os.path.split(target)
    try:
        mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        mode = None
    fd, tmp = _temporary(folder, name)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(fd, mode)
            write(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        with contextlib.suppress(OSError):
            dir_fd = os.open(folder or ".", os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


def _temporary(folder: str, name: str) -> tuple[int, str]:
    """A new file `.<name>.<pid>-<thread>-<n>.tmp` in `folder` (made if missing), open."""
    made = False
    while True:
        tmp = os.path.join(
            folder, f".{name}.{os.getpid()}-{threading.get_ident()}-{next(_NUMBERS)}.tmp"
        )
        try:
            return os.open(tmp, _CREATE, 0o666), tmp
        except FileNotFoundError:
            if made:
                raise
            os.makedirs(folder, exist_ok=True)
            made = True
        except FileExistsError:  # another process of the same pid (a container) on a shared folder
            continue


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    data = text.encode()

    def write(f: BinaryIO) -> None:
        f.write(data)

    write_atomically(path, write)
