"""
The batches of a run: what replaces a batch loop's iterable and an epoch loop's, and the counts
they keep (epochs seen, steps per epoch, the epoch loop's length), prefetching (`--prefetch`), the
loader tuning (`--tune-loader`) and the loader facts the advice reads.

The per-step path is `_iterate_plain`: a plain for loop, bound methods in locals, no try/except
around the body. Everything else runs once per epoch.

What counts: a batch is a training step when a "signal" (a backward() or an optimizer step, which
the session reports in `signals`) came while it was in hand; a batch that brought none (a
validation batch, even through the same `run_epoch()` as training) is taken back out of the
counts, and a pass is an epoch when one of its batches trained. A training loop over a counter
(`range(...)`) that the rewrite hands to `counter_loop` is classified as it runs: its passes are
steps when nothing inside iterates batches (a loop that draws its own data), and it is an epoch
loop when a batch loop or another counter loop runs inside it (also in a function it calls).
Samples are counted exactly from a DataLoader's batch size and sampler, else by the first
dimension of each batch (a guess, and `samples_source` says so).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DistributedSampler

from ..monitor.host import usable_cpus
from .accumulation import Accumulation
from .batch import SampleCounter, leading_size
from .device import Placement
from .guarding import Guards
from .loader import LoaderInfo, loader_info
from .oom import OutOfMemoryRetry
from .prefetch import CudaPrefetcher, FirstOnThisThread, ThreadPrefetcher, auto_thread
from .resume import Checkpoints
from .summary import SamplesSource
from .timing import StepTimer
from .tune import LoaderTuner, tunable

_SEQUENCES = frozenset((tuple, list))  # batches sized inline by their first item


@dataclass(frozen=True)
class EpochPosition:
    """Where the run is in its epochs (for the progress shown)."""

    epoch: int  # 1-based epoch in progress (or the last finished one)
    epochs_total: int | None
    step_in_epoch: int
    steps_per_epoch: int | None
    fraction: float | None  # 0..1 when the epoch loop and the loader have lengths
    steps_left: int | None  # steps to the end of the last epoch, when known


class Signals:
    """Backward() calls and optimizer steps so far: the session adds, the batch loops compare."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class _CounterLoop:
    """A counter loop in progress (`Batches.counter_loop`): what is known of it so far."""

    __slots__ = ("epochs_at_start", "epochs_mark", "inner", "length", "outer", "steps")

    def __init__(self, length: int | None, epochs_at_start: int, epochs_mark: int) -> None:
        self.length = length
        self.epochs_at_start = epochs_at_start
        self.epochs_mark = epochs_mark  # epochs() calls seen when the current pass began
        self.inner = False  # a batch loop, a counter loop or next() ran in the current pass
        self.outer = False  # other loops run inside it: its passes are epochs (or folds)
        self.steps = 0  # passes that were steps


