"""A run's curves: from its TensorBoard event files when they are there and `tensorboard` is
installed (every reading), else from the downsampled `curves` its record carries.

Curve names are the record's: `loss` (the training loss) and each metric logged with
`jupyter_trainmate.log()`. TensorBoard's `train/loss` and `metrics/<name>` map onto them.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

Curve = list[tuple[float, float]]
MOST_POINTS = 200  # per curve in the report: enough for a 640-pixel chart


def downsample(points: Curve, most: int = MOST_POINTS) -> Curve:
    """At most `most` evenly spaced points, first and last kept (deterministic)."""
    if len(points) <= most:
        return points
    last = len(points) - 1
    return [points[round(i * last / (most - 1))] for i in range(most)]


def _from_record(record: Mapping[str, Any]) -> dict[str, Curve]:
    curves = record.get("curves")
    found: dict[str, Curve] = {}
    if not isinstance(curves, Mapping):
        return found
    for name, points in curves.items():
        if not isinstance(points, list):
            continue
        pts = []
        for point in points:
            if (
                isinstance(point, list | tuple)
                and len(point) == 2
                and all(isinstance(v, int | float) and math.isfinite(v) for v in point)
            ):
                pts.append((float(point[0]), float(point[1])))
        if pts:
            found[str(name)] = pts
    return found


def tensorboard_readable() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def _from_tensorboard(folder: Path) -> dict[str, Curve]:
    """`train/loss` and `metrics/*` scalars of one run folder (empty when unreadable)."""
    from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
        EventAccumulator,
    )

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    try:
        accumulator.Reload()
        tags = accumulator.Tags().get("scalars", [])
    except Exception:  # a torn or foreign event file: the record's curves serve instead
        return {}
    found: dict[str, Curve] = {}
    for tag in sorted(tags):
        if tag == "train/loss":
            name = "loss"
        elif tag.startswith("metrics/"):
            name = tag.removeprefix("metrics/")
        else:
            continue
        points = sorted(
            (float(e.step), float(e.value))
            for e in accumulator.Scalars(tag)
            if math.isfinite(e.value)
        )
        if points:
            found[name] = points
    return found


def _event_folder(record: Mapping[str, Any], runs_dir: Path) -> Path | None:
    """The run's TensorBoard folder: where the record says, else under this runs folder's
    `tensorboard/` by name (a runs folder copied or moved elsewhere)."""
    folder = record.get("tensorboard")
    if not isinstance(folder, str) or not folder:
        return None
    for path in (Path(folder), runs_dir / "tensorboard" / Path(folder).name):
        if path.is_absolute() and path.is_dir():
            return path
    return None


def run_curves(record: Mapping[str, Any], runs_dir: Path) -> tuple[dict[str, Curve], str]:
    """The curves of one run and where they came from (`tensorboard`, `record` or `none`)."""
    folder = _event_folder(record, runs_dir.resolve())
    if folder is not None and tensorboard_readable():
        found = _from_tensorboard(folder)
        if found:
            return {k: downsample(v) for k, v in found.items()}, "tensorboard"
    found = _from_record(record)
    if found:
        return {k: downsample(v) for k, v in found.items()}, "record"
    return {}, "none"
