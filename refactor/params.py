"""
Step 3b: notebook state becomes parameters. A function that reads a global the notebook computes
(`model`, `loader`, `device`) or a constant (`LR`) gets it as a keyword-only parameter (constants
with their value as default), transitively through the functions it calls, and every call site
passes it; a class whose `__init__` reads them gets them as `__init__` parameters. State a
definition cannot receive from its callers becomes module state of `train` (`plan.module_state`):
what a class reads outside `__init__`, what a function passed around as a value needs.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from .globalnames import Module
from .placement import Param
from .read import Note
from .transform import DeviceTransformer
from .walk import children, isa, walk
from .walk import names as all_names

if TYPE_CHECKING:
    from .analyze import Item
    from .plan import Plan


CUDA_TEXT = re.compile(r"^[rbu]*['\"]cuda(:\d+)?['\"]$")


_DEVICE = (cst.Call, cst.SimpleString)
_VALUE = (cst.Name, cst.Call, cst.Attribute, cst.FunctionDef, cst.ClassDef)
_LOCAL = (cst.Name, cst.Attribute, cst.Arg)


def hard_coded_device(item: Item) -> bool:
    """`x.cuda()` or a `"cuda"` / `"cuda:N"` literal anywhere in `item` (its text first: most
    statements do not say "cuda" at all, and then no walk of its nodes is needed)."""
    if "cuda" not in item.text:
        return False
    for found in walk(item.node):
        if not isa(found, _DEVICE):
            continue
        if isinstance(found, cst.Call):
            func = found.func
            if isinstance(func, cst.Attribute) and func.attr.value == "cuda":
                return True
        elif isinstance(found, cst.SimpleString) and CUDA_TEXT.match(found.value):
            return True
    return False


def writes_device(item: Item) -> bool:
    """Whether `DeviceTransformer` writes `device` into `item` (`x.cuda()`, `.to("cuda")`); a
    `"cuda"` it leaves alone (`self.device = "cuda" if ... else "cpu"`) reads nothing."""
    if not hard_coded_device(item):  # the cheap test first: most definitions have no "cuda"
        return False
    rewrite = DeviceTransformer()
    item.node.visit(rewrite)
    return rewrite.changed > 0


def state_reads(item: Item, device: bool) -> list[str]:
    """The names `item` reads that it does not declare, with `device` where the refactor turns
    its `.cuda()` / `"cuda"` into `device` (`device`: the plan has one): the read the refactor
    writes in is one like any other, for the parameters and for where the definition goes."""
    reads = [r for r in item.reads if r not in item.declares]
    if device and "device" not in reads and writes_device(item):
        reads.append("device")
    return reads


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
        reads = state_reads(item, out.device)
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


def _value_names(node: cst.CSTNode, names: set[str], found: set[str]) -> None:
    """Adds to `found` the `names` used in `node` other than as the function of a call
    (`DataLoader(collate_fn=collate)`); a def's decorators and annotations are not looked at."""
    stack = [node]
    while stack:
        current = stack.pop()
        if not isa(current, _VALUE):
            stack.extend(children(current))
        elif isinstance(current, cst.Name):
            if current.value in names:
                found.add(current.value)
        elif isinstance(current, cst.Call):
            if not isinstance(current.func, cst.Name):
                stack.append(current.func)
            stack.extend(a.value for a in current.args)
        elif isinstance(current, cst.Attribute):
            stack.append(current.value)
        elif isinstance(current, cst.FunctionDef):
            stack.append(current.body)
            every = [*current.params.params, *current.params.kwonly_params]
            stack.extend(p.default for p in every if p.default is not None)
        elif isinstance(current, cst.ClassDef):
            stack.append(current.body)
            stack.extend(b.value for b in current.bases)
        else:
            stack.extend(children(current))


def _value_uses(out: Plan, names: set[str]) -> set[str]:
    found: set[str] = set()
    for item in [*out.run_body, *(p.item for p in out.placed.values())]:
        _value_names(item.node, names, found)
    return found


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
    names = all_names(init)
    try:  # the names it reads from the globals: not its parameters and locals (`layers`)
        alone = Module(cst.Module(body=[init]).code)
        names &= set(alone.reads(alone.tree.body, (), frozenset()))
    except (SyntaxError, ValueError):  # as a function of its own it does not compile
        pass
    return [r for r in reads if r in names]


def _local_names(node: cst.CSTNode) -> set[str]:
    """Variable names in code: not attribute names (`x.lr`) nor keywords (`f(lr=...)`)."""
    found: set[str] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if not isa(current, _LOCAL):
            stack.extend(children(current))
        elif isinstance(current, cst.Name):
            found.add(current.value)
        elif isinstance(current, cst.Attribute | cst.Arg):
            stack.append(current.value)
        else:
            stack.extend(children(current))
    return found
