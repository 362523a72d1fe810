"""
How a run applies its guards (see `guards`): a non-finite loss drops its batch's update (or stops
the run), a gradient spike drops the optimizer step, `rollback` restores the epoch's first state,
and early stopping reads the metrics the cell logs. Every decision is reported as an event.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .checkpoint import trainable_objects
from .guards import STOP_CHECK_EVERY, EarlyStopping, NanGuard, Rollback, SpikeGuard, StopRun
from .options import TrainOptions


class Guards:
    """The guards of one run and what they decide."""

    def __init__(
        self,
        options: TrainOptions,
        namespace: Mapping[str, object],
        *,
        steps: Callable[[], int],
        report: Callable[[str], None],
    ) -> None:
        self._namespace = namespace
        self._steps = steps
        self._report = report
        self.nan = NanGuard(options.on_nan)
        self.spike = SpikeGuard(options.on_spike, options.spike_factor)
        self.watch_losses = options.on_nan != "off"  # read on every backward(): plain booleans
        self.watch_spikes = options.on_spike != "off"
        self.rollback = Rollback() if "rollback" in (options.on_nan, options.on_spike) else None
        self.early_stopping = (
            EarlyStopping(options.monitor, options.patience, options.mode)
            if options.monitor is not None and options.patience is not None
            else None
        )
        self.drop_update = False  # a guarded loss was not finite: no update for this batch
        self.epoch_loss: EpochLoss | None = None  # `--monitor loss` (see `watch_epoch_loss`)

    def watch_epoch_loss(self, log: Callable[[dict[str, float]], None]) -> None:
        """Log the epoch's mean training loss as the metric `loss` at each epoch's end, for a
        loop that logs no metric of its own (`--monitor loss`: early stopping, a sweep's value)."""
        self.epoch_loss = EpochLoss(log)
        self.watch_losses = True

    # -- per epoch -------------------------------------------------------------------------------

    def epoch_started(self) -> None:
        if self.rollback is not None:
            self.rollback.remember(trainable_objects(self._namespace))

    def epoch_ended(self) -> None:
        """Read what the deferred guards kept on the device (raises `NanDetected`), then log
        the epoch's loss (which may stop the run: early stopping, a pruned trial)."""
        if self.nan.policy == "stop":
            self.nan.check_pending()
        for late in self.spike.check_pending():
            self._report(late)
        if self.epoch_loss is not None:
            self.epoch_loss.log_mean()

    def run_finished(self) -> None:
        """A finished run's losses since the last epoch's end (all of them, for a loop with no
        batch loop to end an epoch: a `range` loop of steps) are logged as its last `loss`."""
        if self.epoch_loss is not None:
            with contextlib.suppress(StopRun):  # the run is over: nothing left to stop
                self.epoch_loss.log_mean()

    # -- per step --------------------------------------------------------------------------------

    def loss_ok(self, loss: torch.Tensor) -> bool:
        """Whether a loss may go on to backward (called only when `watch_losses`)."""
        if self.epoch_loss is not None:
            self.epoch_loss.add(loss)
            if self.nan.policy == "off":
                return True
        step = self._steps()
        if self.nan.watch(step, loss):
            return True
        self.nan.skipped += 1
        self.drop_update = True
        if self.nan.policy == "rollback" and self._roll_back():
            self._report(
                f"non-finite loss at step {step}: rolled back to the epoch's start, batch dropped"
            )
        else:
            self._report(
                f"non-finite loss at step {step}: batch skipped (--on-nan {self.nan.policy})"
            )
        return False

    def take_dropped_update(self) -> bool:
        """Whether the optimizer step now due belongs to a dropped batch (asked once per step)."""
        dropped, self.drop_update = self.drop_update, False
        return dropped

    def spike_drops(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether this optimizer step is a gradient spike to drop (its gradients unscaled)."""
        params = [p for g in optimizer.param_groups for p in g["params"]]
        guard = self.spike
        message = guard.observe(self._steps(), params)
        if len(guard.pending) >= STOP_CHECK_EVERY:
            for late in guard.check_pending():
                self._report(late)
        if message is None:
            return False
        if guard.policy == "rollback" and self._roll_back():
            self._report(message + ": rolled back to the epoch's start, update dropped")
        else:
            self._report(message + ": update skipped")
        return True

    def _roll_back(self) -> bool:
        return self.rollback is not None and self.rollback.restore(
            trainable_objects(self._namespace)
        )

    # -- metrics ---------------------------------------------------------------------------------

    def logged(self, values: dict[str, Any]) -> None:
        """Metrics from `jupyter_trainmate.log()`: early stopping raises `StopRun` when due."""
        if "loss" in values and self.epoch_loss is not None and not self.epoch_loss.logging:
            self.epoch_loss = None  # the cell logs a `loss` of its own: that one is monitored
        if self.early_stopping is not None:
            self.early_stopping.update(values)


class EpochLoss:
    """The mean of an epoch's training losses, summed on their device (no synchronisation per
    step; one read at the epoch's end), logged as `loss`."""

    def __init__(self, log: Callable[[dict[str, float]], None]) -> None:
        self._log = log
        self._sum: torch.Tensor | None = None
        self._count = 0
        self.logging = False

    def add(self, loss: torch.Tensor) -> None:
        value = loss.detach().float().mean()
        self._sum = value if self._sum is None else self._sum + value
        self._count += 1

    def log_mean(self) -> None:
        if self._sum is None or not self._count:
            return
        mean = float(self._sum) / self._count
        self._sum, self._count = None, 0
        self.logging = True
        try:
            self._log({"loss": mean})
        finally:
            self.logging = False
