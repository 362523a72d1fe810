"""mypy's "Need type annotation for ..." (`refactor/declare.py`): the commonest reason the rounds
gave a function `@no_type_check` on real notebooks (a list filled by a helper, so mypy never sees
what goes in) is answered with the annotation mypy's hint names, `Any` for its `<type>`, and the
function stays checked."""

from __future__ import annotations

import ast
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell

from refactor.declare import declare
from refactor.rejected import Error
from tests.test_refactor_wave3 import refactored_clean, run_value


def _decorated(code: str) -> set[str]:
    return {
        node.name
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.FunctionDef)
        and any(ast.unparse(d) == "no_type_check" for d in node.decorator_list)
    }


def test_a_list_a_helper_fills_gets_its_annotation_and_stays_checked(tmp_path: Path) -> None:
    out = refactored_clean(
        tmp_path,
        "filled",
        [
            new_code_cell("from collections import deque\n\nimport torch\nfrom torch import nn"),
            new_markdown_cell("## Model"),
            new_code_cell("torch.manual_seed(0)\nmodel = nn.Linear(3, 1)"),
            new_code_cell(
                "def remember(store, value):\n    store.append(value)\n\n"
                "def scores(net, n):\n    seen = []\n    recent = deque(maxlen=2)\n"
                "    for i in range(n):\n        remember(seen, float(net(torch.ones(3) * i).sum()))\n"
                "        remember(recent, i)\n    return seen + list(recent)\n\n"
                "def pairs(n):\n    left, right = [], []\n    for i in range(n):\n"
                "        remember(left, i)\n        remember(right, -i)\n    return left, right"
            ),
            new_markdown_cell("## Evaluate"),
            new_code_cell("values = scores(model, 3)\nfirst, second = pairs(4)"),
            new_code_cell("count = len(values) + len(first) + sum(second)"),
        ],
    )
    assert run_value(out, "filled", "result['count']") == "3"  # 3 + 2 + 4 - 6
    code = "\n".join(p.read_text() for p in (out / "filled").glob("*.py"))
    assert "seen: list[Any] = []" in code
    assert "recent: deque[Any] = deque(maxlen=2)" in code  # mypy gives no hint for this one
    # a tuple assignment cannot hold annotations: they are declared on the lines before it
    assert "left: list[Any]\n" in code
    assert "right: list[Any]\n" in code
    assert not _decorated(code) & {"scores", "pairs"}
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "variables got the annotation mypy asked for" in report
    assert "mypy on the package: clean." in report


def test_only_what_can_hold_an_annotation_is_declared() -> None:
    code = (
        "def a():\n    global log\n    log = []\n    return log\n\n"
        "def b():\n    if True: items = []\n    return items\n\n"
        "def c():\n    counts = {}\n    return counts\n\n"
        "def d():\n    q = deque()\n    return q\n\n"
        "def e():\n    seen = collections.defaultdict(list)\n    return seen\n\n"
        "def f():\n    loader = DataLoader([1, 2])\n    return loader\n\n"
        "class Agent:\n    def __init__(self):\n        self.transition = list()\n"
    )
    hint = 'Need type annotation for "{0}" (hint: "{0}: {1} = ...")'
    errors = [
        Error("m", 3, hint.format("log", "list[<type>]"), "var-annotated"),  # global: SyntaxError
        Error("m", 7, hint.format("items", "list[<type>]"), "var-annotated"),  # after `if x:`
        Error("m", 11, hint.format("counts", "dict[<type>, <type>]"), "var-annotated"),
        Error("m", 15, hint.format("q", "deque[<type>]"), "var-annotated"),  # not a builtin
        Error("m", 11, 'Need type annotation for "other"', "var-annotated"),  # not on that line
        # no hint: the class of the value, where it is a generic of `collections`
        Error("m", 19, 'Need type annotation for "seen"', "var-annotated"),
        Error("m", 23, 'Need type annotation for "loader"', "var-annotated"),
        # an attribute set in a method (rainbow-is-all-you-need's agents): the method stays
        # checked, so the other methods know the attributes it sets
        Error("m", 28, hint.format("transition", "list[<type>]"), "var-annotated"),
    ]
    result = declare({"p/m.py": code}, "p", errors)
    assert sorted(e.line for e in result.rest) == [3, 7, 11, 15, 23]
    assert sorted(result.declared) == [
        "m:11 counts: dict[Any, Any]",
        "m:19 seen: collections.defaultdict[Any, Any]",
        "m:28 transition: list[Any]",
    ]
    assert "        self.transition: list[Any] = list()\n" in result.files["p/m.py"]
    new = result.files["p/m.py"]
    assert "    counts: dict[Any, Any] = {}\n" in new
    assert "    seen: collections.defaultdict[Any, Any] = collections.defaultdict(list)\n" in new
    assert "from typing import Any\n" in new
    ast.parse(new)


def test_any_is_imported_once() -> None:
    """A module that imports `Any` already (over several lines, as ruff formats a long import)
    gets no second import (the gate's F811)."""
    code = "from typing import (\n    Any,\n    Optional,\n)\n\n\ndef f():\n    xs = []\n    return xs\n"
    text = 'Need type annotation for "xs" (hint: "xs: list[<type>] = ...")'
    error = Error("m", 8, text, "var-annotated")
    new = declare({"p/m.py": code}, "p", [error]).files["p/m.py"]
    assert new.count("Any") == 2
    assert "    xs: list[Any] = []\n" in new
