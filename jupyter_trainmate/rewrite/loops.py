"""
Batch loops: time every batch and prefetch it.

The innermost training loop (one whose body calls `.backward()`) that iterates over something
other than a `range` gets its iterable wrapped: `for x, y in loader:` becomes
`for x, y in __trainmate__.batches(loader):`. `enumerate(...)` and `tqdm(...)` keep their place
outside the wrapper, so counters, `start=` and progress bars behave as before. Inside training
loops, `next(iterator)` becomes `__trainmate__.next_batch(iterator)` so `while` loops that pull
batches by hand are timed too.

A training loop over a counter (`range(...)`, or a list of the notebook's models) is not a batch
loop. Inside a batch loop it is left alone (the batch is the step). Elsewhere it becomes
`__trainmate__.loop(range(...))`, and the session learns at run time what its passes are: steps
when nothing inside it iterates batches (`for step in range(1000):` drawing its own data), epochs
when a loop inside it does (`for epoch in range(3): train_one_epoch()`, the batch loop in the
called function). Every change is inline: line numbers do not move.
"""

from __future__ import annotations

import ast
import textwrap
from typing import TypeVar

import libcst as cst
import libcst.matchers as m

from .context import SESSION, RewriteContext
from .detect import CodeFacts
from .retry import batch_target

_Comp = TypeVar("_Comp", cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
RANGE_LIKE = {"range", "xrange", "trange", "count", "repeat"}  # xrange: six.moves
KEEP_OUTSIDE = {"enumerate", "tqdm"}


def _callee(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Name):
            return node.func.value
        if isinstance(node.func, cst.Attribute):
            return node.func.attr.value
    return None


def is_range_like(node: cst.BaseExpression) -> bool:
    """`range(...)`, literals, and enumerate/tqdm/zip over them: step counters, not batches."""
    if isinstance(node, cst.List | cst.Tuple | cst.Set | cst.Integer):
        return True
    name = _callee(node)
    if name in RANGE_LIKE:
        return True
    if name in KEEP_OUTSIDE | {"zip", "iter"} and isinstance(node, cst.Call) and node.args:
        return is_range_like(node.args[0].value)
    return False


def iterated_names(module: cst.Module) -> set[str]:
    """Names a `for` loop or comprehension iterates: `x` in `for a in x`, `zip(x, ...)`,
    `enumerate(x)`: the rewrite asks the namespace which of them hold models (see `over_models`)."""
    found: set[str] = set()
    for node in m.findall(module, m.For() | m.CompFor()):
        iterable = node.iter if isinstance(node, cst.For | cst.CompFor) else None
        while isinstance(iterable, cst.Call) and _callee(iterable) in {*KEEP_OUTSIDE, "zip"}:
            iterable = iterable.args[0].value if iterable.args else None
        if isinstance(iterable, cst.Name):
            found.add(iterable.value)
    return found


def over_models(node: cst.BaseExpression, model_lists: frozenset[str]) -> bool:
    """`nets`, `zip(nets, opts)`, `enumerate(nets)`, where `nets` holds the notebook's models or
    optimizers: a loop over them trains each in turn; it does not iterate batches."""
    if isinstance(node, cst.Name):
        return node.value in model_lists
    if _callee(node) in {*KEEP_OUTSIDE, "zip"} and isinstance(node, cst.Call) and node.args:
        return over_models(node.args[0].value, model_lists)
    return False


def _innermost(iterable: cst.BaseExpression) -> cst.BaseExpression:
    """What `_wrap` wraps: the first argument through enumerate()/tqdm()."""
    if (
        _callee(iterable) in KEEP_OUTSIDE
        and isinstance(iterable, cst.Call)
        and iterable.args
        and iterable.args[0].star == ""
    ):
        return _innermost(iterable.args[0].value)
    return iterable


def _session_call(method: str, args: list[cst.Arg]) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=cst.Name(SESSION), attr=cst.Name(method)), args=args)


def _wrap(
    iterable: cst.BaseExpression, method: str = "batches", extra: tuple[cst.Arg, ...] = ()
) -> cst.BaseExpression:
    if _callee(iterable) in KEEP_OUTSIDE and isinstance(iterable, cst.Call) and iterable.args:
        first = iterable.args[0]
        if first.star == "":
            inner = first.with_changes(value=_wrap(first.value, method, extra))
            rest = list(iterable.args[1:])
            if method == "batches" and _callee(iterable) == "enumerate":
                rest = _resumed_start(rest)
            return iterable.with_changes(args=[inner, *rest])
    return _session_call(method, [cst.Arg(iterable), *extra])


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    equal = cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
    )
    return cst.Arg(value, keyword=cst.Name(name), equal=equal)


