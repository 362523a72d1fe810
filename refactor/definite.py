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
        return _walrus(node.test) | _both(_block(node.body), _block(node.orelse))
    if isinstance(node, ast.For | ast.AsyncFor):
        bound = _walrus(node.iter) | frozenset(_targets(node.target))
        return bound | _plain(_block(node.body))
    if isinstance(node, ast.While):
        return _walrus(node.test) | _plain(_block(node.body))
    if isinstance(node, ast.With | ast.AsyncWith):
        names = {
            n for item in node.items if item.optional_vars for n in _targets(item.optional_vars)
        }
        names.update(n for item in node.items for n in _walrus(item.context_expr))
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
        subject = _walrus(node.subject)
        every: frozenset[str] = ALL
        wildcard = False
        for case in node.cases:
            every = _both(every, _block(case.body))
            wildcard |= isinstance(case.pattern, ast.MatchAs) and case.pattern.pattern is None
        return subject | (_plain(every) if wildcard else frozenset())
    if isinstance(node, _SCOPES):
        return frozenset(_simple(node))
    return frozenset(_simple(node)) | _walrus(node)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _walrus(node: ast.AST) -> frozenset[str]:
    """The names `:=` binds in `node` wherever it is evaluated (a comprehension's too: its
    loop counts as running, as the statements' loops do); not in the operands `and`, `or` or
    a conditional expression may skip, nor in a lambda's body (its own scope)."""
    found: list[str] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.NamedExpr):
            found += _targets(current.target)
            stack.append(current.value)
        elif isinstance(current, ast.BoolOp):
            stack.append(current.values[0])
        elif isinstance(current, ast.IfExp):
            stack.append(current.test)
        elif not isinstance(current, ast.Lambda | ast.expr_context):
            stack.extend(ast.iter_child_nodes(current))
    return frozenset(found)


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
