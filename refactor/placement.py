"""Where a definition goes (`Placed`) and the parameters it is given (`Param`): the plan's parts."""

from __future__ import annotations

from dataclasses import dataclass, field

from .analyze import Item


@dataclass
class Param:
    name: str  # the parameter's name in the function
    source: str  # the notebook global it stands for
    default: str | None  # a constant's name (its value is the default), None: required


@dataclass
class Placed:
    item: Item
    module: str
    params: list[Param] = field(default_factory=list)