def _carries(function: str | None, loop: cst.For, declared: set[str]) -> tuple[cst.Arg, ...]:
    """The variables a batch loop's batches carry from one to the next (`h = h.detach()`,
    `avg_loss = beta * avg_loss + ...`, `lr *= mult`), as a `carries=` argument, after
    `within=` for a loop in a function. A checkpoint in the middle of an epoch of the cell's own
    loop holds those notebook variables, and a run resumed there puts them back; no checkpoint
    holds a function's locals: a run resumed in the middle of that loop's epoch says they start
    over (`Batches.epoch`)."""
    try:
        tree = ast.parse(textwrap.dedent(cst.Module([]).code_for_node(loop)))
    except SyntaxError:
        return ()
    statement = tree.body[0] if tree.body else None
    if not isinstance(statement, ast.For):
        return ()
    names = [name for name in _carried_by(statement) if name not in declared]  # not `global`
    if not names:
        return ()
    listed = cst.Tuple([cst.Element(cst.SimpleString(repr(name))) for name in names])
    if function is None:
        return (_keyword("carries", listed),)
    return (
        _keyword("within", cst.SimpleString(repr(function))),
        _keyword("carries", listed),
    )


def _resumed_start(args: list[cst.Arg]) -> list[cst.Arg]:
    """enumerate()'s `start` through `__trainmate__.resumed_start(...)`: a run resumed in the
    middle of an epoch skips the batches done, and the index goes on from where it was (a
    warm-up by batch index, `if (i + 1) % k == 0: opt.step()`) instead of starting at 0 again."""
    for i, arg in enumerate(args):
        if arg.star:
            return args  # enumerate(x, *rest): left alone
        if arg.keyword is None or arg.keyword.value == "start":
            args[i] = arg.with_changes(value=_session_call("resumed_start", [cst.Arg(arg.value)]))
            return args
    start = _session_call("resumed_start", [cst.Arg(cst.Integer("0"))])
    return [*args, _keyword("start", start)]


