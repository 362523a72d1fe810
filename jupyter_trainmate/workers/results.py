"""
What a cell run in another process sends back, and how it lands in the notebook.

In the process that ran the cell: `Before.take(namespace)` before the cell, then
`collect(namespace, before)` after it: the `state_dict()` of every model, optimizer and scheduler
(DDP unwrapped) and the variables the cell assigned or whose contents it changed, as bytes
(`payload.dumps`: GPU tensors as CPU copies; values that cannot be pickled are left out).
In the notebook: `apply(data, namespace)` loads the states into the notebook's own objects and
rebinds the variables (a list, dict or set that was there is filled in place).
"""

from __future__ import annotations

import pickle
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

from ..runtime.checkpoint import trainable_objects
from .payload import dumps

Skip = Callable[[str, object], bool]


def _contents(value: object) -> bytes | None:
    """The pickled contents of a list, dict or set (to tell whether the cell changed it)."""
    if isinstance(value, list | dict | set):
        try:
            return pickle.dumps(value)
        except Exception:
            return None
    return None


class Before:
    """The namespace's bindings (and containers' contents) before the cell."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self._seen = {n: (v, _contents(v)) for n, v in namespace.items()}

    def changed(self, namespace: dict[str, Any]) -> dict[str, Any]:
        """The variables the cell assigned (new or rebound) or whose contents it changed."""
        found = {}
        for name, value in namespace.items():
            if name.startswith("__") or isinstance(value, types.ModuleType):
                continue
            old = self._seen.get(name)
            rebound = old is None or old[0] is not value
            if rebound or (old is not None and old[1] is not None and _contents(value) != old[1]):
                found[name] = value
        return found


def collect(namespace: dict[str, Any], before: Before, skip: Skip | None = None) -> bytes:
    """The trained states and the changed variables (`skip(name, value)`: leave one out)."""
    objects = trainable_objects(namespace)
    states = {
        kind: {name: obj.state_dict() for name, obj in found.items()}
        for kind, found in objects.items()
    }
    trained = {name for found in objects.values() for name in found}
    sendable = {}
    for name, value in before.changed(namespace).items():
        if name in trained or (skip is not None and skip(name, value)):
            continue  # a model's state comes back into the notebook's object
        try:
            dumps(value)
        except Exception:
            continue
        sendable[name] = value
    return dumps({"states": states, "assigned": sendable})


def apply(data: bytes, namespace: dict[str, Any]) -> None:
    """Load `collect`'s states into the notebook's objects and rebind the variables."""
    result = cloudpickle.loads(data)
    objects = trainable_objects(namespace)
    for kind, states in result["states"].items():
        for name, state in states.items():
            target = objects[kind].get(name)
            if target is not None:
                target.load_state_dict(state)
    for name, value in result["assigned"].items():
        old = namespace.get(name)
        if isinstance(old, list) and isinstance(value, list):
            old[:] = value  # filled in place: other references to the list see it too
        elif isinstance(old, dict | set) and type(value) is type(old):
            old.clear()
            old.update(value)
        else:
            namespace[name] = value
