"""
Move a batch to a device, whatever its shape.

Batches come as tensors, tuples, lists, dicts, namedtuples, dataclasses or objects with a `.to()`
(Hugging Face's `BatchEncoding`). Each tensor is moved once: a tensor already on the target device
is returned as is, so a collate function that already returns device tensors costs nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import numpy as np
import torch

T = TypeVar("T")


def map_tensors(batch: T, fn: Callable[[torch.Tensor], torch.Tensor]) -> T:
    """Apply `fn` to every tensor in a nested batch, rebuilding containers of the same type."""
    result: Any
    if isinstance(batch, torch.Tensor):
        result = fn(batch)
    elif isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        result = type(batch)(*(map_tensors(item, fn) for item in batch))
    elif isinstance(batch, list | tuple):
        result = type(batch)(map_tensors(item, fn) for item in batch)
    elif isinstance(batch, Mapping):
        items = {key: map_tensors(value, fn) for key, value in batch.items()}
        rebuild: Any = type(batch)
        try:
            result = rebuild(items)  # dict, OrderedDict, BatchEncoding-like mappings
        except TypeError:
            result = items
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {
            f.name: map_tensors(getattr(batch, f.name), fn)
            for f in dataclasses.fields(batch)
            if f.init
        }
        result = dataclasses.replace(batch, **changes)
    else:
        result = batch
    return result  # type: ignore[no-any-return]


def iter_tensors(batch: object) -> list[torch.Tensor]:
    """Every tensor in a nested batch, in order."""
    found: list[torch.Tensor] = []

    def collect(t: torch.Tensor) -> torch.Tensor:
        found.append(t)
        return t

    map_tensors(batch, collect)
    return found


def to_device(batch: T, device: torch.device, non_blocking: bool = False) -> T:
    """Move every tensor of `batch` to `device`; tensors already there are left alone."""

    def move(t: torch.Tensor) -> torch.Tensor:
        if t.device == device:
            return t
        return t.to(device, non_blocking=non_blocking)

    return map_tensors(batch, move)


def batch_size(batch: object) -> int:
    """Samples in a batch: the leading dimension of its first tensor (0 when it has none).

    Searched directly, not through `map_tensors`: it runs on every step and must not rebuild
    the batch's containers.
    """
    if type(batch) is tuple or type(batch) is list:  # the common (inputs, targets) case, fast
        first = batch[0] if batch else None
        if type(first) is torch.Tensor and first.dim():
            return int(first.shape[0])
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 0
    if isinstance(batch, list | tuple):
        items: Iterable[object] = batch
    elif isinstance(batch, Mapping):
        items = batch.values()
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        items = (getattr(batch, f.name) for f in dataclasses.fields(batch))
    else:
        return 0
    for item in items:
        size = batch_size(item)
        if size:
            return size
    return 0


def leading_size(batch: object, nested: bool = False) -> int:
    """The leading dimension of a batch's first tensor or numpy array (0 when it has none).

    A batch of records is counted by its records: a list of `(source, target)` pairs or of
    token lists (more items than its first has: `[(x, y)] * 16`, not the fields `[xs, ys]` of
    16 each), and a list of tensors inside a batch (`(facts, masks, ...)`, a tensor per sample),
    where the first tensor's leading dimension is one sample's length."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 0
    if isinstance(batch, np.ndarray):
        return int(batch.shape[0]) if batch.ndim else 0
    if isinstance(batch, list | tuple):
        first = batch[0] if batch else None
        if isinstance(first, list | tuple) and len(batch) >= len(first) > 0:
            return len(batch)
        if nested and type(batch) is list and isinstance(first, torch.Tensor | np.ndarray):
            return len(batch)
        items: Iterable[object] = batch
    elif isinstance(batch, Mapping):
        items = batch.values()
    else:
        return batch_size(batch)  # a dataclass of tensors, or nothing sized
    for item in items:
        size = leading_size(item, True)
        if size:
            return size
    return 0


class SampleCounter:
    """Samples in each batch of one pass over `iterable`.

    A DataLoader that batches by itself (`batch_size` set, a sampler with a length) gives exact
    counts: `batch_size` per batch, the remainder in the last one unless `drop_last`. Anything
    else is counted by `leading_size`, and `exact` is False.
    """

    def __init__(self, iterable: object, start: int = 0) -> None:
        self.exact = False
        self._size = 0
        self._left = 0
        if isinstance(iterable, torch.utils.data.DataLoader) and iterable.batch_size:
            try:
                total = len(iterable.sampler)  # type: ignore[arg-type]
            except TypeError:  # an iterable-style dataset: no length
                return
            size = int(iterable.batch_size)
            if iterable.drop_last:
                total -= total % size
            self.exact = True
            self._size = size
            self._left = max(0, total - start * size)

    def __call__(self, batch: object) -> int:
        if not self.exact:
            return leading_size(batch)
        count = min(self._size, self._left)
        self._left -= count
        return count
