"""
A read-only pass over the code: which loops train, and what the code already does by itself.

Its answers steer the transformers: a loop is a training loop when `.backward()` is called in its
body (not counting nested function definitions), directly or through a notebook function that
trains, or when its body steps an optimizer with a closure defined in the code that calls
`.backward()` (`lbfgs.step(closure)`); the code brings its own mixed precision when it
names `autocast` or `GradScaler`; it accumulates by hand when an `if` on a `%` test guards an
optimizer `step()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

BACKWARD = m.Call(func=m.Attribute(attr=m.Name("backward")))
STEP = m.Call(func=m.Attribute(attr=m.Name("step")))


@dataclass
class CodeFacts:
    """What a read of the code found (node sets hold libcst nodes by identity)."""

    training_loops: set[cst.CSTNode] = field(default_factory=set)
    training_comprehensions: set[cst.CSTNode] = field(default_factory=set)
    backward_calls: int = 0
    own_autocast: bool = False
    own_scaler: bool = False
    manual_accumulation_line: int | None = None
    autograd_grad: bool = False
    item_lines: tuple[int, ...] = ()  # `.item()` calls inside training loops (host syncs)

    @property
    def own_amp(self) -> bool:
        return self.own_autocast or self.own_scaler


class _FactsVisitor(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self, trainers: frozenset[str]) -> None:
        super().__init__()
        self.facts = CodeFacts()
        self._trainers = trainers
        self._items: list[tuple[int, cst.CSTNode]] = []  # (line, innermost loop)
        self._step_loops: set[cst.CSTNode] = set()  # innermost loops around a backward()
        self._loops: list[cst.CSTNode] = []
        self._saved: list[list[cst.CSTNode]] = []
        self._closures: set[str] = set()  # functions defined here that call backward()

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

    def _trains(self, node: cst.CSTNode) -> bool:
        """Whether `node` holds a backward() or a call to a notebook function that trains."""
        if m.findall(node, BACKWARD):
            return True
        calls = m.findall(node, m.Call(func=m.Name()))
        return any(
            c.func.value in self._trainers
            for c in calls
            if isinstance(c, cst.Call) and isinstance(c.func, cst.Name)
        )

    def _comprehension(
        self, node: cst.ListComp | cst.SetComp | cst.GeneratorExp | cst.DictComp
    ) -> None:
        if self._trains(node):
            self.facts.training_comprehensions.add(node)

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
            pos = self.get_metadata(cst.metadata.PositionProvider, node)
            self._items.append((pos.start.line, self._loops[-1]))
        trains = (
            m.matches(node, BACKWARD)
            or (isinstance(node.func, cst.Name) and node.func.value in self._trainers)
            or (
                m.matches(node, STEP)
                and bool(node.args)
                and isinstance(node.args[0].value, cst.Name)
                and node.args[0].value.value in self._closures
            )
        )
        if m.matches(node, BACKWARD):
            self.facts.backward_calls += 1
        if trains:
            self.facts.training_loops.update(self._loops)
            if self._loops:
                self._step_loops.add(self._loops[-1])
        if m.matches(node.func, m.Attribute(value=m.Name("autograd"), attr=m.Name("grad"))):
            self.facts.autograd_grad = True

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == "autocast":
            self.facts.own_autocast = True
        elif node.value == "GradScaler":
            self.facts.own_scaler = True

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.visit_Name(node.attr)

    def visit_If(self, node: cst.If) -> None:
        has_modulo = m.findall(node.test, m.BinaryOperation(operator=m.Modulo()))
        if (
            has_modulo
            and m.findall(node.body, STEP)
            and self.facts.manual_accumulation_line is None
        ):
            pos = self.get_metadata(cst.metadata.PositionProvider, node)
            self.facts.manual_accumulation_line = pos.start.line


def read_facts(wrapper: cst.MetadataWrapper, trainers: frozenset[str] = frozenset()) -> CodeFacts:
    """Read `wrapper`'s code; calls to the notebook functions named in `trainers` count as training."""
    visitor = _FactsVisitor(trainers)
    wrapper.visit(visitor)
    facts = visitor.facts
    # Per-step .item() calls: in the same innermost loop as a backward() (not once per epoch).
    steps = visitor._step_loops
    facts.item_lines = tuple(sorted({line for line, loop in visitor._items if loop in steps}))
    return facts
