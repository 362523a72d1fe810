"""
Step 4e': the `torchrun` wiring of `run(config)` (the package's `distributed.py` does the work).

The script's training is what reaches `backward()`: a statement that calls it, a `%%train` cell,
or a call of a notebook function or class whose code gets there. What that training reads was
built earlier: a `DataLoader(...)` is given to `distributed.shard` and a model (a constructor of a
class deriving from `nn.Module`, of `nn.*`, or a call's result moved with `.to(...)`) to
`distributed.wrap`, as a line of `run()` after the section that built it (or, built and trained
in one section, a line of that section right after it was built). The sections after the last
training run on rank 0 alone (`if distributed.is_main():`), with the models unwrapped. Each of
those calls does nothing in one process without `torchrun`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import libcst as cst

from .plan import MODEL_BASES, Plan
from .sections import Section, Unit

MODULE = "distributed"


@dataclass(frozen=True)
class Wiring:
    """What `run()` does for `torchrun`, by section index."""

    after: dict[int, tuple[str, ...]]  # lines of run() after that section's call
    main_from: int | None  # the first section that runs on rank 0 only (None: none do)
    unwrap: tuple[str, ...]  # models unwrapped before those sections


def enabled(plan: Plan, imports: dict[str, str]) -> bool:
    """Only for a notebook that uses torch, and leaves the name `distributed` free."""
    uses_torch = any(re.match(r"(import|from) torch\b", line) for line in imports.values())
    taken = {n for it in plan.versions.items for n in (*it.binds, *it.reads)} | set(plan.placed)
    return uses_torch and MODULE not in taken


def model_classes(plan: Plan) -> set[str]:
    """The notebook's classes that derive (through one another) from an `nn.Module`."""
    found: set[str] = set()
    bases: dict[str, list[str]] = {}
    for name, placed in plan.placed.items():
        node = placed.item.node
        if isinstance(node, cst.ClassDef):
            bases[name] = [cst.Module([]).code_for_node(a.value) for a in node.bases]
    changed = True
    while changed:
        changed = False
        for name, of in bases.items():
            if name not in found and any(MODEL_BASES.search(b) or b in found for b in of):
                found.add(name)
                changed = True
    return found


def _reaches_backward(plan: Plan) -> set[str]:
    """The notebook's functions and classes whose code calls `backward()`, or calls one that does."""
    found = {n for n, p in plan.placed.items() if ".backward(" in p.item.code}
    changed = True
    while changed:
        changed = False
        for name, placed in plan.placed.items():
            if name not in found and found & set(placed.item.reads):
                found.add(name)
                changed = True
    return found


def _callee(value: cst.BaseExpression) -> tuple[list[str], bool]:
    """The names called along a chain (`SmallNet(...).to(device)` -> [to, SmallNet]) and
    whether it is moved with `.to()`/`.cuda()` after a call."""
    names: list[str] = []
    moved = False
    while isinstance(value, cst.Call | cst.Attribute):
        func = value.func if isinstance(value, cst.Call) else value
        if isinstance(func, cst.Name):
            names.append(func.value)
            break
        if not isinstance(func, cst.Attribute):
            break
        if isinstance(value, cst.Call):
            names.append(cst.Module([]).code_for_node(func))
            if func.attr.value in ("to", "cuda") and isinstance(func.value, cst.Call):
                moved = True
        value = func.value
    return names, moved


def kind(code: str, name: str, models: set[str]) -> str | None:
    """'shard' for `name = DataLoader(...)`, 'wrap' for a model built by `code`, else None."""
    try:
        node = cst.parse_statement(code)
    except cst.ParserSyntaxError:
        return None
    if not (isinstance(node, cst.SimpleStatementLine) and isinstance(node.body[0], cst.Assign)):
        return None
    assign = node.body[0]
    if [cst.Module([]).code_for_node(t.target) for t in assign.targets] != [name]:
        return None
    called, moved = _callee(assign.value)
    last = [c.split(".")[-1] for c in called]
    if last and last[-1] == "DataLoader":
        return "shard"
    for full, short in zip(called, last, strict=True):
        if short in models:
            return "wrap"
        if re.match(r"(torch\.)?nn\.", full) and not short.endswith("Loss"):
            return "wrap"
    if moved and not called[-1].startswith("torch."):
        return "wrap"  # `resnet18(...).to(device)`; not `torch.randn(...).to(device)`
    return None


def wire(plan: Plan, sections: tuple[Section, ...]) -> tuple[tuple[Section, ...], Wiring]:
    """The sections with the wiring built and trained in one section, and `run()`'s wiring."""
    backward = _reaches_backward(plan)
    models = model_classes(plan)
    where: list[tuple[int, int]] = [
        (s, u) for s, section in enumerate(sections) for u in range(len(section.units))
    ]
    unit_at = {(s, u): sections[s].units[u] for s, u in where}

    def trains(unit: Unit) -> bool:
        return unit.trains or ".backward(" in unit.code or bool(backward & set(unit.reads))

    training = [p for p in where if trains(unit_at[p])]
    wanted: dict[tuple[int, int], tuple[str, str]] = {}  # binding unit -> (name, kind)
    for position in training:
        for name in unit_at[position].reads:
            if name in plan.module_state:
                continue
            earlier = [p for p in where if p < position and name in unit_at[p].binds]
            if earlier and earlier[-1] not in wanted:
                found = kind(unit_at[earlier[-1]].code, name, models)
                if found is not None:
                    wanted[earlier[-1]] = (name, found)
    after: dict[int, list[str]] = {}
    inside: dict[int, dict[int, str]] = {}
    in_run: list[str] = []
    for (s, u), (name, how) in sorted(wanted.items()):
        line = f"{name} = {MODULE}.{how}({name})"
        first = min(p for p in training if p > (s, u) and name in unit_at[p].reads)
        if first[0] > s and name in sections[s].returns:
            after.setdefault(s, []).append(line)
            if how == "wrap":
                in_run.append(name)
        else:
            inside.setdefault(s, {})[u] = line
            if how == "wrap" and name in sections[s].returns:
                in_run.append(name)
    out = list(sections)
    for s, lines in inside.items():
        units: list[Unit] = []
        for u, unit in enumerate(sections[s].units):
            units.append(unit)
            if u in lines:
                name = lines[u].split(" = ")[0]
                units.append(
                    dataclasses.replace(
                        unit, code=lines[u], reads=(name,), binds=(name,), results=(), built=()
                    )
                )
        out[s] = dataclasses.replace(sections[s], units=tuple(units))
    last = max((s for s, _ in training), default=-1)
    main_from = last + 1 if last + 1 < len(sections) else None
    return tuple(out), Wiring(
        {s: tuple(lines) for s, lines in after.items()}, main_from, tuple(dict.fromkeys(in_run))
    )


def in_cell(code: str, binds: tuple[str, ...], models: set[str]) -> str | None:
    """In a `%%train` cell: `model = distributed.wrap(model)` after the line building it."""
    if len(binds) != 1:
        return None
    how = kind(code, binds[0], models)
    return f"{binds[0]} = {MODULE}.{how}({binds[0]})" if how is not None else None


def device_line() -> str:
    """After `device = resolve_device(config.device)`: the process's own GPU under `torchrun`."""
    return f"device = {MODULE}.device(device)  # cuda:LOCAL_RANK under torchrun"


__all__ = ["MODULE", "Wiring", "device_line", "enabled", "in_cell", "kind", "model_classes", "wire"]
