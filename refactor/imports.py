"""
Step 4b: the imports each module needs. Every name the notebook imports maps to one import
statement that binds only it; a module imports what its code uses: the notebook's imports,
the definitions of other modules of the package, the constants of `config`. A name the package
defines itself is not also imported (no `F811`); a definition that reads it first (`class
DeepGP(DeepGP):` over the imported one) reads it under an alias its module imports. A module
that uses a name nothing in the notebook binds gets the notebook's star imports (`from
miniai.datasets import *`), where such names come from. A name imported from where IPython 9 no
longer has it (`from IPython.core.display import display`) is imported from `IPython.display`,
with a warning in the report.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import libcst as cst

from .plan import Plan
from .read import Note
from .transform import aliased_import, rename_in
from .walk import names

CONFIG_NAMES = frozenset({"Config", "resolve_device"})
# Names IPython 8 moved out of `IPython.core.display` (IPython 9 no longer has them there):
# `IPython.display`, the public module, has had each of them since IPython 1.
MOVED = {
    ("IPython.core.display", name): "IPython.display"
    for name in ("display", "clear_output", "update_display", "publish_display_data")
} | {
    # removed in IPython 9; IPython 7.23 said to import it from there
    (module, "set_matplotlib_formats"): "matplotlib_inline.backend_inline"
    for module in ("IPython.display", "IPython.core.display")
}


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def names_in(code: str) -> set[str]:
    """Every `Name` libcst would find in `code` (see `walk.names`), read from Python's own `ast`
    (a tenth of libcst's parse): each identifier its nodes hold in a field or a dotted module
    name; `True`, `False`, `None` are names to libcst. libcst's reading when `ast` cannot."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        try:
            return names(cst.parse_module(code))
        except cst.ParserSyntaxError:
            return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Constant):
            if node.value is None or node.value is True or node.value is False:
                found.add(repr(node.value))
        elif isinstance(node, ast.alias):
            found.update(node.name.split(".") if node.name != "*" else ())
            found.update(() if node.asname is None else (node.asname,))
        elif isinstance(node, ast.ImportFrom):
            found.update(node.module.split(".") if node.module else ())
        elif isinstance(node, ast.Global | ast.Nonlocal):
            found.update(node.names)
        elif isinstance(node, ast.MatchClass):
            found.update(node.kwd_attrs)
        else:
            for field in ("attr", "name", "arg", "rest"):
                value = getattr(node, field, None)
                if isinstance(value, str):
                    found.add(value)
    return found


@dataclass(frozen=True)
class Imports:
    lines: dict[str, str]  # bound name -> the import statement binding only it
    stars: tuple[str, ...]  # the notebook's `from x import *` lines
    notes: tuple[Note, ...]


def imports_of(plan: Plan) -> Imports:
    """Each name the notebook imports -> one import statement that binds only it."""
    lines: dict[str, str] = {}
    stars: list[str] = []
    notes: list[Note] = []
    where: dict[str, tuple[int, int]] = {}
    for item in plan.imports:
        where.update(dict.fromkeys(item.binds, (item.cell.number, item.line)))
        small = item.node.body[0]  # type: ignore[attr-defined]
        if isinstance(small, cst.Import):
            for alias in small.names:
                single = small.with_changes(
                    names=[alias.with_changes(comma=cst.MaybeSentinel.DEFAULT)]
                )
                bound = (
                    alias.asname.name.value  # type: ignore[union-attr]
                    if alias.asname is not None
                    else _code(alias.name).split(".")[0]
                )
                lines.setdefault(bound, _code(single).strip())
        elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            for alias in small.names:
                one = small.with_changes(
                    names=[alias.with_changes(comma=cst.MaybeSentinel.DEFAULT)],
                    lpar=None,
                    rpar=None,
                )
                bound = (
                    alias.asname.name.value  # type: ignore[union-attr]
                    if alias.asname is not None
                    else _code(alias.name)
                )
                source = _code(small.module) if small.module and not small.relative else ""
                moved = MOVED.get((source, _code(alias.name)))
                if moved is not None:
                    one = one.with_changes(module=cst.parse_expression(moved))
                    notes.append(
                        Note(
                            item.cell.number,
                            item.line,
                            "warning",
                            f"`{_code(alias.name)}` imported from `{moved}`: `{source}` no "
                            "longer has it (IPython 9)",
                        )
                    )
                lines.setdefault(bound, _code(one).strip())
        elif isinstance(small, cst.ImportFrom):
            stars.append(_code(small).strip())
            notes.append(
                Note(
                    item.cell.number,
                    item.line,
                    "kept",
                    f"`{_code(small).strip()}`: imported by every module that uses a name it "
                    "may define",
                )
            )
    for name in sorted(set(lines) & set(plan.placed)):
        cell, line = where.get(name, (0, 0))
        notes.append(
            Note(
                cell,
                line or None,
                "warning",
                f"{name}: imported, and defined by the notebook: the package uses its definition",
            )
        )
    return Imports(lines, tuple(dict.fromkeys(stars)), tuple(notes))


