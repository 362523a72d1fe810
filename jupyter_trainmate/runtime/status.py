"""
Status files of runs in progress, for the sidebar: one small JSON file per run, rewritten about
once a second by the live display's thread, atomically (temporary file, then `os.replace`), under
Jupyter's runtime directory. The server lists them; a file whose process is gone is stale.

When the run ends, `finish()` writes its outcome, duration and final metrics into
`trainmate-ended/` (beside `trainmate-runs/`, same file name): the
lab extension shows a toast for each ended run (see docs/sidebar.md); the server removes those
files after `ENDED_KEEP_S`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..monitor.host import this_process
from .files import write_text_atomically
from .summary import RunProgress, RunSummary

STATUS_SUBDIR = "trainmate-runs"
ENDED_SUBDIR = "trainmate-ended"  # beside STATUS_SUBDIR


def status_dir(runtime_dir: str | None = None) -> Path:
    """`<jupyter runtime dir>/trainmate-runs`: shared by kernels and the server of one user."""
    if runtime_dir is None:
        environ = os.environ
        return _status_dir(*(environ.get(name) for name in _RUNTIME_DIR_ENV))
    return Path(runtime_dir) / STATUS_SUBDIR


# What `jupyter_runtime_dir()` reads (jupyter_core 5: Linux, macOS and Windows): the answer is
# cached per value of these (it resolves the home folder on every call, about 0.1 ms of every
# run's start).
_RUNTIME_DIR_ENV = (
    "JUPYTER_RUNTIME_DIR",
    "JUPYTER_DATA_DIR",
    "JUPYTER_CONFIG_DIR",
    "JUPYTER_PLATFORM_DIRS",
    "XDG_DATA_HOME",
    "XDG_RUNTIME_DIR",
    "HOME",
    "APPDATA",
    "USERPROFILE",
    "HOMEDRIVE",
    "HOMEPATH",
)


@functools.lru_cache(maxsize=8)
def _status_dir(*environment: str | None) -> Path:
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / STATUS_SUBDIR


_PROGRESS_FIELDS = tuple(f.name for f in fields(RunProgress))


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
        notify_after: float | None = None,
    ) -> None:
        self._progress = progress
        me = this_process()
        self._identity: dict[str, Any] = {
            "pid": me.pid,
            "pid_started": me.create_time(),  # with the pid: a reused pid is not this run
            "notebook": notebook,
            "run_name": run_name,
            "started": time.time(),
            "notify_after": notify_after,  # --notify-after; None: the lab's setting decides
            "cell_id": current_cell_id(),
        }
        self.directory = directory or status_dir()
        self._id = f"{me.pid}-{int(self._identity['started'] * 1000)}"
        self.path = self.directory / f"{self._id}.json"
        self.active = False
        self.written = False  # the file was written (and is there until `stop`)
        self.missing = False  # its first write failed: no sidebar entry, no ended record

    def follow(self, progress: Callable[[], RunProgress]) -> None:
        """Show another run's progress from now on (a sweep's status file follows its trials)."""
        self._progress = progress

    def rename(self, run_name: str, *, write: bool = True) -> None:
        """The run's new name, written now if `write` and the writer is active (else by the
        next `write`)."""
        self._identity["run_name"] = run_name
        if write and self.active:
            self.write()

    def start(self) -> None:
        self.write()  # the folder is made if it is missing
        self.active = True

    def start_later(self) -> None:
        """Active, with the first write left to the live display's thread at the run's first
        second (`write`, about once a second): a run shorter than that, which the sidebar
        (polling every 2 s) would hardly show, writes no status file and removes none: about
        0.6 ms of every short run's training thread (BENCHMARKS.md). Its ended record is still
        written at `finish`. If the first write fails with an `OSError` (no runtime dir, a
        read-only home), the run has no sidebar entry and no ended record, and nothing is
        reported: as when `start` fails."""
        self.active = True

    def write(self) -> None:
        progress = self._progress()  # flat: its fields directly (`asdict` deep-copies each one)
        status = {**self._identity, **{n: getattr(progress, n) for n in _PROGRESS_FIELDS}}
        status["updated"] = time.time()
        quiet = self.active and not self.written  # the first write of `start_later`
        try:
            write_text_atomically(self.path, json.dumps(status))
        except OSError:
            if not quiet:
                raise
            self.active = False
            self.missing = True
            return
        self.written = True

    def stop(self) -> None:
        self.active = False
        if not self.written:  # a short run's (`start_later`), or its first write failed
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def finish(self, summary: RunSummary, *, restarted: bool = False, quiet: bool = False) -> None:
        """Write the ended run's record (`trainmate-ended/<same name>`) for the lab's toast.
        `restarted`: an attempt that `--retries` restarts; `quiet`: a trial of a sweep whose
        end is announced once (no toast or webhook for either). None after a first write that
        failed (`start_later`)."""
        if self.missing:
            return
        try:
            self.ended(
                outcome=summary.outcome,
                wall_s=summary.wall_s,
                metrics=summary.metrics,
                steps=summary.steps,
                epochs=summary.epochs,
                samples_per_s=summary.samples_per_s,
                restarted=restarted,
                quiet=quiet,
            )
        except OSError:
            if self.written:  # the folder worked during the run: a failure worth a report
                raise

    def ended(
        self,
        *,
        outcome: str,
        wall_s: float,
        metrics: dict[str, float],
        steps: int,
        epochs: int,
        samples_per_s: float = 0.0,
        restarted: bool = False,
        quiet: bool = False,
        **more: Any,
    ) -> None:
        """The ended record of `finish` from its facts (a sweep's: its trials as its epochs)."""
        ended = {
            **self._identity,
            "id": self._id,
            "outcome": outcome,
            "ended": time.time(),
            "wall_s": wall_s,
            "steps": steps,
            "epochs": epochs,
            "samples_per_s": samples_per_s,
            "metrics": metrics,
            "last_loss": self._progress().last_loss,
            "restarted": restarted,
            "quiet": quiet,
            **more,
        }
        # in `os.path` strings, the folder made if it is missing: once per run (issue 15)
        folder = os.path.join(os.path.dirname(self.directory), ENDED_SUBDIR)
        write_text_atomically(os.path.join(folder, f"{self._id}.json"), json.dumps(ended))


def ended_dir(directory: Path) -> Path:
    """Where the runs whose status files are in `directory` leave their ended records."""
    return directory.parent / ENDED_SUBDIR


def current_cell_id() -> str | None:
    """The id of the cell being run, from the execute request's metadata (JupyterLab sends
    `cellId`); None outside a kernel or from a client that does not send it."""
    if "IPython" not in sys.modules:  # no shell in this process (a `--procs` worker)
        return None
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
        parent = kernel.get_parent() if kernel is not None else None  # ipykernel >= 6
    except Exception:
        return None
    cell_id = (parent or {}).get("metadata", {}).get("cellId")
    return cell_id if isinstance(cell_id, str) else None
