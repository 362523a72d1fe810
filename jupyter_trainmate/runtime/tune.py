"""
`%%train --tune-loader N`: try a few DataLoader settings on the run's own first epoch, N batches
each, measure how long each waits for a batch, report the speed-up of each, and use the fastest
for the rest of the run.

Correctness: the first epoch's batch order is drawn once from the loader's own batch sampler
(after the same base-seed draw `iter(DataLoader)` makes) and the candidates serve consecutive
slices of it, so every batch is the one the plain loop would have trained on, in the same order;
the candidates draw their own seeds from a private generator, and later epochs use a loader on
the same dataset, batch sampler, collate function and generator. What may differ: the per-worker
seeds of random augmentations in worker processes, as with any num_workers change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset


@dataclass(frozen=True)
class Candidate:
    num_workers: int
    pin_memory: bool

    def __str__(self) -> str:
        return f"num_workers={self.num_workers}" + (", pin_memory" if self.pin_memory else "")


def tunable(loader: DataLoader[Any]) -> str | None:
    """Why this loader cannot be tuned (None when it can)."""
    if isinstance(loader.dataset, IterableDataset):
        return "an IterableDataset has no batch order to split"
    if loader.batch_sampler is None:
        return "batch_size=None (no automatic batching)"
    return None


def candidates(loader: DataLoader[Any], cpus: int, cuda: bool) -> list[Candidate]:
    pin = bool(loader.pin_memory) or cuda
    counts = sorted({loader.num_workers, 0, min(2, cpus), min(4, cpus), max(0, cpus - 1)})
    current = Candidate(loader.num_workers, bool(loader.pin_memory))
    found = [current] + [Candidate(n, pin) for n in counts if Candidate(n, pin) != current]
    return found


def loader_like(
    loader: DataLoader[Any],
    batch_sampler: Any,
    candidate: Candidate,
    persistent: bool,
    generator: torch.Generator | None,
) -> DataLoader[Any]:
    """A DataLoader on the same data, batches and collate function, with other worker settings."""
    workers = candidate.num_workers
    return DataLoader(
        loader.dataset,
        batch_sampler=batch_sampler,
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=candidate.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        generator=generator,
        prefetch_factor=loader.prefetch_factor if workers else None,
        persistent_workers=persistent and workers > 0,
    )


class LoaderTuner:
    """Serves the first epoch while trying candidates, then the fastest loader for later epochs."""

    def __init__(
        self,
        loader: DataLoader[Any],
        *,
        cpus: int,
        cuda: bool,
        batches_each: int,
        report: Callable[[str], None],
    ) -> None:
        self.loader = loader
        self.candidates = candidates(loader, cpus, cuda)
        self.batches_each = max(2, batches_each)
        self.report = report
        self.results: dict[Candidate, float] = {}  # seconds between batches, steady state
        self.best: Candidate | None = None
        self._best_loader: DataLoader[Any] | None = None

    def first_epoch(self) -> Iterator[Any]:
        # iter(DataLoader) draws a base seed (for worker seeds) before the sampler draws its own:
        # draw it the same way, so the epoch's order is the one the plain loop would have had.
        torch.empty((), dtype=torch.int64).random_(generator=self.loader.generator)
        order = list(self.loader.batch_sampler)  # type: ignore[arg-type]
        # The candidates' own base-seed draws must not touch the shared generators.
        private = torch.Generator().manual_seed(0)
        position = 0
        for candidate in self.candidates:
            if len(order) - position < self.batches_each + 1:
                break
            part = order[position : position + self.batches_each]
            arrivals: list[float] = []
            it = iter(loader_like(self.loader, part, candidate, False, private))
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    break
                arrivals.append(time.perf_counter())
                yield batch
            position += len(part)
            self.results[candidate] = _steady_interval(arrivals, candidate.num_workers)
        self._choose()
        rest = order[position:]
        if rest:
            best = self.best or self.candidates[0]
            yield from loader_like(self.loader, rest, best, False, private)

    def _choose(self) -> None:
        if not self.results:
            self.best = self.candidates[0]
            self.report("--tune-loader: the first epoch is too short to try any setting")
            return
        baseline = self.results.get(self.candidates[0]) or min(self.results.values())
        self.best = min(self.results, key=lambda c: self.results[c])
        parts = [
            f"{c}: {t * 1000:.2f} ms/batch ({baseline / t if t > 0 else float('inf'):.2f}x)"
            + (" <- used" if c == self.best else "")
            for c, t in self.results.items()
        ]
        self.report("--tune-loader: " + "; ".join(parts))

    def later_loader(self) -> DataLoader[Any]:
        """The loader for the following epochs: the fastest setting, workers kept alive."""
        if self._best_loader is None:
            best = self.best or self.candidates[0]
            self._best_loader = loader_like(
                self.loader, self.loader.batch_sampler, best, True, self.loader.generator
            )
        return self._best_loader


def _steady_interval(arrivals: list[float], workers: int) -> float:
    """Seconds between batch arrivals once the loader runs steadily (the step's compute included,
    the same for every candidate).

    The first batch pays for starting the workers, and while it is made the other workers make
    theirs, so the first `workers` batches arrive at once: timing only the waits of so few batches
    made worker loaders look hundreds of times faster than they are. The steady interval starts
    after them.
    """
    skip = max(1, workers)
    if len(arrivals) > skip + 1:
        return (arrivals[-1] - arrivals[skip]) / (len(arrivals) - 1 - skip)
    return (arrivals[-1] - arrivals[0]) / max(1, len(arrivals) - 1)
