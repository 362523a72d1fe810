"""The `%%train` runs in progress, from the status files kernels write (see runtime/status.py)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import psutil

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
