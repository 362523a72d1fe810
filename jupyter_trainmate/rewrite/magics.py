"""
IPython magics inside a `%%train` cell: `%time fit()` and `%%time` are rewritten inside.

IPython turns `%time fit()` into `get_ipython().run_line_magic('time', 'fit()')` before the rewrite
sees the cell: the code is a string, run by the magic. For `%time`/`%%time` the string is rewritten
like the cell and put back, so the magic times the instrumented code (the session is in the
namespace the magic runs it in). Other magics that run code (`%timeit`, `%prun`, `%run`, cell
magics) are left alone with a note saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import libcst as cst
import libcst.matchers as m

from .context import RewriteContext
from .detect import CodeFacts

REWRITTEN_INSIDE = {"time"}
# Line magics that run Python code given to them (the rest, `%matplotlib` and the like, do not).
RUNS_CODE = {"timeit", "prun", "run", "debug", "capture", "time"}


@dataclass(frozen=True)
class MagicCall:
    """`get_ipython().run_line_magic(name, code)` or `.run_cell_magic(name, line, code)`."""

    magic: str
    cell: bool  # a cell magic: `code` is its body, which starts on the line after the call's
    code: str
    string: cst.BaseExpression  # the literal holding `code`

    @property
    def shown(self) -> str:
        return f"%%{self.magic}" if self.cell else f"%{self.magic}"


def _literal(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def magic_call(node: cst.Call) -> MagicCall | None:
    """The magic a call runs, if it is one IPython's transformers wrote."""
    func = node.func
    if not (
        isinstance(func, cst.Attribute)
        and func.attr.value in ("run_line_magic", "run_cell_magic")
        and isinstance(func.value, cst.Call)
        and isinstance(func.value.func, cst.Name)
        and func.value.func.value == "get_ipython"
    ):
        return None
    cell = func.attr.value == "run_cell_magic"
    values = [_literal(a.value) for a in node.args]
    if len(values) != (3 if cell else 2):
        return None
    name, code = values[0], values[-1]
    if name is None or code is None:
        return None
    return MagicCall(name, cell, code, node.args[-1].value)


def python_of(code: str) -> str:
    """A cell magic's body as Python: IPython's own transforms (it runs them itself too)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # pragma: no cover - IPython is a dependency
        return code
    return str(TransformerManager().transform_cell(code))  # type: ignore[no-untyped-call]


def magic_calls(module: cst.CSTNode) -> list[MagicCall]:
    found = []
    for call in m.findall(module, m.Call()):
        assert isinstance(call, cst.Call)
        found_call = magic_call(call)
        if found_call is not None:
            found.append(found_call)
    return found


Rewrite = Callable[[str, RewriteContext], tuple[str, CodeFacts]]


class MagicTransformer(cst.CSTTransformer):
    """Rewrite the code of `%time`/`%%time`; note the other magics that run code."""

    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self, context: RewriteContext, rewrite: Rewrite) -> None:
        super().__init__()
        self.context = context
        self.rewrite = rewrite
        self.facts: list[CodeFacts] = []  # of the code rewritten inside, in the cell's lines

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        found = magic_call(original_node)
        if found is None:
            return updated_node
        line = int(self.get_metadata(cst.metadata.PositionProvider, original_node).start.line)
        if found.magic not in REWRITTEN_INSIDE:
            if found.cell or found.magic in RUNS_CODE:
                self.context.left_alone(
                    line,
                    f"{found.shown} {found.code.splitlines()[0] if found.code else ''}".strip(),
                    f"the {'cell' if found.cell else 'line'} magic runs this code itself; "
                    "%%train cannot rewrite it (optimizer hooks still count its steps)",
                )
            return updated_node
        code = python_of(found.code) if found.cell else found.code
        # A cell magic's body starts on the line after the magic's; a line magic's is that line.
        offset = self.context.line_offset + line - (0 if found.cell else 1)
        inner = RewriteContext(self.context.origin, offset)
        try:
            new_code, facts = self.rewrite(code, inner)
        except cst.ParserSyntaxError as exc:
            self.context.left_alone(
                line, found.shown, f"libcst cannot parse its code: {exc.message}"
            )
            return updated_node
        self.context.notes.extend(
            replace(n, what=f"{n.what} under {found.shown}") for n in inner.notes
        )
        self.context.batch_sources.extend(inner.batch_sources)
        self.facts.append(facts.shifted(offset))
        if new_code == code:
            return updated_node
        new_string = cst.SimpleString(repr(new_code))
        args = [*updated_node.args[:-1], updated_node.args[-1].with_changes(value=new_string)]
        return updated_node.with_changes(args=args)


def code_of(found: MagicCall) -> cst.Module | None:
    """The parsed code a `%time`/`%%time` runs (for the names it calls), or None."""
    if found.magic not in REWRITTEN_INSIDE:
        return None
    try:
        return cst.parse_module(python_of(found.code) if found.cell else found.code)
    except cst.ParserSyntaxError:
        return None
