from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from jupyter_trainmate.runtime.prefetch import CudaPrefetcher, ThreadPrefetcher


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
