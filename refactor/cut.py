"""
Edits of a few functions of a big module without libcst's round trip of the whole module.

Parsing a generated 5,000-line `train.py` with libcst and writing its code back costs more than
the edit itself (about 0.3 s each way). The transformers that annotate and check the package
(`annotate.SetAnnotations`, `typecheck._Edit`) change only the signatures and decorators of the
top-level functions and the methods of top-level classes they name. `edit_headers` cuts each
of those out by its lines (Python's `ast` finds them) down to the line before its body, runs the
transformer on that alone (with `pass` for a body; a method inside `class Name:`) and puts the
text back: the bodies, most of the module, are never parsed or written again (annotating 500
real cells' package: 1.6 s -> 0.5 s). `insert_after_imports` puts lines where
`typeexpr.add_imports` would. Anything else (a named function inside an `if` or a nested class,
a module without a lone import, "\r" in the text) goes through libcst as before: the text is the
same either way (tests/test_refactor_typecheck_edit.py compares them).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Collection, Iterator

import libcst as cst

Span = tuple[int, int, str, ast.FunctionDef | ast.AsyncFunctionDef]


def _spans(tree: ast.Module, wanted: Collection[str]) -> list[Span] | None:
    """(first line, last line, enclosing class or "", the node) of each function a `ByQualname`
    transformer that does not enter functions would meet under a wanted name; None when one of
    them is not a top-level function or a method of a top-level class."""
    spans: list[Span] = []
    whole = False

    def visit(body: list[ast.stmt], stack: list[str], direct: bool) -> None:
        nonlocal whole
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if ".".join([*stack, node.name]) in wanted:
                    whole |= not direct
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    spans.append((first, node.end_lineno or node.lineno, ".".join(stack), node))
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


@functools.lru_cache(maxsize=16)
def parsed(code: str) -> ast.Module | None:
    """`ast.parse(code)`, None where it does not parse. The rounds ask for the tree of one
    module's code several times (the errors' functions, the types to ask mypy for, the headers
    to edit), a tree of a 3,000-line module about 40 ms each: the last codes' trees are kept.
    Shared: the caller must not change the tree."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def statements(nodes: list[ast.stmt], scopes: bool = True) -> Iterator[ast.stmt]:
    """Every statement in `nodes` and in their bodies (functions, classes, branches, handlers,
    cases), the expressions not entered: what `ast.walk` finds of the statement kinds (function
    definitions, imports) in a fraction of its time. Without `scopes`, the bodies of functions
    and classes are not entered (what runs in the scope of `nodes` only)."""
    for node in nodes:
        yield node
        if not scopes and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from statements(inner, scopes)
        for part in [*getattr(node, "handlers", ()), *getattr(node, "cases", ())]:
            yield from statements(part.body, scopes)


def edit_headers(
    code: str, wanted: Collection[str], transformer: Callable[[], cst.CSTTransformer]
) -> str:
    """`cst.parse_module(code).visit(transformer()).code`, for a transformer that changes only
    the decorators, parameters and returns of the functions named in `wanted` (qualnames,
    `Class.method`) and does not enter functions. Each is cut out down to the line before its
    body, with `pass` for a body; one whose body starts on its `def`'s last line, whole."""
    tree = parsed(code) if "\r" not in code else None
    spans = _spans(tree, wanted) if tree is not None else None
    if spans is None:
        return cst.parse_module(code).visit(transformer()).code
    lines = code.split("\n")
    # transformed in the order of the source (a transformer may keep state from one function
    # to the next: `annotate`'s renderer picks the short name of a type where it first meets
    # it), put back from the last so that earlier line numbers still hold
    edits: list[tuple[int, int, str]] = []
    for first, last, owner, node in sorted(spans, key=lambda s: s[0]):
        head = f"class {owner}:\n" if owner else ""
        inner = node.body[0]
        start = min([inner.lineno, *(d.lineno for d in getattr(inner, "decorator_list", []))])
        text = lines[start - 1]
        indent = text[: len(text) - len(text.lstrip())]
        if start <= node.lineno or not text[: inner.col_offset].isspace():
            end = "\n" if last < len(lines) else ""  # a body on the signature's line: all of it
            part = cst.parse_module(head + "\n".join(lines[first - 1 : last]) + end)
            done = part.visit(transformer()).code[len(head) :]
            edits.append((first, last, done.removesuffix(end) if end else done))
            continue
        stub = "\n".join(lines[first - 1 : start - 1]) + f"\n{indent}pass\n"
        done = cst.parse_module(head + stub).visit(transformer()).code[len(head) :]
        kept = done.removesuffix(f"{indent}pass\n")
        if kept == done:  # not expected: the stub's last line is the `pass` it was given
            raise ValueError(f"edit_headers: the stub of line {first} lost its body")
        edits.append((first, start - 1, kept.removesuffix("\n")))
    for first, last, text in reversed(edits):
        lines[first - 1 : last] = [text]
    return "\n".join(lines)


def insert_after_imports(code: str, text: str, fallback: Callable[[cst.Module], cst.Module]) -> str:
    """`text` (whole lines) after the last top-level import alone on its lines (a statement line
    of one import, what `typeexpr.add_imports` counts); `fallback(tree).code` without one."""
    tree = parsed(code) if "\r" not in code else None
    body = tree.body if tree is not None else []
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
