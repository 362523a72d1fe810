"""typecheck's edits cut out only the functions they change; the text must be what libcst's
transformer gives on the whole module."""

from __future__ import annotations

import libcst as cst
import pytest

from jupyter_trainmate.refactor.typecheck import _Edit, _edited, _import_no_type_check
from jupyter_trainmate.refactor.typeexpr import add_imports

MODULE = '''"""Doc."""
import torch


# a comment before
@staticmethod
def scale(x: float, y: int = 2) -> float:
    return x * y  # trailing


async def fetch(url: str) -> bytes:
    return b""


def one(x: int) -> int: return x


class Net:
    """A class."""

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        s = "a\x0cb\u2028c"
        return x

    class Inner:
        def forward(self, x: int) -> int:
            return x


if torch:

    def guarded(a: int) -> int:
        return a


for item in map(lambda v: v, [1]):
    value = item if item else None

try:
    pass
except ValueError:

    def handled(b: int) -> int:
        return b


def last(z: list[int]) -> int:
    return len(z)'''


@pytest.mark.parametrize(
    ("drop", "decorate"),
    [
        ({"scale": {"x", "return"}}, set()),
        ({}, {"scale", "fetch", "one"}),
        ({"Net.forward": {"n"}, "one": {"return"}}, {"last"}),
        ({"last": {"z", "return"}}, {"Net.forward"}),
        ({"Net.Inner.forward": {"x"}}, set()),  # a nested class: the whole module
        ({"guarded": {"a"}}, {"scale"}),  # a function inside `if`: the whole module
        ({"missing": {"a"}}, {"absent"}),
        ({}, {"handled"}),  # inside an `except`: the whole module
    ],
)
def test_edit_by_cut_equals_whole_module(drop: dict[str, set[str]], decorate: set[str]) -> None:
    for code in (MODULE, MODULE + "\n"):
        whole = cst.parse_module(code).visit(_Edit(drop, decorate)).code
        assert _edited(code, drop, decorate) == whole


def test_edit_by_cut_changes_what_it_names() -> None:
    edited = _edited(MODULE, {"Net.forward": {"n"}}, {"last"})
    assert "def forward(self, x: torch.Tensor, n) -> torch.Tensor:" in edited
    assert "@no_type_check\ndef last(z: list[int]) -> int:" in edited
    assert edited.count("\n") == MODULE.count("\n") + 1


@pytest.mark.parametrize(
    "code",
    [
        MODULE,
        MODULE + "\n",
        "import a; import b\nimport c  # why\n\n# next\nx = 1\n",
        "import a\nimport b; import c\n\nx = (\n    1\n)\n",
        "from x import (\n    y,\n    z,\n)\n",
        '"""Doc."""\n\n# a comment\nx = 1\n',
        "import a\n",
        "import a",
    ],
)
def test_import_by_text_equals_add_imports(code: str) -> None:
    line = "from typing import no_type_check"
    expected = add_imports(cst.parse_module(code), {line}, guarded=False).code
    assert _import_no_type_check(code) == expected
