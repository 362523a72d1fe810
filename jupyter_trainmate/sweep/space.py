"""
`--space "lr=1e-5..1e-2:log weight_decay=0..0.1 momentum=[0.8,0.9]"`: a search over the settings
of the optimizers the notebook already built, with no `suggest()` calls.

Before the first trial, `Snapshot.take` copies the state of every model, optimizer and scheduler
of the notebook (deep copies of their `state_dict()`s) and the random generators; before each
trial, `restore` loads them back, so each trial starts bit-identical to the first, and `write`
puts the trial's values into every param group that has the setting.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import TrainmateError
from .suggest import Choice, Param


def _number(text: str, item: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise TrainmateError(f'--space "{item}": {text!r} is not a number') from None


def _choice(text: str) -> Choice:
    text = text.strip()
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"True": True, "False": False, "None": None}.get(text, text.strip("'\""))


def parse_space(text: str) -> list[Param]:
    """`NAME=LOW..HIGH[:log][:step=X]` or `NAME=[A,B,...]`, separated by spaces."""
    params: dict[str, Param] = {}
    items = text.split()
    if not items:
        raise TrainmateError(
            '--space "": give NAME=LOW..HIGH[:log] or NAME=[A,B], e.g. lr=1e-5..1e-2:log'
        )
    for item in items:
        name, eq, rest = item.partition("=")
        if not eq or not name.isidentifier() or not rest:
            raise TrainmateError(
                f'--space "{item}": write NAME=LOW..HIGH[:log][:step=X] or NAME=[A,B,...]'
            )
        if name in params:
            raise TrainmateError(f'--space "{item}": {name} is given twice')
        if rest.startswith("["):
            if not rest.endswith("]"):
                raise TrainmateError(f'--space "{item}": a list of choices ends with "]"')
            choices = [_choice(c) for c in rest[1:-1].split(",") if c.strip()]
            params[name] = _param(item, name, choices)
            continue
        bounds, *flags = rest.split(":")
        low_text, dots, high_text = bounds.partition("..")
        if not dots or not low_text or not high_text:
            raise TrainmateError(
                f'--space "{item}": write NAME=LOW..HIGH[:log][:step=X] or NAME=[A,B,...]'
            )
        low, high = _number(low_text, item), _number(high_text, item)
        log, step = False, None
        for flag in flags:
            if flag == "log":
                log = True
            elif flag.startswith("step="):
                step = _number(flag.removeprefix("step="), item)
            else:
                raise TrainmateError(f'--space "{item}": unknown flag {flag!r} (log, step=X)')
        params[name] = _param(item, name, low, high, log=log, step=step)
    return list(params.values())


def _param(item: str, name: str, low: object, high: object = None, **flags: Any) -> Param:
    """`Param.of`, its error worded for `--space`."""
    try:
        return Param.of(name, low, high, **flags)
    except TrainmateError as exc:
        reason = str(exc).partition("): ")[2] or str(exc)
        raise TrainmateError(f'--space "{item}": {reason}') from None


def check_settings(params: list[Param], namespace: Mapping[str, object]) -> None:
    """Every setting of the space exists in some param group of the notebook's optimizers, or
    is a number variable of the notebook. A notebook with no optimizer yet (the cell builds
    it) is checked when its trial runs (see `Deferred`)."""
    from ..runtime.checkpoint import trainable_objects

    optimizers = trainable_objects(namespace)["optimizers"]
    if not optimizers:
        return
    keys = {k for opt in optimizers.values() for g in opt.param_groups for k in g if k != "params"}
    for param in params:
        if param.name not in keys and not _is_number(namespace.get(param.name)):
            raise TrainmateError(
                f"--space {param.name}: no optimizer setting of that name "
                f"({', '.join(sorted(optimizers))} have {', '.join(sorted(keys))})"
            )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Deferred:
    """The trial's settings, written while it runs into each optimizer it steps, at that
    optimizer's first step (a global step pre-hook: the settings are read at step time, so for
    an optimizer the cell builds this is the same as building it with these values). Leaving the
    `with` after a trial that ran, a setting that no stepped optimizer received and that set no
    variable (`applied`) is an error naming it."""

    def __init__(
        self, values: Mapping[str, Any], namespace: Mapping[str, object], applied: set[str]
    ) -> None:
        self.values = dict(values)
        self.namespace = namespace
        self.applied = set(applied)
        self._seen: set[int] = set()
        self._handle: Any = None

    def __enter__(self) -> Deferred:
        if self.values:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self._handle = register_optimizer_step_pre_hook(self._first_step)
        return self

    def _first_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if id(optimizer) in self._seen:
            return
        self._seen.add(id(optimizer))
        self.applied |= _write_groups([optimizer], self.values)
        if "lr" in self.values:
            from ..runtime.checkpoint import trainable_objects

            schedulers = trainable_objects(self.namespace)["schedulers"].values()
            _follow_lr([s for s in schedulers if s.optimizer is optimizer])

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if self._handle is not None:
            self._handle.remove()
        missing = sorted(set(self.values) - self.applied)
        if error is None and missing:
            if not self._seen:  # captum's house prices: trial 2 loads the model trial 1 saved
                raise TrainmateError(
                    f"--space {', '.join(missing)}: no optimizer the cell stepped: this trial "
                    "stepped none (tensors updated by hand, or a saved model loaded instead of "
                    "trained), and the notebook has no number variable of that name"
                )
            raise TrainmateError(
                f"--space {', '.join(missing)}: no optimizer the cell stepped has that setting, "
                "and the notebook has no number variable of that name"
            )


def _write_groups(optimizers: Any, values: Mapping[str, Any]) -> set[str]:
    """The values into every param group that has them; the names written. A new `lr` keeps
    the group's factor to its scheduler's base rate (`initial_lr`)."""
    written: set[str] = set()
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for name, value in values.items():
                if name not in group:
                    continue
                written.add(name)
                if name == "lr" and group.get("initial_lr"):
                    factor = group["lr"] / group["initial_lr"]
                    group["initial_lr"] = value
                    group["lr"] = value * factor
                else:
                    group[name] = value
    return written


def _follow_lr(schedulers: Any) -> None:
    """A scheduler's base rates follow its groups' new `initial_lr`."""
    for scheduler in schedulers:
        groups = scheduler.optimizer.param_groups
        if all("initial_lr" in g for g in groups):
            scheduler.base_lrs = [g["initial_lr"] for g in groups]


def _copied_in(target: object, state: Mapping[str, Any]) -> bool:
    """Whether `target.load_state_dict` copies every value of `state` into `target` (see
    `restore`): torch's own loading path all the way down (no `load_state_dict` or
    `_load_from_state_dict` outside torch, no load hooks: those may keep or change what they
    are given), with no extra state among the values. When unsure, `restore` copies."""
    import torch

    module = torch.nn.Module
    if not isinstance(target, module) or type(target).load_state_dict is not module.load_state_dict:
        return False
    if any(key.endswith("_extra_state") for key in state):
        return False
    return all(
        # torch's own (BatchNorm's adds a counter to the dict, then calls Module's)
        type(sub)._load_from_state_dict.__module__.startswith("torch.")
        and not sub._load_state_dict_pre_hooks
        and not sub._load_state_dict_post_hooks
        for sub in target.modules()
    )


@dataclass
class Snapshot:
    """The notebook's training objects and random generators before the first trial."""

    states: dict[str, dict[str, Any]]
    rng: dict[str, Any]

    @classmethod
    def take(cls, namespace: Mapping[str, object]) -> Snapshot:
        from ..runtime.checkpoint import rng_state, trainable_objects

        objects = trainable_objects(namespace)
        states = {
            kind: {name: copy.deepcopy(obj.state_dict()) for name, obj in found.items()}
            for kind, found in objects.items()
        }
        return cls(states, copy.deepcopy(rng_state()))

    def restore(self, namespace: Mapping[str, object]) -> None:
        """Load the states back (objects by the same name; a name rebound since is refused).

        A model's state is loaded as it is: `Module.load_state_dict` copies each tensor into the
        model's own parameters and buffers and keeps none of the snapshot's (a copy first cost a
        second copy of the model each trial). An optimizer's and a scheduler's are copied: an
        optimizer keeps the given tensors as its state (momentum buffers, Adam's step), which
        the trial then changes in place; so is a model's with an extra state (an object its
        `set_extra_state` may keep) or a `load_state_dict` of its own."""
        from ..runtime.checkpoint import set_rng_state, trainable_objects

        objects = trainable_objects(namespace)
        for kind, states in self.states.items():
            for name, state in states.items():
                target = objects[kind].get(name)
                if target is None:
                    raise TrainmateError(
                        f"--space: {name} is no longer in the notebook; the snapshot cannot be restored"
                    )
                target.load_state_dict(state if _copied_in(target, state) else copy.deepcopy(state))
        set_rng_state(copy.deepcopy(self.rng))

    def write(self, values: Mapping[str, Any], namespace: Mapping[str, object]) -> Deferred:
        """The trial's settings into every param group of the notebook's optimizers that has
        them (a scheduler's base rate follows a new `lr`, and the group's rate keeps the
        scheduler's factor at its start) and into the notebook's number variables of their
        names (`lr = 0.03` that the cell reads); run the trial inside the returned `Deferred`,
        which writes them into the optimizers the cell builds too."""
        from ..runtime.checkpoint import trainable_objects

        objects = trainable_objects(namespace)
        if "lr" in _write_groups(objects["optimizers"].values(), values):
            _follow_lr(objects["schedulers"].values())
        variables = set()
        for name, value in values.items():
            if _is_number(namespace.get(name)) and isinstance(namespace, dict):
                namespace[name] = value
                variables.add(name)
        return Deferred(values, namespace, variables)
