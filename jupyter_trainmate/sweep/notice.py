"""A sweep's one entry in the sidebar and its one end notice (lab toast, webhook).

A sweep runs its trials as ordinary runs, and every run's end raises a toast and a webhook
post: a 50-trial study would raise 50. Instead the sweep keeps one status file for its whole
length (named `sweep STUDY: trial K of N`), which shows the trial in progress (its runs
`follow` it instead of writing their own), and writes one ended record when the search ends:
its outcome, its length, the best value of `--monitor`, the trials as its epochs. Trials of
`--parallel` run in other processes and write their own status files, with a `quiet` end.

The file is written when the search starts and when its first trial starts, then at most once a
second (`RENAME_S`) by a trial's start, and once a second by each trial's display thread (its
progress): the sidebar polls every two seconds, and an atomic rewrite of the file at every
trial's start was the largest part of a short trial's own cost (about 0.5 ms of a 15 ms trial,
BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import math
import time

from ..runtime.options import TrainOptions
from ..runtime.status import StatusWriter
from ..runtime.summary import RunProgress
from .summary import SweepSummary

RENAME_S = 1.0  # a trial's start rewrites the status file at most this often

IDLE = RunProgress(
    steps=0, samples=0, optimizer_steps=0, epoch=0, epochs_total=None, step_in_epoch=0,
    steps_per_epoch=None, fraction=None, eta_s=None, wall_s=0.0, samples_per_s=0.0,
    steps_per_s=0.0, data_wait_share=0.0, last_loss=None, device="", amp="",
)  # fmt: skip


class SweepNotice:
    """The sweep's status file (`status` is given to each trial's run) and its ended record."""

    def __init__(self, study: str, todo: int, options: TrainOptions, notebook: str | None) -> None:
        self.study, self.todo = study, todo
        self.started = time.monotonic()
        parallel = f", {options.parallel} at a time" if options.parallel > 1 else ""
        self.status: StatusWriter | None = StatusWriter(
            lambda: IDLE,
            notebook=notebook,
            run_name=f"sweep {study}: {todo} trial(s){parallel}",
            notify_after=options.notify_after,
        )
        try:  # written now: a `--parallel` sweep calls no `trial` here, and shows this entry
            self.status.start()
        except OSError:  # no runtime dir (read-only home): no sidebar entry, no toast
            self.status = None
        self._written = -math.inf  # when a trial's start last wrote the file (monotonic)

    def trial(self, number: int) -> None:
        """The `number`-th trial of this search (1-based) starts: its name is written now if the
        file was not written by a trial's start in the last `RENAME_S` seconds, else by the next
        write (the trial's display thread at its first second, or a later trial's start)."""
        status = self.status
        if status is None:
            return
        status.follow(lambda: IDLE)  # not the last trial's progress under this name
        name = f"sweep {self.study}: trial {number} of {self.todo}"
        now = time.monotonic()
        if now - self._written < RENAME_S:
            status.rename(name, write=False)
            return
        self._written = now
        with contextlib.suppress(OSError):
            status.rename(name)

    def end(self, outcome: str, summary: SweepSummary | None) -> None:
        """Leave the sidebar, then write the one ended record (for the toast and the webhook)."""
        status = self.status
        if status is None:
            return
        self.status = None
        metrics: dict[str, float] = {}
        ran = 0
        if summary is not None and summary.study == self.study:
            ran = sum(t.state in ("complete", "pruned", "failed") for t in summary.trials)
            best = summary.best_value
            if best is not None and math.isfinite(best):
                metrics[f"best {summary.monitor}"] = best
        status.follow(lambda: IDLE)  # the last trial's loss is not the sweep's
        # The sidebar entry goes first, as a run's does: renamed once stopped, the ended record
        # gets the final name and no status file is written just before it is removed.
        with contextlib.suppress(OSError):  # the ended record is written even so
            status.stop()
        status.rename(f"sweep {self.study}: {ran} trial(s)")
        with contextlib.suppress(OSError):
            status.ended(
                outcome=outcome,
                wall_s=time.monotonic() - self.started,
                metrics=metrics,
                steps=0,
                epochs=ran,
                sweep={"study": self.study, "trials": ran},
            )