class BatchLoopTransformer(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(
        self, context: RewriteContext, facts: CodeFacts, model_lists: frozenset[str] = frozenset()
    ) -> None:
        super().__init__()
        self.context = context
        self.facts = facts
        self._model_lists = model_lists
        # Per enclosing loop: does it hold a wrapped loop? Is it itself a batch loop candidate (a
        # training loop over something other than a counter)?
        self._frames: list[dict[str, bool]] = []
        self._saved: list[list[dict[str, bool]]] = []
        self._training_depth = 0
        self._functions: list[str] = []  # the functions defined in this code being visited
        self._declared: list[set[str]] = []  # their `global` and `nonlocal` names

    def _line(self, node: cst.CSTNode) -> int:
        return int(self.get_metadata(cst.metadata.PositionProvider, node).start.line)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._saved.append(self._frames)
        self._frames = []
        self._functions.append(node.name.value)
        declared = m.findall(node.body, m.Global() | m.Nonlocal())
        self._declared.append(
            {
                n.name.value
                for d in declared
                if isinstance(d, cst.Global | cst.Nonlocal)
                for n in d.names
            }
        )

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        self._frames = self._saved.pop()
        self._functions.pop()
        self._declared.pop()
        return updated_node

    def _function(self) -> str | None:
        """The function the code being rewritten is in: one defined in this code, else the
        notebook function or method being rewritten; None at a cell's top level."""
        if self._functions:
            return self._functions[-1]
        origin = self.context.origin
        return None if origin == "cell" else origin.split(" ", 1)[-1]

    def _counter(self, loop: cst.For) -> bool:
        """A loop over a counter, over the notebook's models, or one whose passes only call
        functions that iterate batches themselves: its passes are not batches."""
        return (
            is_range_like(loop.iter)
            or over_models(loop.iter, self._model_lists)
            or loop in self.facts.through_loops
        )

    def _enter_loop(self, node: cst.CSTNode) -> None:
        candidate = (
            isinstance(node, cst.For)
            and node in self.facts.training_loops
            and node.asynchronous is None
            and not self._counter(node)
        )
        self._frames.append({"wrapped_inside": False, "batch_candidate": candidate})
        if node in self.facts.training_loops:
            self._training_depth += 1

    def _leave_loop(self, node: cst.CSTNode) -> dict[str, bool]:
        frame = self._frames.pop()
        if node in self.facts.training_loops:
            self._training_depth -= 1
        return frame

    def visit_For(self, node: cst.For) -> None:
        self._enter_loop(node)

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        frame = self._leave_loop(original_node)
        wrapped = frame["wrapped_inside"]
        code = cst.Module([]).code_for_node(original_node.iter)
        line = self._line(original_node)
        if (
            original_node in self.facts.training_loops
            and wrapped
            and is_range_like(original_node.iter)
        ):
            # The loop around the batch loop counts epochs: the session learns how many for
            # progress and ETA. Iterating it yields exactly what it yielded before.
            if original_node.asynchronous is None and not frame.get("epochs_inside"):
                self.context.instrumented(line, f"epoch loop over {code}", "progress and ETA")
                updated_node = updated_node.with_changes(iter=_wrap(updated_node.iter, "epochs"))
                frame["epochs_inside"] = True
        elif original_node in self.facts.training_loops and not wrapped:
            if original_node.asynchronous is not None:
                self.context.left_alone(line, f"async loop over {code}", "async iteration")
            elif self._counter(original_node):
                if any(f["batch_candidate"] for f in self._frames):
                    self.context.left_alone(
                        line, f"loop over {code}", "inside the batch loop: the batch is the step"
                    )
                else:
                    self.context.instrumented(
                        line,
                        f"loop over {code}",
                        "each pass that trains is a step; passes holding other training loops "
                        "are epochs",
                    )
                    updated_node = updated_node.with_changes(iter=_wrap(updated_node.iter, "loop"))
            else:
                retried = batch_target(original_node.target, _wrap(original_node.iter)) is not None
                self.context.instrumented(
                    line,
                    f"batch loop over {code}",
                    "timed; prefetched per --prefetch"
                    + ("; retried as micro-batches on out-of-memory" if retried else ""),
                )
                self.context.batch_sources.append(
                    cst.Module([]).code_for_node(_innermost(original_node.iter))
                )
                carries = _carries(
                    self._function(), original_node, self._declared[-1] if self._declared else set()
                )
                updated_node = updated_node.with_changes(
                    iter=_wrap(updated_node.iter, "batches", carries)
                )
                wrapped = True
        if wrapped and self._frames:
            self._frames[-1]["wrapped_inside"] = True
        if frame.get("epochs_inside") and self._frames:
            self._frames[-1]["epochs_inside"] = True
        return updated_node

    def visit_While(self, node: cst.While) -> None:
        self._enter_loop(node)

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> cst.While:
        frame = self._leave_loop(original_node)
        if frame["wrapped_inside"] and self._frames:
            self._frames[-1]["wrapped_inside"] = True
        return updated_node

    def _leave_comprehension(self, original: cst.CSTNode, updated: _Comp) -> _Comp:
        if original not in self.facts.training_comprehensions:
            return updated
        chain = []
        node: cst.CompFor | None = updated.for_in
        while node is not None:
            chain.append(node)
            node = node.inner_for_in
        candidates = [
            i for i, f in enumerate(chain) if f.asynchronous is None and not is_range_like(f.iter)
        ]
        if not candidates:
            return updated
        target = candidates[-1]
        code = cst.Module([]).code_for_node(chain[target].iter)
        self.context.instrumented(self._line(original), f"batch comprehension over {code}", "timed")
        rebuilt: cst.CompFor | None = None
        for i in reversed(range(len(chain))):
            part = chain[i].with_changes(inner_for_in=rebuilt)
            if i == target:
                part = part.with_changes(iter=_wrap(part.iter))
            rebuilt = part
        assert rebuilt is not None
        return updated.with_changes(for_in=rebuilt)

    def leave_ListComp(
        self, original_node: cst.ListComp, updated_node: cst.ListComp
    ) -> cst.ListComp:
        return self._leave_comprehension(original_node, updated_node)

    def leave_SetComp(self, original_node: cst.SetComp, updated_node: cst.SetComp) -> cst.SetComp:
        return self._leave_comprehension(original_node, updated_node)

    def leave_GeneratorExp(
        self, original_node: cst.GeneratorExp, updated_node: cst.GeneratorExp
    ) -> cst.GeneratorExp:
        return self._leave_comprehension(original_node, updated_node)

    def leave_DictComp(
        self, original_node: cst.DictComp, updated_node: cst.DictComp
    ) -> cst.DictComp:
        return self._leave_comprehension(original_node, updated_node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if (
            self._training_depth
            and m.matches(updated_node.func, m.Name("next"))
            and 1 <= len(updated_node.args) <= 2
        ):
            self.context.instrumented(
                self._line(original_node), "next() on a batch iterator", "timed"
            )
            return _session_call("next_batch", list(updated_node.args))
        return updated_node


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _names(node: ast.AST, kind: type[ast.expr_context]) -> list[str]:
    """The names `node` loads (or stores), not those of a def or lambda inside it."""
    found: list[str] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Name) and isinstance(current.ctx, kind):
            found.append(current.id)
        stack.extend(c for c in ast.iter_child_nodes(current) if not isinstance(c, _SCOPES))
    return found


def _carried_in(body: list[ast.stmt], stored: set[str], read_first: set[str]) -> None:
    """Walk `body` in order: a name read while this pass has not bound it yet is read from the
    last pass (or from before the loop)."""
    for statement in body:
        heads: list[ast.AST]
        targets: list[ast.AST]
        blocks: list[list[ast.stmt]]
        if isinstance(statement, ast.For | ast.AsyncFor):
            heads, targets = [statement.iter], [statement.target]
            blocks = [statement.body, statement.orelse]
        elif isinstance(statement, ast.While | ast.If):
            heads, targets, blocks = [statement.test], [], [statement.body, statement.orelse]
        elif isinstance(statement, ast.With | ast.AsyncWith):
            heads = [item.context_expr for item in statement.items]
            targets = [item.optional_vars for item in statement.items if item.optional_vars]
            blocks = [statement.body]
        elif isinstance(statement, ast.Try):
            heads, targets = [], []
            blocks = [statement.body, *(h.body for h in statement.handlers), statement.orelse]
            blocks.append(statement.finalbody)
        elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stored.add(statement.name)
            continue
        else:
            heads, targets, blocks = [statement], [statement], []
        for head in heads:
            read_first.update(n for n in _names(head, ast.Load) if n not in stored)
        target_name = statement.target if isinstance(statement, ast.AugAssign) else None
        if isinstance(target_name, ast.Name) and target_name.id not in stored:
            read_first.add(target_name.id)  # `total += loss` reads `total` first
        for target in targets:
            stored.update(_names(target, ast.Store))
        for block in blocks:
            _carried_in(block, stored, read_first)


def carried_names(source: str) -> tuple[str, ...]:
    """Names the passes of the cell's outermost loops over a counter carry from one pass to the
    next: bound in the loop's body and read there before the pass binds them (`prediction,
    h_state = rnn(x, h_state)`, an RNN's hidden state). A checkpoint of those passes holds their
    values (`runtime.resume`): the notebook's models and optimizers are in it already, these are
    not."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    carried: dict[str, None] = {}
    for statement in tree.body:
        if isinstance(statement, ast.For) and _counts(source, statement.iter):
            carried.update(dict.fromkeys(_carried_by(statement)))
    return tuple(carried)


def _counts(source: str, iterable: ast.expr) -> bool:
    """Whether the loop over `iterable` (in `source`) is over a counter, as `is_range_like`
    says of the libcst node the rewrite wraps (`range(n)`, `tqdm(range(n))`, `trange(n)`)."""
    code = ast.get_source_segment(source, iterable)
    try:
        return code is not None and is_range_like(cst.parse_expression(code))
    except cst.ParserSyntaxError:
        return False


def _carried_by(statement: ast.For) -> list[str]:
    """The names a `for` loop's passes carry: bound in its body and read there first."""
    target = set(_names(statement.target, ast.Store))
    stored: set[str] = set(target)
    read_first: set[str] = set()
    _carried_in(statement.body, stored, read_first)
    bound = {n for s in statement.body for n in _names(s, ast.Store)}
    return sorted((read_first & bound) - target)