def self_import(imports: Imports, node: cst.BaseStatement, name: str, taken: set[str]) -> Any:
    """A definition that reads the imported name it binds where it is defined (`class
    DeepGP(DeepGP):` over gpytorch's `DeepGP`, a decorator or a default of that name), with
    those reads renamed to an alias its module imports (`from ... import DeepGP as
    DeepGP_import`): importing the name itself and then redefining it works, but mypy rejects
    it (no-redef) and takes every later use for the imported one. Else `node` unchanged."""
    line = imports.lines.get(name)
    if line is None or not isinstance(node, cst.ClassDef | cst.FunctionDef):
        return node
    if isinstance(node, cst.ClassDef):
        outer: list[cst.CSTNode] = [*node.bases, *node.keywords, *node.decorators]
    else:
        params = node.params
        every = [*params.posonly_params, *params.params, *params.kwonly_params]
        outer = [p.default for p in every if p.default is not None]
        outer += [p.annotation for p in every if p.annotation is not None]
        outer += [*node.decorators] + ([node.returns] if node.returns is not None else [])
    if not any(name in names(part) for part in outer):
        return node
    alias = f"{name}_import"
    while alias in taken or alias in imports.lines:
        alias += "_"
    statement = aliased_import(cst.parse_statement(line), name, alias)
    if statement is None:
        return node  # `import a.b` binds `a`: no alias binds the same
    imports.lines[alias] = _code(statement).strip()
    rename = {name: alias}
    if isinstance(node, cst.ClassDef):
        return node.with_changes(
            bases=[rename_in(b, rename) for b in node.bases],
            keywords=[rename_in(k, rename) for k in node.keywords],
            decorators=[rename_in(d, rename) for d in node.decorators],
        )
    return node.with_changes(
        params=rename_in(node.params, rename),
        decorators=[rename_in(d, rename) for d in node.decorators],
        returns=rename_in(node.returns, rename) if node.returns is not None else None,
    )


def header(plan: Plan, imports: Imports, module: str, body: str, extra: Iterable[str] = ()) -> str:
    """The imports `body` needs: the notebook's, other modules' definitions, constants."""
    used = names_in(body) | set(extra)
    own = {n for n, p in plan.placed.items() if p.module == module}
    lines = [
        imports.lines[n]
        for n in sorted(used)
        if n in imports.lines and n not in plan.placed and n not in plan.module_state
    ]
    local: dict[str, list[str]] = {}
    for name in sorted(used):
        where = plan.module_of(name)
        if where is not None and where != module:
            local.setdefault(where, []).append(name)
        elif (
            (name in plan.constants or name in CONFIG_NAMES)
            and module != "config"
            and name not in own
        ):
            local.setdefault("config", []).append(name)
    lines += [f"from .{mod} import {', '.join(names)}" for mod, names in sorted(local.items())]
    if imports.stars and used & set(plan.unknown):
        lines += list(imports.stars)
    return "\n".join(["from __future__ import annotations", "", *sorted(set(lines))]) + "\n"
