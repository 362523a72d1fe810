"""
Give each batch loop a retry point for out-of-memory errors (runtime: `runtime.oom`).

Runs after the other transforms, on loops whose iterable they wrapped in `__trainmate__.batches`:

    for xb, yb in __trainmate__.batches(loader):
        for xb, yb in __trainmate__.parts((xb, yb), ("loss",)):  # %%train oom-retry
            try:  # %%train oom-retry
                <the loop body>
            except __trainmate__.oom_errors:  # %%train oom-retry
                if not __trainmate__.oom_guard.caught(): raise  # %%train oom-retry

`("loss",)` names what the body assigns, so a failed attempt's autograd graph can be dropped. A
body that can `break` out of the batch loop gets `else: continue` / `break` after the inner loop,
so the break still leaves the batch loop. These are the only lines the rewrite adds: each ends
with `MARK`, and `compile_rewritten` maps every line back to the user's own line and column, so
tracebacks still point into the cell as the user wrote it.
"""

from __future__ import annotations

import ast
from collections import OrderedDict
from types import CodeType
from typing import cast

import libcst as cst

from .context import SESSION

MARK = "# %%train oom-retry"
_COMMENT = cst.TrailingWhitespace(
    whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(MARK), newline=cst.Newline()
)


def _session_attr(name: str) -> cst.Attribute:
    return cst.Attribute(value=cst.Name(SESSION), attr=cst.Name(name))


def _is_session_call(node: cst.BaseExpression, method: str) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and isinstance(node.func.value, cst.Name)
        and node.func.value.value == SESSION
        and node.func.attr.value == method
    )


def batch_target(
    target: cst.BaseExpression, iterable: cst.BaseExpression
) -> cst.BaseExpression | None:
    """The part of a for loop's target that receives the batch, through enumerate()/tqdm()."""
    if _is_session_call(iterable, "batches"):
        return target
    if not isinstance(iterable, cst.Call) or not iterable.args or iterable.args[0].star:
        return None
    func = iterable.func
    name = (
        func.value
        if isinstance(func, cst.Name)
        else func.attr.value
        if isinstance(func, cst.Attribute)
        else ""
    )
    inner = iterable.args[0].value
    if name == "enumerate":
        if isinstance(target, cst.Tuple | cst.List) and len(target.elements) == 2:
            second = target.elements[1]
            if not isinstance(second, cst.StarredElement):
                return batch_target(second.value, inner)
        return None
    if name == "tqdm":
        return batch_target(target, inner)
    return None


