"""
Checkpoints of a run, out and in: what a checkpoint holds (the notebook's training objects, the
random generators, the GradScaler, the gradients of an open accumulation window) and where the
run was (epoch, batches done in it, steps), written every `--every` steps, at each epoch's end and
on an interrupt; and, with `--resume`, the same loaded back and the interrupted epoch continued
from the batch after the last complete one, in the order it was drawn.

A loop over a counter whose passes are the steps (`for i in range(max_steps):` drawing its own
batch each pass, makemore's and nanoGPT's shape) is checkpointed the same way by its passes: every
`--every` steps, at its end and on an interrupt, with the generators as they were when the pass
began (or after it, when its update was made); `--resume` skips the passes done.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch

from ..errors import TrainmateError
from .accumulation import Accumulation
from .buffers import StepBuffers
from .checkpoint import (
    FORMAT,
    VERSION,
    CheckpointWriter,
    checkpoint_name,
    rng_state,
    set_rng_state,
    snapshot_state,
    trainable_objects,
)
from .options import TrainOptions
from .tune import Candidate, loader_like, tunable

KINDS = ("models", "optimizers", "schedulers")  # loaded in this order (a scheduler's optimizer)


class Checkpoints:
    """The checkpoint state of one run (`directory` None: the run writes none)."""

    def __init__(
        self,
        options: TrainOptions,
        namespace: Mapping[str, object],
        accumulation: Accumulation,
        scaler: torch.amp.GradScaler | None,
        *,
        steps: Callable[[], int],
        report: Callable[[str], None],
        stepped: Mapping[int, int] | None = None,
    ) -> None:
        self.directory = Path(options.checkpoint) if options.checkpoint else None
        # real optimizer steps by id(optimizer) (the session's step hook counts them): a run
        # that stepped one no notebook variable holds gets no checkpoint (`_steps_unheld`)
        self._stepped: Mapping[int, int] = stepped if stepped is not None else {}
        self.unheld = False  # a checkpoint was not written for that reason
        self.last: Path | None = None  # the newest checkpoint handed to the writer
        self.writes = True  # False in the workers of `--procs` but rank 0: they save nothing
        # Whether the weights changed since the batch in progress arrived: the optimizer steps
        # since (the session adds one on every real optimizer step), and the most a finished
        # batch or pass made; `summed`: a backward() inside an accumulation window came since
        self.updated = 0
        self.summed = False
        self._most_updates = 0
        # The step in progress was taken back out of the counts already (its loop was left,
        # by the exception, before it trained): a checkpoint's `undone` does not take it again
        self.taken_back = False
        self._options = options
        self._namespace = namespace
        self._accumulation = accumulation
        self._scaler = scaler
        self._steps = steps
        self._report = report
        self._writer = CheckpointWriter(options.keep)
        self._steps_before = 0  # steps of the run this one resumed (checkpoint names count on)
        self._resume: dict[str, Any] | None = None  # a loaded checkpoint, until its epoch starts
        self._epochs_to_skip = 0
        # Whether the run's epochs were passes of a counter loop (`for ep in range(n):
        # train(...)`, the batch loop in a function): no explicit epoch loop ran (see `Batches`)
        self.explicit_epochs = False
        self._counter_epochs = False  # the resumed checkpoint's epochs were such passes
        self._epoch_rng: dict[str, Any] | None = None  # the RNG before the epoch drew its order
        self._epoch_list: list[Any] | None = None  # a list iterated, in its order then
        self._rng_after_fetch: torch.Tensor | None = None
        self._buffers: StepBuffers | None = None  # the models' small buffers as the step began
        self._in_body = False  # between a batch's arrival and the request for the next
        # The loops over a counter in progress whose passes are checkpointed (`step_passes`),
        # outermost first
        self._pass_loops: list[_Passes] = []
        # Notebook variables the step loop carries from pass to pass (an RNN's hidden state; the
        # rewrite names them: `rewrite.loops.carried_names`), and their values as the pass began
        self.carried: tuple[str, ...] = ()
        self._interrupted_pass: _Passes | None = None  # the step loop an exception left
        # Notebook variables the cell's own batch loop carries from batch to batch (`h =
        # h.detach()`, `running_loss += ...`; the rewrite names them), set as its epoch begins;
        # and, per batch, what they held as it arrived (with each tensor's version counter: an
        # in-place change since then means that value is gone)
        self.batch_carried: tuple[str, ...] = ()
        self._carried_at_batch: dict[str, Any] = {}
        self._carried_versions: dict[str, int] = {}
        self._epoch = 0  # the epoch in progress, 0-based in the epoch loop
        self._done = 0  # batches completed in the epoch in progress
        # The generators as the run began: a checkpoint carries them and `--resume` restores them
        # before the cell runs, so what the cell draws ahead of its loop (a data split, a
        # shuffle, np.random in a helper) is drawn as the interrupted run drew it.
        self._start_rng = rng_state() if self.directory is not None else None
        # ids of the optimizers a resume loaded states into (None: not resuming)
        self.loaded_optimizers: set[int] | None = None
        self._loaded: dict[str, set[int]] = {}  # ids of the objects it loaded states into, by kind
        self.made_by_cell: frozenset[str] = frozenset()  # names the resumed cell itself assigns
        self._states: dict[str, Any] | None = None  # the checkpoint's states (`made_anew`)

    # -- out -------------------------------------------------------------------------------------

    def save(
        self,
        position: int,
        epoch: int,
        torch_rng: torch.Tensor | None = None,
        rng: dict[str, Any] | None = None,
        passes: int | None = None,
        carried: dict[str, Any] | None = None,
        undone: int = 0,
        loop: _Passes | None = None,
        epoch_end: bool = False,
        buffers: StepBuffers | None = None,
    ) -> Path:
        """Hand a checkpoint of the notebook's training objects to the writer (batch boundary).
        `rng`: the generators to record instead of their state now; `torch_rng`: the torch one.
        `passes`: the step loop's passes done (a checkpoint of a loop over a counter); `undone`:
        steps counted that the checkpoint does not hold (the pass in progress, taken back);
        `loop`: the step loop of a checkpoint of passes; `epoch_end`: its epoch is done;
        `buffers`: the models' buffers as the step taken back began."""
        assert self.directory is not None
        if undone and self.taken_back:
            undone -= 1
        steps = self._steps_before + self._steps() - undone
        name = checkpoint_name(steps, epoch, position) if passes is None else f"step-{steps:08d}.pt"
        if not self.writes:
            return self.directory / name
        objects = trainable_objects(self._namespace)
        if self._steps_unheld(objects["optimizers"]):
            self.unheld = True
            return self.directory / name
        rng = rng_state() if rng is None else rng
        if torch_rng is not None:
            rng["torch"] = torch_rng
        # Copied here, on the training thread: the writer thread serialises while training goes
        # on, and state_dict() tensors share storage with the live weights and optimizer states.
        states = {
            kind: {n: snapshot_state(o.state_dict()) for n, o in found.items()}
            for kind, found in objects.items()
        }
        if buffers is not None:
            buffers.put_into(states, objects["models"])
        accumulation = self._accumulation
        if accumulation.mid_window:
            # The gradients summed so far are part of the state (the batches that produced them
            # are not seen again after a resume).
            states["grads"] = {
                name: {
                    key: None if p.grad is None else snapshot_state(p.grad)
                    for key, p in model.named_parameters()
                }
                for name, model in objects["models"].items()
            }
        payload = {
            "format": FORMAT,
            "version": VERSION,
            **states,
            "pending": accumulation.pending if accumulation.active else 0,
            "scaler": self._scaler.state_dict() if self._scaler is not None else None,
            "rng": rng,
            "epoch_rng": self._epoch_rng if position else None,
            "epoch_list": self._held_epoch_list() if position else None,
            "start_rng": self._start_rng,
            "counter_epochs": not self.explicit_epochs,
            "epoch": epoch,
            "position": position,
            "passes": passes,
            "nested": loop is not None and loop.nested,
            # mid-epoch in a nested loop: the generators as the outer loop's pass began
            "outer_pass_rng": loop.outer.rng
            if loop is not None and loop.outer is not None and not epoch_end
            else None,
            "carried": (carried if carried is not None else self._carried_now())
            if passes is not None
            else carried,
            "steps": steps,
            "ranks": ranks(),  # the position counts one rank's batches
        }
        path = self.directory / name
        self._writer.submit(payload, path)
        self.last = path
        return path

    def iterate(self, batches: Iterator[Any], done: int, epoch: int) -> Iterator[Any]:
        """`batches` (an epoch from batch `done` on) with checkpoints: every `--every` steps, at
        the epoch's end, and enough state kept per step (the torch RNG after each fetch) to
        checkpoint an interrupted step."""
        every, steps = self._options.every, self._steps
        self._done, self._epoch = done, epoch
        fetched = False
        self._buffers = buffers = StepBuffers(self._namespace)
        take = buffers.take if buffers else None
        carried, self.batch_carried = self.batch_carried, ()
        namespace = self._namespace
        for batch in batches:
            fetched = True
            self._rng_after_fetch = torch.get_rng_state()
            if take is not None:
                take()
            if carried:  # references only: a value is copied when a checkpoint needs it
                held = self._carried_at_batch = {n: namespace[n] for n in carried if n in namespace}
                self._carried_versions = {
                    n: v._version for n, v in held.items() if isinstance(v, torch.Tensor)
                }
            self.updated = 0
            self.summed = self.taken_back = False
            self._in_body = True
            yield batch
            self._in_body = False
            if self.updated > self._most_updates:
                self._most_updates = self.updated
            self._done += 1
            if every and steps() % every == 0:
                self.save(self._done, epoch, carried=self._carried_now(carried))
        self._done = 0
        self._carried_at_batch = {}
        self._epoch_rng = None
        self.save(0, epoch + 1 if fetched else epoch)  # the epoch is done: the next starts fresh

    def step_passes(
        self,
        iterable: Iterable[Any],
        steps_only: Callable[[], bool],
        *,
        nested: bool = False,
        epoch: Callable[[], int] = lambda: 0,
    ) -> Iterator[Any]:
        """The passes of a loop over a counter, checkpointed while they are steps (`steps_only()`:
        no loop inside a pass iterated batches; once one does, the loops inside checkpoint and
        the passes are epochs): the run's outermost such loop, or (`nested`) one inside it whose
        passes are the steps of the outer one's epochs (`for ep in range(n): train()`, with
        `train()` looping `for i in range(0, T, bptt):`), its checkpoints in `epoch()`. Resuming
        from such a checkpoint, the passes done are skipped and the generators are as the next
        one began; for a nested one, also as the outer loop's pass began (what the epoch draws
        before its steps is drawn again as it was)."""
        loop = _Passes(nested, epoch, self._pass_loops[0] if nested and self._pass_loops else None)
        resume = self._resume
        if resume is not None and resume.get("passes") is not None:
            if bool(resume.get("nested")) == nested:
                self._resume = None
                self.made_anew()
                loop.passes = int(resume["passes"])
                set_rng_state(resume["rng"])
                if not nested:
                    self._restore_carried(resume.get("carried") or {})
                if loop.passes:
                    iterable = (
                        iterable[loop.passes :]
                        if isinstance(iterable, range)
                        else itertools.islice(iterable, loop.passes, None)
                    )
                    self._report(f"resumed after {loop.passes} passes of the training loop")
            elif not nested and resume.get("outer_pass_rng") is not None:
                set_rng_state(resume["outer_pass_rng"])  # the resumed epoch begins as it began
        start = loop.passes
        every, steps = self._options.every, self._steps
        buffers = StepBuffers(self._namespace)
        loop.buffers = buffers if buffers else None
        self._pass_loops.append(loop)
        # (`loop.in_pass` stays set when the pass is left by an exception: `after_error` reads it)
        try:
            for item in iterable:
                step = steps_only()
                loop.rng = rng_state()
                loop.at_epoch = epoch()
                if step:
                    if self.carried and not nested:
                        loop.carried = self._carried_now()
                    self.updated = 0
                    self.summed = self.taken_back = False
                    loop.in_pass = True
                    if loop.buffers is not None:
                        loop.buffers.take()
                yield item
                loop.in_pass = False
                if self.updated > self._most_updates:
                    self._most_updates = self.updated
                if step and steps_only():
                    loop.passes += 1
                    if every and steps() % every == 0:
                        self.save(0, epoch(), passes=loop.passes, loop=loop)
            if steps_only() and loop.passes > start:
                if nested:  # the outer pass's steps are done: its next one starts afresh
                    self.save(0, epoch() + 1, passes=0, loop=loop, epoch_end=True)
                else:
                    self.save(0, 0, passes=loop.passes, loop=loop)
        finally:
            self._pass_loops.remove(loop)
            if loop.in_pass:
                self._interrupted_pass = loop

    def _held_epoch_list(self) -> Any:
        held = _held(self._epoch_list) if self._epoch_list is not None else None
        return None if held is _CANNOT else held

    def _carried_now(self, names: tuple[str, ...] | None = None) -> dict[str, Any]:
        """What the step loop carries (`carried`), or `names`, now, as a checkpoint holds it
        (what it cannot hold is left out: the resumed run names it)."""
        namespace = self._namespace
        listed = self.carried if names is None else names
        return _held_values({n: namespace[n] for n in listed if n in namespace})

    def _carried_as_batch_began(self) -> dict[str, Any]:
        """What the batch loop carries, as the batch in progress arrived; a tensor the batch
        changed in place since is left out."""
        versions = self._carried_versions
        return _held_values(
            {
                n: v
                for n, v in self._carried_at_batch.items()
                if not isinstance(v, torch.Tensor) or v._version == versions.get(n)
            }
        )

    def _restore_carried(self, carried: dict[str, Any]) -> None:
        namespace = self._namespace
        if carried and isinstance(namespace, MutableMapping):
            for name, value in carried.items():
                namespace[name] = _unheld(value)

    def _steps_unheld(self, optimizers: Mapping[str, Any]) -> bool:
        """Whether the run stepped an optimizer that none of the notebook's variables holds (a
        function's local, an agent's attribute): a checkpoint holds the notebook's variables,
        so one written now could not continue the run (the resumed run would refuse at its
        first step, or fail in the cell's own code before it: an agent's replay memory, made
        anew, holding fewer samples than it asks for)."""
        held = {id(o) for o in optimizers.values()}
        return any(n and key not in held for key, n in self._stepped.items())

    def after_error(self, what: str) -> None:
        """On Ctrl-C or an exception: save the last complete step and say how to continue."""
        if self.directory is None:
            return
        if self.unheld or self._steps_unheld(trainable_objects(self._namespace)["optimizers"]):
            self._report(
                f"{what}: no checkpoint written: the run steps an optimizer that is not a "
                "notebook variable (a function it calls makes it as a local variable, or "
                "another object holds it as an attribute), and a checkpoint holds the "
                "notebook's own variables, so --resume could not continue this run; make the "
                "model and optimizer notebook variables to checkpoint it"
            )
            return
        loop = self._interrupted_pass
        if not self._in_body and self._done == 0 and loop is not None:  # in a step loop's pass
            epoch = loop.at_epoch
            if self.updated or self.summed:  # the pass had updated the weights: it counts
                passes = loop.passes + 1
                path = self.save(0, epoch, passes=passes, loop=loop)
            else:  # back to the moment it began
                passes = loop.passes
                path = self.save(
                    0,
                    epoch,
                    rng=loop.rng,
                    passes=passes,
                    carried=loop.carried,
                    undone=1,
                    loop=loop,
                    buffers=loop.buffers,
                )
            self._report(
                f"{what} after {passes} passes of the training loop: checkpoint {path}; "
                "continue with %%train --resume" + self._partial()
            )
            self._writer.wait()
            return
        if not self._in_body and self._done == 0:  # outside a batch loop
            if self.last is None:  # `while` loops, loops over a counter inside others
                self._report(
                    f"{what}: no checkpoint written (--checkpoint saves inside batch loops, at "
                    "their end, and in the passes of a `for` loop over a counter that steps; "
                    "this run's training loop is none of these), so --resume has nothing to "
                    "continue"
                )
            return  # else the epoch-end checkpoint is the latest state
        done, epoch = self._done, self._epoch
        names = tuple(self._carried_at_batch)
        if self._in_body and (self.updated or self.summed):  # it had updated them: it counts
            done += 1
            path = self.save(done, epoch, carried=self._carried_now(names))
        elif self._in_body and done == 0 and self._epoch_rng is not None:
            # The epoch's first batch had not: a resume starts this epoch afresh, and its
            # iter() draws the order again, so the generators go back to before that draw (not
            # to after the first fetch, which would draw another order)
            path = self.save(0, epoch, rng=self._epoch_rng, undone=1, buffers=self._buffers)
        elif self._in_body:  # it had not: back to the moment its batch arrived
            path = self.save(
                done,
                epoch,
                torch_rng=self._rng_after_fetch,
                undone=1,
                buffers=self._buffers,
                carried=self._carried_as_batch_began(),
            )
        else:
            path = self.save(done, epoch, carried=self._carried_now(names))
        self._report(
            f"{what} in epoch {epoch + 1} after {done} batches: checkpoint {path}; "
            "continue with %%train --resume" + (self._partial() if self._in_body else "")
        )
        self._writer.wait()

    def takes_back(self) -> bool:
        """Whether the step left now (by a Ctrl-C, an exception, or a `break`) is not one the
        checkpoints count: under --checkpoint, a step that had made no optimizer step and summed
        no gradients (a Ctrl-C between backward() and step(): the checkpoint of the interruption
        takes it back and --resume redoes it, so the interrupted run's summary does not count
        it either)."""
        return self.directory is not None and not (self.updated or self.summed)

    def _partial(self) -> str:
        """What the report adds when the step in progress had made some of its optimizer steps
        but fewer than a step has made before (a GAN's discriminator stepped, its generator not
        yet): the checkpoint counts the step as done, so the steps it had still to make are not
        made after --resume."""
        made, most = self.updated, self._most_updates
        if 0 < made < most:
            return (
                f" (that step had made {made} of the up to {most} optimizer steps a step has "
                "made: any it had still to make are not made after --resume, and the results "
                "can differ from a run never interrupted)"
            )
        return ""

    def wait(self) -> None:
        """Return when every checkpoint handed over is on disk (raises for a failed write)."""
        self._writer.wait()

    # -- in --------------------------------------------------------------------------------------

    def load(self, payload: dict[str, Any]) -> None:
        """Load a checkpoint's states into the notebook's objects (before the cell runs)."""
        written = payload.get("ranks")
        if payload.get("position") and written is not None and int(written) != ranks():
            raise TrainmateError(
                f"--resume: the checkpoint was written mid-epoch by a run of {written} rank(s) "
                f"and its position counts one rank's batches; this run has {ranks()} (resume "
                f"with --procs {written}, or from a checkpoint written at an epoch's end)"
            )
        objects = trainable_objects(self._namespace)
        for kind in KINDS:
            for name, state in payload[kind].items():
                target = objects[kind].get(name)
                if target is not None:
                    _load_state(name, target, state)
                elif name not in self.made_by_cell:  # else the cell makes it (`made_anew`)
                    raise TrainmateError(
                        f"--resume: the checkpoint has {kind[:-1]} {name!r}, the notebook has none"
                    )
        self._loaded = {
            kind: {id(objects[kind][name]) for name in payload[kind] if name in objects[kind]}
            for kind in KINDS
        }
        self._states = {kind: payload[kind] for kind in KINDS}
        self._states["grads"] = payload.get("grads") or {}
        if payload.get("scaler") is not None and self._scaler is not None:
            self._scaler.load_state_dict(payload["scaler"])
        if not payload.get("grads"):
            # At a batch boundary outside an accumulation window no gradient is carried into the
            # next step. Those in `.grad` now are the interrupted run's (a Ctrl-C between
            # backward() and step() leaves its batch's): a loop that zeroes after stepping
            # (`opt.step(); opt.zero_grad()`) would add the redone batch's gradients to them.
            # None, as after zero_grad() and as in a fresh kernel.
            for model in objects["models"].values():
                for p in model.parameters():
                    p.grad = None
            for optimizer in objects["optimizers"].values():
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        p.grad = None
        for name, grads in (payload.get("grads") or {}).items():
            if name in objects["models"]:
                _load_grads(objects["models"][name], grads)
        if payload.get("pending") and self._accumulation.active:
            self._accumulation.pending = int(payload["pending"])
        # none when the run's optimizer was not a notebook variable (made inside the function
        # the cell calls): its state is not in the checkpoint, and a step of it is refused too
        self.loaded_optimizers = set(self._loaded["optimizers"])
        if payload.get("start_rng") is not None:
            set_rng_state(payload["start_rng"])
            self._start_rng = payload["start_rng"]
        self._steps_before = int(payload.get("steps") or 0)
        self._epochs_to_skip = int(payload["epoch"])
        self._counter_epochs = bool(payload.get("counter_epochs"))
        self._resume = dict(payload)
        self._apply_settings(objects["optimizers"])

    def made_anew(self) -> list[str]:
        """Where the resumed run picks up (its epoch's batch loop, the pass loop's start) or,
        failing that, at its first optimizer step, once: the models, optimizers and schedulers
        the training cell made itself (`model = Net(); opt = Adam(model.parameters())`,
        `scheduler = OneCycleLR(opt, ...)` before its loop), after the checkpoint went into the
        old ones or found none (a kernel restarted), get the checkpoint's states; the optimizer
        settings a new scheduler resets (the learning rate at its start) are put back as the
        checkpoint has them (nothing has stepped since), `--set` on top. Only names the cell's
        own statements assign count (`made_by_cell`: not a loop's target, which names an object
        made elsewhere); one the cell set to something else (`best_model = None`) is left, one
        it never made is an error. Returns their names."""
        states, self._states = self._states, None  # once
        if states is None:
            return []
        objects = trainable_objects(self._namespace)
        made = []
        for kind in KINDS:
            for name, state in states[kind].items():
                if name not in self.made_by_cell:
                    continue
                target = objects[kind].get(name)
                if target is None:
                    if name in self._namespace:
                        continue  # the cell set it to something else (`best_model = None`)
                    raise TrainmateError(
                        f"--resume: the checkpoint has {kind[:-1]} {name!r}, the notebook has none"
                    )
                if id(target) in self._loaded[kind]:
                    continue
                _load_state(name, target, state)
                self._loaded[kind].add(id(target))
                made.append(name)
                if kind == "models" and name in states["grads"]:
                    _load_grads(target, states["grads"][name])
                elif kind == "optimizers" and self.loaded_optimizers is not None:
                    self.loaded_optimizers.add(id(target))
                elif kind == "schedulers":
                    self._settings_back(target, states["optimizers"], objects["optimizers"])
        if made:
            self._apply_settings(objects["optimizers"])
            self._report(
                f"--resume: {', '.join(made)} made by the cell: the checkpoint's state loaded "
                "into it"
            )
        return made

    @staticmethod
    def _settings_back(
        scheduler: Any, saved: dict[str, Any], optimizers: dict[str, torch.optim.Optimizer]
    ) -> None:
        """The settings of a new scheduler's optimizer as the checkpoint has them."""
        optimizer = getattr(scheduler, "optimizer", None)
        groups = getattr(optimizer, "param_groups", ())
        for name, state in saved.items():
            if optimizer is not None and optimizers.get(name) is optimizer:
                for group, kept in zip(groups, state["param_groups"], strict=False):
                    group.update({k: copy.deepcopy(v) for k, v in kept.items() if k != "params"})

    def _apply_settings(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        """`--set lr=3e-4`: write the values into every param group that has that setting."""
        for item in self._options.set:
            name, _, text = item.partition("=")
            value = float(text)
            groups = [g for opt in optimizers.values() for g in opt.param_groups if name in g]
            if not groups:
                raise TrainmateError(f"--set {item}: no optimizer has a setting {name!r}")
            for group in groups:
                group[name] = value
                if name == "lr" and "initial_lr" in group:
                    group["initial_lr"] = value  # schedulers scale from here
            self._report(f"--set {name}={value:g} on {len(groups)} parameter group(s)")

    def take_counter_epochs_done(self) -> int:
        """Like `take_epochs_done`, for the outermost counter loop of a run whose checkpoint
        counted its passes as the epochs (0 when an explicit epoch loop counted them)."""
        if not self._counter_epochs:
            return 0
        self._counter_epochs = False
        return self.take_epochs_done()

    def take_epochs_done(self) -> int:
        """Epochs the resumed run had finished (the epoch loop skips them), once; else 0."""
        if self._resume is None:
            return 0
        done, self._epochs_to_skip = self._epochs_to_skip, 0
        return done

    def pending_position(self) -> int:
        """The batches done in the epoch the next batch loop resumes (0: none to skip)."""
        resume = self._resume
        return int(resume.get("position") or 0) if resume is not None else 0

    @property
    def resuming(self) -> bool:
        """Whether the next batch loop continues the checkpoint's epoch."""
        return self._resume is not None

    def epoch_starting(self, iterable: Iterable[Any] = ()) -> None:
        """A fresh epoch: keep the RNG before its order is drawn (a resume draws it again), and
        the order of a list the batch loop iterates as it is now (`random.shuffle(sentences)`
        before the loop reorders the notebook's own list each epoch: a resume puts it back)."""
        if self.directory is not None:
            self._epoch_rng = rng_state()
            self._epoch_list = list(iterable) if type(iterable) is list else None

    def resumed_epoch(self, iterable: Iterable[Any]) -> tuple[Iterable[Any], int]:
        """The checkpoint's epoch, from the batch after the last complete one, and that position."""
        resume = self._resume
        assert resume is not None
        self._resume = None
        self.made_anew()
        position = int(resume["position"])
        if position == 0:
            set_rng_state(resume["rng"])
            self._epoch_rng = rng_state()
            return iterable, 0
        set_rng_state(resume["epoch_rng"])  # the epoch's order, drawn again as it was
        self._epoch_rng = resume["epoch_rng"]
        if resume.get("epoch_list") is not None and type(iterable) is list:
            # the list in the order the interrupted epoch iterated it (the cell reordered it in
            # place before the loop, from an order this run never had)
            iterable[:] = _unheld(resume["epoch_list"])
        self._epoch_list = list(iterable) if type(iterable) is list else None
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
        self._report(f"resumed after {position} batches of the epoch in progress")
        carried = resume.get("carried") or {}
        self._restore_carried(carried)  # what the next batch reads, as it was (`h`, sums)
        lost = [n for n in self.batch_carried if n not in carried]
        if lost:
            self._report(
                f"--resume: carried from batch to batch, not in the checkpoint (changed in "
                f"place, or not tensors, arrays or numbers): {', '.join(lost)}; they start over "
                f"here, not as after batch {position}, so the rest of this epoch can differ from "
                "a run never interrupted"
            )
        return source, position


class _Passes:
    """A loop over a counter whose passes `Checkpoints.step_passes` checkpoints."""

    __slots__ = (
        "at_epoch", "buffers", "carried", "epoch", "in_pass", "nested", "outer", "passes", "rng",
    )  # fmt: skip

    def __init__(self, nested: bool, epoch: Callable[[], int], outer: _Passes | None) -> None:
        self.nested = nested
        self.outer = outer  # the loop whose epochs a nested one's passes are the steps of
        self.epoch = epoch  # the epoch its checkpoints are in (0 for the outermost loop)
        self.passes = 0  # passes done that were steps
        self.in_pass = False  # a pass that is a step is in progress
        self.rng: dict[str, Any] | None = None  # the generators as the current pass began
        self.carried: dict[str, Any] | None = None  # the carried variables then
        self.at_epoch = 0  # `epoch()` then (an interrupted epoch counts as seen once it closes)
        self.buffers: StepBuffers | None = None  # the models' small buffers then


_CANNOT = object()
_SCALARS = (bool, int, float, str, type(None))


def _held_values(values: dict[str, Any]) -> dict[str, Any]:
    """`values` as a checkpoint holds them (`_held`), without those it cannot hold."""
    found = {}
    for name, value in values.items():
        held = _held(value)
        if held is not _CANNOT:
            found[name] = held
    return found


def _held(value: Any) -> Any:
    """`value` as a checkpoint loaded with `weights_only=True` can hold it: tensors (copied to
    the CPU, with their device), NumPy arrays (as tensors), numbers, strings, None, and tuples
    and lists of those (an LSTM's `(h, c)`); `_CANNOT` for anything else."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, torch.Tensor):
        return {"tensor": snapshot_state(value), "device": str(value.device)}
    if type(value).__module__ == "numpy" and hasattr(value, "__array__"):
        import numpy as np  # loaded: the value is one of its objects

        try:  # an array, or a scalar (`np.float32`: kept as a 0-d array, then taken out again)
            array = torch.from_numpy(np.array(value, copy=True))
        except (TypeError, ValueError):
            return _CANNOT
        return {"ndarray": array, "scalar": not isinstance(value, np.ndarray)}
    if isinstance(value, tuple | list):
        items = [_held(v) for v in value]
        if any(v is _CANNOT for v in items):
            return _CANNOT
        return {"sequence": items, "tuple": isinstance(value, tuple)}
    return _CANNOT


def _unheld(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "tensor" in value:
        return value["tensor"].to(value["device"])
    if "ndarray" in value:
        array = value["ndarray"].numpy()
        return array[()] if value["scalar"] else array
    items = [_unheld(v) for v in value["sequence"]]
    return tuple(items) if value["tuple"] else items


def ranks() -> int:
    """The ranks of the process group this process is in (1: none)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _load_state(name: str, target: Any, state: Any) -> None:
    try:
        target.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0][:160]
        raise TrainmateError(f"--resume: {name} does not match the checkpoint: {first}") from None


def _load_grads(model: torch.nn.Module, grads: dict[str, Any]) -> None:
    """A checkpoint's gradients (written inside an accumulation window) into `model`."""
    params = dict(model.named_parameters())
    for key, grad in grads.items():
        if key in params:
            p = params[key]
            p.grad = None if grad is None else grad.to(p.device, p.dtype)
