"""
Step 4b: the imports each module needs. Every name the notebook imports maps to one import
statement that binds only it; a module imports what its code uses: the notebook's imports,
the definitions of other modules of the package, the constants of `config`. A name the package
defines itself is never also imported (no `F811`), and a module that uses a name nothing in the
notebook binds gets the notebook's star imports (`from miniai.datasets import *`), where such
names come from.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from .plan import Plan
from .read import Note

CONFIG_NAMES = frozenset({"Config", "resolve_device"})


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def names_in(code: str) -> set[str]:
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError:
        return set()
    return {n.value for n in m.findall(module, m.Name()) if isinstance(n, cst.Name)}


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
