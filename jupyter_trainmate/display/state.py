"""
One model of a run's state, which every view (widget, text) draws.

Fed by the display thread a few times a second from the session's `progress()` and the sampler's
latest reading, and by `jupyter_trainmate.log()` calls; histories are bounded (`BoundedSeries`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..monitor.sampler import DeviceSample
from ..runtime.summary import RunProgress, RunSummary
from .advice import Advice
from .history import BoundedSeries

GiB = 1024**3


@dataclass(frozen=True)
class DeviceLine:
    """One device row of the display: a GPU, or the CPU and this process on a machine without one."""

    label: str
    util_pct: float | None
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class Snapshot:
    progress: RunProgress | None
    loss: list[tuple[float, float]]
    metrics: dict[str, list[tuple[float, float]]]
    devices: tuple[DeviceLine, ...]
    amp: str
    loss_scale: float | None
    skipped_steps: int
    events: tuple[str, ...]
    advice: tuple[Advice, ...]
    summary: RunSummary | None = None


def device_lines(sample: DeviceSample | None) -> tuple[DeviceLine, ...]:
    if sample is None:
        return ()
    if sample.gpu.available:
        return tuple(
            DeviceLine(
                f"GPU {g.index} {g.name}",
                g.utilization_pct,
                g.memory_used_bytes,
                g.memory_total_bytes,
            )
            for g in sample.gpu.gpus
        )
    host = sample.host
    return (
        DeviceLine(
            f"CPU ({host.cpus})", host.cpu_percent, host.memory_used_bytes, host.memory_total_bytes
        ),
        DeviceLine("this process", None, sample.process_rss_bytes, host.memory_total_bytes),
    )


@dataclass
class RunState:
    """The run as the display knows it. Thread-safe: the training thread may call `log()`."""

    max_points: int = 512
    loss: BoundedSeries = field(init=False)
    metrics: dict[str, BoundedSeries] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    progress: RunProgress | None = None
    device: DeviceSample | None = None
    gpu_util: BoundedSeries = field(init=False)
    gpu_memory_fraction: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last_loss_step: int = -1

    def __post_init__(self) -> None:
        self.loss = BoundedSeries(self.max_points)
        self.gpu_util = BoundedSeries(self.max_points)

    def observe(self, progress: RunProgress, device: DeviceSample | None) -> None:
        with self._lock:
            self.progress = progress
            self.device = device
            if progress.last_loss is not None and progress.steps != self._last_loss_step:
                self.loss.append(progress.steps, progress.last_loss)
                self._last_loss_step = progress.steps
            if device is not None and device.gpu.available and device.gpu.gpus:
                gpus = device.gpu.gpus
                utils = [g.utilization_pct for g in gpus if g.utilization_pct is not None]
                if utils:
                    self.gpu_util.append(progress.steps, sum(utils) / len(utils))
                self.gpu_memory_fraction = max(
                    g.memory_used_bytes / max(1, g.memory_total_bytes) for g in gpus
                )

    def log(self, step: float, values: dict[str, float]) -> None:
        with self._lock:
            for name, value in values.items():
                self.metrics.setdefault(name, BoundedSeries(self.max_points)).append(step, value)

    def event(self, text: str) -> None:
        with self._lock:
            self.events.append(text)
            del self.events[:-20]

    def snapshot(
        self,
        *,
        amp: str,
        loss_scale: float | None,
        skipped_steps: int,
        advice: tuple[Advice, ...] = (),
        summary: RunSummary | None = None,
    ) -> Snapshot:
        with self._lock:
            return Snapshot(
                progress=self.progress,
                loss=self.loss.points(),
                metrics={k: v.points() for k, v in self.metrics.items()},
                devices=device_lines(self.device),
                amp=amp,
                loss_scale=loss_scale,
                skipped_steps=skipped_steps,
                events=tuple(self.events),
                advice=advice,
                summary=summary,
            )
