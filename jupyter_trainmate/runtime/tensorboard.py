"""
TensorBoard event files for a `%%train` run, when the `tensorboard` package is installed.

`--tensorboard auto` (the default) writes them when `tensorboard` can be imported, `on` insists
(a one-line error if it is missing), `off` never does. Each run gets its own folder,
`runs/tensorboard/<time>-<run name>/` beside the notebook (next to `runs/runs.jsonl`), so
`tensorboard --logdir runs/tensorboard` compares runs.

What is written costs the training loop nothing per step: the run's one display thread already
reads the progress once a second (loss, samples/s, data-wait share; the loss read is the only
host-device synchronisation, as for the display) and those readings go to
`torch.utils.tensorboard.SummaryWriter`, created on that thread (its import takes a moment) and
flushed at the end of the run. Metrics from `jupyter_trainmate.log(...)` are written at the step
they were logged, and the run's summary line and options as text.
"""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path
from typing import Any

from ..errors import TrainmateError
from .summary import RunProgress, RunSummary

MODES = ("auto", "on", "off")


def tensorboard_installed() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def wanted(mode: str) -> bool:
    """Whether a run with `--tensorboard MODE` writes event files (raises for `on` without it)."""
    if mode == "off":
        return False
    installed = tensorboard_installed()
    if mode == "on" and not installed:
        raise TrainmateError("--tensorboard on: the tensorboard package is not installed")
    return installed


def run_folder(runs: Path, run_name: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_name).strip("_")[:40] or "run"
    return runs / "tensorboard" / f"{time.strftime('%Y%m%d-%H%M%S')}-{slug}"


class TensorBoardLog:
    """Scalars and text for one run; every method may be called from any thread."""

    def __init__(self, folder: Path, options_text: str) -> None:
        self.folder = folder
        self._options = options_text
        self._writer: Any = None
        self._pending_metrics: list[tuple[int, dict[str, float]]] = []
        self._last_step = -1

    def _open(self) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.folder.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(log_dir=str(self.folder), flush_secs=10)
            self._writer.add_text("run/options", self._options, 0)
        return self._writer

    def progress(self, progress: RunProgress | None) -> None:
        """One reading of the run (display thread, about once a second)."""
        if progress is None or progress.steps == self._last_step or progress.steps == 0:
            return
        writer = self._open()
        step = progress.steps
        self._last_step = step
        if progress.last_loss is not None:
            writer.add_scalar("train/loss", progress.last_loss, step)
        writer.add_scalar("train/samples_per_s", progress.samples_per_s, step)
        writer.add_scalar("train/data_wait_share", progress.data_wait_share, step)
        for logged_step, values in self._take_metrics():
            for name, value in values.items():
                writer.add_scalar(f"metrics/{name}", value, logged_step)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Values from `jupyter_trainmate.log()` (training thread): kept for the next write."""
        self._pending_metrics.append((step, dict(values)))

    def _take_metrics(self) -> list[tuple[int, dict[str, float]]]:
        taken, self._pending_metrics = self._pending_metrics, []
        return taken

    def close(self, summary: RunSummary, last: RunProgress | None) -> None:
        self.progress(last)
        writer = self._open()
        for logged_step, values in self._take_metrics():
            for name, value in values.items():
                writer.add_scalar(f"metrics/{name}", value, logged_step)
        writer.add_text("run/summary", summary.line(), summary.steps)
        writer.close()
