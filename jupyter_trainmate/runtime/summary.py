"""The summary of a `%%train` run, kept for `jupyter_trainmate.last_run()`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..explain.kinds import Explanation

Outcome = Literal["finished", "interrupted", "failed", "stopped early"]
SamplesSource = Literal["loader", "batch dim 0", "none"]
"""How a run's samples were counted: exactly from a DataLoader's batch size and sampler, from the
leading dimension of each batch's first tensor or array (a guess: a time-major `(T, B)` batch
gives T), or not at all (no batch loop, or batches holding no tensor or array to guess from: a
Python list of token ids per sentence)."""


@dataclass(frozen=True)
class RunSummary:
    """What one `%%train` run did.

    `steps` are the batches (micro-batches under `--accumulate`) that trained: a batch counts when
    a backward() or an optimizer step happened while it was in hand, so validation batches do not.
    `optimizer_steps` are real updates. `epochs` are passes over the training data that trained.
    `samples_source` says how samples were counted (see `SamplesSource`). `error` explains a
    failed run (`kind`, `message`, `cause`, `advice`; see `jupyter_trainmate.explain`).
    """

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
    samples_source: SamplesSource = "loader"
    error: Explanation | None = None  # why the run failed: kind, message, cause, advice

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s if self.wall_s > 0 else 0.0

    def line(self) -> str:
        """One line for a log or a terminal."""
        if self.samples_source == "none":
            samples, rate = "samples not counted (no batch loop, or no tensor in its batches)", ""
        elif self.samples_source == "batch dim 0":
            samples = f"~{self.samples:,} samples (a guess: the first dimension of each batch)"
            rate = f"~{self.samples_per_s:,.0f} samples/s, "
        else:
            samples, rate = f"{self.samples:,} samples", f"{self.samples_per_s:,.0f} samples/s, "
        return (
            f"trainmate: {self.outcome} after {self.epochs} epoch(s), {self.steps:,} steps "
            f"({self.optimizer_steps:,} optimizer steps), {samples} in {self.wall_s:.1f} s: "
            f"{rate}{self.steps_per_s:,.1f} steps/s, data wait {self.data_wait_share:.0%}; "
            f"{self.device}, amp {self.amp}, prefetch {self.prefetch}, "
            f"{self.skipped_steps} skipped step(s)"
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
