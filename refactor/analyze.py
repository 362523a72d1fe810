"""
Step 2: parse every code cell with libcst and say what each top-level statement is.

Each statement becomes an `Item`: an import, a function, a class, a constant (a name bound to a
literal: a hyperparameter), or a plain statement (notebook state: `model = Net()`, the loop, a
print). libcst's scope analysis gives, for every function and class, the global names it reads
(its free variables); for a statement, the names it reads and binds. `if __name__ ==
"__main__":` gates are opened (their body is top-level code of a script). A cell that does not
parse is a `BadCell` with its line (assignment placeholders like `<YOUR CODE>` are common).
"""

from __future__ import annotations

import ast
import bisect
import builtins
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst
from libcst.metadata import CodePosition, GlobalScope, Scope, ScopeProvider

from .positions import starts as start_positions
from .read import CodeCell, Notebook
from .walk import children, find, isa, walk

Scopes = Mapping[cst.CSTNode, Scope | None]
Positions = Mapping[cst.CSTNode, CodePosition]  # where names and statements start
Kind = Literal["import", "function", "class", "constant", "statement"]
FUTURE = re.compile(r"^from __future__ import [^\n]*$", re.M)
FUTURE_DROPPED = "pass  # trainmate: dropped (a __future__ import)"
BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__", "get_ipython", "display"}


@dataclass
class Item:
    cell: CodeCell
    line: int
    kind: Kind
    node: cst.BaseStatement
    name: str | None = None  # functions, classes, constants
    binds: tuple[str, ...] = ()  # top-level names it binds
    reads: tuple[str, ...] = ()  # global names it reads (free variables of a def)
    value: object = None  # a constant's value
    train_cell: bool = False  # the body of a %%train cell
    declares: tuple[str, ...] = ()  # names a def declares `global` (module state)
    at_definition: tuple[str, ...] = ()  # what a def's decorators, defaults and bases read

    @property
    def code(self) -> str:
        return cst.Module([]).code_for_node(self.node)


@dataclass(frozen=True)
class BadCell:
    cell: int
    line: int
    message: str


@dataclass
class Analysis:
    items: list[Item] = field(default_factory=list)
    bad: list[BadCell] = field(default_factory=list)


def analyze(nb: Notebook) -> Analysis:
    """Check each cell alone, then analyse the good ones as the one module they are.

    The cells of a notebook share one global scope, so they are parsed and scope-analysed
    together, once (per-cell metadata resolution cost more than the analysis itself).
    """
    out = Analysis()
    good: list[CodeCell] = []
    for cell in nb.cells:
        if not cell.python.strip():
            continue
        if FUTURE.search(cell.python):  # a no-op in Python 3, and legal only first in a file
            cell = dataclasses.replace(cell, python=FUTURE.sub(FUTURE_DROPPED, cell.python))
        try:  # CPython's message first: the one users know
            compile(cell.python, f"cell {cell.number}", "exec", dont_inherit=True)
        except SyntaxError as exc:
            out.bad.append(BadCell(cell.number, exc.lineno or 1, exc.msg))
            continue
        good.append(cell)
    starts: list[int] = []
    parts: list[str] = []
    line = 1
    for cell in good:
        text = cell.python if cell.python.endswith("\n") else cell.python + "\n"
        starts.append(line)
        parts.append(text)
        line += text.count("\n")
    try:
        module = cst.parse_module("".join(parts))
    except cst.ParserSyntaxError:  # one cell libcst cannot read: find it, analyse the rest
        for cell in good:
            try:
                cst.parse_module(cell.python)
            except cst.ParserSyntaxError as exc:
                out.bad.append(BadCell(cell.number, exc.raw_line, exc.message.splitlines()[0]))
        bad = {b.cell for b in out.bad}
        nb_rest = Notebook(nb.path, [c for c in good if c.number not in bad])
        out.items = analyze(nb_rest).items
        return out
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    scopes = wrapper.resolve(ScopeProvider)
    positions = start_positions(module)  # PositionProvider's starts, for a fifth of its cost
    for statement in _opened(list(module.body)):
        at = positions[statement].line
        index = bisect.bisect_right(starts, at) - 1
        cell = good[index]
        out.items.append(_item(cell, statement, at - starts[index] + 1, scopes, positions))
    for item in out.items:
        if item.cell.train_options is not None and item.kind in ("statement", "constant"):
            item.train_cell = True
            item.kind = "statement"
    return out


