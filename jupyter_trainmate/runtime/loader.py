"""What the runtime knows of a DataLoader: the settings that decide how fast batches come."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoaderInfo:
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    batch_size: int | None


def loader_info(iterable: object) -> LoaderInfo | None:
    """The settings of a DataLoader (None for any other iterable)."""
    if not isinstance(iterable, torch.utils.data.DataLoader):
        return None
    return LoaderInfo(
        num_workers=iterable.num_workers,
        pin_memory=bool(iterable.pin_memory),
        persistent_workers=bool(iterable.persistent_workers),
        prefetch_factor=iterable.prefetch_factor,
        batch_size=iterable.batch_size,
    )
