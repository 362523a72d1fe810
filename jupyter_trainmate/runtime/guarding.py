"""
How a run applies its guards (see `guards`): a non-finite loss drops its batch's update (or stops
the run), a gradient spike drops the optimizer step, `rollback` restores the epoch's first state,
and early stopping reads the metrics the cell logs. Every decision is reported as an event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from .checkpoint import trainable_objects
from .guards import STOP_CHECK_EVERY, EarlyStopping, NanGuard, Rollback, SpikeGuard
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

    # -- per epoch -------------------------------------------------------------------------------

    def epoch_started(self) -> None:
        if self.rollback is not None:
            self.rollback.remember(trainable_objects(self._namespace))

    def epoch_ended(self) -> None:
        """Read what the deferred guards kept on the device (raises `NanDetected`)."""
        if self.nan.policy == "stop":
            self.nan.check_pending()
        for late in self.spike.check_pending():
            self._report(late)

    # -- per step --------------------------------------------------------------------------------

    def loss_ok(self, loss: torch.Tensor) -> bool:
        """Whether a loss may go on to backward (called only when `watch_losses`)."""
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
        if self.early_stopping is not None:
            self.early_stopping.update(values)
