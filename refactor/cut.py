"""
Edits of a few functions of a big module without libcst's round trip of the whole module.

Parsing a generated 5,000-line `train.py` with libcst and writing its code back costs more than
the edit itself (about 0.3 s each way). The transformers that annotate and check the package
(`annotate.SetAnnotations`, `typecheck._Edit`) change only the signatures and decorators of the
top-level functions and the methods of top-level classes they name (`typecheck` uses it;
`annotate.apply` does not: it changes most functions of a module, so cutting them out saved
nothing there, measured). `edit_functions` cuts each
of those out by its lines (Python's `ast` finds them), runs the transformer on it alone (a method
inside `class Name:`) and puts the text back; `insert_after_imports` puts lines where
`typeexpr.add_imports` would. Anything else (a named function inside an `if` or a nested class,
a module without a lone import, "\r" in the text) goes through libcst as before: the text is the
same either way (tests/test_refactor_typecheck_edit.py compares them).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Collection

import libcst as cst


def _spans(tree: ast.Module, wanted: Collection[str]) -> list[tuple[int, int, str]] | None:
    """(first line, last line, enclosing class or "") of each function a `ByQualname`
    transformer that does not enter functions would meet under a wanted name; None when one of
    them is not a top-level function or a method of a top-level class."""
    spans: list[tuple[int, int, str]] = []
    whole = False

    def visit(body: list[ast.stmt], stack: list[str], direct: bool) -> None:
        nonlocal whole
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if ".".join([*stack, node.name]) in wanted:
                    whole |= not direct
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    spans.append((first, node.end_lineno or node.lineno, ".".join(stack)))
            elif isinstance(node, ast.ClassDef):
                visit(node.body, [*stack, node.name], direct and not stack)
            else:  # if/for/while/with/try/match: the transformer looks inside, same classes
                inner: list[ast.stmt] = []
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        inner.append(child)
                    elif isinstance(child, ast.ExceptHandler | ast.match_case):
                        inner.extend(child.body)
                visit(inner, stack, False)

    visit(tree.body, [], True)
    return None if whole else spans


def edit_functions(
    code: str, wanted: Collection[str], transformer: Callable[[], cst.CSTTransformer]
) -> str:
    """`cst.parse_module(code).visit(transformer()).code`, for a transformer that changes only
    the functions named in `wanted` (qualnames, `Class.method`) and does not enter functions."""
    try:
        spans = _spans(ast.parse(code), wanted) if "\r" not in code else None
    except (SyntaxError, ValueError):
        spans = None
    if spans is None:
        return cst.parse_module(code).visit(transformer()).code
    lines = code.split("\n")  # ast's line numbers: no "\r" (checked above)
    for first, last, owner in sorted(spans, reverse=True):
        head = f"class {owner}:\n" if owner else ""
        end = "\n" if last < len(lines) else ""
        part = cst.parse_module(head + "\n".join(lines[first - 1 : last]) + end)
        text = part.visit(transformer()).code[len(head) :]
        lines[first - 1 : last] = [text.removesuffix(end) if end else text]
    return "\n".join(lines)


def insert_after_imports(code: str, text: str, fallback: Callable[[cst.Module], cst.Module]) -> str:
    """`text` (whole lines) after the last top-level import alone on its lines (a statement line
    of one import, what `typeexpr.add_imports` counts); `fallback(tree).code` without one."""
    try:
        body = ast.parse(code).body if "\r" not in code else []
    except (SyntaxError, ValueError):
        body = []
    after = 0
    for i, node in enumerate(body):
        alone = (i == 0 or body[i - 1].end_lineno != node.lineno) and (
            i + 1 == len(body) or body[i + 1].lineno != node.end_lineno
        )
        if isinstance(node, ast.Import | ast.ImportFrom) and alone:
            after = node.end_lineno or node.lineno
    lines = code.split("\n")
    if not after or after >= len(lines):
        return fallback(cst.parse_module(code)).code
    return "\n".join([*lines[:after], text.removesuffix("\n"), *lines[after:]])
