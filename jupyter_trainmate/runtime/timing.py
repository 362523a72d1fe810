"""
Per-step timing without a host-device synchronisation on every step.

A step has two parts: waiting for the batch (data) and everything after it until the next batch
is asked for (compute). On the CPU both are wall-clock intervals. On CUDA the host runs ahead of
the GPU, so the host's compute interval says little; each step's GPU time is bracketed by two
CUDA events instead, and the events are read lazily: `poll()` reads only those the GPU has
already passed (`Event.query()` does not block), so a step's GPU time arrives a few steps late
and the loop never waits for it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class StepTotals:
    """Running totals of a run's steps (seconds)."""

    steps: int = 0
    samples: int = 0
    data_s: float = 0.0
    compute_s: float = 0.0
    gpu_s: float = 0.0
    gpu_steps: int = 0

    @property
    def data_share(self) -> float:
        """Fraction of step time spent waiting for data (0 when nothing was timed)."""
        total = self.data_s + self.compute_s
        return self.data_s / total if total > 0 else 0.0


class StepTimer:
    """Time data wait and compute of each step; on CUDA also GPU time, read lazily."""

    def __init__(
        self,
        device: torch.device | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.totals = StepTotals()
        self._clock = clock
        self._cuda = device is not None and device.type == "cuda"
        self._device = device
        self._pending: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()
        self._mark = clock()  # end of the previous step's data wait = start of its compute
        self._in_step = False
        self._start_event: torch.cuda.Event | None = None

    def before_fetch(self) -> None:
        """The loop asks for the next batch: the previous step's compute ends here."""
        now = self._clock()
        if self._in_step:
            self.totals.compute_s += now - self._mark
            if self._cuda and self._start_event is not None:
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end.record()
                self._pending.append((self._start_event, end))
                self._start_event = None
            self._in_step = False
        self._mark = now

    def after_fetch(self, samples: int) -> None:
        """The batch arrived: the data wait ends and the step's compute begins."""
        now = self._clock()
        self.totals.data_s += now - self._mark
        self.totals.steps += 1
        self.totals.samples += samples
        self._mark = now
        self._in_step = True
        if self._cuda:
            self._start_event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._start_event.record()

    def uncount(self, samples: int) -> None:
        """The step that began at the last `after_fetch` did not train (a validation batch, or a
        pass of a loop whose batches are counted inside it): take it back out of the totals.
        Its time stays in the totals."""
        self.totals.steps -= 1
        self.totals.samples -= samples

    def finish(self) -> StepTotals:
        """Close the last step and read every GPU time (synchronises once, at the end)."""
        self.before_fetch()
        self.poll(block=True)
        return self.totals

    def poll(self, block: bool = False) -> None:
        """Add the GPU time of steps whose end event the GPU has passed."""
        while self._pending:
            start, end = self._pending[0]
            if block:
                end.synchronize()
            elif not end.query():  # type: ignore[no-untyped-call]
                break
            self._pending.popleft()
            self.totals.gpu_s += start.elapsed_time(end) / 1000.0
            self.totals.gpu_steps += 1
