"""
Run records: every `%%train` run appends one JSON line to `runs/runs.jsonl` beside the notebook.

One `os.write` of a whole line to a file opened with O_APPEND: concurrent runs never interleave
their lines. Readers skip a line that does not parse. The git lookup (two `git` subprocesses) runs
on a background thread from the start of the run, so it costs the run nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .._version import __version__
from .options import TrainOptions
from .summary import RunSummary

RECORDS = "runs.jsonl"


def runs_folder(notebook: str | None) -> Path:
    return (Path(notebook).parent if notebook else Path.cwd()) / "runs"


def git_commit(directory: Path) -> str | None:
    """The commit the notebook's repository is at (with "-dirty" for uncommitted changes)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def hyperparameters(
    namespace: Mapping[str, object], batch_size: int | None, epochs: int | None
) -> dict[str, Any]:
    """What the run's objects say about it: learning rates, optimizer and scheduler names, sizes."""
    optimizers, schedulers, params = {}, {}, 0
    trained: set[int] = set()
    for name, value in namespace.items():
        if name.startswith("_"):
            continue
        if isinstance(value, torch.optim.Optimizer):
            group = value.param_groups[0]
            optimizers[name] = {"type": type(value).__name__, "lr": float(group.get("lr", 0.0))}
            trained.update(id(p) for g in value.param_groups for p in g["params"])
        elif isinstance(value, torch.optim.lr_scheduler.LRScheduler):
            schedulers[name] = type(value).__name__
    for name, value in namespace.items():
        if isinstance(value, torch.nn.Module) and not name.startswith("_"):
            params += sum(p.numel() for p in value.parameters() if id(p) in trained)
    return {
        "optimizers": optimizers,
        "schedulers": schedulers,
        "batch_size": batch_size,
        "epochs": epochs,
        "trained_parameters": params,
    }


class GitLookup:
    """`git_commit()` of a folder, started on a thread now, read when the record is written."""

    def __init__(self, directory: Path) -> None:
        self._result: str | None = None
        self._thread = threading.Thread(target=self._run, args=(directory,), daemon=True)
        self._thread.start()

    def _run(self, directory: Path) -> None:
        self._result = git_commit(directory)

    def result(self, timeout: float = 5.0) -> str | None:
        self._thread.join(timeout)
        return self._result


def make_record(
    summary: RunSummary,
    options: TrainOptions,
    *,
    notebook: str | None,
    hyper: dict[str, Any],
    checkpoint: Path | None,
    commit: str | None,
) -> dict[str, Any]:
    data = asdict(summary)
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "notebook": notebook,
        "outcome": summary.outcome,
        "options": asdict(options),
        "hyperparameters": hyper,
        "metrics": summary.metrics,
        "summary": {
            k: v for k, v in data.items() if k not in ("metrics", "instrumented", "left_alone")
        },
        "checkpoint": str(checkpoint) if checkpoint else None,
        "versions": {
            "jupyter_trainmate": __version__,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        "git_commit": commit,
        "host": platform.node(),
    }


def append_record(folder: Path, record: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RECORDS
    line = (json.dumps(record, default=str) + "\n").encode()
    # One write of a whole line with O_APPEND: lines of concurrent runs never interleave. No
    # fsync: a record is worth little next to the milliseconds it would add to every short run.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return path


def read_records(folder: Path) -> list[dict[str, Any]]:
    path = folder / RECORDS
    found = []
    with contextlib.suppress(FileNotFoundError), path.open() as f:
        for line in f:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    found.append(record)
    return found