def _opened(body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """Top-level statements with `if __name__ == "__main__":` gates replaced by their body."""
    opened: list[cst.BaseStatement] = []
    for statement in body:
        if isinstance(statement, cst.If) and _main_gate(statement):
            block = statement.body
            if isinstance(block, cst.IndentedBlock):
                opened.extend(block.body)
                continue
        opened.append(statement)
    return opened


def _main_gate(node: cst.If) -> bool:
    """`if __name__ == "<a string>":` with no `else`."""
    test = node.test
    return (
        node.orelse is None
        and isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name)
        and test.left.value == "__name__"
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Equal)
        and isinstance(test.comparisons[0].comparator, cst.SimpleString)
    )


def _item(
    cell: CodeCell, node: cst.BaseStatement, line: int, scopes: Scopes, positions: Positions
) -> Item:
    if isinstance(node, cst.FunctionDef | cst.ClassDef):
        kind: Kind = "function" if isinstance(node, cst.FunctionDef) else "class"
        reads = _free_globals(node, scopes)
        declares = tuple(
            dict.fromkeys(
                n.name.value
                for g in find(node, cst.Global)
                if isinstance(g, cst.Global)
                for n in g.names
            )
        )
        outer: dict[str, None] = {}  # evaluated when the def runs, in the global scope
        heads: list[cst.CSTNode] = [d.decorator for d in node.decorators]
        if isinstance(node, cst.FunctionDef):
            p = node.params
            params = [*p.posonly_params, *p.params, *p.kwonly_params]
            heads += [x.default for x in params if x.default is not None]
            heads += [x.annotation.annotation for x in params if x.annotation is not None]
        else:
            heads += [b.value for b in (*node.bases, *node.keywords)]
            for method in node.body.body:  # evaluated when the class body runs
                if isinstance(method, cst.FunctionDef):
                    p = method.params
                    every = [*p.posonly_params, *p.params, *p.kwonly_params]
                    heads += [x.default for x in every if x.default is not None]
                    heads += [d.decorator for d in method.decorators]
        for head in heads:
            outer.update(dict.fromkeys(_read(head, scopes, positions, ())))
        at_definition = tuple(outer)
        reads = tuple(dict.fromkeys([*reads, *at_definition]))
        return Item(
            cell,
            line,
            kind,
            node,
            node.name.value,
            (node.name.value,),
            reads,
            declares=declares,
            at_definition=at_definition,
        )
    if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1:
        small = node.body[0]
        if isinstance(small, cst.Import | cst.ImportFrom):
            return Item(cell, line, "import", node, None, _import_names(small))
        constant = _constant(small)
        if constant is not None:
            name, value = constant
            return Item(cell, line, "constant", node, name, (name,), (), value)
    declares = tuple(
        dict.fromkeys(
            n.name.value
            for g in find(node, cst.Global)
            if isinstance(g, cst.Global)
            for n in g.names
        )
    )
    binds = _bound(node)
    reads = _read(node, scopes, positions, binds)
    return Item(cell, line, "statement", node, None, binds, reads, declares=declares)


def _import_names(node: cst.Import | cst.ImportFrom) -> tuple[str, ...]:
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


def _constant(node: cst.BaseSmallStatement) -> tuple[str, object] | None:
    """`NAME = <literal>` or `NAME: T = <literal>`: a hyperparameter."""
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        target, value = node.targets[0].target, node.value
    elif isinstance(node, cst.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return None
    if not isinstance(target, cst.Name):
        return None
    try:
        literal = ast.literal_eval(cst.Module([]).code_for_node(value))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not _plain(literal):
        return None
    return target.value, literal


def _plain(value: object) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, tuple | list) and value and len(value) <= 16:
        kinds = {type(v) for v in value}
        return len(kinds) == 1 and kinds <= {int, float, str, bool}
    return False


