"""typecheck's edits and annotate's annotations cut out only the signatures they change (down to
the line before the body, `cut.edit_headers`); the text must be what libcst's transformer gives
on the whole module."""

from __future__ import annotations

import libcst as cst
import pytest

from jupyter_trainmate.refactor.annotate import SetAnnotations
from jupyter_trainmate.refactor.cut import edit_headers
from jupyter_trainmate.refactor.typecheck import _Edit, _edited, _import_no_type_check
from jupyter_trainmate.refactor.typeexpr import Renderer, T, add_imports, add_imports_text

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


def multi(
    a: int,
    b: int,
) -> int:
    # a comment before the body

    return a + b


def body_on_close(a: int,
                  b: int) -> int: return a


def docs(a: int) -> int:
    """Doc."""
    return a


def wraps(f: int) -> int:
    @staticmethod
    def inner() -> None:
        pass
    return f


class Later:
    @property
    def size(self) -> int:  # why
        # first
        return 1


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
        ({"multi": {"a"}, "body_on_close": {"b"}, "docs": {"return"}}, {"multi", "docs"}),
        ({"wraps": {"f"}, "Later.size": {"return"}}, {"body_on_close", "wraps", "Later.size"}),
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


def test_annotations_by_cut_equal_whole_module() -> None:
    """What `annotate.apply` writes: each parameter without a type gets one, on every kind of
    function of MODULE (a body on the signature's line, a comment before the body, a method)."""
    from jupyter_trainmate.refactor.annotate import Signature

    sigs = {
        name: Signature({p: T("int") for p in params}, T("torch.Tensor"))
        for name, params in {
            "scale": ["y"], "one": [], "Net.forward": ["self"], "multi": ["a"],
            "body_on_close": ["b"], "docs": ["a"], "wraps": ["f"], "Later.size": ["self"],
            "last": ["z"],
        }.items()
    }  # fmt: skip
    for code in (MODULE.replace(": int", ""), MODULE.replace(": int", "") + "\n"):
        whole = Renderer("m", {"torch": "torch"}, set(), frozenset())
        expected = cst.parse_module(code).visit(SetAnnotations(sigs, whole)).code
        cut = Renderer("m", {"torch": "torch"}, set(), frozenset())
        assert edit_headers(code, set(sigs), lambda r=cut: SetAnnotations(sigs, r)) == expected
        assert expected != code


@pytest.mark.parametrize("have_flag", [False, True])
@pytest.mark.parametrize(
    "code", [MODULE, "import a; import b\nimport c  # why\n\nx = 1\n", "x = 1\n"]
)
def test_guarded_imports_by_text_equal_add_imports(code: str, have_flag: bool) -> None:
    lines = {"import numpy", "from torch import Tensor"}
    expected = add_imports(cst.parse_module(code), lines, have_flag=have_flag).code
    assert add_imports_text(code, lines, have_flag=have_flag) == expected


def test_annotations_by_cut_render_in_source_order() -> None:
    """The renderer gives the short name to the type it meets first (`Foo` for `alpha.Foo`,
    then `beta.Foo` in full): the cut way meets the functions in the same order."""
    from jupyter_trainmate.refactor.annotate import Signature

    code = "def f(a):\n    return a\n\n\ndef g(b):\n    return b\n"
    sigs = {"f": Signature({"a": T("alpha.Foo")}), "g": Signature({"b": T("beta.Foo")})}
    whole = Renderer("m", {}, set(), frozenset())
    expected = cst.parse_module(code).visit(SetAnnotations(sigs, whole)).code
    cut = Renderer("m", {}, set(), frozenset())
    assert edit_headers(code, set(sigs), lambda: SetAnnotations(sigs, cut)) == expected
    assert cut.imports == whole.imports
