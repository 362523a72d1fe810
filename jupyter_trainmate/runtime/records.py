"""
Run records: every `%%train` run appends one JSON line to `runs/runs.jsonl` beside the notebook.

One `os.write` of a whole line to a file opened with O_APPEND: concurrent runs never interleave
their lines. Readers skip a line that does not parse. The commit is read from `.git` directly: a
`git` subprocess would cost every run milliseconds.

A run's record has an `id`. What is done later with the run's model (`trainmate export`,
`trainmate bench`) is appended as a line of its own with a `kind` ("export", "bench") and the
run's `id` in `run`: the file stays append-only, never rewritten. A line without `kind` is a
run; `read_records` returns only runs unless asked for other kinds (`deploy/attach.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import stat
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from .._version import __version__
from .options import TrainOptions
from .summary import RunSummary

RECORDS = "runs.jsonl"
RUN = "run"  # the kind of a line without "kind": a %%train run's record


def kind(record: Mapping[str, Any]) -> str:
    """What a line records: "run" (a `%%train` run), "export", "bench"."""
    return str(record.get("kind") or RUN)


def git_commit(directory: Path | str) -> str | None:
    """The commit the repository holding `directory` is at, read from `.git` (no subprocess).

    The folders up to the root are walked as strings, one `stat` of `.git` each (`pathlib`'s
    `parents` and an `is_file` and `is_dir` per folder were about 1,300 Python opcodes and two
    syscalls a folder of every run, issue 15)."""
    folder = os.fspath(directory)
    while True:
        git = os.path.join(folder, ".git")
        try:
            mode = os.stat(git).st_mode
        except OSError:
            mode = 0
        if stat.S_ISREG(mode):  # a worktree or submodule: "gitdir: <path>"
            with open(git) as f:
                text = f.read().strip()
            git = os.path.realpath(os.path.join(folder, text.removeprefix("gitdir:").strip()))
            mode = os.stat(git).st_mode if os.path.exists(git) else 0
        if stat.S_ISDIR(mode):
            return _resolve_head(Path(git))
        parent = os.path.dirname(folder) or "."  # "a" (relative): "." is its parent
        if parent == folder:
            return None
        folder = parent


def _resolve_head(git: Path) -> str | None:
    try:
        head = (git / "HEAD").read_text().strip()
    except OSError:
        return None
    if not head.startswith("ref:"):
        return head or None  # detached HEAD
    ref = head.removeprefix("ref:").strip()
    common = git
    with contextlib.suppress(OSError):  # worktrees keep refs in the common dir
        common = (git / (git / "commondir").read_text().strip()).resolve()
    for base in (git, common):
        with contextlib.suppress(OSError):
            return (base / ref).read_text().strip()
        with contextlib.suppress(OSError):
            for line in (base / "packed-refs").read_text().splitlines():
                sha, _, name = line.partition(" ")
                if name == ref:
                    return sha
    return None  # a branch with no commit yet


def hyperparameters(
    namespace: Mapping[str, object], batch_size: int | None, epochs: int | None
) -> dict[str, Any]:
    """What the run's objects say about it: learning rates, optimizer and scheduler names, sizes."""
    import torch  # here: reading records (`trainmate runs`, the refactor's docs) needs no torch

    optimizer, scheduler, module = (
        torch.optim.Optimizer,
        torch.optim.lr_scheduler.LRScheduler,
        torch.nn.Module,
    )
    optimizers, schedulers, params = {}, {}, 0
    trained: set[int] = set()
    modules = []
    for name, value in namespace.items():  # one pass (IPython's namespace grows with each cell)
        if name.startswith("_"):
            continue
        if isinstance(value, optimizer):
            group = value.param_groups[0]
            optimizers[name] = {"type": type(value).__name__, "lr": float(group.get("lr", 0.0))}
            trained.update(id(p) for g in value.param_groups for p in g["params"])
        elif isinstance(value, scheduler):
            schedulers[name] = type(value).__name__
        elif isinstance(value, module):
            modules.append(value)
    for value in modules:  # once every optimizer's parameters are known
        params += sum(p.numel() for p in value.parameters() if id(p) in trained)
    return {
        "optimizers": optimizers,
        "schedulers": schedulers,
        "batch_size": batch_size,
        "epochs": epochs,
        "trained_parameters": params,
    }


def make_record(
    summary: RunSummary,
    options: TrainOptions,
    *,
    notebook: str | None,
    hyper: dict[str, Any],
    checkpoint: Path | None,
    commit: str | None,
) -> dict[str, Any]:
    import torch

    data = _fields(summary)
    return {
        "id": uuid.uuid4().hex[:12],  # what later lines (exports, benches) refer to
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "notebook": notebook,
        "outcome": summary.outcome,
        "options": _fields(options),
        "hyperparameters": hyper,
        "metrics": summary.metrics,
        "summary": {
            k: v
            for k, v in data.items()
            if k not in ("metrics", "instrumented", "left_alone", "error")
        },
        "error": summary.error.as_dict() if summary.error is not None else None,
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


def _fields(record: RunSummary | TrainOptions) -> dict[str, Any]:
    """A dataclass's fields (`asdict` without its deep copy: they are plain values, tuples and a
    dict of floats, written out as JSON at once)."""
    names = _NAMES.get(type(record))
    if names is None:  # `fields()` builds its list anew on every call: the names once per class
        names = _NAMES[type(record)] = tuple(f.name for f in fields(record))
    return {name: getattr(record, name) for name in names}


_NAMES: dict[type, tuple[str, ...]] = {}


CURVE_POINTS = 64


def _downsample(points: Sequence[tuple[float, float]], most: int) -> list[list[float]]:
    """At most `most` evenly spaced points (the first and last kept), 6 significant digits."""
    if len(points) > most:
        last = len(points) - 1
        points = [points[round(i * last / (most - 1))] for i in range(most)]
    return [[float(f"{x:.6g}"), float(f"{y:.6g}")] for x, y in points]


def compact_curves(
    loss: Sequence[tuple[float, float]],
    metrics: Mapping[str, Sequence[tuple[float, float]]],
    most: int = CURVE_POINTS,
) -> dict[str, list[list[float]]]:
    """The run's curves for its record: `{"loss": [[step, value], ...], "<metric>": ...}`,
    downsampled to `most` points each (`trainmate report` draws them without TensorBoard)."""
    curves = {"loss": _downsample(loss, most)} if loss else {}
    for name in sorted(metrics):
        if name != "loss" and metrics[name]:
            curves[name] = _downsample(metrics[name], most)
    return curves


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


def read_records(folder: Path, kinds: Sequence[str] | None = (RUN,)) -> list[dict[str, Any]]:
    """The records in `folder/runs.jsonl` of these kinds (default: runs only; None: every line)."""
    path = folder / RECORDS
    found = []
    with contextlib.suppress(FileNotFoundError), path.open() as f:
        for line in f:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and (kinds is None or kind(record) in kinds):
                    found.append(record)
    return found
