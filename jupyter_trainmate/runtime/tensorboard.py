"""
TensorBoard event files for a `%%train` run, when the `tensorboard` package is installed.

`--tensorboard auto` (the default) writes them when `tensorboard` can be imported, `on` insists
(a one-line error if it is missing), `off` never does. Each run gets its own folder,
`runs/tensorboard/<time>-<run name>/` beside the notebook (next to `runs/runs.jsonl`), so
`tensorboard --logdir runs/tensorboard` compares runs.

What is written costs the training loop nothing per step: the run's one display thread already
reads the progress once a second (loss, samples/s, data-wait share; the loss read is the only
host-device synchronisation, as for the display) and those readings are appended to the run's event file, opened on that thread at its first reading (or
at the end of a shorter run) and flushed after each reading. The file is written in place, as
`torch.utils.tensorboard.SummaryWriter` writes it (the same records, built by torch's summary
functions and tensorboard's record writer) but without the writer thread and queue a
SummaryWriter starts and joins: about half a millisecond of every short run. Metrics from `jupyter_trainmate.log(...)` are written at the step
they were logged, and the run's summary line and options as text.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import socket
import threading
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


_FILE_NUMBERS = itertools.count()  # as tensorboard's writer: a process's files never collide


class EventFile:
    """One TensorBoard event file, written synchronously by whichever thread calls."""

    def __init__(self, folder: Path) -> None:
        from tensorboard.compat.proto.event_pb2 import Event  # type: ignore[import-untyped]
        from tensorboard.summary.writer.record_writer import (  # type: ignore[import-untyped]
            RecordWriter,
        )
        from torch.utils.tensorboard import summary

        self._event = Event
        self._summary: Any = summary  # scalar() and text(): SummaryWriter's own event builders
        folder.mkdir(parents=True, exist_ok=True)
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{next(_FILE_NUMBERS)}"
        )
        self._records = RecordWriter((folder / name).open("wb"))  # closed by close()
        self._write(self._event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event: Any) -> None:
        self._records.write(event.SerializeToString())

    def scalar(self, tag: str, value: float, step: int) -> None:
        summary = self._summary.scalar(tag, value)
        self._write(self._event(wall_time=time.time(), step=step, summary=summary))

    def text(self, tag: str, text: str, step: int) -> None:
        summary = self._summary.text(tag, text)
        self._write(self._event(wall_time=time.time(), step=step, summary=summary))

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()


class TensorBoardLog:
    """Scalars and text for one run; every method may be called from any thread."""

    def __init__(self, folder: Path, options_text: str) -> None:
        self.folder = folder
        self._options = options_text
        self._writer: EventFile | None = None
        self._pending_metrics: list[tuple[int, dict[str, float]]] = []
        self._last_step = -1
        self._lock = threading.Lock()  # the display thread writes, then the training thread

    def _open(self) -> EventFile:
        if self._writer is None:
            self._writer = EventFile(self.folder)
            self._writer.text("run/options", self._options, 0)
        return self._writer

    def progress(self, progress: RunProgress | None) -> None:
        """One reading of the run (display thread, about once a second)."""
        if progress is None or progress.steps == self._last_step or progress.steps == 0:
            return
        with self._lock:
            self._write_progress(progress)
            self._open().flush()

    def _write_progress(self, progress: RunProgress) -> None:
        writer = self._open()
        step = progress.steps
        self._last_step = step
        if progress.last_loss is not None:
            writer.scalar("train/loss", progress.last_loss, step)
        writer.scalar("train/samples_per_s", progress.samples_per_s, step)
        writer.scalar("train/data_wait_share", progress.data_wait_share, step)
        self._write_metrics(writer)

    def _write_metrics(self, writer: EventFile) -> None:
        for logged_step, values in self._take_metrics():
            for name, value in values.items():
                writer.scalar(f"metrics/{name}", value, logged_step)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Values from `jupyter_trainmate.log()` (training thread): kept for the next write."""
        self._pending_metrics.append((step, dict(values)))

    def _take_metrics(self) -> list[tuple[int, dict[str, float]]]:
        taken, self._pending_metrics = self._pending_metrics, []
        return taken

    def close(self, summary: RunSummary, last: RunProgress | None) -> None:
        with self._lock:
            writer = self._open()
            try:
                if last is not None and last.steps not in (self._last_step, 0):
                    self._write_progress(last)
                self._write_metrics(writer)
                writer.text("run/summary", summary.line(), summary.steps)
            finally:
                writer.close()
