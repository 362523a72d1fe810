from __future__ import annotations

from collections import OrderedDict, namedtuple
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from jupyter_trainmate.runtime.batch import (
    SampleCounter,
    batch_size,
    iter_tensors,
    leading_size,
    map_tensors,
    to_device,
)

Pair = namedtuple("Pair", ["x", "y"])


@dataclass
class Sample:
    image: torch.Tensor
    label: torch.Tensor
    meta: dict[str, str] = field(default_factory=dict)


def test_nested_structures_keep_their_types() -> None:
    x, y = torch.ones(4, 3), torch.arange(4)
    batch = {
        "pair": Pair(x, y),
        "list": [x, (y, "text")],
        "ordered": OrderedDict(a=x),
        "sample": Sample(x, y, {"id": "7"}),
        "n": 3,
    }
    doubled = map_tensors(batch, lambda t: t * 2)
    assert isinstance(doubled["pair"], Pair)
    assert torch.equal(doubled["pair"].x, x * 2)
    assert isinstance(doubled["list"][1], tuple)
    assert doubled["list"][1][1] == "text"
    assert isinstance(doubled["ordered"], OrderedDict)
    assert isinstance(doubled["sample"], Sample)
    assert torch.equal(doubled["sample"].label, y * 2)
    assert doubled["sample"].meta == {"id": "7"}
    assert doubled["n"] == 3
    assert len(iter_tensors(batch)) == 7


def test_tensors_already_on_the_device_are_not_copied() -> None:
    x = torch.ones(2, 2)
    moved = to_device((x, {"y": x}), torch.device("cpu"))
    assert moved[0] is x
    assert moved[1]["y"] is x


def test_batch_size_is_the_leading_dimension() -> None:
    assert batch_size({"scalar": torch.tensor(1.0), "x": torch.zeros(5, 2)}) == 5
    assert batch_size(["no tensors"]) == 0


def test_leading_size_reads_numpy_arrays_too() -> None:
    assert leading_size((np.zeros((5, 3)), np.zeros(5))) == 5
    assert leading_size({"ids": [1, 2], "x": np.zeros((7, 2))}) == 7
    assert leading_size(torch.zeros(4, 2)) == 4
    assert leading_size(np.float32(1.0)) == 0
    assert leading_size("text") == 0


@pytest.mark.parametrize(("drop_last", "expected"), [(False, [16, 16, 4]), (True, [16, 16])])
def test_loader_counts_are_exact_whatever_the_batch_shape(
    drop_last: bool, expected: list[int]
) -> None:
    data = TensorDataset(torch.zeros(36, 12, 3))

    def time_major(items: list[tuple[torch.Tensor]]) -> torch.Tensor:
        return torch.stack([item for (item,) in items], 1)  # (T=12, B, 3)

    loader = DataLoader(data, batch_size=16, drop_last=drop_last, collate_fn=time_major)
    counter = SampleCounter(loader)
    assert counter.exact
    assert [counter(batch) for batch in loader] == expected


def test_a_resumed_pass_counts_from_its_position() -> None:
    loader = DataLoader(TensorDataset(torch.zeros(36, 2)), batch_size=16)
    counter = SampleCounter(loader, start=2)
    assert [counter(batch) for batch in list(loader)[2:]] == [4]


class Stream(IterableDataset[torch.Tensor]):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(torch.zeros(10, 2).split(3))


def test_without_a_sampler_length_or_a_loader_the_count_is_a_guess() -> None:
    stream = SampleCounter(DataLoader(Stream(), batch_size=None))
    assert not stream.exact
    assert [stream(b) for b in DataLoader(Stream(), batch_size=None)] == [3, 3, 3, 1]
    listed = SampleCounter([torch.zeros(12, 5)])
    assert not listed.exact
    assert listed(torch.zeros(12, 5)) == 12  # a (T, B) batch would give T: hence "a guess"
