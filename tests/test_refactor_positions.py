"""`positions.starts` must give, for every name and statement, the start libcst's
`PositionProvider` gives (analyze orders a statement's reads and finds its cell by them)."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.metadata import PositionProvider

from jupyter_trainmate.refactor.positions import starts
from jupyter_trainmate.refactor.walk import walk

MODULE = '''"""Doc."""
import torch, os as o
from x import (a,
    b as c)


@decorate(  a )
class Net(torch.nn.Module):
    def forward(self, x: "torch.Tensor", *, n: int = (3)) -> ((torch.Tensor)):
        s = "a\\x0cb"; t = """one
two""" + f"{x!r:>{n}}"
        return (x)[n:(n + 1)] if n else [y for y in x if y]


total = 0
for i in range(3): total += i  # a comment
if __name__ == "__main__":
    try:
        del total
    except (KeyError, ValueError) as e:
        pass
    else:
        lam = lambda q, *r, **k: q
    finally:
        with open("f") as f, open("g"): pass
while False:
    break
match total:
    case [1, *rest]:
        pass
'''


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_starts_are_position_providers(newline: str) -> None:
    module = cst.parse_module(MODULE.replace("\n", newline))
    expected = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    found = starts(module)
    wanted = [n for n in walk(module) if isinstance(n, cst.Name | cst.BaseStatement)]
    assert len(wanted) > 60
    assert set(found) == set(wanted)
    for node in wanted:
        assert found[node] == expected[node].start, cst.Module([]).code_for_node(node)
