"""The runs of a report: run records read line by line (a bad line is a warning naming file:line),
then flattened into what the report shows (`RunView`)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TrainmateError
from ..runtime.records import RECORDS

# Options that change how a run is shown or where it writes, never what it trains.
NOT_HYPERPARAMETERS = frozenset({"display", "show", "tensorboard", "checkpoint", "every", "keep"})
# A metric whose name holds one of these improves upward; every other one (loss, error) downward.
HIGHER_IS_BETTER = ("acc", "f1", "auc", "score", "precision", "recall", "iou", "map", "bleu", "top")


def records_file(path: Path) -> Path:
    """`RUNS_DIR/runs.jsonl` (or a `.jsonl` file given directly); a one-line error when missing."""
    if path.is_file():
        return path
    if not path.exists():
        raise TrainmateError(f"{path}: no such folder")
    if not path.is_dir():
        raise TrainmateError(f"{path}: not a runs folder")
    found = path / RECORDS
    if not found.is_file():
        raise TrainmateError(f"{found}: no run records (no %%train run wrote here)")
    return found


def read_checked(path: Path, warn: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every record of `path`; a line that is not a JSON object is skipped with a warning."""
    records = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise TrainmateError(f"{path}: cannot read ({exc.strerror or exc})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            warn(f"{path}:{number}: not valid JSON ({exc.msg}), skipped")
            continue
        if not isinstance(record, dict):
            warn(f"{path}:{number}: not a JSON object, skipped")
            continue
        records.append(record)
    return records


def higher_is_better(metric: str, options: Mapping[str, Any] | None = None) -> bool:
    """Which way `metric` improves: `--monitor`'s `--mode` for the monitored one, else by name."""
    if options and options.get("monitor") == metric and options.get("mode") in ("min", "max"):
        return bool(options["mode"] == "max")
    name = metric.lower()
    if "loss" in name or "err" in name:
        return False
    return any(word in name for word in HIGHER_IS_BETTER)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _flat(prefix: str, value: Any, into: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for key in sorted(value, key=str):
            _flat(f"{prefix}.{key}" if prefix else str(key), value[key], into)
    elif isinstance(value, list | tuple):
        into[prefix] = ", ".join(str(v) for v in value) if value else "-"
    elif isinstance(value, float):
        into[prefix] = f"{value:.6g}"
    else:
        into[prefix] = "-" if value is None else str(value)


def parameters(record: Mapping[str, Any]) -> dict[str, str]:
    """The run's options (`--amp`, ...) and what its objects said (optimizer, lr, batch size),
    flattened to `name: text`."""
    found: dict[str, str] = {}
    options = record.get("options")
    if isinstance(options, Mapping):
        kept = {k: v for k, v in options.items() if k not in NOT_HYPERPARAMETERS}
        _flat("", kept, found)
    hyper = record.get("hyperparameters")
    if isinstance(hyper, Mapping):
        _flat("", hyper, found)
    return found


@dataclass(frozen=True)
class RunView:
    """One run as the report shows it."""

    number: int  # 1-based position in runs.jsonl: the run's name in the report ("#3")
    record: dict[str, Any]
    params: dict[str, str]

    @property
    def label(self) -> str:
        return f"#{self.number}"

    @property
    def summary(self) -> dict[str, Any]:
        summary = self.record.get("summary")
        return summary if isinstance(summary, dict) else {}

    @property
    def outcome(self) -> str:
        return str(self.record.get("outcome") or "?")

    @property
    def notebook(self) -> str:
        return Path(str(self.record.get("notebook") or "-")).name

    @property
    def time(self) -> str:
        return str(self.record.get("time") or "-")

    @property
    def wall_s(self) -> float | None:
        return _number(self.summary.get("wall_s"))

    @property
    def samples_per_s(self) -> float | None:
        wall, samples = self.wall_s, _number(self.summary.get("samples"))
        if not wall or samples is None or self.summary.get("samples_source") == "none":
            return None
        return samples / wall

    @property
    def steps_per_s(self) -> float | None:
        wall, steps = self.wall_s, _number(self.summary.get("steps"))
        return steps / wall if wall and steps is not None else None

    @property
    def data_wait_share(self) -> float | None:
        return _number(self.summary.get("data_wait_share"))

    @property
    def metrics(self) -> dict[str, float]:
        """The last value of each logged metric."""
        metrics = self.record.get("metrics")
        if not isinstance(metrics, Mapping):
            return {}
        return {str(k): v for k, val in metrics.items() if (v := _number(val)) is not None}

    @property
    def advice(self) -> list[str]:
        found = self.record.get("advice")
        if not isinstance(found, list):
            return []
        return [str(a.get("message")) for a in found if isinstance(a, Mapping)]

    @property
    def events(self) -> list[str]:
        events = self.summary.get("events")
        return [str(e) for e in events] if isinstance(events, list) else []

    @property
    def sweep(self) -> dict[str, Any] | None:
        sweep = self.record.get("sweep")
        if isinstance(sweep, Mapping) and isinstance(sweep.get("study"), str):
            return dict(sweep)
        return None

    @property
    def options(self) -> dict[str, Any]:
        options = self.record.get("options")
        return options if isinstance(options, dict) else {}


def run_views(records: list[dict[str, Any]]) -> list[RunView]:
    return [RunView(i, r, parameters(r)) for i, r in enumerate(records, start=1)]


def differing(runs: list[RunView]) -> list[str]:
    """The parameter names whose value is not the same in every run (a missing one counts)."""
    names = sorted({name for run in runs for name in run.params})
    return [n for n in names if len({run.params.get(n, "-") for run in runs}) > 1]


def shared(runs: list[RunView]) -> dict[str, str]:
    """The parameters every run has with the same value."""
    if not runs:
        return {}
    first = runs[0].params
    return {n: v for n, v in sorted(first.items()) if all(r.params.get(n) == v for r in runs)}
