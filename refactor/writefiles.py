"""
Step 4c: the files the notebook wrote with `%%writefile`, as the package holds them.

A Python file a notebook writes is often a piece of its own script, run back in the notebook's
namespace with `%run -i file.py`: it uses the notebook's imports (`torch`, `nn`, `optim`) without
importing them. Copied as written, it fails on its first line outside the notebook. Each name the
file reads, binds nowhere and the notebook imports gets that one import at the top of the file
(the same statement the package's modules use), under a comment that says so; the rest of the
file is kept as the notebook wrote it. Files that are not Python, or do not parse, are copied as
they are.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from collections.abc import Iterable
from pathlib import PurePosixPath

from .imports import Imports

BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__"}
HEADER = "# trainmate refactor: the notebook's imports this file uses (it ran in the notebook)\n"


def free_names(code: str, path: str) -> set[str]:
    """Global names `code` reads that it never binds (nor are builtins); empty if it does not
    parse."""
    try:
        top = symtable.symtable(code, path, "exec")
    except (SyntaxError, ValueError):
        return set()
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    bound |= {s.get_name() for s in top.get_symbols() if s.is_namespace()}
    read: set[str] = set()
    todo = [top]
    while todo:
        table = todo.pop()
        todo.extend(table.get_children())
        for symbol in table.get_symbols():
            if symbol.is_declared_global() and symbol.is_assigned():
                bound.add(symbol.get_name())  # `global x; x = 1` in a function
            if not symbol.is_referenced():
                continue
            if table is top or (symbol.is_global() and not symbol.is_declared_global()):
                read.add(symbol.get_name())
    return read - bound - BUILTINS


def with_imports(path: str, text: str, imports: Imports) -> str:
    """`text` with the notebook's imports of the names it uses and never binds (a `.py` only)."""
    if not path.endswith(".py"):
        return text
    lines = sorted(
        {imports.lines[n] for n in free_names(text, path) if n in imports.lines}
        - {line for line in imports.lines.values() if line.startswith("from .")}
    )
    if not lines:
        return text
    head, rest = "", text
    while rest.startswith(("#!", "# -*-", "# vim:")):  # a shebang or an encoding line stays first
        first, _, rest = rest.partition("\n")
        head += first + "\n"
    return head + HEADER + "".join(f"{line}\n" for line in lines) + "\n" + rest


def imported_modules(statements: Iterable[str]) -> set[str]:
    """The modules import statements name (`import a.b`: `a.b`; `from a import b`: `a` and
    `a.b`, which may be a module too)."""
    found: set[str] = set()
    for code in statements:
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def module_names(path: str) -> set[str]:
    """The names an import could reach the file `path` by (`prep/v1.py`: `prep.v1`, and `v1`
    from its own folder on `sys.path`); none for a file that is not Python."""
    pure = PurePosixPath(path)
    if pure.suffix != ".py":
        return set()
    return {".".join(pure.with_suffix("").parts), pure.stem}
