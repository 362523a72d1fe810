"""The refactor's shared parse of a module's code (`cut.parsed`) and its statement-only walk
(`cut.statements`), which mypy's rounds, the symbol index and the coverage count now use instead
of `ast.parse` and `ast.walk` of their own."""

from __future__ import annotations

import ast

from jupyter_trainmate.refactor.annotate import coverage
from jupyter_trainmate.refactor.cut import parsed, statements
from jupyter_trainmate.refactor.rejected import Error, checked_by_default
from jupyter_trainmate.refactor.symbols import index

CODE = """
import os
from typing import no_type_check


def top(a: int) -> int:
    def inner(b):
        import json

        return json.dumps(b)

    return a


class Model:
    def forward(self, x):
        return x

    if os.name == "nt":
        def windows_only(self, y: int) -> int:
            return y + 1
    else:
        def other(self, y):
            return y


try:
    from numpy import ndarray
except ImportError:
    def fallback(z):
        return z
else:
    def chosen(z: int) -> int:
        return z
finally:
    def last(z):
        return z

for _ in range(1):
    while False:
        def in_loop(q):
            return q

with open(os.devnull) as f:
    def in_with(q: str) -> str:
        return q

match os.name:
    case "posix":
        def in_case(q):
            return q
    case _:
        pass

handler = lambda v: v  # noqa: E731


@no_type_check
def decorated(a: int) -> int:
    return a + 0
"""


def test_statements_finds_what_ast_walk_finds_of_the_statement_kinds() -> None:
    tree = ast.parse(CODE)
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    walked = [n for n in ast.walk(tree) if isinstance(n, kinds)]
    ours = [n for n in statements(tree.body) if isinstance(n, kinds)]
    assert {id(n) for n in ours} == {id(n) for n in walked}
    assert len(ours) == len(walked) == 17  # 4 imports, a class, 12 functions
    names = {n.name for n in ours if isinstance(n, ast.FunctionDef)}
    assert {"inner", "windows_only", "other", "fallback", "chosen", "last"} <= names
    assert {"in_loop", "in_with", "in_case", "decorated"} <= names


def test_parsed_is_shared_and_refuses_what_does_not_parse() -> None:
    assert parsed(CODE) is parsed(CODE)  # the same tree: one parse for every step that asks
    assert parsed("def broken(:\n    pass\n") is None
    assert parsed("x = 1\x00\n") is None  # a null byte: ValueError in ast.parse


def test_the_steps_that_share_the_tree_count_as_before() -> None:
    files = {"pkg/__init__.py": "", "pkg/a.py": CODE, "pkg/b.py": CODE}
    # two modules of the same code: each gets a tree of its own in the index
    pkg = index(files, "pkg")
    assert pkg.modules["a"].tree is not pkg.modules["b"].tree
    # the coverage count over the statement walk: every def, nested ones included, `self` not
    got = coverage({"pkg/a.py": CODE}, "pkg")
    tree = ast.parse(CODE)
    total = annotated = 0
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            params = [p for p in fn.args.args if p.arg not in ("self", "cls")]
            total += len(params) + 1
            annotated += sum(p.annotation is not None for p in params) + (fn.returns is not None)
    assert (got.annotated, got.total) == (annotated, total) == (10, 24)
    # an error inside a function without annotations, or with @no_type_check, is set aside;
    # one inside an annotated function nested in a branch is kept
    lines = CODE.splitlines()
    line_of = {text: i + 1 for i, text in enumerate(lines)}
    errors = [
        Error("a", line_of["        return json.dumps(b)"], "x", "misc"),
        Error("a", line_of["            return y + 1"], "x", "misc"),  # windows_only: annotated
        Error("a", line_of["    return a"], "x", "misc"),  # top: annotated
        Error("a", line_of["    return a + 0"], "x", "misc"),  # @no_type_check
    ]
    kept = checked_by_default(errors, files, "pkg")
    assert [e.line for e in kept] == [errors[1].line, errors[2].line]
