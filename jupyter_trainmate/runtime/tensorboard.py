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
functions, framed as tensorboard's record writer frames them) but without the writer thread and
queue a SummaryWriter starts and joins: about half a millisecond of every short run. Each record
carries two CRC-32C checksums; tensorboard computes them in pure Python (about 0.24 us a byte,
0.3-0.4 ms of a run's event file, more than any other part of a run's end): with
`google-crc32c` installed (the `tensorboard` extra brings it) its C implementation frames the
records instead, byte for byte the same. Metrics from `jupyter_trainmate.log(...)` are written at the step
they were logged, and the run's summary line and options as text.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

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


class _Records:
    """TensorBoard's record framing (tensorboard's `RecordWriter`: the length, its masked CRC-32C,
    the data, its masked CRC-32C, little-endian) with a CRC-32C function given."""

    def __init__(self, file: BinaryIO, crc32c: Callable[[bytes], int]) -> None:
        self._file = file
        self._crc32c = crc32c

    def _masked(self, data: bytes) -> bytes:
        crc = self._crc32c(data)
        return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)

    def write(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self._file.write(header + self._masked(header) + data + self._masked(data))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def c_crc32c() -> Callable[[bytes], int] | None:
    """google-crc32c's CRC-32C when it is installed with its C implementation, else None."""
    try:
        import google_crc32c
    except ImportError:
        return None
    return google_crc32c.value if google_crc32c.implementation == "c" else None


def record_writer(file: BinaryIO) -> Any:
    """A writer of framed records to `file`: `_Records` with google-crc32c's C CRC-32C when it is
    installed, else tensorboard's own `RecordWriter` (its CRC in pure Python)."""
    crc32c = c_crc32c()
    if crc32c is not None:
        return _Records(file, crc32c)
    from tensorboard.summary.writer.record_writer import (  # type: ignore[import-untyped]
        RecordWriter,
    )

    return RecordWriter(file)


_FILE_NUMBERS = itertools.count()  # as tensorboard's writer: a process's files never collide


class EventFile:
    """One TensorBoard event file, written synchronously by whichever thread calls."""

    def __init__(self, folder: Path) -> None:
        from tensorboard.compat.proto.event_pb2 import Event  # type: ignore[import-untyped]
        from torch.utils.tensorboard import summary

        self._event = Event
        self._summary: Any = summary  # scalar() and text(): SummaryWriter's own event builders
        folder.mkdir(parents=True, exist_ok=True)
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{next(_FILE_NUMBERS)}"
        )
        self._records = record_writer((folder / name).open("wb"))  # closed by close()
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
