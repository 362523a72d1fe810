"""
The names top-level code binds on every path through it: what a section function may return or
read back without an `UnboundLocalError`.

At a notebook's top level a name bound in one branch only (`if "google.colab" in sys.modules:
data_dir = ...`, a `try` whose `except` binds something else) is simply absent on the other path,
or keeps the value an earlier cell gave it. Moved into a function it becomes a local that may be
unbound: `return data_dir` fails, and so does a read after `if restart: opt = SGD(...)` that the
notebook meant to see the earlier `opt`. `sections.cut` passes such a name in when an earlier
section (or `config`) binds it, and otherwise binds it to None first (`Section.unbound`).

Loops count as running (a notebook's loops run: a `for` over an empty list is not what the
refactor guards against), `with` bodies as run, an `if` binds what both branches bind, a `try`
what its body (and `else`) and every handler bind, plus its `finally`. A branch that ends in
`raise`, `return`, `break` or `continue` binds everything (its path does not go on).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

_EXITS = (ast.Raise, ast.Return, ast.Break, ast.Continue)


class _All(frozenset[str]):
    """What a path that does not go on binds: everything (the identity of `&`)."""


ALL = _All()


def definitely_bound(code: str) -> frozenset[str] | None:
    """The names `code` binds on every path through it; None when it does not parse."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    found = _block(tree.body)
    return frozenset() if isinstance(found, _All) else found


def _both(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    if isinstance(a, _All):
        return b
    if isinstance(b, _All):
        return a
    return a & b


def _block(body: Iterable[ast.stmt]) -> frozenset[str]:
    bound: set[str] = set()
    for statement in body:
        if isinstance(statement, _EXITS):
            return ALL
        bound |= _statement(statement)
    return frozenset(bound)


def _statement(node: ast.stmt) -> frozenset[str]:
    if isinstance(node, ast.If):
        return _both(_block(node.body), _block(node.orelse))
    if isinstance(node, ast.For | ast.AsyncFor):
        return frozenset(_targets(node.target)) | _plain(_block(node.body))
    if isinstance(node, ast.While):
        return _plain(_block(node.body))
    if isinstance(node, ast.With | ast.AsyncWith):
        names = {
            n for item in node.items if item.optional_vars for n in _targets(item.optional_vars)
        }
        return frozenset(names) | _plain(_block(node.body))
    if isinstance(node, ast.Try | ast.TryStar):
        found = _block([*node.body, *node.orelse])
        for handler in node.handlers:
            caught = _block(handler.body)
            if handler.name and not isinstance(caught, _All):
                caught = caught | {handler.name}
            found = _both(found, caught)
        return _plain(found) | _plain(_block(node.finalbody))
    if isinstance(node, ast.Match):
        every: frozenset[str] = ALL
        wildcard = False
        for case in node.cases:
            every = _both(every, _block(case.body))
            wildcard |= isinstance(case.pattern, ast.MatchAs) and case.pattern.pattern is None
        return _plain(every) if wildcard else frozenset()
    return frozenset(_simple(node))


def _plain(found: frozenset[str]) -> frozenset[str]:
    return frozenset() if isinstance(found, _All) else found


def _simple(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        return [n for target in node.targets for n in _targets(target)]
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return _targets(node.target) if not isinstance(node, ast.AnnAssign) or node.value else []
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    return []


def _targets(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple | ast.List):
        return [n for element in target.elts for n in _targets(element)]
    if isinstance(target, ast.Starred):
        return _targets(target.value)
    return []
