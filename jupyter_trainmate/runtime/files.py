"""Atomic file writes: a reader sees the old file or the new one, never a part of either."""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


@functools.cache
def _umask() -> int:
    """The process's umask, read without setting it (`os.umask` would race other threads)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text()
        return int(
            next(line for line in status.splitlines() if line.startswith("Umask:")).split()[1], 8
        )
    return 0o022


def write_atomically(
    path: Path, write: Callable[[BinaryIO], None], *, durable: bool = False
) -> None:
    """Write to a temporary file beside `path`, then `os.replace` it into place.

    `durable`: also fsync the file and the folder, so the new contents survive a power loss (for
    checkpoints; status files and tables only need atomicity).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # mkstemp makes the file 0600: keep a replaced file's mode, else what open() would give
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp).unlink()
        raise
    if durable:
        with contextlib.suppress(OSError):
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


def write_text_atomically(path: Path, text: str) -> None:
    data = text.encode()

    def write(f: BinaryIO) -> None:
        f.write(data)

    write_atomically(path, write)
