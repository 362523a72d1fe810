"""
A read-only pass over the code: which loops train, and what the code already does by itself.

Its answers steer the transformers: a loop is a training loop when `.backward()` is called in its
body (not counting nested function definitions), directly or through a notebook function that
trains (one of an earlier cell, or one this code defines: `rewrite.cell_functions`), or when its body steps an optimizer with a closure defined in the code that calls
`.backward()` (`lbfgs.step(closure)`); the code brings its own mixed precision when it
names `autocast` or `GradScaler`; it accumulates by hand when an `if` on a `%` test guards an
optimizer `step()`; it reads gradients the session cannot unscale first (`p.grad`, clipping under
a name it does not know), which rules out fp16 with a GradScaler.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

import libcst as cst
import libcst.matchers as m

BACKWARD = m.Call(func=m.Attribute(attr=m.Name("backward")))
STEP = m.Call(func=m.Attribute(attr=m.Name("step")))
# Gradient clipping the session runs itself (unscaled first under fp16). `clip_grad_norm` is
# torch's deprecated name for `clip_grad_norm_`, still common in notebooks.
CLIP = {"clip_grad_norm_": "clip_grad_norm_", "clip_grad_norm": "clip_grad_norm_"}
CLIP["clip_grad_value_"] = "clip_grad_value_"
# Calls on a gradient that do not read its values: fine on scaled gradients.
_HARMLESS_ON_GRAD = {"zero_", "detach_", "requires_grad_"}


@dataclass(frozen=True)
class CodeFacts:
    """What a read of the code found (node sets hold libcst nodes by identity)."""

    training_loops: frozenset[cst.CSTNode] = frozenset()
    # training loops whose bodies train only by calling functions that iterate batches
    # themselves (`for w in widths: fit(make(w))`): their passes hold other loops' steps
    through_loops: frozenset[cst.CSTNode] = frozenset()
    training_comprehensions: frozenset[cst.CSTNode] = frozenset()
    backward_calls: int = 0
    own_autocast: bool = False
    own_scaler: bool = False
    manual_accumulation_line: int | None = None
    autograd_grad: bool = False
    item_lines: tuple[int, ...] = ()  # `.item()` calls inside training loops (host syncs)
    # Code that reads gradients where the rewrite cannot unscale them first: `p.grad` reads and
    # clipping it does not know, as (line, code). A GradScaler would hand them scaled values.
    gradient_reads: tuple[tuple[int, str], ...] = ()

    @property
    def own_amp(self) -> bool:
        return self.own_autocast or self.own_scaler

    def shifted(self, offset: int) -> CodeFacts:
        """The same facts with every line moved down by `offset` (a function in its cell)."""
        line = self.manual_accumulation_line
        return replace(
            self,
            manual_accumulation_line=None if line is None else line + offset,
            item_lines=tuple(n + offset for n in self.item_lines),
            gradient_reads=tuple((n + offset, text) for n, text in self.gradient_reads),
        )

    def merged(self, other: CodeFacts) -> CodeFacts:
        """Facts of this code and `other` run together (a cell and a function it calls)."""
        line = self.manual_accumulation_line
        return replace(
            self,
            backward_calls=self.backward_calls + other.backward_calls,
            own_autocast=self.own_autocast or other.own_autocast,
            own_scaler=self.own_scaler or other.own_scaler,
            autograd_grad=self.autograd_grad or other.autograd_grad,
            item_lines=(*self.item_lines, *other.item_lines),
            manual_accumulation_line=other.manual_accumulation_line if line is None else line,
            gradient_reads=(*self.gradient_reads, *other.gradient_reads),
        )


def _callee_name(func: cst.BaseExpression) -> str | None:
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def _is_grad(node: cst.BaseExpression) -> bool:
    """`x.grad` or `x.grad.data`, but not `torch.autograd.grad` (a function)."""
    if isinstance(node, cst.Attribute) and node.attr.value == "data":
        node = node.value
    return (
        isinstance(node, cst.Attribute)
        and node.attr.value == "grad"
        and _callee_name(node.value) != "autograd"
    )


def calls_one_of(node: cst.Call, names: AbstractSet[str]) -> bool:
    """A call of a function named in `names` (`f()`), or of a method named there after a dot
    (`.f()`, `x.f()`)."""
    func = node.func
    if isinstance(func, cst.Name):
        return func.value in names
    return isinstance(func, cst.Attribute) and f".{func.attr.value}" in names


class _FactsVisitor(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self, trainers: frozenset[str], batch_loopers: frozenset[str]) -> None:
        super().__init__()
        self._trainers = trainers
        self._loopers = batch_loopers
        self.training_loops: set[cst.CSTNode] = set()
        self.direct_loops: set[cst.CSTNode] = set()  # a step of their own in their bodies
        self.training_comprehensions: set[cst.CSTNode] = set()
        self.backward_calls = 0
        self.own_autocast = False
        self.own_scaler = False
        self.manual_accumulation_line: int | None = None
        self.autograd_grad = False
        self.gradient_reads: list[tuple[int, str]] = []
        self._not_reads: set[int] = set()  # ids of `.grad` nodes written, tested or zeroed
        self.items: list[tuple[int, cst.CSTNode]] = []  # (line, innermost loop)
        self.step_loops: set[cst.CSTNode] = set()  # innermost loops around a backward()
        self._loops: list[cst.CSTNode] = []
        self._saved: list[list[cst.CSTNode]] = []
        self._closures: set[str] = set()  # functions defined here that call backward()
        # loops around a `torch.autograd.grad(...)` call, and around an argument-less `.step()`:
        # a loop holding both trains (MAML: gradients by autograd.grad, set on `.grad` by hand,
        # then `meta_opt.step()`), though no backward() is in it
        self._grad_loops: set[cst.CSTNode] = set()
        self._bare_step_loops: set[cst.CSTNode] = set()

    def _line(self, node: cst.CSTNode) -> int:
        return int(self.get_metadata(cst.metadata.PositionProvider, node).start.line)

    # A nested def or lambda starts a fresh loop stack: its body runs when called, not in the loop.
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if m.findall(node.body, BACKWARD):
            self._closures.add(node.name.value)
        self._saved.append(self._loops)
        self._loops = []

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._loops = self._saved.pop()

    def visit_For(self, node: cst.For) -> None:
        self._loops.append(node)

    def leave_For(self, original_node: cst.For) -> None:
        self._loops.pop()

    def visit_While(self, node: cst.While) -> None:
        self._loops.append(node)

    def leave_While(self, original_node: cst.While) -> None:
        self._loops.pop()

    def _steps_a_closure(self, node: cst.Call) -> bool:
        """`lbfgs.step(closure)` where `closure` is defined here and calls backward()."""
        return (
            m.matches(node, STEP)
            and bool(node.args)
            and isinstance(node.args[0].value, cst.Name)
            and node.args[0].value.value in self._closures
        )

    def _calls_trainer(self, node: cst.Call) -> bool:
        """A call of a notebook function (`f()`) or method (`.f()`) that trains."""
        return calls_one_of(node, self._trainers)

    def _trains(self, node: cst.CSTNode) -> bool:
        """Whether `node` holds a backward() or a call to a notebook function that trains."""
        if m.findall(node, BACKWARD):
            return True
        return any(
            isinstance(c, cst.Call) and self._calls_trainer(c) for c in m.findall(node, m.Call())
        )

    def _comprehension(
        self, node: cst.ListComp | cst.SetComp | cst.GeneratorExp | cst.DictComp
    ) -> None:
        if self._trains(node):
            self.training_comprehensions.add(node)

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._comprehension(node)

    def visit_SetComp(self, node: cst.SetComp) -> None:
        self._comprehension(node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._comprehension(node)

    def visit_DictComp(self, node: cst.DictComp) -> None:
        self._comprehension(node)

    def visit_Call(self, node: cst.Call) -> None:
        if self._loops and m.matches(node, m.Call(func=m.Attribute(attr=m.Name("item")))):
            self.items.append((self._line(node), self._loops[-1]))
        is_backward = m.matches(node, BACKWARD)
        if is_backward:
            self.backward_calls += 1
        if is_backward or self._calls_trainer(node) or self._steps_a_closure(node):
            self.training_loops.update(self._loops)
            if self._loops:
                self.step_loops.add(self._loops[-1])
            if not calls_one_of(node, self._loopers):
                self.direct_loops.update(self._loops)
        autograd = m.Name("autograd") | m.Attribute(attr=m.Name("autograd"))
        if m.matches(node.func, m.Attribute(value=autograd, attr=m.Name("grad"))):
            self.autograd_grad = True
            self._grad_loops.update(self._loops)
        elif not node.args and m.matches(node, STEP):
            self._bare_step_loops.update(self._loops)
        func = node.func
        harmless = isinstance(func, cst.Attribute) and func.attr.value in _HARMLESS_ON_GRAD
        if harmless and isinstance(func, cst.Attribute) and _is_grad(func.value):
            self._not_reads.add(id(func.value))
        name = _callee_name(func)
        if name is not None and "clip_grad" in name and name not in CLIP:
            self.gradient_reads.append((self._line(node), f"{name}()"))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._not_reads.add(id(node.target))  # `p.grad = None`

    def visit_Del(self, node: cst.Del) -> None:
        self._not_reads.add(id(node.target))

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if any(m.matches(c.comparator, m.Name("None")) for c in node.comparisons):
            self._not_reads.add(id(node.left))  # `p.grad is None`

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == "autocast":
            self.own_autocast = True
        elif node.value == "GradScaler":
            self.own_scaler = True

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self.visit_Name(node.attr)
        if _is_grad(node):
            if id(node) not in self._not_reads:
                code = cst.Module([]).code_for_node(node)
                self.gradient_reads.append((self._line(node), code))
            return False  # `p.grad.data` is one read
        return True

    def visit_If(self, node: cst.If) -> None:
        has_modulo = m.findall(node.test, m.BinaryOperation(operator=m.Modulo()))
        if has_modulo and m.findall(node.body, STEP) and self.manual_accumulation_line is None:
            self.manual_accumulation_line = self._line(node)


def read_facts(
    wrapper: cst.MetadataWrapper,
    trainers: frozenset[str] = frozenset(),
    batch_loopers: frozenset[str] = frozenset(),
) -> CodeFacts:
    """Read `wrapper`'s code; calls to the notebook functions named in `trainers` count as training.

    `trainers` holds function names (`train_step`) and method names after a dot (`.fit`);
    `batch_loopers` those of them that iterate batches themselves.
    """
    v = _FactsVisitor(trainers, batch_loopers)
    wrapper.visit(v)
    by_grad = v._grad_loops & v._bare_step_loops
    v.training_loops |= by_grad
    v.direct_loops |= by_grad
    # Per-step .item() calls: in the same innermost loop as a backward() (not once per epoch).
    items = tuple(sorted({line for line, loop in v.items if loop in v.step_loops}))
    return CodeFacts(
        training_loops=frozenset(v.training_loops),
        through_loops=frozenset(v.training_loops - v.direct_loops),
        training_comprehensions=frozenset(v.training_comprehensions),
        backward_calls=v.backward_calls,
        own_autocast=v.own_autocast,
        own_scaler=v.own_scaler,
        manual_accumulation_line=v.manual_accumulation_line,
        autograd_grad=v.autograd_grad,
        item_lines=items,
        gradient_reads=tuple(v.gradient_reads),
    )
