"""
The guards of a run, each on its own: NaN/inf losses (`--on-nan stop|skip|rollback`), gradient-norm
spikes (`--on-spike warn|skip|rollback`), the rollback state they share, and early stopping
(`--patience N --monitor NAME --mode min|max` on metrics from `jupyter_trainmate.log`). How a run
applies them is `guarding`.

When a NaN is seen: `stop` keeps the loss flags on the device and reads them every
`STOP_CHECK_EVERY` steps, so it costs no host-device synchronisation per step and may notice up to
that many steps late (the run stops there, the step is named). `skip` and `rollback` must decide
before the optimizer steps, so they read the flag on every step (a synchronisation on a GPU, free on
a CPU): `skip` drops that batch's update; `rollback` also restores the last good weights and
optimizer state (kept in memory at the start of each epoch) and drops the batch.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import NanDetected as NanDetected

STOP_CHECK_EVERY = 16


class StopRun(Exception):
    """Raised inside the cell to end the run early; `%%train` catches it."""

    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason


@dataclass
class NanGuard:
    """Non-finite losses (`--on-nan`): flags kept on the device under `stop`, read at once else."""

    policy: str  # "off" | "stop" | "skip" | "rollback"
    pending: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    skipped: int = 0

    def watch(self, step: int, loss: torch.Tensor) -> bool:
        """Called with each loss before backward; False: drop this step (skip/rollback)."""
        if self.policy == "stop":
            self.pending.append((step, torch.isfinite(loss.detach()).all()))
            if len(self.pending) >= STOP_CHECK_EVERY:
                self.check_pending()
            return True
        return bool(torch.isfinite(loss.detach()).all())

    def check_pending(self) -> None:
        pending, self.pending = self.pending, []
        if not pending:
            return
        flags = torch.stack([flag for _, flag in pending]).cpu()  # one synchronisation for all
        for (step, _), ok in zip(pending, flags.tolist(), strict=True):
            if not ok:
                raise NanDetected(f"--on-nan stop: non-finite loss at step {step}")


@dataclass
class Rollback:
    """The last good state of the models and optimizers (taken at each epoch's start), restored
    by `--on-nan rollback` and `--on-spike rollback` alike."""

    snapshot: dict[str, Any] | None = None

    def remember(self, objects: dict[str, dict[str, Any]]) -> None:
        self.snapshot = {
            kind: {name: copy.deepcopy(obj.state_dict()) for name, obj in found.items()}
            for kind, found in objects.items()
            if kind in ("models", "optimizers")
        }

    def restore(self, objects: dict[str, dict[str, Any]]) -> bool:
        if self.snapshot is None:
            return False
        for kind, states in self.snapshot.items():
            for name, state in states.items():
                target = objects[kind].get(name)
                if target is not None:
                    target.load_state_dict(copy.deepcopy(state))
        return True


@dataclass
class SpikeGuard:
    """Gradient-norm spikes: a norm over `factor` times the running median of recent norms.

    `warn` keeps the norms on the device and reads them every `STOP_CHECK_EVERY` steps (no
    per-step synchronisation; the warning names the step); `skip` and `rollback` read each norm
    before the optimizer steps.
    """

    policy: str  # "off" | "warn" | "skip" | "rollback"
    factor: float = 10.0
    history: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    pending: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    min_history: int = 10

    def _is_spike(self, norm: float) -> float | None:
        if len(self.history) < self.min_history or not math.isfinite(norm):
            return None
        median = statistics.median(self.history)
        return median if median > 0 and norm > self.factor * median else None

    def observe(self, step: int, params: list[torch.Tensor]) -> str | None:
        """Called before an optimizer step; returns a message when this step must be dropped."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return None
        norm = torch.nn.utils.get_total_norm(grads)
        if self.policy == "warn":
            self.pending.append((step, norm.detach()))
            return None
        value = float(norm)
        median = self._is_spike(value)
        if median is not None:
            return f"gradient norm {value:.3g} at step {step} is {value / median:.0f}x the running median {median:.3g}"
        if math.isfinite(value):
            self.history.append(value)
        return None

    def check_pending(self) -> list[str]:
        pending, self.pending = self.pending, []
        if not pending:
            return []
        values = torch.stack([n for _, n in pending]).cpu().tolist()
        messages = []
        for (step, _), value in zip(pending, values, strict=True):
            median = self._is_spike(value)
            if median is not None:
                messages.append(
                    f"gradient norm {value:.3g} at step {step} is {value / median:.0f}x the running median {median:.3g}"
                )
            elif math.isfinite(value):
                self.history.append(value)
        return messages


@dataclass
class EarlyStopping:
    monitor: str
    patience: int
    mode: str = "min"
    best: float = math.nan
    bad: int = 0

    def update(self, values: dict[str, float]) -> None:
        if self.monitor not in values:
            return
        value = values[self.monitor]
        better = math.isnan(self.best) or (
            value < self.best if self.mode == "min" else value > self.best
        )
        if better:
            self.best, self.bad = value, 0
            return
        self.bad += 1
        if self.bad >= self.patience:
            raise StopRun(
                "stopped early",
                f"{self.monitor}={value:.4g}: no improvement on {self.best:.4g} in {self.bad} "
                f"report(s) (--patience {self.patience}, --mode {self.mode})",
            )
