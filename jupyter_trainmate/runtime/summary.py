"""The summary of a `%%train` run, kept for `jupyter_trainmate.last_run()`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["finished", "interrupted", "failed", "stopped early"]


@dataclass(frozen=True)
class RunSummary:
    """What one `%%train` run did. `steps` are micro-batches; `optimizer_steps` real updates."""

    outcome: Outcome
    device: str
    amp: str
    amp_reason: str
    prefetch: str
    accumulate: int
    steps: int
    optimizer_steps: int
    optimizer_steps_by_optimizer: tuple[int, ...]
    epochs: int
    samples: int
    wall_s: float
    data_wait_s: float
    compute_s: float
    data_wait_share: float
    skipped_steps: int
    metrics: dict[str, float] = field(default_factory=dict)  # last value of each logged metric
    events: tuple[str, ...] = field(default=())  # what the run reported: tuning, guards
    instrumented: tuple[str, ...] = field(default=())
    left_alone: tuple[str, ...] = field(default=())

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s if self.wall_s > 0 else 0.0

    def line(self) -> str:
        """One line for a log or a terminal."""
        return (
            f"trainmate: {self.outcome} after {self.epochs} epoch(s), {self.steps:,} steps "
            f"({self.optimizer_steps:,} optimizer steps), {self.samples:,} samples in "
            f"{self.wall_s:.1f} s: {self.samples_per_s:,.0f} samples/s, {self.steps_per_s:,.1f} "
            f"steps/s, data wait {self.data_wait_share:.0%}; {self.device}, amp {self.amp}, "
            f"prefetch {self.prefetch}, {self.skipped_steps} skipped step(s)"
        )


@dataclass(frozen=True)
class RunProgress:
    """Where a run in progress is: what the status file, the sidebar and the widget show."""

    steps: int
    samples: int
    optimizer_steps: int
    epoch: int  # 1-based epoch in progress (or the last finished one)
    epochs_total: int | None
    step_in_epoch: int
    steps_per_epoch: int | None
    fraction: float | None  # 0..1 when the epoch loop and the loader have lengths
    eta_s: float | None
    wall_s: float
    samples_per_s: float
    steps_per_s: float
    data_wait_share: float
    last_loss: float | None
    device: str
    amp: str


_last: RunSummary | None = None


def last_run() -> RunSummary | None:
    """The summary of the most recent `%%train` run in this process, or None before the first."""
    return _last


def remember_last_run(summary: RunSummary) -> None:
    global _last
    _last = summary


def reset() -> None:
    """Forget the last run (tests: each starts with none)."""
    global _last
    _last = None