class _BodyScan(cst.CSTVisitor):
    """Names the body assigns and whether it breaks out of its loop (not nested scopes/loops)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.breaks = False
        self._depth = 0  # nested loops, functions, classes, lambdas, comprehensions

    _SCOPES = (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, self._SCOPES):
            self._depth += 1
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        if isinstance(original_node, self._SCOPES):
            self._depth -= 1

    def visit_Break(self, node: cst.Break) -> None:
        if self._depth == 0:
            self.breaks = True

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._names_in(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._names_in(node.target)

    def _names_in(self, target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            if target.value not in self.names:
                self.names.append(target.value)
        elif isinstance(target, cst.Tuple | cst.List):
            for element in target.elements:
                self._names_in(element.value)


def _as_expression(target: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(target, cst.Tuple) and not target.lpar:
        return target.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return target


def _with_comment(block: cst.IndentedBlock) -> cst.IndentedBlock:
    return block.with_changes(header=_COMMENT)


class RetryTransformer(cst.CSTTransformer):
    """Wrap the body of every `__trainmate__.batches(...)` loop in a retry point."""

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        if updated_node.asynchronous is not None or not isinstance(
            updated_node.body, cst.IndentedBlock
        ):
            return updated_node
        target = batch_target(updated_node.target, updated_node.iter)
        if target is None:
            return updated_node
        scan = _BodyScan()
        updated_node.body.visit(scan)
        names = (
            cst.Tuple(
                [cst.Element(cst.SimpleString(f'"{n}"')) for n in scan.names],
            )
            if scan.names
            else cst.Tuple([])
        )
        parts = cst.Call(
            func=_session_attr("parts"),
            args=[cst.Arg(_as_expression(target)), cst.Arg(names)],
        )
        # try/except, not `with`: entering a try costs nothing (Python 3.11+), a with calls
        # __enter__ and __exit__ on every step. `if not caught(): raise` re-raises in this frame,
        # so the traceback is the one the error had.
        caught = cst.Call(
            func=cst.Attribute(value=_session_attr("oom_guard"), attr=cst.Name("caught"))
        )
        guarded = cst.Try(
            body=_with_comment(updated_node.body),
            handlers=[
                cst.ExceptHandler(
                    type=_session_attr("oom_errors"),
                    body=cst.IndentedBlock(
                        [
                            cst.If(
                                test=cst.UnaryOperation(operator=cst.Not(), expression=caught),
                                body=cst.SimpleStatementSuite(
                                    [cst.Raise()], trailing_whitespace=_COMMENT
                                ),
                            )
                        ],
                        header=_COMMENT,
                    ),
                )
            ],
        )
        inner = cst.For(
            target=cast(cst.BaseAssignTargetExpression, target),  # part of a for target
            iter=parts,
            body=cst.IndentedBlock([guarded], header=_COMMENT),
        )
        statements: list[cst.BaseStatement] = [inner]
        if scan.breaks:
            inner = inner.with_changes(
                orelse=cst.Else(
                    body=cst.IndentedBlock(
                        [cst.SimpleStatementLine([cst.Continue()], trailing_whitespace=_COMMENT)],
                        header=_COMMENT,
                    )
                )
            )
            statements = [
                inner,
                cst.SimpleStatementLine([cst.Break()], trailing_whitespace=_COMMENT),
            ]
        return updated_node.with_changes(body=updated_node.body.with_changes(body=statements))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def compile_rewritten(code: str, original: str, filename: str, first_line: int = 1) -> CodeType:
    """Compile rewritten code so every position is the user's: line (from `first_line`) and column.

    Without added lines the rewrite is inline and a plain compile of the padded code does it.
    A re-run of the same code reuses its compiled code under the new file name (IPython names
    each execution of a cell anew): compiling costs a run about half a millisecond.
    """
    key = (code, original, first_line)
    compiled = _COMPILED.get(key)
    if compiled is not None:
        _COMPILED.move_to_end(key)
        return _renamed(compiled, filename) if compiled.co_filename != filename else compiled
    compiled = _compile(code, original, filename, first_line)
    _COMPILED[key] = compiled
    while len(_COMPILED) > _COMPILED_SIZE:
        _COMPILED.popitem(last=False)
    return compiled


# Compiled once, under the file name of its first run (so a compile warning names the cell).
_COMPILED: OrderedDict[tuple[str, str, int], CodeType] = OrderedDict()
_COMPILED_SIZE = 128


def _renamed(code: CodeType, filename: str) -> CodeType:
    """`code` and the code objects inside it (functions, comprehensions, classes) as `filename`."""
    consts = tuple(_renamed(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def forget_compiled() -> None:
    """Drop the compiled code kept for re-runs (with the rewrite cache)."""
    _COMPILED.clear()


def _compile(code: str, original: str, filename: str, first_line: int) -> CodeType:
    if MARK not in code:
        return compile("\n" * (first_line - 1) + code, filename, "exec")
    new_lines = code.splitlines()
    old_lines = original.splitlines()
    where: list[tuple[int, int]] = [(1, 0)]  # index: new line (1-based) -> (original line, shift)
    old = 0
    for line in new_lines:
        if line.rstrip().endswith(MARK):
            where.append((max(old, 1), 0))
            continue
        old += 1
        mine = old_lines[old - 1] if old - 1 < len(old_lines) else line
        where.append((old, _indent(line) - _indent(mine)))
    tree = ast.parse(code, filename)
    offset = first_line - 1
    for node in ast.walk(tree):
        lineno = getattr(node, "lineno", None)
        if lineno is None:
            continue
        line, shift = where[min(lineno, len(where) - 1)]
        node.lineno = line + offset  # type: ignore[attr-defined]
        node.col_offset = max(node.col_offset - shift, 0)  # type: ignore[attr-defined]
        end = getattr(node, "end_lineno", None)
        if end is not None:
            end_line, end_shift = where[min(end, len(where) - 1)]
            node.end_lineno = end_line + offset  # type: ignore[attr-defined]
            if node.end_col_offset is not None:  # type: ignore[attr-defined]
                node.end_col_offset = max(node.end_col_offset - end_shift, 0)  # type: ignore[attr-defined]
    return compile(tree, filename, "exec")
