"""
Step 2: parse every code cell with libcst and say what each top-level statement is.

Each statement becomes an `Item`: an import, a function, a class, a constant (a name bound to a
literal: a hyperparameter), or a plain statement (notebook state: `model = Net()`, the loop, a
print). Python's own scope analysis (`globalnames`) gives, for every function and class, the
global names it reads (its free variables); for a statement, the names it reads and binds.
`if __name__ == "__main__":` gates are opened (their body is top-level code of a script). A cell
that does not parse is a `BadCell` with its line (assignment placeholders like `<YOUR CODE>` are
common).
"""

from __future__ import annotations

import ast
import bisect
import builtins
import dataclasses
import io
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from .binds import bound, import_names, imported_again
from .globalnames import Module, lines_of
from .read import CodeCell, Notebook

Kind = Literal["import", "function", "class", "constant", "statement"]
FUTURE = re.compile(r"^from __future__ import [^\n]*$", re.M)
FUTURE_DROPPED = "pass  # trainmate: dropped (a __future__ import)"
# What IPython puts in a notebook's namespace, and the import that binds each in a module
IPYTHON_NAMES = {
    "display": "from IPython.display import display",
    "get_ipython": "from IPython import get_ipython",
}
BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__", *IPYTHON_NAMES}


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
    text: str = ""  # the statement's lines as the cell has them (for cheap tests of its text)
    # its place among the notebook's statements: `line` is the cell's, which the statements an
    # inlined `%run` put in its place share
    index: int = 0

    @property
    def code(self) -> str:
        return cst.Module([]).code_for_node(self.node)


@dataclass(frozen=True)
class BadCell:
    cell: int
    line: int
    message: str
    kept: tuple[str, ...] = ()  # its import lines, kept for the cells after it


@dataclass
class Analysis:
    items: list[Item] = field(default_factory=list)
    bad: list[BadCell] = field(default_factory=list)


def analyze(nb: Notebook) -> Analysis:
    """Check each cell alone, then analyse the good ones as the one module they are.

    The cells of a notebook share one global scope, so they are parsed and scope-analysed
    together, once (per-cell metadata resolution cost more than the analysis itself).
    """
    out = _analyze(nb)
    for index, item in enumerate(out.items):
        item.index = index
    imported_again(out.items)
    return out


def _analyze(nb: Notebook) -> Analysis:
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
            kept = _imports_of(cell.python)
            at = cell.source_line(exc.lineno or 1)
            out.bad.append(BadCell(cell.number, at, exc.msg, tuple(kept.values())))
            if kept:  # the cell's own lines, the rest blank: the imports keep their line numbers
                lines = lines_of(cell.python)
                text = "".join(
                    line if n in kept else line[len(line.rstrip("\r\n")) :]
                    for n, line in enumerate(lines)
                )
                good.append(dataclasses.replace(cell, python=text))
            continue
        good.append(cell)
    starts: list[int] = []
    parts: list[str] = []
    line = 1
    for cell in good:
        text = cell.python if cell.python.endswith(("\n", "\r")) else cell.python + "\n"
        starts.append(line)
        parts.append(text)
        line += len(lines_of(text))
    try:
        module = cst.parse_module("".join(parts))
    except cst.ParserSyntaxError:  # one cell libcst cannot read: find it, analyse the rest
        for cell in good:
            try:
                cst.parse_module(cell.python)
            except cst.ParserSyntaxError as exc:
                at = cell.source_line(exc.raw_line)
                out.bad.append(BadCell(cell.number, at, exc.message.splitlines()[0]))
        bad = {b.cell for b in out.bad}
        nb_rest = Notebook(nb.path, [c for c in good if c.number not in bad])
        out.items = _analyze(nb_rest).items
        return out
    source = "".join(parts)
    try:
        names = Module(source)
    except SyntaxError as exc:  # CPython refuses the cells as one module: that cell goes
        index = max(bisect.bisect_right(starts, exc.lineno or 1) - 1, 0)
        cell = good[index]
        at = cell.source_line((exc.lineno or 1) - starts[index] + 1)
        out.bad.append(BadCell(cell.number, at, exc.msg))
        rest = Notebook(nb.path, [c for c in good if c.number != cell.number])
        again = _analyze(rest)
        out.items, out.bad = again.items, [*out.bad, *again.bad]
        return out
    lines = lines_of(source)
    for statement, same in _paired(list(module.body), names.tree.body):
        # where the statement starts (a decorated definition: its `def` or `class` line), as
        # libcst's PositionProvider says (the same on the 143 notebooks of our corpora), from
        # the ast: the provider generated the whole module's code to find out
        at = same[0].lineno
        decorated = getattr(same[0], "decorator_list", [])
        first = min([at, *(d.lineno for d in decorated)])
        index = bisect.bisect_right(starts, at) - 1
        cell = good[index]
        item = _item(cell, statement, cell.source_line(at - starts[index] + 1), names, same)
        last = max(s.end_lineno or s.lineno for s in same)
        item.text = "".join(lines[first - 1 : last])  # ast's lines: "\u2028" ends none
        out.items.append(item)
    for item in out.items:
        if item.cell.train_options is not None and item.kind in ("statement", "constant"):
            item.train_cell = True
            item.kind = "statement"
    return out


