"""The `%%train` runs in progress and the runs that ended lately, from the status files kernels
write (see runtime/status.py)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import psutil

from ..runtime.status import ended_dir

# How long an ended run stays listed (for a lab window that polls now and then): then it goes.
ENDED_KEEP_S = 600.0
# A process's start time as psutil reports it can differ by rounding between two reads.
_START_TOLERANCE_S = 1.0


def _alive(pid: int, started: float | None) -> bool:
    try:
        process = psutil.Process(pid)
        if started is not None and abs(process.create_time() - started) > _START_TOLERANCE_S:
            return False  # the pid was reused by another process
        return process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def list_runs(directory: Path) -> list[dict[str, Any]]:
    """The runs whose process is alive, oldest first; status files of dead processes are removed."""
    runs: list[dict[str, Any]] = []
    if not directory.is_dir():
        return runs
    for path in sorted(directory.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            pid = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced right now, or not ours: skip, never crash the endpoint
        if _alive(pid, record.get("pid_started")):
            runs.append(record)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    runs.sort(key=lambda r: r.get("started", 0.0))
    return runs


def list_ended(directory: Path, keep_s: float = ENDED_KEEP_S) -> list[dict[str, Any]]:
    """The runs (of status files in `directory`) that ended in the last `keep_s` seconds, oldest
    first; older records are removed. An attempt that `--retries` restarted is no ended run, nor
    is a trial of a sweep (`quiet`: the sweep's own end is)."""
    folder = ended_dir(directory)
    ended: list[dict[str, Any]] = []
    if not folder.is_dir():
        return ended
    now = time.time()
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            at = float(record["ended"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if now - at > keep_s:
            with contextlib.suppress(OSError):
                path.unlink()
        elif not record.get("restarted") and not record.get("quiet"):
            ended.append(record)
    ended.sort(key=lambda r: r["ended"])
    return ended
