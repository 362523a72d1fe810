from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from jupyter_trainmate.runtime.prefetch import (
    CudaPrefetcher,
    FirstOnThisThread,
    ThreadPrefetcher,
    auto_thread,
)


def test_thread_prefetch_yields_the_same_batches_in_order() -> None:
    data = TensorDataset(torch.arange(100.0).unsqueeze(1))
    loader = DataLoader(
        data, batch_size=7, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    plain = [
        b[0]
        for b in DataLoader(
            data, batch_size=7, shuffle=True, generator=torch.Generator().manual_seed(3)
        )
    ]
    fetched = [b[0] for b in ThreadPrefetcher(loader)]
    assert len(fetched) == len(plain)
    assert all(torch.equal(a, b) for a, b in zip(fetched, plain, strict=True))


def test_thread_prefetch_reraises_loader_errors_in_the_caller() -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise ValueError("bad sample 2")

    it = ThreadPrefetcher(broken())
    assert next(it) == 1
    with pytest.raises(ValueError, match="bad sample 2"):
        next(it)


def test_closing_early_stops_the_thread() -> None:
    produced = []

    def endless() -> Iterator[int]:
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    it = ThreadPrefetcher(endless(), depth=2)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()
    assert not any(t.name == "trainmate-prefetch" and t.is_alive() for t in threading.enumerate())
    assert len(produced) <= 3 + 2 + 2  # taken + queue depth + one in hand, then it stopped
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.gpu
def test_cuda_prefetch_moves_nested_batches_once() -> None:
    device = torch.device("cuda")
    already = torch.ones(2, device=device)
    batches = [{"x": torch.full((4, 3), float(i)), "on_gpu": already} for i in range(5)]
    out = list(CudaPrefetcher(batches, device))
    assert [int(b["x"][0, 0]) for b in out] == list(range(5))
    assert all(b["x"].is_cuda for b in out)
    assert all(b["on_gpu"] is already for b in out)


# -- `--prefetch auto` on the CPU: the probe -----------------------------------------------------


class _Augmenting(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A dataset whose samples draw from a global generator (random augmentation)."""

    def __init__(self, draw: str) -> None:
        self.x = torch.arange(64.0).reshape(32, 2)
        self.draw = draw

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.draw == "torch":
            return self.x[i] + torch.rand(2), self.x[i, 0]
        if self.draw == "random":
            return self.x[i] * random.random(), self.x[i, 0]
        if self.draw == "numpy":
            return self.x[i] * float(np.random.rand()), self.x[i, 0]
        time.sleep(0.0005)  # waits, as reading a file would
        return self.x[i], self.x[i, 0]


@pytest.mark.parametrize(
    ("draw", "expected"),
    [
        ("none", None),
        ("torch", "fetching its samples draws random numbers (torch"),
        ("random", "fetching its samples draws random numbers (Python's random"),
        ("numpy", "fetching its samples draws random numbers (NumPy"),
    ],
)
def test_probe_sees_draws_while_fetching_and_puts_every_generator_back(
    draw: str, expected: str | None
) -> None:
    loader = DataLoader(_Augmenting(draw), batch_size=8, shuffle=True)
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    why = auto_thread(loader)
    assert why is None if expected is None else why is not None and why.startswith(expected)
    assert torch.equal(states[0], torch.get_rng_state())
    assert states[1] == random.getstate()
    assert (states[2] == np.random.get_state()[1]).all()


def test_probe_keeps_cpu_bound_loading_workers_iterable_datasets_and_lists_on_this_thread() -> None:
    data = TensorDataset(torch.zeros(8, 2))
    assert "CPU work on this thread" in (auto_thread(DataLoader(data, batch_size=4)) or "")
    assert auto_thread(DataLoader(data, num_workers=2)) is not None
    assert auto_thread([torch.zeros(2)]) == "not a DataLoader"

    class Stream(torch.utils.data.IterableDataset[torch.Tensor]):
        def __iter__(self) -> Iterator[torch.Tensor]:
            yield torch.zeros(2)

    assert "IterableDataset" in (auto_thread(DataLoader(Stream())) or "")


def test_first_batch_comes_from_the_training_thread_and_the_rest_in_order() -> None:
    loader = DataLoader(TensorDataset(torch.arange(20.0)), batch_size=4, shuffle=True)
    torch.manual_seed(3)
    expected = [b[0] for b in loader]
    torch.manual_seed(3)
    prefetched = FirstOnThisThread(loader)
    first = next(prefetched)
    after_first = torch.get_rng_state()  # the sampler's draw happened here, on this thread
    got = [first[0]] + [b[0] for b in prefetched]
    assert torch.equal(after_first, torch.get_rng_state())
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
