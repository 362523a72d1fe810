"""Export and bench reports in the run record of the run that trained the model.

Run records are append-only JSON lines (`runtime/records.py`), so an export or a bench never
rewrites the run's line: it appends a line of its own, `{"kind": "export" | "bench", "run": <the
run's id>, "run_time": ..., "export" | "bench": <the report as JSON>}`. `read_records` hands
readers of runs (`trainmate runs`, the webhook, the refactor's tables) only runs; `trainmate
report` lists these lines under the run they belong to.

Which run: in a notebook (or a script), the latest run recorded for that notebook in `runs/`
beside it; for a checkpoint (`trainmate export CHECKPOINT --model ...`), the latest run whose
recorded checkpoint is that file, else one in the same folder (older checkpoints are pruned
from the record but not always from the folder), looked up in `runs/` of the working directory
and of the checkpoint's parent folders; for an exported `.onnx` file (`trainmate bench
model.onnx`), the run its export was recorded with. Nothing is written when no run is found:
an export with no `%%train` run behind it creates no `runs/` folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.notebook import notebook_path, runs_folder
from ..runtime.records import RECORDS, append_record, read_records

EXPORT = "export"
BENCH = "bench"


@dataclass(frozen=True)
class Attached:
    """Where a report was recorded: the records file and the run's record."""

    records: Path
    run: dict[str, Any]

    def describe(self) -> str:
        return f"recorded in {self.records} with the run of {self.run.get('time', '?')}"


def current_notebook() -> str | None:
    """The notebook of the running kernel (None in a shell or a plain script)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return notebook_path({})
    shell = get_ipython()
    return notebook_path(shell.user_ns if shell is not None else {})


def find_run(
    *,
    notebook: str | None = None,
    checkpoint: Path | None = None,
    onnx_file: Path | None = None,
) -> tuple[Path, dict[str, Any]] | None:
    """The runs folder and record of the run that made the model (see the module's docstring)."""
    if checkpoint is not None:
        return _by_file(checkpoint, _checkpoint_of)
    if onnx_file is not None:
        return _by_file(onnx_file, _export_of)
    folder = runs_folder(notebook)
    runs = [r for r in read_records(folder) if r.get("notebook") == notebook]
    return (folder, runs[-1]) if runs else None


def attach(
    kind: str,
    report: Any,
    *,
    notebook: str | None = None,
    checkpoint: Path | None = None,
    onnx_file: Path | None = None,
) -> Attached | None:
    """Append `report` (an `ExportReport` or `BenchReport`) as a line of `kind` referring to the
    run that made the model; None when there is no such run or the file cannot be written."""
    found = find_run(notebook=notebook, checkpoint=checkpoint, onnx_file=onnx_file)
    if found is None:
        return None
    folder, run = found
    if run.get("kind") not in (None, "run"):  # an export line found for an .onnx file
        run = {"id": run.get("run"), "time": run.get("run_time"), "notebook": run.get("notebook")}
    model = Path(report.path) if kind == EXPORT else onnx_file
    line = {
        "kind": kind,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "notebook": run.get("notebook"),
        "run": run.get("id"),
        "run_time": run.get("time"),  # records written before runs had an id
        "checkpoint": str(checkpoint.resolve()) if checkpoint is not None else None,
        "model": str(model.resolve()) if model is not None else None,  # absolute: found again
        kind: json.loads(report.to_json()),
    }
    try:
        path = append_record(folder, line)
    except OSError as exc:  # a read-only folder must not turn a finished export into an error
        print(f"trainmate {kind}: not recorded in {folder / RECORDS}: {exc}")
        return None
    return Attached(path, run)


def _folders(file: Path) -> Iterator[Path]:
    """`runs/` of the working directory, then of each folder above `file`."""
    seen: set[Path] = set()
    for base in (Path.cwd(), *file.resolve().parents):
        folder = base.resolve() / "runs"
        if folder not in seen and (folder / RECORDS).is_file():
            seen.add(folder)
            yield folder


def _resolved(value: Any, base: Path) -> Path | None:
    if not isinstance(value, str) or not value:
        return None
    path = Path(value)
    return (path if path.is_absolute() else base / path).resolve()


def _checkpoint_of(record: dict[str, Any], base: Path) -> Path | None:
    return _resolved(record.get("checkpoint"), base)


def _export_of(record: dict[str, Any], base: Path) -> Path | None:
    return _resolved(record.get("model"), base)


def _by_file(
    file: Path, recorded: Callable[[dict[str, Any], Path], Path | None]
) -> tuple[Path, dict[str, Any]] | None:
    """The latest record naming `file` (a checkpoint: else one in its folder), per runs folder."""
    target = file.resolve()
    checkpoint = recorded is _checkpoint_of
    for folder in _folders(target):
        base = folder.parent  # runs/ sits beside the notebook, the kernel's working directory
        named = [
            (r, recorded(r, base))
            for r in read_records(folder, ("run",) if checkpoint else (EXPORT,))
        ]
        exact = [r for r, path in named if path == target]
        near = [r for r, path in named if path is not None and path.parent == target.parent]
        if exact or (near and checkpoint):
            return folder, (exact or near)[-1]
    return None
