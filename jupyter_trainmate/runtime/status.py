"""
Status files of runs in progress, for the sidebar: one small JSON file per run, rewritten about
once a second by the live display's thread, atomically (temporary file, then `os.replace`), under
Jupyter's runtime directory. The server lists them; a file whose process is gone is stale.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from .files import write_text_atomically
from .summary import RunProgress

STATUS_SUBDIR = "trainmate-runs"


def status_dir(runtime_dir: str | None = None) -> Path:
    """`<jupyter runtime dir>/trainmate-runs`: shared by kernels and the server of one user."""
    if runtime_dir is None:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime_dir = jupyter_runtime_dir()
    return Path(runtime_dir) / STATUS_SUBDIR


class StatusWriter:
    """One run's status file: written at `start()`, rewritten by `write()` (the live display's
    thread calls it about once a second), removed at `stop()`."""

    def __init__(
        self,
        progress: Callable[[], RunProgress],
        *,
        notebook: str | None,
        run_name: str,
        directory: Path | None = None,
    ) -> None:
        self._progress = progress
        me = psutil.Process()
        self._identity: dict[str, Any] = {
            "pid": me.pid,
            "pid_started": me.create_time(),  # with the pid: a reused pid is not this run
            "notebook": notebook,
            "run_name": run_name,
            "started": time.time(),
        }
        self.directory = directory or status_dir()
        self.path = self.directory / f"{me.pid}-{int(self._identity['started'] * 1000)}.json"
        self.active = False

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write()
        self.active = True

    def write(self) -> None:
        status = {**self._identity, **asdict(self._progress()), "updated": time.time()}
        write_text_atomically(self.path, json.dumps(status))

    def stop(self) -> None:
        self.active = False
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
