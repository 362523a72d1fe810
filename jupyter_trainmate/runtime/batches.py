"""
The batches of a run: what replaces a batch loop's iterable and an epoch loop's, and the counts
they keep (epochs seen, steps per epoch, the epoch loop's length), prefetching (`--prefetch`), the
loader tuning (`--tune-loader`) and the loader facts the advice reads.

The per-step path is `_iterate_plain`: a plain for loop, bound methods in locals, no try/except
per batch. Everything else runs once per epoch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..monitor.host import usable_cpus
from .accumulation import Accumulation
from .batch import batch_size
from .device import Placement
from .guarding import Guards
from .loader import LoaderInfo, loader_info
from .prefetch import CudaPrefetcher, FirstOnThisThread, ThreadPrefetcher, auto_thread
from .resume import Checkpoints
from .timing import StepTimer
from .tune import LoaderTuner, tunable


@dataclass(frozen=True)
class EpochPosition:
    """Where the run is in its epochs (for the progress shown)."""

    epoch: int  # 1-based epoch in progress (or the last finished one)
    epochs_total: int | None
    step_in_epoch: int
    steps_per_epoch: int | None
    fraction: float | None  # 0..1 when the epoch loop and the loader have lengths
    steps_left: int | None  # steps to the end of the last epoch, when known


class BatchLoop:
    """The iterable that replaces a batch loop's iterable: `len()` works if the original's does.

    `iter()` on it calls `iter()` on the original at once, as the plain loop would: creating a
    DataLoader iterator draws a seed from the global RNG, and wrappers such as tqdm's asyncio
    class call `iter()` an extra time, so a lazy wrapper would shift every later random draw.
    """

    __slots__ = ("_batches", "_iterable")

    def __init__(self, batches: Batches, iterable: Iterable[Any]) -> None:
        self._batches = batches
        self._iterable = iterable

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return self._batches.epoch(self._iterable)


class Batches:
    """Batch and epoch iteration of one run, and its counts."""

    def __init__(
        self,
        *,
        prefetch: str,
        tune_loader: int,
        placement: Placement,
        timer: StepTimer,
        accumulation: Accumulation,
        checkpoints: Checkpoints,
        guards: Guards,
        report: Callable[[str], None],
    ) -> None:
        self.prefetch_mode = prefetch  # "cuda" | "thread" | "off" | "auto" (CPU), by `Placement`
        # what `auto` did: "thread" once a loader was fetched on a thread, else "off", and why
        self.prefetch_used = "off" if prefetch == "auto" else prefetch
        self.prefetch_note: str | None = None
        self._probed: dict[int, str | None] = {}
        self._tune_loader = tune_loader
        self._placement = placement
        self._timer = timer
        self._accumulation = accumulation
        self._checkpoints = checkpoints
        self._guards = guards
        self._report = report
        self.epochs_seen = 0  # batch loops that fetched at least one batch
        self.epochs_total: int | None = None  # from the epoch loop, when the rewrite found one
        self.steps_per_epoch: int | None = None
        self.loader_info: LoaderInfo | None = None
        self._epochs_base = 0  # epochs_seen when the epoch loop started (less resumed epochs)
        self._epoch_first_step = 0
        self._in_epoch = False
        self._tuners: dict[int, LoaderTuner | None] = {}

    @property
    def epoch_index(self) -> int:
        """Epochs finished in the current epoch loop (0-based index of the one in progress)."""
        return self.epochs_seen - self._epochs_base

    def loop(self, iterable: Iterable[Any]) -> BatchLoop:
        return BatchLoop(self, iterable)

    def epochs(self, iterable: Iterable[Any]) -> Iterable[Any]:
        """The epoch loop's iterable, returned as is: the session only learns its length (and,
        resuming, skips the epochs the checkpoint had finished)."""
        try:
            self.epochs_total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            self.epochs_total = None
        self._epochs_base = self.epochs_seen
        done = self._checkpoints.take_epochs_done()
        if done > 0:
            self._epochs_base -= done  # progress counts the epochs done before the interruption
            if isinstance(iterable, range):
                return iterable[done:]
            return itertools.islice(iterable, done, None)
        return iterable

    def next_batch(self, iterator: Iterator[Any], *default: Any) -> Any:
        """`next(iterator)` in a hand-written loop, timed as a step."""
        timer = self._timer
        timer.before_fetch()
        batch = next(iterator, *default)
        timer.after_fetch(batch_size(batch))
        return batch

    def epoch(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """One pass over a batch loop's iterable (what `iter()` on a `BatchLoop` returns)."""
        if self.loader_info is None:
            self.loader_info = loader_info(iterable)
        try:
            remaining: int | None = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            remaining = None
        checkpoints = self._checkpoints
        if checkpoints.resuming:
            source, done = checkpoints.resumed_epoch(iterable)
            return self._iterate(self._source(source), remaining, done)
        checkpoints.epoch_starting()  # before iter() draws: a resume redraws this order
        self._guards.epoch_started()
        if self._tune_loader and isinstance(iterable, torch.utils.data.DataLoader):
            tuner = self._tuner(iterable)
            if tuner is not None:
                if tuner.best is None:  # first epoch: try the candidates on its own batches
                    return self._iterate(self._source(tuner.first_epoch()), remaining)
                iterable = tuner.later_loader()
                self.loader_info = loader_info(iterable)  # advice about the loader in use
        return self._iterate(self._source(iterable), remaining)

    def position(self, steps: int) -> EpochPosition:
        """Where the run is after `steps` steps (any thread)."""
        per_epoch, epochs_total, active = self.steps_per_epoch, self.epochs_total, self._in_epoch
        finished = self.epochs_seen - self._epochs_base
        in_epoch = steps - self._epoch_first_step if active else 0
        fraction = left = None
        if epochs_total and per_epoch:
            total = epochs_total * per_epoch
            done = min(total, finished * per_epoch + in_epoch)
            fraction, left = done / total, total - done
        return EpochPosition(
            epoch=finished + (1 if active else 0),
            epochs_total=epochs_total,
            # between epochs (or after the last) the finished epoch shows as complete
            step_in_epoch=in_epoch if active or not finished else (per_epoch or in_epoch),
            steps_per_epoch=per_epoch,
            fraction=fraction,
            steps_left=left,
        )

    def _source(self, iterable: Iterable[Any]) -> Iterator[Any]:
        mode = self.prefetch_mode
        if mode == "cuda":
            if self._placement.confirmed():
                return CudaPrefetcher(iterable, self._placement.device)
        elif mode == "thread":
            return ThreadPrefetcher(iterable)
        elif mode == "auto" and isinstance(iterable, torch.utils.data.DataLoader):
            key = id(iterable)
            if key not in self._probed:
                self._probed[key] = why = auto_thread(iterable)
                if why is None:
                    self.prefetch_used = "thread"
                    self._report(
                        "--prefetch auto: loading on a thread (it draws no random numbers)"
                    )
                elif self.prefetch_note is None:
                    self.prefetch_note = why
            if self._probed[key] is None:
                return FirstOnThisThread(iterable)
        return iter(iterable)

    def _iterate(
        self, source: Iterator[Any], remaining: int | None, done: int = 0
    ) -> Iterator[Any]:
        if self._checkpoints.directory is None:
            return self._iterate_plain(source, remaining)
        left = None if remaining is None else remaining - done
        return self._checkpoints.iterate(self._iterate_plain(source, left), done, self.epoch_index)

    def _iterate_plain(self, source: Iterator[Any], remaining: int | None) -> Iterator[Any]:
        # The per-step path: a plain for loop, bound methods in locals, no try/except per batch.
        timer = self._timer
        before, after, size = timer.before_fetch, timer.after_fetch, batch_size
        accumulation = self._accumulation
        track_last = remaining is not None and accumulation.every > 1
        self.steps_per_epoch = remaining
        self._epoch_first_step = timer.totals.steps
        self._in_epoch = True
        fetched = 0
        try:
            before()
            for batch in source:
                after(size(batch))
                fetched += 1
                if track_last:
                    remaining -= 1  # type: ignore[operator]
                    accumulation.last_batch = remaining == 0
                yield batch
                before()
            self._guards.epoch_ended()
        finally:
            if fetched:
                self.epochs_seen += 1  # an iter() that fetched nothing (tqdm's spare one): no epoch
            self._in_epoch = False
            accumulation.last_batch = False
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _tuner(self, loader: torch.utils.data.DataLoader[Any]) -> LoaderTuner | None:
        key = id(loader)
        if key not in self._tuners:
            reason = tunable(loader)
            if reason is not None:
                self._report(f"--tune-loader: not tuned, {reason}")
                self._tuners[key] = None
            else:
                self._tuners[key] = LoaderTuner(
                    loader,
                    cpus=usable_cpus(),
                    cuda=self._placement.device.type == "cuda",
                    batches_each=self._tune_loader,
                    report=self._report,
                )
        return self._tuners[key]
