"""
Step 3b: notebook state becomes parameters. A function that reads a global the notebook computes
(`model`, `loader`, `device`) or a constant (`LR`) gets it as a keyword-only parameter (constants
with their value as default), transitively through the functions it calls, and every call site
passes it; a class whose `__init__` reads them gets them as `__init__` parameters. State a
definition cannot receive from its callers becomes module state of `train` (`plan.module_state`):
what a class reads outside `__init__`, what a function passed around as a value needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .placement import Param
from .read import Note

if TYPE_CHECKING:
    from .plan import Plan


def hard_coded_device(node: cst.CSTNode) -> bool:
    cuda_call = m.Call(func=m.Attribute(attr=m.Name("cuda")))
    cuda_text = m.SimpleString(value=m.MatchRegex(r"^[rbu]*['\"]cuda(:\d+)?['\"]$"))
    return bool(m.findall(node, cuda_call | cuda_text))


def parameters(out: Plan) -> None:
    """Which globals each function (and class `__init__`) receives as parameters.

    State a function cannot receive from its callers becomes module state (`out.module_state`):
    what a class reads outside `__init__`, what a function passed around as a value needs.
    """
    state = {n for it in out.run_body for n in it.binds}  # computed at run time
    constants = set(out.constants)
    if out.device:
        state.add("device")
    state -= out.module_state
    needs: dict[str, list[str]] = {}
    calls: dict[str, set[str]] = {}
    methods_call: dict[str, set[str]] = {}  # what a class's methods other than __init__ call
    for name, placed in out.placed.items():
        item = placed.item
        reads = [r for r in item.reads if r not in item.declares]
        if out.device and hard_coded_device(item.node) and "device" not in reads:
            reads.append("device")
        if isinstance(item.node, cst.ClassDef):
            init_reads = _init_reads(item.node, list(item.reads))
            outside = [r for r in reads if r in state and r not in init_reads]
            if outside:
                out.module_state.update(outside)
                out.notes.append(
                    Note(
                        item.cell.number,
                        item.line,
                        "warning",
                        f"class {name} reads notebook state {outside} outside __init__: "
                        "module state of train",
                    )
                )
            methods_call[name] = {r for r in reads if r in out.placed and r not in init_reads}
            reads = init_reads
        needs[name] = [r for r in reads if r in state or r in constants]
        callees = reads if isinstance(item.node, cst.ClassDef) else item.reads  # __init__ only
        calls[name] = {r for r in callees if r in out.placed}
    changed = True
    while changed:  # a function calling one that needs a global needs it too
        changed = False
        for name in needs:
            for callee in sorted(calls.get(name, ())):
                for need in needs.get(callee, []):
                    if need not in needs[name]:
                        needs[name].append(need)
                        changed = True
    values = _value_uses(out, set(needs))
    for cls, called in sorted(methods_call.items()):  # a method cannot pass what it lacks
        values |= {c for c in called if c != cls}
    for name in sorted(values):
        stateful = [n for n in needs[name] if n in state]
        if stateful:
            out.module_state.update(stateful)
            placed = out.placed[name]
            out.notes.append(
                Note(
                    placed.item.cell.number,
                    placed.item.line,
                    "warning",
                    f"{name} is passed around as a value (or called by a method) and reads "
                    f"notebook state {stateful}: module state of train",
                )
            )
    for name, wanted in needs.items():
        placed = out.placed[name]
        taken = _local_names(placed.item.node)
        for source in wanted:
            param = out.field_name(source) if source in constants else source
            if param in taken and param != source:
                param = source
            default = source if source in constants else None
            placed.params.append(Param(param, source, default))


class _ValueUses(cst.CSTVisitor):
    """Names used other than as the function of a call (`DataLoader(collate_fn=collate)`)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.found: set[str] = set()

    def visit_Call(self, node: cst.Call) -> bool:
        if not isinstance(node.func, cst.Name):
            node.func.visit(self)
        for arg in node.args:
            arg.value.visit(self)
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names:
            self.found.add(node.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        node.body.visit(self)
        for param in [*node.params.params, *node.params.kwonly_params]:
            if param.default is not None:
                param.default.visit(self)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        node.body.visit(self)
        for base in node.bases:
            base.value.visit(self)
        return False


def _value_uses(out: Plan, names: set[str]) -> set[str]:
    visitor = _ValueUses(names)
    for item in [*out.run_body, *(p.item for p in out.placed.values())]:
        item.node.visit(visitor)
    return visitor.found


def _init_reads(node: cst.ClassDef, reads: list[str]) -> list[str]:
    init = next(
        (
            s
            for s in node.body.body
            if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
        ),
        None,
    )
    if init is None:
        return []
    names = {n.value for n in m.findall(init, m.Name()) if isinstance(n, cst.Name)}
    return [r for r in reads if r in names]


class _Names(cst.CSTVisitor):
    """Variable names in code: not attribute names (`x.lr`) nor keywords (`f(lr=...)`)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False


def _local_names(node: cst.CSTNode) -> set[str]:
    names = _Names()
    node.visit(names)
    return names.names
