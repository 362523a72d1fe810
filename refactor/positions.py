"""
Where each statement and each name of a libcst module starts (line and column), for what
`analyze` asks: which cell a statement is in, and in which order a statement reads its names.

libcst's `PositionProvider` finds these by generating the module's code while it records a
start and an end for every node (about 95,000 nodes for 500 notebook cells, a third of the
analysis). `starts` runs the same code generation and records the same start positions, the same
way (`PositionProvidingCodegenState`: a node's syntactic position where libcst records one, else
where its code begins), for the `Name` nodes and the statements only, and without a regular
expression per token.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition

from .walk import isa

_WANTED = (cst.Name, cst.BaseStatement)


@dataclass(frozen=False)
class _Starts(CodegenState):
    line: int = 1  # one-indexed, as libcst's
    column: int = 0  # zero-indexed
    found: dict[cst.CSTNode, CodePosition] = field(default_factory=dict)
    _stack: list[CodePosition] = field(default_factory=list)

    def add_indent_tokens(self) -> None:
        self.tokens.extend(self.indent_tokens)
        for token in self.indent_tokens:
            self._update(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self._update(value)

    def _update(self, value: str) -> None:
        if "\n" not in value and "\r" not in value:
            self.column += len(value)
            return
        lines = value.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self.line += len(lines) - 1
        self.column = len(lines[-1])

    def before_codegen(self, node: cst.CSTNode) -> None:
        if isa(node, _WANTED):
            self._stack.append(CodePosition(self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        if isa(node, _WANTED):
            start = self._stack.pop()
            if node not in self.found:  # a syntactic position recorded already wins
                self.found[node] = start

    @contextmanager
    def record_syntactic_position(
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> Iterator[None]:
        start = CodePosition(self.line, self.column)
        try:
            yield
        finally:
            if isa(node, _WANTED):
                self.found[node] = self.found[start_node] if start_node is not None else start


def starts(module: cst.Module) -> dict[cst.CSTNode, CodePosition]:
    """The start (`PositionProvider`'s `.start`) of every `Name` and statement in `module`."""
    state = _Starts(default_indent=module.default_indent, default_newline=module.default_newline)
    module._codegen(state)
    return state.found
