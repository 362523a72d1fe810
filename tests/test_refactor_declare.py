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


HINT = 'Need type annotation for "{0}" (hint: "{0}: {1} = ...")'


def _asked(line: int, name: str, hint: str | None = None) -> Error:
    text = HINT.format(name, hint) if hint else f'Need type annotation for "{name}"'
    return Error("m", line, text, "var-annotated")


def test_only_what_can_hold_an_annotation_is_declared() -> None:
    code = (
        "import collections\n"
        "from collections import deque\n\n"
        "from mylib import Counter\n\n\n"
        "def a():\n    global log\n    log = []\n    return log\n\n"  # 7
        "def b():\n    if True: items = []\n    return items\n\n"  # 12
        "def c():\n    counts = {}\n    return counts\n\n"  # 16
        "def d():\n    q = deque()\n    return q\n\n"  # 20
        "def e():\n    seen = collections.defaultdict(list)\n    return seen\n\n"  # 24
        "def f():\n    loader = DataLoader([1, 2])\n    tally = Counter()\n\n"  # 28
        "class Agent:\n    def __init__(self):\n        self.transition = list()\n"  # 32
    )
    errors = [
        _asked(9, "log", "list[<type>]"),  # global: an annotation is a SyntaxError
        _asked(13, "items", "list[<type>]"),  # after `if x:` on the same line
        _asked(17, "counts", "dict[<type>, <type>]"),
        _asked(21, "q", "deque[<type>]"),  # a hint that is not a builtin container
        _asked(17, "other"),  # no such name on that line
        # no hint: the class of the value, where it is a generic the module has from
        # `collections`; not a `DataLoader` (mypy rejects its list argument anyway), not
        # another library's `Counter` (it may take no type arguments)
        _asked(21, "q"),
        _asked(25, "seen"),
        _asked(29, "loader"),
        _asked(30, "tally"),
        # an attribute set in a method (rainbow-is-all-you-need's agents): the method stays
        # checked, so the other methods know the attributes it sets
        _asked(34, "transition", "list[<type>]"),
    ]
    result = declare({"p/m.py": code}, "p", errors)
    assert [e.line for e in result.rest] == [9, 13, 21, 17, 29, 30]  # in mypy's order
    assert result.declared == (
        "m.c: counts: dict[Any, Any]",
        "m.d: q: deque[Any]",
        "m.e: seen: collections.defaultdict[Any, Any]",
        "m.Agent.__init__: transition: list[Any]",
    )
    new = result.files["p/m.py"]
    assert "    counts: dict[Any, Any] = {}\n" in new
    assert "    q: deque[Any] = deque()\n" in new
    assert "    seen: collections.defaultdict[Any, Any] = collections.defaultdict(list)\n" in new
    assert "        self.transition: list[Any] = list()\n" in new
    assert "from typing import Any\n" in new
    ast.parse(new)


def test_a_tuple_assignment_gets_declarations_above_it_in_the_file_s_own_line_breaks() -> None:
    code = "def f():\r\n    # \x0c\r\n    xs, ys = [], []\r\n    return xs, ys\r\n"
    result = declare(
        {"p/m.py": code}, "p", [_asked(3, "xs", "list[<type>]"), _asked(3, "ys", "list[<type>]")]
    )
    new = result.files["p/m.py"]
    # a form feed is a line break to `str.splitlines`, not to Python: the lines are Python's
    assert "    xs: list[Any]\r\n    ys: list[Any]\r\n    xs, ys = [], []\r\n" in new
    assert result.rest == []


def test_names_that_are_not_ascii_are_cut_by_their_bytes() -> None:
    code = "def f():\n    pérdidas = []\n    return pérdidas\n\n\nclass A:\n    def g(self):\n        self.données = []\n"
    result = declare(
        {"p/m.py": code},
        "p",
        [_asked(2, "pérdidas", "list[<type>]"), _asked(8, "données", "list[<type>]")],
    )
    new = result.files["p/m.py"]
    assert "    pérdidas: list[Any] = []\n" in new
    assert "        self.données: list[Any] = []\n" in new


def test_module_and_class_level_names_are_left_to_the_decorator() -> None:
    """At a module's top level the annotation runs on import (before a late `from typing import
    Any`); in a dataclass's body it makes the class attribute a field (a mutable default: the
    class fails to build)."""
    code = (
        "from dataclasses import dataclass\n\nhistory = []\n\nimport sys\n\n\n"
        "@dataclass\nclass C:\n    items = []\n"
    )
    errors = [_asked(3, "history", "list[<type>]"), _asked(10, "items", "list[<type>]")]
    result = declare({"p/m.py": code}, "p", errors)
    assert result.files["p/m.py"] == code
    assert result.rest == errors
    assert result.declared == ()