def _imports_of(python: str) -> dict[int, str]:
    """The top-level one-line imports of a cell that does not parse, by line index: an exercise
    notebook's cell with a `<YOUR CODE>` placeholder often imports what later cells use
    (Practical RL's `import matplotlib.pyplot as plt`); refusing the cell lost the import, and
    every later `plt` was an undefined name."""
    kept: dict[int, str] = {}
    inside = _not_starts(python)
    for n, line in enumerate(lines_of(python)):
        if not line.startswith(("import ", "from ")) or n in inside:
            continue
        try:
            tree = ast.parse(line)
        except (SyntaxError, ValueError):  # ValueError: a null byte (Python 3.11)
            continue  # a parenthesised import over several lines, or not an import at all
        if len(tree.body) == 1 and isinstance(tree.body[0], ast.Import | ast.ImportFrom):
            kept[n] = line.rstrip("\r\n")
    return kept


def _not_starts(python: str) -> set[int]:
    """The lines (by index) that are not the start of a statement: those a string spanning
    several lines continues or ends on, and those inside brackets, as far as the cell tokenizes
    (a placeholder such as `<YOUR CODE>` does; an unclosed string ends it, and the lines from
    there on count as inside)."""
    inside: set[int] = set()
    depth = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(python).readline):
            if depth > 0:
                inside.add(token.start[0] - 1)
            if token.type == tokenize.OP and token.string in ("(", "[", "{"):
                depth += 1
            elif token.type == tokenize.OP and token.string in (")", "]", "}"):
                depth = max(depth - 1, 0)
            if token.start[0] < token.end[0] and token.type == tokenize.STRING:
                inside.update(range(token.start[0], token.end[0]))  # 1-based rows: the next ones
    except tokenize.TokenError as exc:  # ("EOF in multi-line string", (row, column))
        inside.update(range(max(exc.args[1][0] - 1, 0), len(lines_of(python))))
    except SyntaxError as exc:  # IndentationError: a line that dedents to no outer level
        inside.update(range(max((exc.lineno or 1) - 1, 0), len(lines_of(python))))
    return inside


def _paired(
    body: Sequence[cst.BaseStatement], same: list[ast.stmt], gates: bool = True
) -> list[tuple[cst.BaseStatement, list[ast.stmt]]]:
    """Top-level statements with `if __name__ == "__main__":` gates replaced by their body, each
    with the `ast` statements of its text (a line `a = 1; b = 2` is one libcst statement)."""
    opened: list[tuple[cst.BaseStatement, list[ast.stmt]]] = []
    at = 0
    for statement in body:
        count = len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
        group, at = same[at : at + count], at + count
        if gates and isinstance(statement, cst.If) and _main_gate(statement):
            block = statement.body
            if isinstance(block, cst.IndentedBlock) and isinstance(group[0], ast.If):
                opened.extend(_paired(block.body, group[0].body, gates=False))
                continue
        opened.append((statement, group))
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
    cell: CodeCell, node: cst.BaseStatement, line: int, names: Module, same: list[ast.stmt]
) -> Item:
    if isinstance(node, cst.FunctionDef | cst.ClassDef):
        kind: Kind = "function" if isinstance(node, cst.FunctionDef) else "class"
        defined = same[0]
        reads = names.free_globals(defined, BUILTINS)
        declares = names.declares(defined)
        at_definition = _at_definition(names, defined)
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
            return Item(cell, line, "import", node, None, import_names(small))
        constant = _constant(same[0])
        if constant is not None:
            name, value = constant
            return Item(cell, line, "constant", node, name, (name,), (), value)
    declares = tuple(dict.fromkeys(n for part in same for n in names.declares(part)))
    binds = bound(node)
    reads = names.reads(same, binds, BUILTINS)
    return Item(cell, line, "statement", node, None, binds, reads, declares=declares)


def _at_definition(names: Module, node: ast.stmt) -> tuple[str, ...]:
    """What a def's decorators, defaults and parameter annotations read, and a class's bases,
    keywords, and its methods' decorators and defaults: run when the definition runs."""
    heads: list[ast.AST] = []
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        args = node.args
        heads += node.decorator_list
        heads += [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        heads += [a.annotation for a in every if a.annotation is not None]
    elif isinstance(node, ast.ClassDef):
        heads += [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]
        for method in node.body:  # evaluated when the class body runs
            if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
                args = method.args
                heads += [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
                heads += method.decorator_list
    outer: dict[str, None] = {}
    for head in heads:
        outer.update(dict.fromkeys(names.reads([head], (), BUILTINS)))
    return tuple(outer)


def _constant(node: ast.stmt) -> tuple[str, object] | None:
    """`NAME = <literal>` or `NAME: T = <literal>`: a hyperparameter."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return None
    if not isinstance(target, ast.Name):
        return None
    try:
        literal = ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not _plain(literal):
        return None
    return target.id, literal


def _plain(value: object, depth: int = 0) -> bool:
    """A hyperparameter's value: a scalar, a short list of one kind of scalar, or a dict of
    those by string keys, one level of nested dicts at most (a notebook's `config = {"model":
    {...}, "training": {...}}`: a `Config` field set from JSON on the command line)."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, tuple | list) and value and len(value) <= 16:
        kinds = {type(v) for v in value}
        return len(kinds) == 1 and kinds <= {int, float, str, bool}
    if isinstance(value, dict) and value and len(value) <= 16 and depth < 2:
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False
