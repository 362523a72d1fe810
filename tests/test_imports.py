"""No import cycle between the package's modules (standard library only: `ast`).

Every import counts, at module level or inside a function, except those under
`if TYPE_CHECKING:` (never run). Only imports of the package's own modules are edges.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import jupyter_trainmate

PACKAGE = Path(jupyter_trainmate.__file__).parent
NAME = PACKAGE.name


def _python_files() -> list[Path]:
    # os.walk with followlinks: `jupyter_trainmate/refactor` is a link to the repository's
    # `refactor/` in a checkout (the wheel maps it there), and its imports count too.
    return sorted(
        Path(folder) / name
        for folder, _, names in os.walk(PACKAGE, followlinks=True)
        for name in names
        if name.endswith(".py")
    )


def modules() -> dict[str, Path]:
    found = {}
    for path in _python_files():
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `module` imports."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            names = [f"{stem}.{alias.name}" for alias in node.names] + [stem]
        for name in names:
            while name and name not in known:  # `from .x import function`: the module x
                name = name.rpartition(".")[0]
            if name.startswith(NAME) and name != module:
                targets.add(name)
    return targets


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {module: imported(module, path, known) for module, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle is not None:
                return cycle
    return None


def test_the_graph_sees_relative_absolute_and_function_level_imports() -> None:
    graph = import_graph()
    assert "jupyter_trainmate.runtime.session" in graph["jupyter_trainmate.runner"]
    assert "jupyter_trainmate.errors" in graph["jupyter_trainmate.runtime.guards"]  # from ..errors
    assert "jupyter_trainmate.runner" in graph["jupyter_trainmate"]  # inside a function
    assert "jupyter_trainmate.refactor.pipeline" in graph["jupyter_trainmate.cli"]  # the link
    # `if TYPE_CHECKING:` imports are not edges
    assert "jupyter_trainmate.runtime.session" not in graph["jupyter_trainmate.display.live"]


def test_find_cycle_reports_the_path() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle_between_the_packages_modules() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
