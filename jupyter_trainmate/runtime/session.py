"""
`TrainSession`: what rewritten training code calls, through the name `__trainmate__`.

The session owns the device, the mixed precision policy and GradScaler, prefetching, step timing
and gradient accumulation and clipping. Its calls pass anything they do not own straight through
(`env.step(a)` stays `env.step(a)`), and with the defaults on a CPU they add nothing to the
numerics: the same seed gives bit-identical weights with and without `%%train`.

Per step it does no host-device synchronisation: GPU times are read lazily (see `timing`), and
a GradScaler's skipped steps are counted from the optimizer step hook, not by reading the scale.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
import types
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..errors import TrainmateError
from ..monitor.host import usable_cpus
from .amp import AmpPolicy, resolve_amp
from .batch import SampleCounter, leading_size
from .checkpoint import FORMAT as CHECKPOINT_FORMAT
from .checkpoint import VERSION as CHECKPOINT_VERSION
from .checkpoint import (
    CheckpointWriter,
    checkpoints,
    rng_state,
    set_rng_state,
    snapshot_state,
    trainable_objects,
)
from .guards import STOP_CHECK_EVERY, EarlyStopping, NanGuard, SpikeGuard
from .loader import LoaderInfo, loader_info
from .oom import OutOfMemoryRetry
from .options import TrainOptions
from .prefetch import CudaPrefetcher, ThreadPrefetcher
from .summary import Outcome, RunProgress, RunSummary, SamplesSource, _record
from .timing import StepTimer
from .tune import Candidate, LoaderTuner, loader_like, tunable


def params_device(namespace: Mapping[str, object]) -> torch.device | None:
    """Where the training happens: the parameters of an optimizer, else of a model, in `namespace`."""
    values = list(namespace.values())
    for value in values:
        if isinstance(value, torch.optim.Optimizer):
            for group in value.param_groups:
                for p in group["params"]:
                    return torch.device(p.device)
    for value in values:
        if isinstance(value, torch.nn.Module):
            for p in value.parameters():
                return torch.device(p.device)
    return None


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


class _CounterLoop:
    """A counter loop in progress (`TrainSession.loop`): what the session knows of it so far."""

    __slots__ = ("epochs_at_start", "epochs_mark", "inner", "length", "outer", "steps")

    def __init__(self, length: int | None, epochs_at_start: int, epochs_mark: int) -> None:
        self.length = length
        self.epochs_at_start = epochs_at_start
        self.epochs_mark = epochs_mark  # epochs() calls seen when the current pass began
        self.inner = False  # a batch loop, a counter loop or next() ran in the current pass
        self.outer = False  # other loops run inside it: its passes are epochs (or folds)
        self.steps = 0  # passes that were steps


class _Batches:
    """The iterable that replaces a batch loop's iterable: `len()` works if the original's does.

    `iter()` on it calls `iter()` on the original at once, as the plain loop would: creating a
    DataLoader iterator draws a seed from the global RNG, and wrappers such as tqdm's asyncio
    class call `iter()` an extra time, so a lazy wrapper would shift every later random draw.
    """

    def __init__(self, session: TrainSession, iterable: Iterable[Any]) -> None:
        self._session = session
        self._iterable = iterable

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        session, iterable = self._session, self._iterable
        if session.loader_info is None:
            session.loader_info = loader_info(iterable)
        try:
            remaining: int | None = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            remaining = None
        if session._resume is not None:
            return session._resumed_epoch(iterable, remaining)
        if session.checkpoint_dir is not None:
            session._epoch_rng = rng_state()  # before iter() draws: resume redraws this order
        if "rollback" in (session.nan_guard.policy, session.spike_guard.policy):
            session.nan_guard.remember(trainable_objects(session._namespace))
        if session.options.tune_loader and isinstance(iterable, torch.utils.data.DataLoader):
            tuner = session._tuner(iterable)
            if tuner is not None:
                if tuner.best is None:  # first epoch: try the candidates on its own batches
                    return session._iterate(
                        session._source(tuner.first_epoch()), remaining, 0, SampleCounter(iterable)
                    )
                iterable = tuner.later_loader()
                session.loader_info = loader_info(iterable)  # advice about the loader in use
        return session._iterate(session._source(iterable), remaining, 0, SampleCounter(iterable))


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
        found = params_device(namespace)
        if options.device == "auto":
            self.device = found or torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self._device_confirmed = found is not None
        else:
            self.device = torch.device(options.device)
            if found is not None and not _same_device(found, self.device):
                raise TrainmateError(
                    f"--device {options.device}: the model's parameters are on {found}; "
                    "move the model there or drop --device"
                )
            self._device_confirmed = True
        if own_amp:
            self.amp = AmpPolicy(
                "off", self.device.type, "the cell brings its own autocast/GradScaler"
            )
        else:
            self.amp = resolve_amp(options.amp, self.device, reads_gradients)
        # A scaler only where the rewrite routes backward(): scaling gradients it never saw would
        # make the unscale in step() divide unscaled gradients.
        self.scaler = self.amp.grad_scaler() if saw_backward else None
        if options.prefetch == "cuda" and self.device.type != "cuda":
            raise TrainmateError(f"--prefetch cuda: the run is on {self.device}")
        self.accumulate = options.accumulate
        self.timer = StepTimer(self.device)
        self.epochs_seen = 0  # batch loops that fetched at least one batch
        self.epochs_total: int | None = None  # from the epoch loop, when the rewrite found one
        self.steps_per_epoch: int | None = None
        self._epochs_base = 0
        self._epoch_first_step = 0
        self._in_epoch = False
        self._last_loss: Any = None
        self.loader_info: LoaderInfo | None = None
        self.on_log: list[Callable[[int, dict[str, float]], None]] = []
        self.on_event: list[Callable[[str], None]] = []
        self.events: list[str] = []
        self._tuners: dict[int, LoaderTuner | None] = {}
        self.checkpoint_dir = Path(options.checkpoint) if options.checkpoint else None
        self.last_checkpoint: Path | None = None
        self._epoch_rng: dict[str, Any] | None = None
        self._rng_after_fetch: torch.Tensor | None = None
        self._stepped = False  # whether the optimizer stepped since the last batch arrived
        self._in_body = False  # between a batch's arrival and the request for the next
        self._ckpt_epoch = 0
        self._in_epoch_done = 0  # batches completed in the current epoch (checkpointing only)
        self._resume: dict[str, Any] | None = None
        self._writer = CheckpointWriter(options.keep)
        self._checkpoint_number: int | None = None
        self.nan_guard = NanGuard(options.on_nan)
        self.early_stopping = (
            EarlyStopping(options.monitor, options.patience, options.mode)
            if options.monitor is not None and options.patience is not None
            else None
        )
        self._drop_step = False  # a guarded loss was not finite: no update for this batch
        self.spike_guard = SpikeGuard(options.on_spike, options.spike_factor)
        self.logged: dict[str, float] = {}
        self.skipped_steps = 0
        self._instrumented = instrumented
        self._left_alone = left_alone
        self._backwards = 0
        self._pending = 0  # backward() calls since the last real optimizer step
        # What counts as a step and an epoch (see `loop` and `_iterate_plain`): a batch, or a pass
        # of a counter loop, is a training step when a backward() or an optimizer step (a
        # "signal") happened while it was in hand; validation batches are taken back out.
        self._signals = 0
        self._in_batch = 0  # batch loop bodies in progress: a counter loop inside one is no step
        self._loops: list[_CounterLoop] = []  # counter loops in progress, innermost last
        self._epochs_calls = 0  # epochs() calls: an explicit epoch loop outranks a counter loop
        self._uncounted = [0, 0, 0]  # steps, samples, passes taken back as not training
        self._samples_counted = False  # a batch loop or next() counted samples
        self._samples_guessed = False  # ... some by the batches' first dimension
        self.oom_guard = OutOfMemoryRetry(self)  # `with __trainmate__.oom_guard:` in batch loops
        # `__trainmate__.parts(batch, names)`: the batch once; after an out-of-memory error, again
        # as micro-batches (see `oom`). Bound once: it runs on every step.
        self.parts = self.oom_guard.parts
        self._last_batch = False
        self._opt_steps: defaultdict[int, int] = defaultdict(int)
        self._stepping: dict[int, torch.optim.Optimizer] = {}
        self._sched_last: dict[int, int] = {}
        self._unscaled: set[int] = set()
        self._update_pending = False
        self._exit = contextlib.ExitStack()
        self._started = 0.0

    # -- lifecycle -------------------------------------------------------------------------------

    def save_checkpoint(
        self, position: int, torch_rng: torch.Tensor | None = None, epoch: int | None = None
    ) -> Path:
        """Write a checkpoint of the notebook's training objects at a batch boundary."""
        assert self.checkpoint_dir is not None
        objects = trainable_objects(self._namespace)
        rng = rng_state()
        if torch_rng is not None:
            rng["torch"] = torch_rng
        # Copied here, on the training thread: the writer thread serialises while training goes
        # on, and state_dict() tensors share storage with the live weights and optimizer states.
        states = {
            kind: {n: snapshot_state(o.state_dict()) for n, o in found.items()}
            for kind, found in objects.items()
        }
        if self.accumulate > 1 and self._pending > 0:
            # Mid-window: the gradients summed so far are part of the state (the batches that
            # produced them are not seen again after a resume).
            states["grads"] = {
                name: {
                    key: None if p.grad is None else snapshot_state(p.grad)
                    for key, p in model.named_parameters()
                }
                for name, model in objects["models"].items()
            }
        payload = {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            **states,
            "pending": self._pending if self.accumulate > 1 else 0,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rng,
            "epoch_rng": self._epoch_rng if position else None,
            "epoch": self.epochs_seen - self._epochs_base if epoch is None else epoch,
            "position": position,
            "steps": self.timer.totals.steps,
        }
        if self._checkpoint_number is None:
            existing = checkpoints(self.checkpoint_dir)
            self._checkpoint_number = (
                int(existing[-1].stem.removeprefix("step-")) if existing else 0
            )
        self._checkpoint_number += 1
        path = self.checkpoint_dir / f"step-{self._checkpoint_number:08d}.pt"
        self._writer.submit(payload, path)
        self.last_checkpoint = path
        return path

    def checkpoint_after_error(self, what: str) -> None:
        """On Ctrl-C or an exception: save the last complete step and say how to continue."""
        if self.checkpoint_dir is None or (not self._in_body and self._in_epoch_done == 0):
            return  # outside a batch loop: the epoch-end checkpoint is the latest state
        done, epoch = self._in_epoch_done, self._ckpt_epoch
        if self._in_body and self._stepped:  # the step had updated the weights: it counts
            done += 1
            path = self.save_checkpoint(done, epoch=epoch)
        elif self._in_body:  # it had not: back to the moment its batch arrived
            path = self.save_checkpoint(done, torch_rng=self._rng_after_fetch, epoch=epoch)
        else:
            path = self.save_checkpoint(done, epoch=epoch)
        self.event(
            f"{what} in epoch {epoch + 1} after {done} batches: checkpoint {path}; "
            "continue with %%train --resume"
        )
        self._writer.wait()

    def resume_from(self, payload: dict[str, Any]) -> None:
        """Load a checkpoint's states into the notebook's objects (before the cell runs)."""
        objects = trainable_objects(self._namespace)
        for kind in ("models", "optimizers", "schedulers"):
            for name, state in payload[kind].items():
                target = objects[kind].get(name)
                if target is None:
                    raise TrainmateError(
                        f"--resume: the checkpoint has {kind[:-1]} {name!r}, the notebook has none"
                    )
                try:
                    target.load_state_dict(state)
                except (RuntimeError, ValueError, KeyError) as exc:
                    first = str(exc).strip().splitlines()[0][:160]
                    raise TrainmateError(
                        f"--resume: {name} does not match the checkpoint: {first}"
                    ) from None
        if payload.get("scaler") is not None and self.scaler is not None:
            self.scaler.load_state_dict(payload["scaler"])
        for name, grads in (payload.get("grads") or {}).items():
            params = dict(objects["models"][name].named_parameters())
            for key, grad in grads.items():
                if key in params:
                    p = params[key]
                    p.grad = None if grad is None else grad.to(p.device, p.dtype)
        if payload.get("pending") and self.accumulate > 1:
            self._pending = int(payload["pending"])
        self._resume = dict(payload)
        self._apply_settings(objects["optimizers"])

    def _apply_settings(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        """`--set lr=3e-4`: write the values into every param group that has that setting."""
        for item in self.options.set:
            name, _, text = item.partition("=")
            value = float(text)
            groups = [g for opt in optimizers.values() for g in opt.param_groups if name in g]
            if not groups:
                raise TrainmateError(f"--set {item}: no optimizer has a setting {name!r}")
            for group in groups:
                group[name] = value
                if name == "lr" and "initial_lr" in group:
                    group["initial_lr"] = value  # schedulers scale from here
            self.event(f"--set {name}={value:g} on {len(groups)} parameter group(s)")

    def _resumed_epoch(self, iterable: Iterable[Any], remaining: int | None) -> Iterator[Any]:
        resume = self._resume
        assert resume is not None
        self._resume = None
        position = int(resume["position"])
        if position == 0:
            set_rng_state(resume["rng"])
            self._epoch_rng = rng_state()
            return self._iterate(self._source(iterable), remaining, 0, SampleCounter(iterable))
        set_rng_state(resume["epoch_rng"])  # the epoch's order, drawn again as it was
        self._epoch_rng = resume["epoch_rng"]
        source: Iterable[Any]
        if isinstance(iterable, torch.utils.data.DataLoader) and tunable(iterable) is None:
            torch.empty((), dtype=torch.int64).random_(generator=iterable.generator)
            order = list(iterable.batch_sampler)  # type: ignore[arg-type]
            current = Candidate(iterable.num_workers, bool(iterable.pin_memory))
            source = loader_like(
                iterable, order[position:], current, False, torch.Generator().manual_seed(0)
            )
        else:
            it = iter(iterable)
            for _ in range(position):
                next(it)
            source = it
        set_rng_state(resume["rng"])  # then every draw continues where the run stopped
        self.event(f"resumed after {position} batches of the epoch in progress")
        return self._iterate(
            self._source(source), remaining, position, SampleCounter(iterable, position)
        )

    def _spike(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether this optimizer step is a gradient spike to drop (skip/rollback)."""
        self._unscale(optimizer)  # norms of real gradients, not of GradScaler-scaled ones
        params = [p for g in optimizer.param_groups for p in g["params"]]
        guard, step = self.spike_guard, self.timer.totals.steps
        message = guard.observe(step, params)
        if len(guard.pending) >= STOP_CHECK_EVERY:
            for late in guard.check_pending():
                self.event(late)
        if message is None:
            return False
        if guard.policy == "rollback" and self.nan_guard.roll_back(
            trainable_objects(self._namespace)
        ):
            self.event(message + ": rolled back to the epoch's start, update dropped")
        else:
            self.event(message + ": update skipped")
        return True

    def _on_bad_loss(self) -> None:
        guard, step = self.nan_guard, self.timer.totals.steps
        guard.skipped += 1
        self._drop_step = True
        if guard.policy == "rollback" and guard.roll_back(trainable_objects(self._namespace)):
            self.event(
                f"non-finite loss at step {step}: rolled back to the epoch's start, batch dropped"
            )
        else:
            self.event(f"non-finite loss at step {step}: batch skipped (--on-nan {guard.policy})")

    def event(self, text: str) -> None:
        """Something the user should see: shown by the display, kept in the summary."""
        self.events.append(text)
        for listener in self.on_event:
            listener(text)

    def _tuner(self, loader: torch.utils.data.DataLoader[Any]) -> LoaderTuner | None:
        key = id(loader)
        if key not in self._tuners:
            reason = tunable(loader)
            if reason is not None:
                self.event(f"--tune-loader: not tuned, {reason}")
                self._tuners[key] = None
            else:
                self._tuners[key] = LoaderTuner(
                    loader,
                    cpus=usable_cpus(),
                    cuda=self.device.type == "cuda",
                    batches_each=self.options.tune_loader,
                    report=self.event,
                )
        return self._tuners[key]

    def log(self, values: dict[str, float]) -> None:
        """Metrics the cell reports with `jupyter_trainmate.log(name=value)`."""
        self.logged.update(values)
        step = self.timer.totals.steps
        for listener in self.on_log:
            listener(step, values)
        if self.early_stopping is not None:
            self.early_stopping.update(values)

    def start(self) -> None:
        global _active
        _active = self
        self._exit.callback(_deactivate, self)
        self._started = time.perf_counter()
        handle = register_optimizer_step_post_hook(self._on_optimizer_step)
        self._exit.callback(handle.remove)
        self._exit.enter_context(self.amp.autocast())

    def close(self, outcome: Outcome) -> RunSummary:
        """Undo everything the session set up and record the run's summary."""
        try:
            self._writer.wait()  # every checkpoint handed over is on disk
            if self._update_pending and self.scaler is not None:
                self.scaler.update()
            totals = self.timer.finish()
        finally:
            self._exit.close()
        steps, samples, epochs = totals.steps, totals.samples, self.epochs_seen
        if not self._signals:  # nothing trained where the session could see it: count it all
            steps, samples = steps + self._uncounted[0], samples + self._uncounted[1]
            epochs += self._uncounted[2]
        optimizer_steps = sum(self._opt_steps.values())
        steps = steps or self._backwards
        if not steps and optimizer_steps:
            steps = optimizer_steps
            self.event(
                "steps counted at optimizer steps: the rewrite reached no training loop "
                "(%%train --show says why)"
            )
        source: SamplesSource = "none"
        if self._samples_counted:
            source = "batch dim 0" if self._samples_guessed else "loader"
        summary = RunSummary(
            outcome=outcome,
            device=str(self.device),
            amp=self.amp.mode,
            amp_reason=self.amp.reason,
            prefetch=self.prefetch_mode,
            accumulate=self.accumulate,
            steps=steps,
            optimizer_steps=optimizer_steps,
            optimizer_steps_by_optimizer=tuple(self._opt_steps.values()),
            epochs=epochs,
            samples=samples,
            wall_s=time.perf_counter() - self._started,
            data_wait_s=totals.data_s,
            compute_s=totals.compute_s,
            data_wait_share=totals.data_share,
            skipped_steps=self.skipped_steps,
            metrics=dict(self.logged),
            events=tuple(self.events),
            instrumented=self._instrumented,
            left_alone=self._left_alone,
            samples_source=source,
        )
        _record(summary)
        return summary

    def progress(self) -> RunProgress:
        """A snapshot of where the run is, for the status file and the display (any thread)."""
        totals = self.timer.totals
        wall = time.perf_counter() - self._started
        optimizer_steps = sum(self._opt_steps.values())
        # the summary's fallbacks too: a loop the rewrite could not reach still moves the widget
        steps = totals.steps or self._backwards or optimizer_steps
        per_epoch, epochs_total = self.steps_per_epoch, self.epochs_total
        active = self._in_epoch
        finished_epochs = self.epochs_seen - self._epochs_base
        in_epoch = steps - self._epoch_first_step if active else 0
        fraction = eta = None
        if epochs_total and per_epoch:
            total = epochs_total * per_epoch
            done = min(total, finished_epochs * per_epoch + in_epoch)
            fraction = done / total
            if steps and wall > 0:
                eta = (total - done) / (steps / wall)
        loss = self._last_loss
        return RunProgress(
            steps=steps,
            samples=totals.samples,
            optimizer_steps=optimizer_steps,
            epoch=finished_epochs + (1 if active else 0),
            epochs_total=epochs_total,
            # between epochs (or after the last) the finished epoch shows as complete
            step_in_epoch=in_epoch if active or not finished_epochs else (per_epoch or in_epoch),
            steps_per_epoch=per_epoch,
            fraction=fraction,
            eta_s=eta,
            wall_s=wall,
            samples_per_s=totals.samples / wall if wall > 0 else 0.0,
            steps_per_s=steps / wall if wall > 0 else 0.0,
            data_wait_share=totals.data_share,
            last_loss=float(loss.detach().float()) if loss is not None else None,
            device=str(self.device),
            amp=self.amp.mode,
        )

    @property
    def prefetch_mode(self) -> str:
        mode = self.options.prefetch
        if mode == "auto":
            return "cuda" if self.device.type == "cuda" else "off"
        return mode

    # -- batches ---------------------------------------------------------------------------------

    def batches(self, iterable: Iterable[Any]) -> _Batches:
        return _Batches(self, iterable)

    def epochs(self, iterable: Iterable[Any]) -> Iterable[Any]:
        """The epoch loop's iterable, returned as is: the session only learns its length."""
        self._epochs_calls += 1
        try:
            self.epochs_total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            self.epochs_total = None
        self._epochs_base = self.epochs_seen
        resume = self._resume
        if resume is not None and resume["epoch"] > 0:
            done = int(resume["epoch"])
            self._epochs_base -= done  # progress counts the epochs done before the interruption
            resume["epoch"] = 0
            if isinstance(iterable, range):
                return iterable[done:]
            return itertools.islice(iterable, done, None)
        return iterable

    def _source(self, iterable: Iterable[Any]) -> Iterator[Any]:
        mode = self.prefetch_mode
        if mode == "cuda":
            if not self._device_confirmed:
                found = params_device(self._namespace)
                self._device_confirmed = found is not None and _same_device(found, self.device)
            if self._device_confirmed:
                return CudaPrefetcher(iterable, self.device)
        elif mode == "thread":
            return ThreadPrefetcher(iterable)
        return iter(iterable)

    def _iterate(
        self, source: Iterator[Any], remaining: int | None, done: int, counter: SampleCounter
    ) -> Iterator[Any]:
        if self.checkpoint_dir is not None:
            return self._iterate_checkpointed(source, remaining, done, counter)
        return self._iterate_plain(source, remaining, counter)

    def _iterate_checkpointed(
        self, source: Iterator[Any], remaining: int | None, done: int, counter: SampleCounter
    ) -> Iterator[Any]:
        """The batch loop with checkpoints: every `--every` steps, at the epoch's end, and enough
        state kept per step (the torch RNG after each fetch) to checkpoint an interrupted step."""
        every = self.options.every
        self._in_epoch_done = done
        # The epoch in progress, 0-based in the epoch loop: read now, since an exception closes
        # the inner generator (which counts the epoch as seen) before the handler runs.
        self._ckpt_epoch = self.epochs_seen - self._epochs_base
        inner = self._iterate_plain(
            source, None if remaining is None else remaining - done, counter
        )
        for batch in inner:
            self._rng_after_fetch = torch.get_rng_state()
            self._stepped = False
            self._in_body = True
            yield batch
            self._in_body = False
            self._in_epoch_done += 1
            if every and self.timer.totals.steps % every == 0:
                self.save_checkpoint(self._in_epoch_done, epoch=self._ckpt_epoch)
        self._in_epoch_done = 0
        self._epoch_rng = None
        self.save_checkpoint(0)  # the epoch is done: the next one starts fresh

    def _iterate_plain(
        self, source: Iterator[Any], remaining: int | None, counter: SampleCounter
    ) -> Iterator[Any]:
        # The per-step path: a plain for loop, bound methods in locals, no try/except per batch.
        # A batch is a training step when a signal (backward(), an optimizer step) came while it
        # was in hand; one that brought none (validation) is taken back out of the counts. The
        # pass is an epoch from its first batch that trained: progress follows it from there.
        timer = self.timer
        before, after, uncount = timer.before_fetch, timer.after_fetch, timer.uncount
        track_last = remaining is not None and self.accumulate > 1
        per_epoch, first_step = remaining, timer.totals.steps
        self._inner_loop_started(epochs=True)
        self._samples_counted = True
        self._samples_guessed |= not counter.exact
        fetched = trained = 0
        holding = False
        signals = self._signals
        try:
            before()
            for batch in source:
                samples = counter(batch)
                after(samples)
                fetched += 1
                if track_last:
                    remaining -= 1  # type: ignore[operator]
                    self._last_batch = remaining == 0
                signals = self._signals
                self._in_batch += 1
                holding = True
                yield batch
                holding = False
                self._in_batch -= 1
                if self._signals == signals:
                    uncount(samples)
                    self._uncounted[0] += 1
                    self._uncounted[1] += samples
                elif not trained:
                    trained = 1
                    self.steps_per_epoch = per_epoch
                    self._epoch_first_step = first_step
                    self._in_epoch = True
                else:
                    trained += 1
                before()
            if self.nan_guard.policy == "stop":
                self.nan_guard.check_pending()
            for late in self.spike_guard.check_pending():
                self.event(late)
        finally:
            if holding:  # left from inside the body (break, an exception): did the batch train?
                self._in_batch -= 1
                if self._signals != signals:
                    trained += 1
            if trained:
                self.epochs_seen += 1
                self._in_epoch = False
            elif fetched:  # a validation pass (an iter() that fetched nothing is no pass at all)
                self._uncounted[2] += 1
            self._last_batch = False
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def loop(self, iterable: Iterable[Any]) -> Iterable[Any]:
        """A training loop over a counter (`range(...)`, a list of models; see `rewrite.loops`).

        Inside a batch loop's body it is returned as is: the batch is the step. Elsewhere each
        pass is a step when it brought a signal and no loop inside it iterated batches (a loop
        that draws its own data); when a batch loop or another counter loop runs inside it, it
        is an epoch loop (the epoch total for progress and ETA is its length) and the loops
        inside count. Iterating it yields exactly what the original yields.
        """
        if self._in_batch:
            return iterable
        return self._counter_loop(iterable)

    def _counter_loop(self, iterable: Iterable[Any]) -> Iterator[Any]:
        try:
            length: int | None = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            length = None
        parent = self._loops[-1] if self._loops else None
        self._inner_loop_started(epochs=True)
        frame = _CounterLoop(length, self.epochs_seen, self._epochs_calls)
        self._loops.append(frame)
        timer = self.timer
        first_step = timer.totals.steps
        try:
            for item in iterable:
                frame.inner = False
                frame.epochs_mark = self._epochs_calls
                provisional = not frame.outer  # a step, unless a loop inside it counts
                if provisional:
                    timer.before_fetch()
                    timer.after_fetch(0)
                signals = self._signals
                yield item
                if provisional:
                    if frame.inner or self._signals == signals:
                        timer.uncount(0)
                    else:
                        frame.steps += 1
                        if frame.steps == 1 and parent is not None:  # an epoch, as a batch pass
                            self.steps_per_epoch = length
                            self._epoch_first_step = first_step
                            self._in_epoch = True
        finally:
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

    def drop_gradients(self) -> None:
        """Every gradient of the run's optimizers and models to None (after out-of-memory)."""
        found = trainable_objects(self._namespace)
        optimizers = [*found["optimizers"].values(), *self._stepping.values()]
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        for model in found["models"].values():
            model.zero_grad(set_to_none=True)
        if self.scaler is not None and self._unscaled:
            self.scaler.update()  # forget the unscale_ of the failed attempt
            self._unscaled.clear()
            self._update_pending = False

    def next_batch(self, iterator: Iterator[Any], *default: Any) -> Any:
        self._inner_loop_started(epochs=False)
        self.timer.before_fetch()
        batch = next(iterator, *default)
        self.timer.after_fetch(leading_size(batch))
        self._samples_counted = self._samples_guessed = True
        return batch

    # -- gradients -------------------------------------------------------------------------------

    def backward(self, loss: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(loss, torch.Tensor):  # torch.autograd.backward(...) and the like
            return loss.backward(*args, **kwargs)
        self._signals += 1
        self._last_loss = loss  # read (and synchronised) only by the status writer, 1/s
        guard = self.nan_guard
        if guard.policy != "off" and not guard.watch(self.timer.totals.steps, loss):
            self._on_bad_loss()
            return None
        if self._update_pending and self.scaler is not None:
            # Once per iteration, before the next scale(): every optimizer stepped with one scale.
            self.scaler.update()
            self._update_pending = False
            self._unscaled.clear()
        if self.accumulate > 1:
            loss = loss / self.accumulate
        micro = self.oom_guard
        if micro.count > 1:  # a micro-batch after out-of-memory (see `oom`)
            loss = loss * micro.weight  # its share of the batch: the mean over the whole batch
            if micro.last_part:
                self._pending += 1
        else:
            self._pending += 1
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        self._backwards += 1
        if self.accumulate > 1:
            self._stepped = True  # its gradients are summed in: an interrupt counts the batch done
        return loss.backward(*args, **kwargs)

    @property
    def _at_boundary(self) -> bool:
        """Whether the optimizer step that follows is a real one (accumulation complete)."""
        if not self.oom_guard.last_part:
            return False
        return self._pending >= self.accumulate or self._last_batch

    def zero_grad(self, target: Any, *args: Any, **kwargs: Any) -> Any:
        if ((self.accumulate > 1 and self._pending > 0) or self.oom_guard.index > 0) and isinstance(
            target, torch.optim.Optimizer | torch.nn.Module
        ):
            return None  # mid-accumulation or a later micro-batch: keep summing gradients
        return target.zero_grad(*args, **kwargs)

    def _unscale(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def _clip(self, fn: Callable[..., Any], parameters: Any, *args: Any, **kwargs: Any) -> Any:
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        if (self.accumulate > 1 or self.oom_guard.count > 1) and not self._at_boundary:
            return torch.nn.utils.clip_grad_norm_(params, math.inf)  # the norm, nothing clipped
        if self.scaler is not None:
            ids = {id(p) for p in params}

            # Before the first optimizer step `_stepping` is empty: the notebook's optimizers
            # (and its objects' own, `trainer.opt`) must be unscaled too, or the first clip
            # reads scaled gradients.
            def owns(o: torch.optim.Optimizer) -> bool:
                return any(id(p) in ids for g in o.param_groups for p in g["params"])

            owners = [o for o in self._stepping.values() if owns(o)]
            if not owners:
                owners = [o for o in _optimizers_in(self._namespace).values() if owns(o)]
            for optimizer in owners:
                self._unscale(optimizer)
        return fn(params, *args, **kwargs)

    def clip_grad_norm_(self, parameters: Any, *args: Any, **kwargs: Any) -> Any:
        return self._clip(torch.nn.utils.clip_grad_norm_, parameters, *args, **kwargs)

    def clip_grad_value_(self, parameters: Any, *args: Any, **kwargs: Any) -> Any:
        return self._clip(torch.nn.utils.clip_grad_value_, parameters, *args, **kwargs)

    # -- steps -----------------------------------------------------------------------------------

    def step(self, target: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(target, torch.optim.Optimizer):
            return self._optimizer_step(target, args, kwargs)
        if isinstance(target, LRScheduler):
            return self._scheduler_step(target, args, kwargs)
        return target.step(*args, **kwargs)

    def _optimizer_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        self._stepping.setdefault(id(optimizer), optimizer)
        if self.accumulate > 1 and len(self._stepping) > 1:
            raise TrainmateError(
                "--accumulate works with one optimizer; this loop steps several (accumulate by hand)"
            )
        if args or kwargs:  # a closure (LBFGS): it runs forward and backward itself
            backwards = self._backwards
            result = optimizer.step(*args, **kwargs)
            self._backwards = backwards + 1  # one step, however often it ran the closure
            return result
        if (self.accumulate > 1 or self.oom_guard.count > 1) and not self._at_boundary:
            return None
        if self._drop_step:
            self._drop_step = False
            optimizer.zero_grad(set_to_none=True)
            return None
        if self.spike_guard.policy != "off" and self._spike(optimizer):
            optimizer.zero_grad(set_to_none=True)
            return None
        if self.options.clip is not None:
            self._unscale(optimizer)
            params = [p for g in optimizer.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.options.clip)
        result = None
        if self.scaler is not None:
            before = self._opt_steps.get(id(optimizer), 0)
            result = self.scaler.step(optimizer)
            self._update_pending = True
            if self._opt_steps.get(id(optimizer), 0) == before:
                self.skipped_steps += 1  # inf/NaN gradients: GradScaler skipped the update
        else:
            result = optimizer.step()
        self._pending = 0
        return result

    def _scheduler_step(
        self, scheduler: LRScheduler, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        real = self._opt_steps.get(id(scheduler.optimizer), 0)
        if self.scaler is None and self.accumulate == 1 and self.oom_guard.count == 1:
            self._sched_last[id(scheduler)] = real
            return scheduler.step(*args, **kwargs)  # nothing can skip a step: leave the order alone
        # Step a scheduler only after its optimizer really stepped (PyTorch issue 44511: with a
        # GradScaler skipping steps, mid-accumulation or between micro-batches, the schedule
        # would run ahead).
        if real == 0 or self._sched_last.get(id(scheduler)) == real:
            return None
        self._sched_last[id(scheduler)] = real
        return scheduler.step(*args, **kwargs)

    def _on_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # Runs after every real optimizer step anywhere (hooks reach code the rewrite cannot
        # see): keep it to one dict update and a flag.
        self._opt_steps[id(optimizer)] += 1
        self._signals += 1
        self._stepped = True


_active: TrainSession | None = None


def _deactivate(session: TrainSession) -> None:
    global _active
    if _active is session:
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


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type == "cuda":
        index_a = a.index if a.index is not None else torch.cuda.current_device()
        index_b = b.index if b.index is not None else torch.cuda.current_device()
        return index_a == index_b
    return True