class BatchLoop:
    """The iterable that replaces a batch loop's iterable: `len()` works if the original's does.

    `iter()` on it calls `iter()` on the original at once, as the plain loop would: creating a
    DataLoader iterator draws a seed from the global RNG, and wrappers such as tqdm's asyncio
    class call `iter()` an extra time, so a lazy wrapper would shift every later random draw.
    """

    __slots__ = ("_batches", "_carries", "_iterable")

    def __init__(
        self, batches: Batches, iterable: Iterable[Any], carries: tuple[str, tuple[str, ...]]
    ) -> None:
        self._batches = batches
        self._iterable = iterable
        self._carries = carries  # (function, its locals the batches carry): see `epoch`

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return self._batches.epoch(self._iterable, self._carries)


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
        retry: OutOfMemoryRetry,
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
        self._retry = retry
        self._report = report
        self.epochs_seen = 0  # batch loops that fetched at least one batch
        # called on the training thread when a batch loop that trained ends (the display takes a
        # reading there, so a run shorter than its refresh interval still has a curve)
        self.on_epoch_end: list[Callable[[], None]] = []
        self.epochs_total: int | None = None  # from the epoch loop, when the rewrite found one
        self.steps_per_epoch: int | None = None
        self.loader_info: LoaderInfo | None = None
        self._epochs_base = 0  # epochs_seen when the epoch loop started (less resumed epochs)
        self._epoch_first_step = 0
        self._in_epoch = False
        self._tuners: dict[int, LoaderTuner | None] = {}
        self._next_left = 0  # next() fetches before the next timed one
        # the last next() fetch: the signals seen when it came and its samples (taken back at
        # the next fetch, or at the count, when no signal came after it: a validation batch)
        self._next_held: tuple[int, int] | None = None
        self.signals = Signals()
        self._in_batch = 0  # batch loop bodies in progress: a counter loop inside one is no step
        self._loops: list[_CounterLoop] = []  # counter loops in progress, innermost last
        self._epochs_calls = 0  # epochs() calls: an explicit epoch loop outranks a counter loop
        self._uncounted = [0, 0, 0]  # steps, samples, passes taken back as not training
        self._samples_counted = False  # a batch loop or next() counted samples
        self._samples_guessed = False  # ... some by the batches' first dimension
        self._next_fetched = False  # a next() fetch came (its samples count once it trains)

    @property
    def epoch_index(self) -> int:
        """Epochs finished in the current epoch loop (0-based index of the one in progress)."""
        return self.epochs_seen - self._epochs_base

    def loop(
        self, iterable: Iterable[Any], carries: tuple[str, tuple[str, ...]] = ("", ())
    ) -> BatchLoop:
        return BatchLoop(self, iterable, carries)

    def epochs(self, iterable: Iterable[Any]) -> Iterable[Any]:
        """The epoch loop's iterable, returned as is: the session only learns its length (and,
        resuming, skips the epochs the checkpoint had finished)."""
        self._epochs_calls += 1
        self._checkpoints.explicit_epochs = True
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

    def resumed_start(self, start: int) -> int:
        """enumerate()'s start for the batch loop about to begin: on in the resumed epoch."""
        return start + self._checkpoints.pending_position()

    def next_batch(self, iterator: Iterator[Any], *default: Any) -> Any:
        """`next(iterator)` in a hand-written loop, timed as a step (inside a batch loop's body,
        where that loop's batch is the step, a plain `next()`: a second loader's paired batch)."""
        if self._in_batch:
            return next(iterator, *default)
        self._inner_loop_started(epochs=False)
        self._settle_next()
        timer = self._timer
        left = self._next_left  # untimed fetches before the next timed one (see `timing`)
        if left:
            self._next_left = left - 1
            batch = next(iterator, *default)
            samples = leading_size(batch)
            totals = timer.totals
            totals.steps += 1
            totals.samples += samples
        else:
            self._next_left = timer.before_fetch() - 1
            batch = next(iterator, *default)
            samples = leading_size(batch)
            timer.after_fetch(samples)
        self._next_held = (self.signals.count, samples)
        self._next_fetched = True
        return batch

    def _settle_next(self) -> bool:
        """The last next() fetch is a step only if a signal came after it (a batch loop asks
        the same of each batch; a validation `next(iter(val_loader))` brings none). Whether it
        was taken back."""
        held = self._next_held
        if held is not None:
            self._next_held = None
            if self.signals.count == held[0]:
                self._timer.uncount(held[1])
                self._uncounted[0] += 1
                self._uncounted[1] += held[1]
                return True
            # a step: its samples are the batch's first dimension, a guess
            self._samples_counted = self._samples_guessed = True
        return False

    def counted(self) -> tuple[int, int, int]:
        """Steps, samples and epochs for the summary. When no signal came at all (the training
        calls ran where the session could not see them), the batches taken back count again:
        there is nothing to tell training from validation by."""
        self._settle_next()
        totals = self._timer.totals
        steps, samples, epochs = totals.steps, totals.samples, self.epochs_seen
        if not self.signals.count:
            steps, samples = steps + self._uncounted[0], samples + self._uncounted[1]
            epochs += self._uncounted[2]
        return steps, samples, epochs

    @property
    def samples_source(self) -> SamplesSource:
        counted, guessed = self._samples_counted, self._samples_guessed
        if self._next_fetched and not self.signals.count:  # every fetch counts (`counted`)
            counted = guessed = True
        if not counted:
            return "none"
        if guessed and not self.counted()[1]:
            # the guess found no tensor or array in any batch (a list of token ids per step):
            # "~0 samples (a guess)" would read as a count
            return "none"
        return "batch dim 0" if guessed else "loader"

    def epoch(
        self, iterable: Iterable[Any], carries: tuple[str, tuple[str, ...]] = ("", ())
    ) -> Iterator[Any]:
        """One pass over a batch loop's iterable (what `iter()` on a `BatchLoop` returns).
        `carries`: for a loop in a function, its name and the local variables its batches carry
        from one to the next (the rewrite names them); resumed in the middle of the epoch,
        they start over, and the report says so."""
        sampler = getattr(iterable, "sampler", None)
        if isinstance(sampler, DistributedSampler):  # `--procs`: each epoch its own order
            sampler.set_epoch(self.epoch_index)
        if self.loader_info is None:
            self.loader_info = loader_info(iterable)
        try:
            remaining: int | None = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            remaining = None
        checkpoints = self._checkpoints
        function, names = carries
        if not function and checkpoints.directory is not None:
            checkpoints.batch_carried = names  # the cell's own loop: notebook variables, held
        if checkpoints.resuming:
            source, done = checkpoints.resumed_epoch(iterable)
            if done and names and function:
                self._report(
                    f"--resume: {function}'s own variables {', '.join(names)} carry from batch to "
                    f"batch and start over here, not as they were after batch {done}: no "
                    "checkpoint holds a function's locals, so the rest of this epoch can differ "
                    "from a run never interrupted"
                )
            counter = SampleCounter(iterable, done)
            return self._iterate(self._source(source), remaining, counter, done)
        checkpoints.epoch_starting(iterable)  # before iter() draws: a resume redraws it
        self._guards.epoch_started()
        if self._tune_loader and isinstance(iterable, torch.utils.data.DataLoader):
            tuner = self._tuner(iterable)
            if tuner is not None:
                if tuner.best is None:  # first epoch: try the candidates on its own batches
                    counter = SampleCounter(iterable)
                    return self._iterate(self._source(tuner.first_epoch()), remaining, counter)
                iterable = tuner.later_loader()
                self.loader_info = loader_info(iterable)  # advice about the loader in use
        return self._iterate(self._source(iterable), remaining, SampleCounter(iterable))

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
        self, source: Iterator[Any], remaining: int | None, counter: SampleCounter, done: int = 0
    ) -> Iterator[Any]:
        if self._checkpoints.directory is None:
            return self._iterate_plain(source, remaining, counter)
        left = None if remaining is None else remaining - done
        return self._checkpoints.iterate(
            self._iterate_plain(source, left, counter), done, self.epoch_index
        )

    def _iterate_plain(
        self, source: Iterator[Any], remaining: int | None, counter: SampleCounter
    ) -> Iterator[Any]:
        # The per-step path: a plain for loop, bound methods in locals, no try/except around the
        # body (the one around reading a batch's size costs nothing from Python 3.11 on), and the
        # clock read only at the timed points (`left` counts down to the next one; see `timing`):
        # every other step is only counted. Flags, not counters, where only "any?" is asked.
        # A batch that brought no signal is taken back out of the counts (see the module's
        # docstring); the pass becomes the epoch in progress at its first batch that trained.
        timer, signals = self._timer, self.signals
        before, after, uncount = timer.before_fetch, timer.after_fetch, timer.uncount
        totals = timer.totals
        accumulation = self._accumulation
        track_last = remaining is not None and accumulation.every > 1
        # a next() fetch no signal followed before this loop began was no step (a validation
        # batch drawn after the last epoch's loop): settled here, or the loop's signals count it
        self._settle_next()
        per_epoch, first_step = remaining, timer.totals.steps
        self._inner_loop_started(epochs=True)
        self._samples_counted = True
        self._samples_guessed |= not counter.exact
        count = counter if counter.exact else leading_size  # one call per batch, not two
        guess = not counter.exact  # (inputs, targets, ...) batches are sized inline, below
        fetched = trained = False  # only whether any batch was fetched, any trained
        shown: tuple[int | None, int, bool] | None = None
        holding = False
        mark = signals.count
        retry = self._retry
        point = retry.retry_point()  # the batch loops of a batch's body make their own
        try:
            left = before()  # this fetch is timed; the next timed one `left` steps later
            timed = True  # `before()` ran: the next fetch's end is `after()`'s
            for batch in source:
                if guess and type(batch) in _SEQUENCES and batch:
                    # (inputs, targets, ...): what `leading_size` reads, without its calls
                    first = batch[0]
                    if type(first) is Tensor:
                        try:
                            samples = first.shape[0]
                        except IndexError:  # a 0-d tensor first
                            samples = count(batch)
                    else:
                        samples = count(batch)
                else:
                    samples = count(batch)
                if timed:
                    after(samples)
                    timed = False
                else:
                    totals.steps += 1
                    totals.samples += samples
                if track_last:
                    remaining -= 1  # type: ignore[operator]
                    accumulation.last_batch = remaining == 0
                mark = signals.count
                if not fetched:
                    fetched = True
                    if mark:
                        # The run has trained before: show this pass as the epoch in progress
                        # from its first batch (taken back below if that batch does not train).
                        shown = (self.steps_per_epoch, self._epoch_first_step, self._in_epoch)
                        self.steps_per_epoch, self._epoch_first_step = per_epoch, first_step
                        self._in_epoch = True
                self._in_batch += 1
                holding = True
                yield batch
                holding = False
                self._in_batch -= 1
                if signals.count == mark:
                    uncount(samples)
                    self._uncounted[0] += 1
                    self._uncounted[1] += samples
                    if shown is not None:  # the pass's first batch did not train after all
                        self.steps_per_epoch, self._epoch_first_step, self._in_epoch = shown
                        shown = None
                elif not trained:
                    trained = True
                    shown = None
                    self.steps_per_epoch = per_epoch
                    self._epoch_first_step = first_step
                    self._in_epoch = True
                left -= 1
                if not left:
                    left = before()
                    timed = True
            if not timed:
                before()  # the pass is over: what follows it is no step of it
            self._guards.epoch_ended()
        finally:
            retry.restore(point)
            if holding:  # left from inside the body (break, return, an exception)
                self._in_batch -= 1
                if signals.count != mark and not self._checkpoints.takes_back():
                    trained = True
                else:  # left before the batch trained (a finder's `return` as the loss explodes;
                    # under --checkpoint, a Ctrl-C between backward() and the optimizer step)
                    uncount(samples)
                    self._uncounted[0] += 1
                    self._uncounted[1] += samples
                    self._checkpoints.taken_back = True
                    if shown is not None:
                        self.steps_per_epoch, self._epoch_first_step, self._in_epoch = shown
            if trained:
                self.epochs_seen += 1
                self._in_epoch = False
                for listener in self.on_epoch_end:
                    listener()
            elif fetched:  # a validation pass (an iter() that fetched nothing is no pass at all)
                self._uncounted[2] += 1
            accumulation.last_batch = False
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def counter_loop(self, iterable: Iterable[Any]) -> Iterable[Any]:
        """A training loop over a counter (`range(...)`, a list of models; see `rewrite.loops`).

        Inside a batch loop's body it is returned as is: the batch is the step. Elsewhere each
        pass is a step when it brought a signal and no loop inside it iterated batches; when a
        batch loop or another counter loop runs inside it, it is an epoch loop (its length is
        the epoch total for progress and ETA) and the loops inside count. Iterating it yields
        exactly what the original yields.
        """
        if self._in_batch:
            return iterable
        return self._counter_passes(iterable)

    def _counter_passes(self, iterable: Iterable[Any]) -> Iterator[Any]:
        try:
            length: int | None = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            length = None
        parent = self._loops[-1] if self._loops else None
        done = 0
        if parent is None and self._checkpoints.resuming:
            # `for ep in range(n): train(...)`: this loop's passes were the checkpoint's epochs
            # (no explicit epoch loop ran); skip the finished ones, as `epochs()` does
            done = self._checkpoints.take_counter_epochs_done()
            if done > 0:
                self._epochs_base -= done
                if isinstance(iterable, range):
                    iterable = iterable[done:]
                else:
                    iterable = itertools.islice(iterable, done, None)
        self._inner_loop_started(epochs=True)
        # (the epochs it skipped count as seen when its passes turn out to be epochs)
        frame = _CounterLoop(length, self.epochs_seen - done, self._epochs_calls)
        if self._checkpoints.directory is not None and len(self._loops) <= 1:
            # `for i in range(max_steps):` drawing its own batches, or such a loop in the epochs
            # of an outer one: its passes are checkpointed
            iterable = self._checkpoints.step_passes(
                iterable,
                lambda: not frame.outer,
                nested=parent is not None,
                epoch=lambda: self.epoch_index,
            )
        self._loops.append(frame)
        timer, signals = self._timer, self.signals
        totals = timer.totals
        first_step = totals.steps
        left = 0  # passes before the next timed one (see `timing`)
        provisional = holding = False
        mark = signals.count
        try:
            for item in iterable:
                frame.inner = False
                frame.epochs_mark = self._epochs_calls
                provisional = not frame.outer  # a step, unless a loop inside it counts
                if provisional:
                    if left:
                        left -= 1
                        totals.steps += 1
                    else:
                        left = timer.before_fetch() - 1
                        timer.after_fetch(0)
                mark = signals.count
                holding = True
                yield item
                holding = False
                if provisional:
                    if frame.inner or signals.count == mark:
                        timer.uncount(0)
                    else:
                        frame.steps += 1
                        if frame.steps == 1 and parent is not None:  # an epoch, as a batch pass
                            self.steps_per_epoch = length
                            self._epoch_first_step = first_step
                            self._in_epoch = True
        finally:
            if holding and provisional:  # left from inside a pass (break, return, an exception)
                if frame.inner:  # the pass was no step: what ran inside it counts ...
                    timer.uncount(0)
                    if self._settle_next():  # ... but a next() fetch it had not trained on
                        self._checkpoints.taken_back = True
                elif signals.count == mark or self._checkpoints.takes_back():
                    timer.uncount(0)
                    self._checkpoints.taken_back = True
                else:
                    frame.steps += 1
            self._loops.remove(frame)
            if frame.steps and parent is not None:
                self.epochs_seen += 1  # a pass of steps that the loop around it repeats
                self._in_epoch = False

    def _inner_loop_started(self, epochs: bool) -> None:
        """A batch loop or a counter loop (`epochs`), or a next() fetch, starts inside the
        innermost counter loop in progress: that loop's current pass is not a step itself."""
        if not self._loops or self._in_batch:
            return
        frame = self._loops[-1]
        frame.inner = True
        if epochs and not frame.outer:
            frame.outer = True
            if self._epochs_calls == frame.epochs_mark:  # no explicit epoch loop in between
                self.epochs_total = frame.length
                self._epochs_base = frame.epochs_at_start

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
