"""
The models' small buffers as a step began, for a checkpoint of an interrupted step.

A forward pass in training mode changes some buffers: BatchNorm's running mean, variance and
batch count, spectral norm's power-iteration vectors. A Ctrl-C between a batch's forward and its
optimizer step leaves them changed by a step whose update never happened; the checkpoint, which
takes that step back (the batch is trained again after `--resume`), must hold them as the step
began, or the resumed run counts the batch in them twice. So while a run writes checkpoints, the
buffers are copied as each step begins (one `torch._foreach_copy_` into copies made once per
epoch). Large buffers (over `LARGEST` elements: attention masks, positional tables) are left
out; they are constants in the models seen, and copying them each step would cost more than the
step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.nn.parameter import UninitializedBuffer

from .checkpoint import snapshot_state, trainable_objects

LARGEST = 1 << 16  # elements: a 256 KB float32 buffer at most


class StepBuffers:
    """The small buffers of the notebook's models (found when made, once per epoch) and their
    values as the last step began (`take`). A buffer is read from its module at each `take`: a
    forward that assigns a new tensor to it (an EMA codebook) is followed."""

    __slots__ = ("_copies", "_keys", "_models", "_owners")

    def __init__(self, namespace: Mapping[str, object]) -> None:
        keys: list[tuple[str, str]] = []  # (model name, state_dict key)
        owners: list[tuple[dict[str, torch.Tensor | None], str]] = []  # (module._buffers, name)
        copies: list[torch.Tensor] = []
        self._models = trainable_objects(namespace)["models"]
        for model_name, model in self._models.items():
            for prefix, module in model.named_modules():
                for name, buffer in module.named_buffers(recurse=False):
                    if (
                        buffer is None
                        or isinstance(buffer, UninitializedBuffer)  # a lazy module's
                        or buffer.numel() > LARGEST
                        or name in module._non_persistent_buffers_set
                    ):
                        continue
                    keys.append((model_name, f"{prefix}.{name}" if prefix else name))
                    owners.append((module._buffers, name))
                    copies.append(buffer.detach().clone())
        self._keys = keys
        self._owners = owners
        self._copies: list[torch.Tensor | None] = list(copies)

    def __bool__(self) -> bool:
        return bool(self._keys)

    def take(self) -> None:
        """Copy the buffers as they are now (a step begins)."""
        owners = self._owners
        if not owners:
            return
        now = [buffers.get(name) for buffers, name in owners]
        with torch.no_grad():
            try:
                torch._foreach_copy_(self._copies, now)  # type: ignore[arg-type]
            except (RuntimeError, TypeError):  # replaced by one of another shape, or removed
                self._copies = [None if b is None else b.detach().clone() for b in now]

    def put_into(self, states: dict[str, Any], models: Mapping[str, object]) -> None:
        """Replace, in a checkpoint's model states, each buffer by its value as the step began.
        `models`: the models the states are of, by name; a name that now holds another model
        (`for net, opt in zip(nets, opts)` moves `net` along) keeps its model's buffers as they
        are."""
        found = states.get("models", {})
        for (model_name, key), copy in zip(self._keys, self._copies, strict=True):
            state = found.get(model_name)
            if (
                state is not None
                and key in state
                and copy is not None
                and models.get(model_name) is self._models.get(model_name)
            ):
                state[key] = snapshot_state(copy)
