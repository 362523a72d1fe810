from __future__ import annotations

from collections import OrderedDict, namedtuple
from dataclasses import dataclass, field

import torch

from jupyter_trainmate.runtime.batch import batch_size, iter_tensors, map_tensors, to_device

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
