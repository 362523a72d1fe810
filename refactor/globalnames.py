"""
Which names a top-level statement reads from the notebook's global scope, from CPython's own
scope analysis (`symtable`, in C) over the same source parsed by `ast` (in C).

`analyze` asked libcst's `ScopeProvider` this until it was two thirds of the step's time: it
visits and rebuilds every node of the notebook in Python (3.6 s of 5.3 on 4,500 lines of real
notebook code, where `symtable` takes 0.05 s and `ast.parse` 0.1 s). `symtable` also gives
Python's own rules (a class body's names are not seen by its methods, comprehension targets are
local, `global` and `nonlocal`) rather than a reimplementation of them.

Each function, class, lambda and comprehension of `ast` is matched to its symbol table by
kind, name and line, in the order CPython makes the tables (where two of a kind share a line),
and a `Name` is read from the global scope when the table it is read in says so (a class body's
read before the class binds the name, too: Python looks it up in the globals then). The answers
are those `analyze` gave with libcst, in the same order: for a definition, the global names its
body reads in order of the scopes (its own first) and then of first use; for a statement, the
names it reads before it binds them, in the order of the source.
"""

from __future__ import annotations

import ast
import bisect
import re
import symtable
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

_SCOPED = (
    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
    ast.DictComp, ast.GeneratorExp,
)  # fmt: skip
_COMPREHENSION = {
    ast.ListComp: "listcomp", ast.SetComp: "setcomp", ast.DictComp: "dictcomp",
    ast.GeneratorExp: "genexpr",
}  # fmt: skip
At = tuple[int, int]
_ASSIGNS = (ast.Assign, ast.AnnAssign, ast.AugAssign)


def _key(node: ast.AST) -> tuple[str, int]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name, node.lineno
    if isinstance(node, ast.Lambda):
        return "lambda", node.lineno
    return _COMPREHENSION[type(node)], node.lineno  # type: ignore[attr-defined]


@dataclass(eq=False)
class Scope:
    """One symbol table, with the tables of the scopes it holds, by kind, name and line."""

    table: symtable.SymbolTable
    parent: Scope | None  # None for the module's own scope
    index: int = 0  # the order in which the walk of the source met the scope (set by it)

    @property
    def glob(self) -> bool:
        return self.parent is None

    @property
    def kind(self) -> str:
        return str(self.table.get_type())

    def assigns(self, name: str) -> bool:
        """A comprehension that binds `name` itself (with `:=`, in the enclosing scope)."""
        if self.table.get_name() not in _COMPREHENSION.values():
            return False
        try:
            return self.table.lookup(name).is_assigned()
        except KeyError:
            return False

    def is_local(self, name: str) -> bool:
        try:
            return self.table.lookup(name).is_local()
        except KeyError:
            return False

    def __post_init__(self) -> None:
        self._children: dict[tuple[str, int], list[symtable.SymbolTable]] = {}
        for child in self.table.get_children():
            key = (child.get_name(), child.get_lineno())
            self._children.setdefault(key, []).append(child)
        self._taken: dict[tuple[str, int], int] = {}
        self._cache: dict[str, bool] = {}

    def child(self, node: ast.AST) -> Scope:
        """The table of `node`, a scope-making node this scope holds (asked in CPython's order)."""
        key = _key(node)
        tables = self._children.get(key, [])
        taken = self._taken.get(key, 0)
        self._taken[key] = taken + 1
        if taken >= len(tables):  # not expected: CPython makes a table for every such node
            raise LookupError(f"no symbol table for {key}")
        return Scope(tables[taken], self)

    def is_global(self, name: str) -> bool:
        """Whether `name`, read here, is looked up in the module's globals."""
        found = self._cache.get(name)
        if found is None:
            if self.glob:
                found = True
            else:
                try:
                    symbol = self.table.lookup(name)
                except KeyError:
                    found = True
                else:
                    found = symbol.is_global() or (
                        self.table.get_type() == "class"
                        and not symbol.is_local()
                        and not symbol.is_free()
                    )
            self._cache[name] = found
        return found


def _parts(node: ast.AST, cpython: bool = False) -> tuple[list[ast.AST], list[ast.AST]]:
    """A scope-making node's parts: those run where it is defined (defaults, annotations,
    decorators, bases, a comprehension's first iterable), and those run in its own scope. In
    the order of the source, or (`cpython`) in the order CPython's symtable visits them (a
    `*args` annotation before the keyword-only ones, a dict comprehension's value before its
    key), which is the order it makes the tables of the scopes inside them in."""
    outer: list[ast.AST] = []
    inner: list[ast.AST] = []
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        args = node.args
        outer += [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
        if isinstance(node, ast.Lambda):
            inner.append(node.body)
        else:
            star = [args.vararg] if args.vararg else []
            every = [*args.posonlyargs, *args.args]
            every += [*star, *args.kwonlyargs] if cpython else [*args.kwonlyargs, *star]
            every += [args.kwarg] if args.kwarg else []
            outer += [a.annotation for a in every if a.annotation is not None]
            outer += [node.returns] if node.returns is not None else []
            outer += node.decorator_list
            inner += node.body
    elif isinstance(node, ast.ClassDef):
        outer += [*node.bases, *(k.value for k in node.keywords), *node.decorator_list]
        inner += node.body
    else:
        generators: list[ast.comprehension] = node.generators  # type: ignore[attr-defined]
        outer.append(generators[0].iter)
        inner += [generators[0].target, *generators[0].ifs]
        for more in generators[1:]:
            inner += [more.target, more.iter, *more.ifs]
        if isinstance(node, ast.DictComp):
            inner += [node.value, node.key] if cpython else [node.key, node.value]
        else:
            inner.append(node.elt)  # type: ignore[attr-defined]
    return outer, inner


def _name(node: ast.AST) -> tuple[str, bool] | None:
    """The name a node reads or binds (and whether it reads it), if it is one of those."""
    if isinstance(node, ast.Name):
        return node.id, not isinstance(node.ctx, ast.Store)
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
        return node.target.id, True  # `total += x` reads `total` first
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name, False
    if isinstance(node, ast.alias):
        return node.asname or node.name.split(".")[0], False
    if isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
        return node.name, False
    if isinstance(node, ast.MatchMapping) and node.rest:
        return node.rest, False
    return None


# a name, where, the scope it is in, whether it is read, whether that reads the module's globals
Found = tuple[str, At, Scope, bool, bool]


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def lines_of(text: str) -> list[str]:
    """`text`'s lines as `ast` numbers them (ends kept): only "\n", "\r\n" and "\r" end a line,
    where `str.splitlines` also ends one at "\x0c", "\u2028" and the like."""
    return _LINE.findall(text)


def _symtable(source: str, tree: ast.Module) -> symtable.SymbolTable:
    """CPython's symbol table of the notebook's code. The cells are one module here, which
    CPython may refuse where each cell alone is fine: `x = 1` in one cell and `global x` at
    the top of a later one ("assigned to before global declaration"). A `global` statement
    outside any function does nothing, so those are read as `pass` (same lines and columns)."""
    try:
        return symtable.symtable(source, "<notebook>", "exec")
    except SyntaxError:
        lines = lines_of(source)
        todo: list[ast.AST] = [tree]
        changed = False
        while todo:
            node = todo.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                continue
            if isinstance(node, ast.Global) and node.end_lineno == node.lineno:
                raw = lines[node.lineno - 1].encode()
                start, end = node.col_offset, node.end_col_offset or node.col_offset
                stub = b"pass".ljust(end - start)
                lines[node.lineno - 1] = (raw[:start] + stub + raw[end:]).decode()
                changed = True
            todo.extend(ast.iter_child_nodes(node))
        if not changed:
            raise
        return symtable.symtable("".join(lines), "<notebook>", "exec")


def _tables(node: ast.AST, scope: Scope, own: dict[int, Scope]) -> None:
    """The symbol table of each def, class, lambda and comprehension under `node`, matched in
    the order CPython's symtable makes them (what runs where a scope is defined comes first:
    defaults, annotations, decorators, bases, a comprehension's first iterable; a dict
    comprehension's value before its key), so that two of a kind on one line get theirs."""
    todo: list[tuple[ast.AST, Scope] | tuple[ast.AST, Scope, bool]] = [(node, scope)]
    while todo:
        item = todo.pop()
        current, where = item[0], item[1]
        if len(item) == 3:  # the scope-making node itself, once its outer parts are done
            inside = own[id(current)] = where.child(current)
            todo.extend((part, inside) for part in reversed(_parts(current, cpython=True)[1]))
            continue
        if isinstance(current, _SCOPED):
            todo.append((current, where, True))
            todo.extend((part, where) for part in reversed(_parts(current, cpython=True)[0]))
        else:
            todo.extend((child, where) for child in reversed(list(ast.iter_child_nodes(current))))


class Module:
    """The notebook's code as one module: `ast` and `symtable` of the same text, walked once.

    The walk keeps, for each node, the names found from where it starts to where it ends (a
    node's names are a contiguous run of the walk, in the order of the source)."""

    def __init__(self, source: str) -> None:
        self.tree = ast.parse(source)
        self.found: list[Found] = []
        self.span: dict[int, tuple[int, int]] = {}
        self.own: dict[int, Scope] = {}  # the scope each def, class, lambda, comprehension makes
        self.declared: list[tuple[int, list[str]]] = []  # `global` statements, where in `found`
        module = Scope(_symtable(source, self.tree), None)
        _tables(self.tree, module, self.own)
        self._walk(self.tree, module)

    def _walk(self, root: ast.AST, scope: Scope) -> None:
        found, span = self.found, self.span
        # a class body's names bound so far (a read before its class binds the name reads the
        # module's: `class Config: lr = lr`); a line's value is read before its target is bound
        bound: dict[Scope, dict[str, At]] = {}
        # the names an assignment over several lines binds, and its last line: its value is
        # read before they are bound (`model, opt = wrap(\n    module=model, ...)` reads them)
        late: dict[int, int] = {}
        met = 0
        stack: list[tuple[ast.AST, Scope] | int] = [(root, scope)]
        while stack:
            top = stack.pop()
            if isinstance(top, int):  # the end of the node whose id this is
                span[top] = (span[top][0], len(found))
                continue
            node, scope = top
            if isinstance(node, _ASSIGNS) and node.end_lineno != node.lineno:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name):
                            late[id(sub)] = node.end_lineno or node.lineno
            span[id(node)] = (len(found), 0)
            stack.append(id(node))
            if isinstance(node, ast.Global):  # an entry of its own, so that spans hold it
                self.declared.append((len(found), node.names))
                found.append((" global", (node.lineno, node.col_offset), scope, False, False))
            name = _name(node)
            if name is not None:
                at: Any = getattr(node, "target", node)
                where = (at.lineno, at.col_offset)
                text, read = name
                if not read:
                    if late:  # bound where the assignment ends, after the lines it reads
                        where = (late.get(id(node), where[0]), where[1])
                    if scope.kind == "class":
                        end = (where[0], 1 << 30)
                        names = bound.setdefault(scope, {})
                        names[text] = min(names.get(text, end), end)
                    found.append((text, where, scope, False, scope.glob))
                else:
                    glob = scope.is_global(text)
                    if not glob and scope.kind == "class" and scope.is_local(text):
                        glob = bound.get(scope, {}).get(text, (1 << 30, 0)) > where
                    elif glob and scope.assigns(text):  # `[y for x in xs if (y := f(x))]`
                        glob = False  # the comprehension's own `:=` binds what it reads
                    found.append((text, where, scope, True, glob))
            if isinstance(node, _SCOPED):
                outer, inner = _parts(node)
                own = self.own[id(node)]
                own.index = met
                met += 1
                # in reverse: the stack gives them back in the order of the source
                stack.extend((part, own) for part in reversed(inner))
                stack.extend((part, scope) for part in reversed(outer))
            else:
                stack.extend((child, scope) for child in reversed(list(ast.iter_child_nodes(node))))

    def _of(self, nodes: Iterable[ast.AST]) -> Iterator[Found]:
        for node in nodes:
            start, end = self.span[id(node)]
            yield from self.found[start:end]

    def declares(self, node: ast.AST) -> tuple[str, ...]:
        """The names `node`'s `global` statements declare, in order, once each."""
        start, end = self.span[id(node)]
        first = bisect.bisect_left(self.declared, start, key=lambda d: d[0])
        out: dict[str, None] = {}
        for at, names in self.declared[first:]:
            if at >= end:
                break
            out.update(dict.fromkeys(names))
        return tuple(out)

    def free_globals(self, node: ast.AST, skip: frozenset[str]) -> tuple[str, ...]:
        """Global names a definition's body reads (not the parts run where it is defined).

        The order is libcst's, which `analyze` gave before and the packages' parameters follow:
        scope by scope, each in order of first use; the scopes in the order of a walk that
        lists a node's children and goes into the last one first (a class's last method before
        its first, a function before the scopes inside it)."""
        named: dict[Scope, dict[str, None]] = {}
        for name, _, scope, read, glob in self._of([node]):
            if scope.glob:
                continue
            names = named.setdefault(scope, {})
            if read and glob and name not in skip:
                names.setdefault(name, None)
        inside: dict[Scope, list[Scope]] = {}
        roots: list[Scope] = []
        for scope in list(named):
            while scope.parent is not None and scope not in inside:
                inside[scope] = []
                if scope.parent.glob:
                    roots.append(scope)
                scope = scope.parent
        for scope in inside:
            if scope.parent is not None and not scope.parent.glob:
                inside[scope.parent].append(scope)
        own = self.own.get(id(node))
        roots.sort(key=lambda s: (s is not own, -s.index))
        found: dict[str, None] = {}
        stack = roots[::-1]
        while stack:
            scope = stack.pop()
            found.update(named.get(scope, {}))
            stack.extend(sorted(inside[scope], key=lambda s: s.index))  # the last popped first
        return tuple(found)

    def reads(
        self, nodes: Iterable[ast.AST], binds: Iterable[str], skip: frozenset[str]
    ) -> tuple[str, ...]:
        """Global names `nodes` read before they bind them, in the order of the source:
        `for x in xs: total += x` reads `total`, not `x`."""
        bound = set(binds)
        reads: dict[str, At] = {}
        assigned: dict[str, At] = {}
        for name, at, _, read, glob in self._of(nodes):
            if name in skip:
                continue
            if not read:
                if name in bound and glob:
                    end = (at[0], 1 << 30)  # a line's value is read before its target is bound
                    assigned[name] = min(assigned.get(name, end), end)
            elif glob:
                reads[name] = min(reads.get(name, at), at)
        ordered = sorted(reads.items(), key=lambda kv: kv[1])
        return tuple(n for n, at in ordered if n not in assigned or at < assigned[n])