def _free_globals(node: cst.CSTNode, scopes: Scopes) -> tuple[str, ...]:
    """Global names a def's body reads (not bound inside it), in order of first use."""
    found: dict[str, None] = {}
    seen: dict[int, Scope] = {}
    for child in _walk(node):
        scope = scopes.get(child)
        if scope is not None and not isinstance(scope, GlobalScope):
            seen.setdefault(id(scope), scope)
    for scope in seen.values():
        for access in scope.accesses:
            name = access.node.value if isinstance(access.node, cst.Name) else None
            if name is None or name in BUILTINS:
                continue
            if all(isinstance(a.scope, GlobalScope) for a in access.referents):
                found.setdefault(name, None)
    return tuple(found)


def _read(
    node: cst.CSTNode, scopes: Scopes, positions: Positions, binds: tuple[str, ...]
) -> tuple[str, ...]:
    """Names a top-level statement reads before it binds them (its own and those of its nested
    scopes), in source order: `for x in xs: total += x` reads `total`, not `x`."""
    reads: dict[str, tuple[int, int]] = {}
    assigned: dict[str, tuple[int, int]] = {}
    skip: set[int] = set()
    bound = set(binds)
    for child in walk(node):
        if not isa(child, _READING):
            continue
        if isinstance(child, cst.Attribute):
            skip.add(id(child.attr))
        elif isinstance(child, cst.Arg) and child.keyword is not None:
            skip.add(id(child.keyword))
        elif isinstance(child, cst.AugAssign) and isinstance(child.target, cst.Name):
            target = child.target  # `total += x` reads `total` first
            if isinstance(scopes.get(target), GlobalScope):
                begin = positions[target]
                reads.setdefault(target.value, (begin.line, begin.column))
        if not isinstance(child, cst.Name) or id(child) in skip:
            continue
        scope = scopes.get(child)
        if scope is None or child.value in BUILTINS:
            continue
        start = positions[child]
        at = (start.line, start.column)
        mine = [a for a in scope.accesses[child] if a.node is child]  # every access of the name
        if not mine:
            if child.value in bound and isinstance(scope, GlobalScope):
                end = (start.line, 1 << 30)  # a line's value is read before its target is bound
                assigned[child.value] = min(assigned.get(child.value, end), end)
            continue
        if all(isinstance(r.scope, GlobalScope) for a in mine for r in a.referents):
            reads[child.value] = min(reads.get(child.value, at), at)
    ordered = sorted(reads.items(), key=lambda kv: kv[1])
    return tuple(n for n, at in ordered if n not in assigned or at < assigned[n])


_BINDING = (
    cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.ExceptHandler,
    cst.ExceptStarHandler, cst.AsName, cst.FunctionDef, cst.ClassDef, cst.Import, cst.ImportFrom,
)  # fmt: skip
_READING = (cst.Attribute, cst.Arg, cst.AugAssign, cst.Name)


def _bound(node: cst.CSTNode) -> tuple[str, ...]:
    """Names a top-level statement binds: assignment, for and with targets, nested defs. Not
    `except E as ex`'s `ex`: Python deletes it at the end of the handler, so nothing after the
    statement can read it (only the handler itself does)."""
    names: dict[str, None] = {}
    targets: list[cst.BaseExpression] = []
    named: list[cst.BaseExpression] = []
    imports: list[cst.Import | cst.ImportFrom] = []
    handlers: set[int] = set()  # the `as ex` of each `except` (the walk meets it after)
    for found in walk(node):  # one pass; the names in the order the three kinds were found in
        if not isa(found, _BINDING):
            continue
        if isinstance(found, cst.AssignTarget | cst.AnnAssign | cst.AugAssign | cst.For):
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
        for name in _target_names(target):
            names.setdefault(name, None)
    for imported in imports:
        names.update(dict.fromkeys(_import_names(imported)))
    return tuple(names)


def _target_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, cst.Tuple | cst.List):
        return [n for e in target.elements for n in _target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []


def _walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node` and the nodes under it, in the order the scopes of a def are met (see `walk`)."""
    out = [node]
    stack = [node]
    while stack:
        for child in children(stack.pop()):
            out.append(child)
            stack.append(child)
    return out
