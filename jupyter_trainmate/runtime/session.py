"""
`TrainSession`: what rewritten training code calls, through the name `__trainmate__`.

The session is a face: its calls (`batches`, `epochs`, `next_batch`, `backward`, `zero_grad`,
`step` and their `_kw` forms, `clip_grad_norm_`, `clip_grad_value_`, `parts`, `oom_guard`) are the
ones the rewrite emits, and each job behind them is a collaborator with its own state:

- `device.Placement`: the device and the prefetch mode;
- `batches.Batches`: batch and epoch iteration, prefetching, loader tuning, epoch counts;
- `accumulation.Accumulation`: the pending-step counter and the window boundary (shared with the
  out-of-memory retry, `oom.OutOfMemoryRetry`);
- `stepping.Stepping`: optimizer and scheduler steps, clipping, the GradScaler's bookkeeping;
- `guarding.Guards`: NaN, spike and rollback guards, early stopping;
- `resume.Checkpoints`: checkpoints out and in;
- `report.Report`: events and metrics as they come, progress and summary (what the display, the
  status file and the run record read; `timing.StepTimer` measures the steps).

Calls pass anything they do not own straight through (`env.step(a)` stays `env.step(a)`), and with
the defaults on a CPU they add nothing to the numerics: the same seed gives bit-identical weights
with and without `%%train`. Per step there is no host-device synchronisation: GPU times are read
lazily (see `timing`), and a GradScaler's skipped steps are counted from the optimizer step hook.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from ..errors import TrainmateError
from .accumulation import Accumulation
from .amp import AmpPolicy, resolve_amp
from .batches import Batches, BatchLoop
from .device import Placement
from .guarding import Guards
from .loader import LoaderInfo
from .oom import OutOfMemoryRetry
from .options import TrainOptions
from .report import Report
from .resume import Checkpoints
from .stepping import Stepping
from .summary import Outcome, RunProgress, RunSummary, remember_last_run
from .timing import StepTimer

# Bound once: `torch.optim.Optimizer` is three lookups on every step.
_Tensor = torch.Tensor
_Optimizer = torch.optim.Optimizer


class TrainSession:
    """One `%%train` run."""

    def __init__(
        self,
        options: TrainOptions,
        namespace: Mapping[str, object],
        *,
        own_amp: bool = False,
        saw_backward: bool = True,
        instrumented: tuple[str, ...] = (),
        left_alone: tuple[str, ...] = (),
        reads_gradients: str | None = None,
    ) -> None:
        self.options = options
        self._namespace = namespace
        placement = Placement(options.device, options.prefetch, namespace)
        self.device = placement.device
        if own_amp:
            self.amp = AmpPolicy(
                "off", self.device.type, "the cell brings its own autocast/GradScaler"
            )
        else:
            self.amp = resolve_amp(options.amp, self.device, reads_gradients)
        # A scaler only where the rewrite routes backward(): scaling gradients it never saw would
        # make the unscale in step() divide unscaled gradients.
        self.scaler = self.amp.grad_scaler() if saw_backward else None
        self.timer = StepTimer(self.device)
        self.report = Report(
            self.timer,
            device=str(self.device),
            amp=self.amp,
            prefetch=placement.prefetch_mode,
            accumulate=options.accumulate,
            instrumented=instrumented,
            left_alone=left_alone,
        )
        self.event = report = self.report.event
        self.events, self.logged = self.report.events, self.report.logged
        self.on_event, self.on_log = self.report.on_event, self.report.on_log
        steps = self._steps
        self.accumulation = Accumulation(options.accumulate)
        self.guards = Guards(options, namespace, steps=steps, report=report)
        # `__trainmate__.parts(batch, names)` and `except __trainmate__.oom_errors:` in batch loops:
        # the batch once; after an out-of-memory error, again as micro-batches (see `oom`).
        self.oom_guard = OutOfMemoryRetry(
            self.accumulation, steps=steps, report=report, drop_gradients=self._drop_gradients
        )
        self.parts = self.oom_guard.parts  # bound once: it runs on every step
        self.oom_errors = (torch.OutOfMemoryError,)  # what the retry point's `except` catches
        self.stepping = Stepping(
            namespace, self.scaler, self.accumulation, self.oom_guard, self.guards, options.clip
        )
        self._step_counts = self.stepping.counts  # for the hook: one dict update per step
        self.checkpoints = Checkpoints(
            options,
            namespace,
            self.accumulation,
            self.scaler,
            steps=steps,
            report=report,
            stepped=self._step_counts,
        )
        self._batches = Batches(
            prefetch=placement.prefetch_mode,
            tune_loader=options.tune_loader,
            placement=placement,
            timer=self.timer,
            accumulation=self.accumulation,
            checkpoints=self.checkpoints,
            guards=self.guards,
            retry=self.oom_guard,
            report=report,
        )
        self.on_epoch_end = self._batches.on_epoch_end
        self.epochs = self._batches.epochs  # the calls the rewrite emits, bound once
        self.next_batch = self._batches.next_batch
        self.loop = self._batches.counter_loop
        self.resumed_start = self._batches.resumed_start
        self._signals = self._batches.signals  # backward() calls and optimizer steps, counted
        self._backwards = 0
        self._last_loss: Any = None
        # backward() with nothing to do but count: no loss guard, no scaler, no accumulation
        # (checked once here; a micro-batch after out-of-memory is checked per call)
        if options.monitor == "loss":  # early stopping on the training loss the loop computes
            self.guards.watch_epoch_loss(self.log)
        self._plain_backward = (
            not self.guards.watch_losses and self.scaler is None and options.accumulate == 1
        )
        self._optimizers = self.stepping.optimizers  # those stepped through the session
        self._stepped_last: object = None  # the optimizer the plain step registered last
        # `backward`, `zero_grad`, `step`: the form for what the run has to decide now (`_pick`)
        self.backward: Callable[..., Any] = self._backward_any
        self.zero_grad: Callable[..., Any] = self._zero_grad_any
        self.step: Callable[..., Any] = self._step_any
        self.oom_guard.on_split = self._pick
        self._pick()
        self._exit = contextlib.ExitStack()

    def _steps(self) -> int:
        return self.timer.totals.steps

    def _drop_gradients(self) -> None:  # for the out-of-memory retry, made before `stepping`
        self.stepping.drop_gradients()

    # -- what the display, the status file and the record read -----------------------------------

    @property
    def checkpoint_dir(self) -> Path | None:
        return self.checkpoints.directory

    @property
    def last_checkpoint(self) -> Path | None:
        return self.checkpoints.last

    @property
    def loader_info(self) -> LoaderInfo | None:
        return self._batches.loader_info

    @property
    def prefetch_mode(self) -> str:
        """How batches were loaded: "cuda", "thread" or "off" (`auto` on the CPU: "thread" once a
        loader was found to draw no random numbers)."""
        return self._batches.prefetch_used

    @property
    def prefetch_note(self) -> str | None:
        """Why `--prefetch auto` kept a loader on the training thread."""
        return self._batches.prefetch_note

    @property
    def epochs_total(self) -> int | None:
        return self._batches.epochs_total

    @property
    def skipped_steps(self) -> int:
        return self.stepping.skipped

    # -- lifecycle (runner.py) -------------------------------------------------------------------

    def resume_from(self, payload: dict[str, Any]) -> None:
        """Load a checkpoint's states into the notebook's objects (before the cell runs), and
        check the run's first optimizer step is one of theirs (a pre-step hook that removes
        itself: nothing per step)."""
        self.checkpoints.load(payload)
        loaded = self.checkpoints.loaded_optimizers
        if loaded is None:
            return

        def first_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            handle.remove()
            self.checkpoints.made_anew()  # if the run did not pick up in a loop of its own
            if id(optimizer) not in loaded:
                # `opt = Adam(net.parameters())` inside a function the cell calls: no notebook
                # variable, so no checkpoint holds its state (one the cell itself makes was loaded
                # by `made_anew`), and the run would go on from a fresh start without a word
                raise TrainmateError(
                    "--resume: the cell steps an optimizer the checkpoint does not hold (a "
                    "function it calls makes it anew as a local variable, or another object "
                    "holds it as an attribute: a checkpoint holds the notebook's own "
                    "variables); make the model and optimizer notebook variables to resume"
                )

        handle = register_optimizer_step_pre_hook(first_step)
        self._exit.callback(handle.remove)

    def checkpoint_after_error(self, what: str) -> None:
        """On Ctrl-C or an exception: save the last complete step and say how to continue."""
        self.checkpoints.after_error(what)

    def start(self) -> None:
        """Make this the active run (for `log()`), count optimizer steps, enter autocast."""
        global _active
        _active = self
        self._exit.callback(_deactivate, self)
        self.report.started = time.perf_counter()
        handle = register_optimizer_step_post_hook(self._step_hook())
        self._exit.callback(handle.remove)
        self._exit.enter_context(self.amp.autocast())

    def close(self, outcome: Outcome) -> RunSummary:
        """Undo what `start()` set up and make the run's summary (kept for `last_run()`)."""
        if outcome == "finished":
            self.guards.run_finished()
        try:
            self.checkpoints.wait()  # every checkpoint handed over is on disk
            self.stepping.finish()
            self.timer.finish()
        finally:
            self._exit.close()
        summary = self.summary(outcome)
        remember_last_run(summary)
        return summary

    def summary(self, outcome: Outcome) -> RunSummary:
        """What the run did so far."""
        return self.report.summary(outcome, self._batches, self.stepping, self._backwards)

    def progress(self) -> RunProgress:
        """A snapshot of where the run is, for the status file and the display (any thread)."""
        return self.report.progress(self._batches, self.stepping, self._last_loss, self._backwards)

    def log(self, values: dict[str, float]) -> None:
        """Metrics the cell reports with `jupyter_trainmate.log(name=value)`."""
        self.report.log(values)
        self.guards.logged(values)

    def monitor_epoch_loss(self) -> None:
        """Log the epoch's mean training loss as `loss` (a sweep's `--monitor loss`: the value
        of a loop that logs nothing); before the cell runs."""
        if self.guards.epoch_loss is None:
            self.guards.watch_epoch_loss(self.log)
            self._plain_backward = False
            self._pick()

    # -- batches ---------------------------------------------------------------------------------

    def batches(
        self, iterable: Iterable[Any], within: str = "", carries: tuple[str, ...] = ()
    ) -> BatchLoop:
        """A batch loop's iterable; `within`/`carries`: the function a batch loop is in and the
        local variables its batches carry (see `Batches.epoch`)."""
        return BatchLoop(self._batches, iterable, (within, carries))

    # -- gradients -------------------------------------------------------------------------------

    # The per-step calls come in two forms: `backward(loss)`, `zero_grad(opt)`, `step(opt)` for
    # calls with positional arguments or none (what nearly every loop writes), and `backward_kw`,
    # `zero_grad_kw`, `step_kw` for calls with keywords (the rewrite picks the form). A function
    # with `**kwargs` makes a new dict on every call and forwards through the generic call path:
    # about 0.3 us a call, three calls a step (issue 14).
    #
    # The positional forms are instance attributes that `_pick` points at a `_plain` function
    # when the run has nothing to decide for that call (no loss guard, scaler, accumulation or
    # clipping: fixed for the run; and no out-of-memory micro-batch in progress: the retry calls
    # `_pick` when its split starts and ends), else at the `_any` one that checks each call.
    # The plain ones test nothing the run's options fixed: 9-14 Python opcodes less a call.

    def _pick(self) -> None:
        micro = self.oom_guard
        whole = micro.count == 1 and micro.index == 0
        plain_backward = whole and self._plain_backward
        self.backward = self._backward_plain if plain_backward else self._backward_any
        plain_zero = whole and self.accumulation.every == 1
        self.zero_grad = self._zero_grad_plain if plain_zero else self._zero_grad_any
        self.step = self._step_plain if whole and self.stepping.plain else self._step_any

    def _backward_plain(self, loss: Any, *args: Any) -> Any:
        # `accumulation.pending` is left alone: with one backward() a step it is read nowhere
        # (see `Accumulation`), and the plain step does not reset it either
        if isinstance(loss, _Tensor):
            self._signals.count += 1  # this batch trains, even if a guard drops its update
            self._last_loss = loss  # read (and synchronised) only by the status writer, 1/s
            self._backwards += 1
            return loss.backward(*args) if args else loss.backward()  # type: ignore[no-untyped-call]
        return self.backward_kw(loss, *args)

    def _backward_any(self, loss: Any, *args: Any) -> Any:
        if self._plain_backward and self.oom_guard.count == 1 and isinstance(loss, _Tensor):
            self._signals.count += 1  # this batch trains, even if a guard drops its update
            self._last_loss = loss  # read (and synchronised) only by the status writer, 1/s
            self.accumulation.pending += 1
            self._backwards += 1
            return loss.backward(*args) if args else loss.backward()  # type: ignore[no-untyped-call]
        return self.backward_kw(loss, *args)

    def observed_backward(self, loss: _Tensor) -> None:
        """A backward() the rewrite did not route (`runtime.observe`): counted, its loss kept
        and added to the epoch's mean (`--monitor loss`) as a routed one's; nothing else. The
        first one says which of the run's options cannot apply to it."""
        if not self._backwards:
            options = self.options
            unapplied = [
                flag
                for flag, asked in (
                    (f"--on-nan {options.on_nan}", options.on_nan != "off"),
                    (f"--accumulate {options.accumulate}", options.accumulate > 1),
                )
                if asked
            ]
            if unapplied:
                self.event(
                    "backward() runs where %%train does not rewrite it (in a step closure made "
                    f"before the cell, or an imported function): {' and '.join(unapplied)} "
                    "cannot apply to it"
                )
        self._signals.count += 1
        self._last_loss = loss
        self._backwards += 1
        epoch_loss = self.guards.epoch_loss
        if epoch_loss is not None:
            epoch_loss.add(loss)

    def backward_kw(self, loss: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(loss, _Tensor):  # torch.autograd.backward(...) and the like
            return loss.backward(*args, **kwargs)
        self._signals.count += 1  # this batch trains, even if a guard drops its update
        self._last_loss = loss  # read (and synchronised) only by the status writer, 1/s
        if self._plain_backward and self.oom_guard.count == 1:
            self.accumulation.pending += 1
            self._backwards += 1
            return loss.backward(*args, **kwargs)  # type: ignore[no-untyped-call]
        guards = self.guards
        if guards.watch_losses and not guards.loss_ok(loss):
            return None
        stepping = self.stepping
        if stepping.update_pending:
            stepping.before_scale()
        accumulation = self.accumulation
        if accumulation.every > 1:
            loss = loss / accumulation.every
            self.checkpoints.summed = True  # its gradients are summed in: an interrupt counts it
        micro = self.oom_guard
        if micro.count > 1:  # a micro-batch after out-of-memory (see `oom`)
            loss = loss * micro.weight  # its share of the batch: the mean over the whole batch
            if micro.last_part:
                accumulation.pending += 1
        else:
            accumulation.pending += 1
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        self._backwards += 1
        return loss.backward(*args, **kwargs)

    def _zero_grad_plain(self, target: Any, *args: Any) -> Any:
        return target.zero_grad(*args) if args else target.zero_grad()

    def _zero_grad_any(self, target: Any, *args: Any) -> Any:
        accumulation = self.accumulation  # `_keeps_gradients`, inline: it runs on every step
        if (
            (accumulation.every > 1 and accumulation.pending > 0) or self.oom_guard.index > 0
        ) and isinstance(target, torch.optim.Optimizer | torch.nn.Module):
            return None  # mid-accumulation or a later micro-batch: keep summing gradients
        return target.zero_grad(*args) if args else target.zero_grad()

    def zero_grad_kw(self, target: Any, *args: Any, **kwargs: Any) -> Any:
        if self._keeps_gradients(target):
            return None
        return target.zero_grad(*args, **kwargs)

    def _keeps_gradients(self, target: Any) -> bool:
        """Mid-accumulation or a later micro-batch: an optimizer's or a module's zero_grad() is
        skipped, so the gradients keep summing."""
        accumulation = self.accumulation
        return (
            (accumulation.every > 1 and accumulation.pending > 0) or self.oom_guard.index > 0
        ) and isinstance(target, torch.optim.Optimizer | torch.nn.Module)

    def clip_grad_norm_(self, parameters: Any, *args: Any, **kwargs: Any) -> Any:
        return self.stepping.clip(torch.nn.utils.clip_grad_norm_, parameters, *args, **kwargs)

    def clip_grad_value_(self, parameters: Any, *args: Any, **kwargs: Any) -> Any:
        return self.stepping.clip(torch.nn.utils.clip_grad_value_, parameters, *args, **kwargs)

    # -- steps -----------------------------------------------------------------------------------

    def _step_plain(self, target: Any, *args: Any) -> Any:
        if not args and isinstance(target, _Optimizer):
            # `Stepping.optimizer_step`'s plain path, inline: one call less per step; the
            # optimizer registered when it is not the one stepped last (one test a step)
            if target is not self._stepped_last:
                self._stepped_last = target
                self._optimizers[id(target)] = target
            return target.step()
        return self.step_kw(target, *args)

    def _step_any(self, target: Any, *args: Any) -> Any:
        if not args and isinstance(target, _Optimizer):
            stepping = self.stepping
            if stepping.plain and self.oom_guard.count == 1:
                # `Stepping.optimizer_step`'s plain path, inline: one call less per step
                optimizers = stepping.optimizers
                if id(target) not in optimizers:
                    optimizers[id(target)] = target
                result = target.step()
                self.accumulation.pending = 0
                return result
        return self.step_kw(target, *args)

    def step_kw(self, target: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(target, _Optimizer):
            if args or kwargs:  # a closure (LBFGS): one step, however often it runs the closure
                backwards = self._backwards
                result = self.stepping.optimizer_step(target, args, kwargs)
                self._backwards = backwards + 1
                return result
            return self.stepping.optimizer_step(target, args, kwargs)
        if isinstance(target, LRScheduler):
            return self.stepping.scheduler_step(target, args, kwargs)
        return target.step(*args, **kwargs)

    def _step_hook(self) -> Callable[[torch.optim.Optimizer, Any, Any], None]:
        """The optimizer step post hook: runs after every real optimizer step anywhere (hooks
        reach code the rewrite cannot see). A closure over the three objects it updates, not a
        bound method reading them from the session: next to a real step, where the session's
        objects are out of the caches, each lookup saved shows (issue 14, round 4)."""
        counts, signals, checkpoints = self._step_counts, self._signals, self.checkpoints

        def on_optimizer_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            counts[id(optimizer)] += 1
            signals.count += 1
            checkpoints.updated += 1

        return on_optimizer_step


_active: TrainSession | None = None


def _deactivate(session: TrainSession) -> None:
    global _active
    if _active is session:
        _active = None


def reset() -> None:
    """Forget the active run (tests: each starts with none)."""
    global _active
    _active = None


def log(**values: Any) -> None:
    """Report metrics from a `%%train` cell: `jupyter_trainmate.log(val_loss=0.31, acc=0.9)`.

    They go to the live chart and the run's summary. Values may be numbers or 0-d tensors (a
    tensor is read once here, which waits for the GPU: log at most once every few steps). Outside
    a `%%train` run it does nothing.
    """
    session = _active
    if session is None:
        return
    session.log({name: float(value) for name, value in values.items()})
