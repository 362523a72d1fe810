"""
Optimizer and scheduler steps of a run: accumulation windows and micro-batches (a step only at
the window's end), the guards' dropped updates, `--clip`, and the GradScaler's bookkeeping
(unscale once per optimizer and iteration, update once per iteration, skipped steps counted).

Real optimizer steps are counted in `counts` by the optimizer step hook the session registers: it
sees steps the rewrite cannot, and costs one dict update.
"""

from __future__ import annotations

import math
import types
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from ..errors import TrainmateError
from .accumulation import Accumulation
from .checkpoint import trainable_objects
from .guarding import Guards
from .oom import OutOfMemoryRetry


def _optimizers_in(namespace: Mapping[str, object]) -> dict[int, torch.optim.Optimizer]:
    """The optimizers the namespace holds, and those its objects hold as attributes."""
    found: dict[int, torch.optim.Optimizer] = {}
    for value in namespace.values():
        if isinstance(value, types.ModuleType | type):
            continue
        inner = getattr(value, "__dict__", None)
        for item in (value, *(inner.values() if isinstance(inner, dict) else ())):
            if isinstance(item, torch.optim.Optimizer):
                found[id(item)] = item
    return found


class Stepping:
    """Decides and makes the optimizer and scheduler steps of one run."""

    def __init__(
        self,
        namespace: Mapping[str, object],
        scaler: torch.amp.GradScaler | None,
        accumulation: Accumulation,
        micro: OutOfMemoryRetry,
        guards: Guards,
        clip: float | None,
    ) -> None:
        self._namespace = namespace
        self.scaler = scaler
        self._accumulation = accumulation
        self._micro = micro
        self._guards = guards
        self._clip_norm = clip
        self.counts: defaultdict[int, int] = defaultdict(int)  # real steps, by id(optimizer)
        self.optimizers: dict[int, torch.optim.Optimizer] = {}  # those stepped through the session
        self.skipped = 0  # steps the GradScaler skipped (inf/NaN gradients)
        self._sched_last: dict[int, int] = {}
        self._unscaled: set[int] = set()
        self.update_pending = False  # a scaler.step() ran: update() before the next scale()
        # a step with nothing to decide: no scaler, accumulation, guard or clipping (checked
        # once here; a micro-batch after out-of-memory is checked per step; the session's
        # `step()` takes this path inline)
        self.plain = (
            scaler is None
            and accumulation.every == 1
            and not guards.watch_losses
            and not guards.watch_spikes
            and clip is None
        )

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def at_boundary(self) -> bool:
        """Whether the optimizer step that follows is a real one (window and batch complete)."""
        return self._micro.last_part and self._accumulation.complete()

    def _deferred(self) -> bool:
        """An optimizer step now would fall inside an accumulation window or a split batch."""
        return (self._accumulation.every > 1 or self._micro.count > 1) and not self.at_boundary()

    # -- GradScaler ------------------------------------------------------------------------------

    def before_scale(self) -> None:
        """Once per iteration, before the next scale(): every optimizer stepped with one scale
        (the session calls it only when `update_pending`: nothing per step otherwise)."""
        if self.update_pending and self.scaler is not None:
            self.scaler.update()
            self.update_pending = False
            self._unscaled.clear()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def drop_gradients(self) -> None:
        """Every gradient of the run's optimizers and models to None (after out-of-memory), and
        the failed attempt's unscale_ forgotten."""
        found = trainable_objects(self._namespace)
        for optimizer in [*found["optimizers"].values(), *self.optimizers.values()]:
            optimizer.zero_grad(set_to_none=True)
        for model in found["models"].values():
            model.zero_grad(set_to_none=True)
        if self.scaler is not None and self._unscaled:
            self.scaler.update()
            self._unscaled.clear()
            self.update_pending = False

    def finish(self) -> None:
        if self.update_pending and self.scaler is not None:
            self.scaler.update()
            self.update_pending = False

    # -- steps -----------------------------------------------------------------------------------

    def clip(self, fn: Callable[..., Any], parameters: Any, *args: Any, **kwargs: Any) -> Any:
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        if self._deferred():
            return torch.nn.utils.clip_grad_norm_(params, math.inf)  # the norm, nothing clipped
        if self.scaler is not None:
            ids = {id(p) for p in params}

            def owns(o: torch.optim.Optimizer) -> bool:
                return any(id(p) in ids for g in o.param_groups for p in g["params"])

            # Before the first optimizer step none was stepped through the session yet: the
            # notebook's optimizers (and its objects' own, `trainer.opt`) must be unscaled too, or
            # the first clip reads scaled gradients.
            owners = [o for o in self.optimizers.values() if owns(o)]
            if not owners:
                owners = [o for o in _optimizers_in(self._namespace).values() if owns(o)]
            for optimizer in owners:
                self.unscale(optimizer)
        return fn(params, *args, **kwargs)

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self.plain and self._micro.count == 1 and not args and not kwargs:
            if id(optimizer) not in self.optimizers:
                self.optimizers[id(optimizer)] = optimizer
            result = optimizer.step()
            self._accumulation.pending = 0
            return result
        self.optimizers.setdefault(id(optimizer), optimizer)
        if self._accumulation.every > 1 and len(self.optimizers) > 1:
            raise TrainmateError(
                "--accumulate works with one optimizer; this loop steps several (accumulate by hand)"
            )
        if args or kwargs:  # a closure (LBFGS): it runs forward and backward itself
            if self._accumulation.every > 1:
                # LBFGS runs the closure several times per step and needs each run's gradient
                # alone: a skipped zero_grad() would sum them, and halved losses mislead its line
                # search (the weights changed silently before)
                raise TrainmateError(
                    "--accumulate does not work with optimizer.step(closure) (LBFGS evaluates the "
                    "loss itself, several times per step); run without --accumulate"
                )
            return optimizer.step(*args, **kwargs)
        if (self._accumulation.every > 1 or self._micro.count > 1) and not self.at_boundary():
            return None  # inside an accumulation window or a split batch
        guards = self._guards
        if guards.drop_update and guards.take_dropped_update():
            optimizer.zero_grad(set_to_none=True)
            return None
        if guards.watch_spikes:
            self.unscale(optimizer)  # norms of real gradients, not of GradScaler-scaled ones
            if guards.spike_drops(optimizer):
                optimizer.zero_grad(set_to_none=True)
                return None
        if self._clip_norm is not None:
            self.unscale(optimizer)
            params = [p for g in optimizer.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, self._clip_norm)
        result = None
        if self.scaler is not None:
            before = self.counts.get(id(optimizer), 0)
            result = self.scaler.step(optimizer)
            self.update_pending = True
            if self.counts.get(id(optimizer), 0) == before:
                self.skipped += 1  # inf/NaN gradients: GradScaler skipped the update
        else:
            result = optimizer.step()
        self._accumulation.pending = 0
        return result

    def scheduler_step(
        self, scheduler: LRScheduler, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        real = self.counts.get(id(scheduler.optimizer), 0)
        if self.scaler is None and self._accumulation.every == 1 and self._micro.count == 1:
            self._sched_last[id(scheduler)] = real
            return scheduler.step(*args, **kwargs)  # nothing can skip a step: leave the order alone
        # Step a scheduler only after its optimizer really stepped (PyTorch issue 44511: with a
        # GradScaler skipping steps, mid-accumulation or between micro-batches, the schedule
        # would run ahead).
        if real == 0 or self._sched_last.get(id(scheduler)) == real:
            return None
        self._sched_last[id(scheduler)] = real
        return scheduler.step(*args, **kwargs)
