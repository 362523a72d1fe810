"""Atomic file writes: a reader sees the old file or the new one, never a part of either."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(
    path: Path, write: Callable[[BinaryIO], None], *, durable: bool = False
) -> None:
    """Write to a temporary file beside `path`, then `os.replace` it into place.

    `durable`: also fsync the file and the folder, so the new contents survive a power loss (for
    checkpoints; status files and tables only need atomicity).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
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
