"""
Per-step timing that reads the clock on a few steps a second, not on every step.

A step has two parts: waiting for the batch (data) and everything after it until the next batch
is asked for (compute). Reading the clock twice per step costs about 2 us on a step that has just
run a model (caches cold), which is most of `%%train`'s cost on a small model; and the display
reads the totals only 4 times a second. So the loop times one step in every `stride` (a *timed
point*: the clock before the fetch and after it), and counts the other steps only. Between two
timed points the clock gives the exact wall time of the steps in between (a *span*); the span is
split into data wait and compute by the data wait of the timed step that opened it, measured
(never more than the span). The stride adapts so that about `POINTS_PER_S` points are timed a
second (every step when steps are slower than that, so slow loops are timed exactly as before),
with a private jitter so a loader whose waits repeat every few batches is not sampled in phase.
Steps and samples are counted exactly.

On CUDA the host runs ahead of the GPU, so the host's compute interval says little: one CUDA
event is recorded per timed point (not two per step), and the GPU time between two events is
read lazily: `poll()` reads only events the GPU has already passed (`Event.query()` does not
block), so the loop never waits for it.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

_clock: Callable[[], float] = time.perf_counter  # tests replace it to script the time
POINTS_PER_S = 32  # timed points a second (the display reads 4 times a second)
MAX_STRIDE = 256


@dataclass(slots=True)
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
    """Time data wait and compute of a run's steps; on CUDA also GPU time, read lazily.

    The batch loop calls `before_fetch()` (it returns how many steps to the next timed point) and
    `after_fetch(samples)` around a timed step's fetch, and counts every other step itself in
    `totals` (`steps`, `samples`). `next_batch` times every step.
    """

    def __init__(
        self,
        device: torch.device | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.totals = StepTotals()
        self._clock = clock = clock if clock is not None else _clock
        self._cuda = device is not None and device.type == "cuda"
        self._pending: deque[tuple[torch.cuda.Event, torch.cuda.Event, int]] = deque()
        self._point = clock()  # the clock at the last timed point
        self._point_steps = 0  # totals.steps then
        self._point_event: torch.cuda.Event | None = None
        self._wait = 0.0  # the data wait of the step that opened the span (seconds)
        self._stride = 1
        self._jitter = random.Random(0x5EED)  # private: the global generators stay untouched

    def before_fetch(self) -> int:
        """A timed point: the span since the last one ends here. Returns the stride: the number
        of steps until the next timed point (1: time the next step too)."""
        now = self._clock()
        totals = self.totals
        steps = totals.steps - self._point_steps
        if steps > 0:
            span = now - self._point
            data = min(self._wait * steps, span)
            totals.data_s += data
            totals.compute_s += span - data
            if span > 0:
                wanted = int(steps / (span * POINTS_PER_S))  # steps per 1/POINTS_PER_S seconds
                self._stride = max(1, min(MAX_STRIDE, wanted))
        if self._cuda:
            self._record_event(steps)
        self._point = now
        self._point_steps = totals.steps
        self._wait = 0.0
        if steps == 0:
            return 1  # a loop (re)starting: its first fetch (workers starting) is a span of its own
        stride = self._stride
        if stride > 3:  # +-25%, so waits that repeat every few batches are not met in phase
            stride += self._jitter.randint(-stride // 4, stride // 4)
        return stride

    def after_fetch(self, samples: int) -> None:
        """The timed step's batch arrived: its data wait ends and its compute begins."""
        self._wait = self._clock() - self._point
        totals = self.totals
        totals.steps += 1
        totals.samples += samples

    def uncount(self, samples: int) -> None:
        """The step that began at the last `after_fetch` did not train (a validation batch, or a
        pass of a loop whose batches are counted inside it): take it back out of the totals.
        Its time stays in the totals."""
        self.totals.steps -= 1
        self.totals.samples -= samples

    def finish(self) -> StepTotals:
        """Close the last span and read every GPU time (synchronises once, at the end)."""
        self.before_fetch()
        self.poll(block=True)
        return self.totals

    def _record_event(self, steps: int) -> None:
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        if self._point_event is not None and steps > 0:
            self._pending.append((self._point_event, event, steps))
            self.poll()
        self._point_event = event

    def poll(self, block: bool = False) -> None:
        """Add the GPU time of spans whose end event the GPU has passed."""
        while self._pending:
            start, end, steps = self._pending[0]
            if block:
                end.synchronize()
            elif not end.query():  # type: ignore[no-untyped-call]
                break
            self._pending.popleft()
            self.totals.gpu_s += start.elapsed_time(end) / 1000.0
            self.totals.gpu_steps += steps
