"""
What a run tells: its events (tuning, guards, checkpoints, failures) and logged metrics, handed to
listeners (the display, TensorBoard) as they come, and its progress and summary, read from the
session's collaborators.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .amp import AmpPolicy
from .batches import Batches
from .stepping import Stepping
from .summary import Outcome, RunProgress, RunSummary
from .timing import StepTimer

UNREACHED = (
    "steps counted at optimizer steps: the rewrite reached no training loop (%%train --show "
    "says why)"
)


class Report:
    """Events, metrics, progress and summary of one run."""

    def __init__(
        self,
        timer: StepTimer,
        *,
        device: str,
        amp: AmpPolicy,
        prefetch: str,
        accumulate: int,
        instrumented: tuple[str, ...],
        left_alone: tuple[str, ...],
    ) -> None:
        self._timer = timer
        self._device, self._amp, self._prefetch, self._accumulate = (
            device,
            amp,
            prefetch,
            accumulate,
        )
        self._instrumented, self._left_alone = instrumented, left_alone
        self.events: list[str] = []
        self.logged: dict[str, float] = {}  # the last value of each metric
        self.on_event: list[Callable[[str], None]] = []
        self.on_log: list[Callable[[int, dict[str, float]], None]] = []
        self.started = 0.0

    def event(self, text: str) -> None:
        """Something the user should see: shown by the display, kept in the summary."""
        self.events.append(text)
        for listener in self.on_event:
            listener(text)

    def log(self, values: dict[str, float]) -> None:
        self.logged.update(values)
        step = self._timer.totals.steps
        for listener in self.on_log:
            listener(step, values)

    def progress(
        self, batches: Batches, stepping: Stepping, last_loss: Any, backwards: int = 0
    ) -> RunProgress:
        """Where the run is (any thread; reads the last loss, a synchronisation on a GPU).

        Steps fall back as the summary's do, so a loop the session cannot time (a `while` loop
        drawing its own batches) still moves the progress."""
        totals = self._timer.totals
        wall = time.perf_counter() - self.started
        steps = totals.steps or backwards or stepping.total
        at = batches.position(steps)
        eta = None
        if at.steps_left is not None and steps and wall > 0:
            eta = at.steps_left / (steps / wall)
        return RunProgress(
            steps=steps,
            samples=totals.samples,
            optimizer_steps=stepping.total,
            epoch=at.epoch,
            epochs_total=at.epochs_total,
            step_in_epoch=at.step_in_epoch,
            steps_per_epoch=at.steps_per_epoch,
            fraction=at.fraction,
            eta_s=eta,
            wall_s=wall,
            samples_per_s=totals.samples / wall if wall > 0 else 0.0,
            steps_per_s=steps / wall if wall > 0 else 0.0,
            data_wait_share=totals.data_share,
            last_loss=float(last_loss.detach().float()) if last_loss is not None else None,
            device=self._device,
            amp=self._amp.mode,
        )

    def summary(
        self, outcome: Outcome, batches: Batches, stepping: Stepping, backwards: int
    ) -> RunSummary:
        """What the run did so far (`steps` falls back to backward() calls, then to optimizer
        steps: loops it could not time still count, and a summary never shows 0 steps beside
        optimizer steps)."""
        totals = self._timer.totals
        steps, samples, epochs = batches.counted()
        steps = steps or backwards
        if not steps and stepping.total:
            steps = stepping.total
            if UNREACHED not in self.events:
                self.event(UNREACHED)
        return RunSummary(
            outcome=outcome,
            device=self._device,
            amp=self._amp.mode,
            amp_reason=self._amp.reason,
            prefetch=batches.prefetch_used,
            accumulate=self._accumulate,
            steps=steps,
            optimizer_steps=stepping.total,
            optimizer_steps_by_optimizer=tuple(stepping.counts.values()),
            epochs=epochs,
            samples=samples,
            wall_s=time.perf_counter() - self.started if self.started else 0.0,
            data_wait_s=totals.data_s,
            compute_s=totals.compute_s,
            data_wait_share=totals.data_share,
            skipped_steps=stepping.skipped,
            metrics=dict(self.logged),
            events=tuple(self.events),
            instrumented=self._instrumented,
            left_alone=self._left_alone,
            samples_source=batches.samples_source,
        )