def test_any_is_imported_once() -> None:
    """A module that imports `Any` already (over several lines, as ruff formats a long import)
    gets no second import (the gate's F811)."""
    code = "from typing import (\n    Any,\n    Optional,\n)\n\n\ndef f():\n    xs = []\n    return xs\n"
    text = 'Need type annotation for "xs" (hint: "xs: list[<type>] = ...")'
    error = Error("m", 8, text, "var-annotated")
    new = declare({"p/m.py": code}, "p", [error]).files["p/m.py"]
    assert new.count("Any") == 2
    assert "    xs: list[Any] = []\n" in new


def test_a_list_the_function_later_rebinds_to_something_else_is_declared_any() -> None:
    """JavierAntoran's Bayes-by-Backprop: `predictions = []`, later `predictions =
    probs.numpy()`. `list[Any]` made the later line fail mypy (an ndarray is no list), and the
    function got `@no_type_check` for the answer to mypy's own question. A new list each epoch
    (`losses = []` again) keeps `list[Any]`."""
    code = (
        "def f(probs):\n    predictions = []\n    predictions = probs.numpy()\n"
        "    return predictions\n\n"  # 1-5
        "def g(n):\n    losses = []\n    for _ in range(n):\n        losses = list()\n"
        "    return losses\n"  # 6-10
    )
    # mypy's fallback for the variable, `list[Any]`, fails on the later line in the same round
    fallback = Error("m", 3, 'Incompatible types in assignment (expression has type "ndarray", '
                     'variable has type "list[Any]")', "assignment")  # fmt: skip
    other = Error("m", 9, "Incompatible types in assignment", "assignment")
    asked = [
        _asked(2, "predictions", "list[<type>]"),
        fallback,
        _asked(7, "losses", "list[<type>]"),
    ]
    result = declare({"p/m.py": code}, "p", [*asked, other])
    new = result.files["p/m.py"]
    assert "    predictions: Any = []\n" in new
    assert "    losses: list[Any] = []\n" in new
    assert result.rest == [other]  # settled: the lines of the function it answers for


def test_a_del_of_the_old_object_before_a_new_one_keeps_the_function_checked(
    tmp_path: Path,
) -> None:
    """xbresson's graph convnets: `try: del net / except NameError:` frees the last run's
    network before building a new one. In the section function `net` is a new local, so mypy
    cannot type it at the `del` ("Cannot determine type", "used before definition") and the
    function got `@no_type_check`. A declaration `net: Any` before the `del` answers both; the
    `del` still raises `UnboundLocalError` (a `NameError`), as in a fresh kernel."""
    out = refactored_clean(
        tmp_path,
        "freed",
        [
            new_code_cell("import torch\nfrom torch import nn"),
            new_markdown_cell("## Model"),
            new_code_cell(
                "try:\n    del net\n    print('Delete existing network')\n"
                "except NameError:\n    print('No existing network to delete')\n"
                "torch.manual_seed(0)\nnet = nn.Linear(3, 1)"
            ),
            new_markdown_cell("## Evaluate"),
            new_code_cell("value = round(net(torch.ones(3)).sum().item(), 4)"),
        ],
    )
    shown = run_value(out, "freed", "result['value']")
    import torch  # the notebook's value, computed here

    torch.manual_seed(0)
    value = round(torch.nn.Linear(3, 1)(torch.ones(3)).sum().item(), 4)
    assert shown == f"No existing network to delete\n{value}"  # the `del` raised, as it did
    code = "\n".join(p.read_text() for p in (out / "freed").glob("*.py"))
    assert "        net: Any\n        del net\n" in code
    assert not _decorated(code)
    assert "mypy on the package: clean." in (out / "REFACTOR_REPORT.md").read_text()


def test_only_a_del_of_a_local_is_declared() -> None:
    """Not a `del` of a parameter, of a name the function declares `global`, or after `;`."""
    code = (
        "def f():\n    try:\n        del a\n    except NameError:\n        pass\n    a = 1\n"
        "    return a\n\n"  # 1-8
        "def g(b):\n    del b\n\n"  # 9-11
        "def h():\n    global c\n    del c\n\n"  # 12-15
        "def k():\n    x = 0; del d\n    d = 2\n    return d\n"  # 16-19
    )

    def unknown(line: int, name: str) -> list[Error]:
        return [
            Error("m", line, f'Cannot determine type of "{name}"', "has-type"),
            Error("m", line, f'Name "{name}" is used before definition', "used-before-def"),
        ]

    errors = [*unknown(3, "a"), *unknown(10, "b"), *unknown(14, "c"), *unknown(17, "d")]
    result = declare({"p/m.py": code}, "p", errors)
    new = result.files["p/m.py"]
    assert "        a: Any\n        del a\n" in new
    assert new.count(": Any\n") == 1
    assert result.declared == ("m.f: a: Any",)
    assert [e.line for e in result.rest] == [10, 10, 14, 14, 17, 17]
