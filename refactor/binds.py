"""
What a top-level statement binds (step 2, for `analyze`): its targets, the names its nested
definitions and imports bind, `:=` where it stands; not what a function, a lambda or a class
binds in its own scope. And which of those names are no state: a module a statement imports on
some paths only that a top-level import binds to the same name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from .walk import isa, walk

if TYPE_CHECKING:
    from .analyze import Item


def imported_again(items: list[Item]) -> None:
    """A statement that imports a module on some paths only (`if not colab: import sys`, a
    `try: import wandb`) binds no state when a top-level import of the notebook binds the same
    module to the same name (`import sys` in a later cell): the name is that module either way,
    imported at the top of the modules that use it. As state, the section with the `if` passed
    its `sys` (None on the other path) to the later ones, where the notebook had the module."""
    top: dict[str, set[tuple[str, ...]]] = {}
    for item in items:
        if item.kind == "import":
            for name, key in _import_keys(item.node.body[0]):  # type: ignore[attr-defined]
                top.setdefault(name, set()).add(key)
    for item in items:
        if (
            item.kind != "statement"
            or not top.keys() & set(item.binds)
            or "import" not in item.text
        ):
            continue
        only = _imported_only(item.node)
        same = {n for n, keys in only.items() if keys <= top.get(n, set())}
        if same:
            item.binds = tuple(n for n in item.binds if n not in same)


def _import_keys(node: cst.CSTNode) -> list[tuple[str, tuple[str, ...]]]:
    """(the name it binds, what it binds it to) for each name of an import statement."""
    if not isinstance(node, cst.Import | cst.ImportFrom) or isinstance(node.names, cst.ImportStar):
        return []
    code = cst.Module([]).code_for_node
    where = ""
    if isinstance(node, cst.ImportFrom):
        where = "." * len(node.relative) + (code(node.module) if node.module else "")
    found: list[tuple[str, tuple[str, ...]]] = []
    for alias, name in zip(node.names, import_names(node), strict=False):
        found.append((name, (where, code(alias.name), name)))
    return found


def _imported_only(node: cst.CSTNode) -> dict[str, set[tuple[str, ...]]]:
    """The names `node` binds by import statements only (in its own scope), with what each of
    its imports binds them to."""
    imported: dict[str, set[tuple[str, ...]]] = {}
    other: set[str] = set()
    for found in walk(node, _same_scope):
        if isa(found, (cst.Import, cst.ImportFrom)):
            for name, key in _import_keys(found):
                imported.setdefault(name, set()).add(key)
        elif isinstance(
            found, cst.AssignTarget | cst.AnnAssign | cst.AugAssign | cst.For | cst.NamedExpr
        ):
            other.update(target_names(found.target))
        elif isinstance(found, cst.FunctionDef | cst.ClassDef):
            other.add(found.name.value)
        elif isinstance(found, cst.WithItem) and found.asname is not None:
            other.update(target_names(found.asname.name))
    return {n: keys for n, keys in imported.items() if n not in other}


def import_names(node: cst.Import | cst.ImportFrom) -> tuple[str, ...]:
    names = []
    if isinstance(node.names, cst.ImportStar):
        return ()
    for alias in node.names:
        if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
            names.append(alias.asname.name.value)
        elif isinstance(node, cst.Import):
            names.append(cst.Module([]).code_for_node(alias.name).split(".")[0])
        else:
            names.append(cst.Module([]).code_for_node(alias.name))
    return tuple(names)


_BINDING = (
    cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.ExceptHandler,
    cst.ExceptStarHandler, cst.AsName, cst.FunctionDef, cst.ClassDef, cst.Import, cst.ImportFrom,
    cst.NamedExpr,
)  # fmt: skip
_OWN_SCOPE = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def _same_scope(node: cst.CSTNode) -> bool:
    return not isa(node, _OWN_SCOPE)


def bound(node: cst.CSTNode) -> tuple[str, ...]:
    """Names a top-level statement binds: assignment, for and with targets, nested defs. Not
    `except E as ex`'s `ex`: Python deletes it at the end of the handler, so nothing after the
    statement can read it (only the handler itself does)."""
    names: dict[str, None] = {}
    targets: list[cst.BaseExpression] = []
    named: list[cst.BaseExpression] = []
    imports: list[cst.Import | cst.ImportFrom] = []
    handlers: set[int] = set()  # the `as ex` of each `except` (the walk meets it after)
    # one pass, not into a function's, a lambda's or a class's own scope (what they bind is
    # theirs); the names in the order the three kinds were found in
    for found in walk(node, _same_scope):
        if not isa(found, _BINDING):
            continue
        if isinstance(
            found, cst.AssignTarget | cst.AnnAssign | cst.AugAssign | cst.For | cst.NamedExpr
        ):  # `:=` binds in the statement's scope, in a comprehension too
            targets.append(found.target)
        elif isinstance(found, cst.ExceptHandler | cst.ExceptStarHandler) and found.name:
            handlers.add(id(found.name))
        elif isinstance(found, cst.AsName) and id(found) in handlers:
            continue
        elif isinstance(found, cst.AsName | cst.FunctionDef | cst.ClassDef):
            named.append(found.name)
        elif isinstance(found, cst.Import | cst.ImportFrom):  # `try: import x` in a cell
            imports.append(found)
    for target in [*targets, *named]:
        for name in target_names(target):
            names.setdefault(name, None)
    for imported in imports:
        names.update(dict.fromkeys(import_names(imported)))
    return tuple(names)


def target_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, cst.Tuple | cst.List):
        return [n for e in target.elements for n in target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []
