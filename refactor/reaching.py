"""
Which binding of a local name reaches a point of a function, where the function's top level makes
that certain: the flow-sensitive part of the static types.

`Scope` is flow-insensitive: a name has a type when every binding of it gives the same one. A
section function that rebinds a name (`model = LSTM(...)`, later `model, criterion =
to_device(model, criterion)`) then has no type for it, and the function it is passed to none for
its parameter: a cycle no round breaks. Top-level statements of a function body run once each, in
order, so at a point in top-level statement `k` the binding that reaches it is the last one in the
statements before `k`, when that is one simple assignment (`x = ...`, `x += ...`) and statement `k`
itself binds the name nowhere before the point (a simple statement binds its targets after
evaluating its value; a compound one, a loop above all, may bind it anywhere).

Where the statements after that last simple assignment (or after the parameter, with none)
rebind the name only inside compound statements (`if normalize: x = (x - x.mean()) / x.std()`,
a loop that updates it), the point is reached by that assignment or by one of those bindings:
`Updated` lists them, and `scope` gives the name the assignment's type when every one of those
bindings, typed with the name holding that type, gives it again (a type the updates keep).

It gives up (None: the flow-insensitive type stands) for names declared `global` or `nonlocal`,
bound by `:=`, by a nested def, class or import, or by an annotated assignment.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Literal

Source = tuple[str, ast.AST, tuple[int, ...]]  # as in `scope`: (kind, node, path)
SIMPLE = (ast.Assign, ast.AugAssign, ast.Expr, ast.Return)


@dataclass(frozen=True)
class Updated:
    """The last simple assignment before the point (or the parameter) and the bindings inside
    the compound statements between it and the point, any of which may reach it."""

    base: Source | Literal["param"]
    updates: tuple[Source, ...]


class Reaching:
    def __init__(self, body: list[ast.stmt], bindings: dict[str, list[Source]]) -> None:
        self.body = body
        self.bindings = bindings
        # node -> where it stands: the statements holding it, outermost first, each as (the
        # block it is in, its index there); the walk goes down into the branches of an `if`
        # (both run in order from the `if`), not into loops, `with` or `try`
        self.trail: dict[int, tuple[tuple[int, int], ...]] = {}
        self.blocks: dict[int, list[ast.stmt]] = {id(body): body}
        self.unsure: set[str] = set()  # `:=` targets, globals, nested definitions and imports
        self._place(body, ())

    def _place(self, block: list[ast.stmt], outer: tuple[tuple[int, int], ...]) -> None:
        for index, statement in enumerate(block):
            trail = (*outer, (id(block), index))
            todo: list[ast.AST] = [statement]
            while todo:
                node = todo.pop()
                self.trail[id(node)] = trail
                if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                    self.unsure.add(node.target.id)
                elif isinstance(node, ast.Global | ast.Nonlocal):
                    self.unsure.update(node.names)
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    self.unsure.add(node.name)
                elif isinstance(node, ast.Import | ast.ImportFrom):
                    self.unsure.update((a.asname or a.name).split(".")[0] for a in node.names)
                if node is statement and isinstance(node, ast.If):
                    todo.append(node.test)
                    for branch in (node.body, node.orelse):
                        self.blocks[id(branch)] = branch
                        self._place(branch, trail)
                    continue
                todo.extend(ast.iter_child_nodes(node))

    def source(self, name: str, where: ast.AST) -> Source | Literal["param"] | Updated | None:
        """The binding of `name` that reaches `where` ("param": none before it, the parameter's
        value), or None where the function's statements do not make it certain. The statements
        that surely ran before `where`, in order: those before it in its block, then those
        before the `if` that holds that block in the block around it, and so on up."""
        point = self.trail.get(id(where))
        sources = self.bindings.get(name)
        if point is None or not sources or name in self.unsure:
            return None
        line: list[ast.stmt] = []  # the statements that ran before, then the point's own
        position: dict[tuple[int, int], int] = {}
        for block, index in point:
            statements = self.blocks[block]
            for i in range(index):
                position[(block, i)] = len(line)
                line.append(statements[i])
        position[point[-1]] = len(line)
        line.append(self.blocks[point[-1][0]][point[-1][1]])
        at = len(line) - 1
        placed: list[tuple[int, Source]] = []
        for source in sources:
            kind, node, _ = source
            if kind == "ann":
                return None
            if kind == "param":
                continue  # the parameter itself: before every statement
            trail = self.trail.get(id(node))
            if trail is None:
                return None
            # the statement of `line` it stands in: the first of its trail that `line` holds
            # (none: after the point, or in the other branch of an `if` the point is in)
            found = next((position[t] for t in trail if t in position), None)
            if found is not None:
                placed.append((found, source))
        if any(i == at for i, _ in placed) and not isinstance(line[at], SIMPLE):
            return None  # a compound statement may bind it before the point
        before = [(i, s) for i, s in placed if i < at]
        if not before:
            return "param" if any(s[0] == "param" for s in sources) else None
        last = max(i for i, _ in before)
        here = [s for i, s in before if i == last]
        if len(here) == 1 and isinstance(line[last], ast.Assign | ast.AugAssign):
            return here[0]
        return self._updated(sources, before, line)

    def _updated(
        self, sources: list[Source], before: list[tuple[int, Source]], line: list[ast.stmt]
    ) -> Updated | None:
        """The last simple assignment before the point and the bindings in compound statements
        after it; None where another simple statement binds it there (an unpacking, a second
        target) or nothing simple comes first and the name is no parameter."""
        simple = [i for i, _ in before if isinstance(line[i], ast.Assign | ast.AugAssign)]
        start = max(simple, default=-1)
        base: Source | Literal["param"]
        if start >= 0:
            here = [s for i, s in before if i == start]
            if len(here) != 1:
                return None
            base = here[0]
        elif any(s[0] == "param" for s in sources):
            base = "param"
        else:
            return None
        updates = tuple(s for i, s in before if i > start)
        if any(isinstance(line[i], SIMPLE) for i, _ in before if i > start):
            return None
        return Updated(base, updates)
