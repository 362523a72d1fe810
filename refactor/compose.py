"""
Step 4e: the notebook's top-level code as section functions and `run(config)`, their composition.

Each kept top-level statement becomes a `Unit` (a `%%train` cell becomes one call through
`jupyter_trainmate.train()`, its body a function of its own); what is left out is reported
(IPython-only lines, bare expressions a notebook shows as output, the device line the config
replaces). `sections.cut` groups the units into sections and works out the dataflow; this module
writes them: a function per section (typed at its edges, the notebook's code as its body) and
`run(config)`, a short list of calls, the display-only ones under `if config.plots:`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from .analyze import Item
from .binds import target_names
from .display import is_display
from .distribute import MODULE, model_classes, wire
from .functions import TrainCell, run_function, section_function, train_cell_function
from .params import hard_coded_device
from .plan import Plan
from .read import CodeCell, Note
from .sections import Section, Unit, built, cut, deleted, results
from .transform import DeviceTransformer
from .walk import find, isa, walk

DROPPED = "# trainmate: dropped"
COMMENTED = "# notebook: "
DISPLAY_CALLS = frozenset({"len", "type", "repr", "str", "head", "tail", "describe", "info"})
RESERVED = frozenset({"run", "main", "config", "Config", "resolve_device", "jupyter_trainmate"})


@dataclass(frozen=True)
class Script:
    """The notebook's script, composed: what `emit` puts in `train.py`."""

    code: str  # the section functions, the %%train cell functions and run()
    sections: tuple[Section, ...]
    train_cells: tuple[TrainCell, ...]
    extra_names: frozenset[str]  # names the code uses that the imports must provide
    plots: str | None  # the Config field that turns the display-only sections on
    notes: tuple[Note, ...]
    places: tuple[tuple[int, str], ...]


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _dropped(item: Item) -> str | None:
    """'dropped' / 'commented' for the placeholders `read` left, else None."""
    node = item.node
    if isinstance(node, cst.SimpleStatementLine) and isinstance(node.body[0], cst.Pass):
        comment = node.trailing_whitespace.comment
        if comment is not None and comment.value.startswith(DROPPED):
            return "dropped"
        if comment is not None and comment.value.startswith(COMMENTED):
            return "commented"
    return None


def display_expression(item: Item) -> bool:
    """A bare expression a notebook shows as the cell's output: no effect in a script."""
    node = item.node
    if not (
        isinstance(node, cst.SimpleStatementLine)
        and len(node.body) == 1
        and isinstance(node.body[0], cst.Expr)
    ):
        return False
    value = node.body[0].value
    if isinstance(value, cst.Call):
        func = value.func
        name = func.value if isinstance(func, cst.Name) else None
        if isinstance(func, cst.Attribute):
            name = func.attr.value
        inner = [a.value for a in value.args] + (
            [func.value] if isinstance(func, cst.Attribute) else []
        )
        return name in DISPLAY_CALLS and not any(find(v, cst.Call) for v in inner)
    if find(value, cst.Call):
        return False  # `model(x).shape` runs the model (BatchNorm statistics, random draws)
    return isinstance(
        value,
        cst.Name
        | cst.Attribute
        | cst.Subscript
        | cst.BaseNumber
        | cst.BaseString
        | cst.Comparison
        | cst.BinaryOperation
        | cst.Tuple,
    )


def _indent(text: str) -> str:
    return "\n".join(("    " + ln) if ln.strip() else "" for ln in text.splitlines())


class Composer:
    def __init__(
        self,
        plan: Plan,
        transformed: Callable[[cst.BaseStatement, dict[str, str]], str],
        distributed: bool = False,
    ) -> None:
        """`transformed(node, local)`: a statement's code as the package runs it; `distributed`:
        `run()` calls the package's `distributed.py` for `torchrun` (`distribute.py`)."""
        self.plan = plan
        self.distributed = distributed
        self.transformed = transformed
        self.notes: list[Note] = []
        self.places: list[tuple[int, str]] = []

    def _heading(self, cell: CodeCell) -> str | None:
        """The section heading of a cell: not the notebook's title (cells under it alone)."""
        return cell.heading if cell.heading != self.plan.notebook.title else None

    def _callee_sources(self, reads: tuple[str, ...]) -> list[str]:
        """What the functions a statement calls are given at its call sites (`CallSites`)."""
        found: list[str] = []
        for name in reads:
            placed = self.plan.placed.get(name)
            if placed is not None:
                found += [p.source for p in placed.params]
        return found

    def units(self) -> tuple[list[Unit], list[TrainCell]]:
        plan = self.plan
        units: list[Unit] = []
        train_cells: list[TrainCell] = []
        bound: set[str] = set(plan.constants) | ({"device"} if plan.device else set())
        merged = list(plan.run_body)
        index = 0
        while index < len(merged):
            item = merged[index]
            cell = item.cell
            if item.train_cell:
                group = [item]
                while (
                    index + 1 < len(merged)
                    and merged[index + 1].train_cell
                    and merged[index + 1].cell.number == cell.number
                ):
                    index += 1
                    group.append(merged[index])
                train = self._train_cell(group, bound, merged[index + 1 :])
                bound |= {b for it in group for b in it.binds}
                train_cells.append(train)
                args = ", ".join(f"{p}={p}" for p in train.params)
                call = f"jupyter_trainmate.train({train.name}, {train.options!r}" + (
                    f", {args})" if args else ")"
                )
                target = ", ".join(train.returns)
                code = f"{target} = {call}" if target else call
                units.append(
                    Unit(
                        cell.number,
                        self._heading(cell),
                        cell.markdown,
                        code,
                        tuple(train.params),
                        tuple(train.returns),
                        (),
                        False,
                        trains=True,
                    )
                )
                self.places.append((cell.number, f"{plan.package}.train.{train.name}"))
                index += 1
                continue
            index += 1
            kind = _dropped(item)
            if kind == "dropped":
                self.places.append((cell.number, "dropped (IPython-only)"))
                continue
            if kind == "commented":
                comment = item.node.trailing_whitespace.comment  # type: ignore[attr-defined]
                units.append(
                    Unit(
                        cell.number,
                        self._heading(cell),
                        cell.markdown,
                        comment.value,
                        (),
                        (),
                        (),
                        True,
                    )
                )
                continue
            if display_expression(item):
                self.notes.append(
                    Note(cell.number, item.line, "dropped", f"`{item.code.strip()}`: display only")
                )
                continue
            if plan.device and item.binds == ("device",):
                self.notes.append(
                    Note(
                        cell.number,
                        item.line,
                        "dropped",
                        f"`{item.code.strip()}`: the device comes from Config.device (--device)",
                    )
                )
                continue
            reads = [*item.reads, *self._callee_sources(item.reads)]
            if plan.device and hard_coded_device(item):
                reads.append("device")
            node = item.node
            code = self.transformed(node, {}).strip("\n")
            units.append(
                Unit(
                    cell.number,
                    self._heading(cell),
                    cell.markdown,
                    code,
                    tuple(dict.fromkeys(reads)),
                    item.binds,
                    results(node, item.binds),
                    is_display(node),
                    built(node),
                    trains=".backward(" in code,
                    deletes=deleted(node),
                )
            )
            bound |= set(item.binds)
        return units, train_cells

    def _train_cell(self, group: list[Item], bound: set[str], after: list[Item]) -> TrainCell:
        first = group[0]
        cell = TrainCell(first.cell.number, first.cell.train_options or "", group)
        reads: list[str] = []
        own: set[str] = set()  # bound by the cell before it reads them: not inputs
        for it in group:
            loops = {
                n
                for f in find(it.node, cst.For)
                for n in target_names(f.target)  # type: ignore[attr-defined]
            }
            reads += [r for r in it.reads if r not in own and r not in loops]
            own |= set(it.binds)
        reads += self._callee_sources(tuple(reads))
        if self.plan.device and any(hard_coded_device(it) for it in group):
            reads.append("device")
        cell.params = sorted({r for r in reads if r in bound} - self.plan.module_state)
        binds = {b for it in group for b in it.binds}
        later = {r for it in after for r in [*it.reads, *self._callee_sources(it.reads)]}
        cell.returns = sorted((binds & later) - self.plan.module_state)
        return cell

    def script(self) -> Script:
        plan = self.plan
        units, train_cells = self.units()
        taken = (
            {n for it in plan.versions.items for n in it.binds}
            | set(plan.placed)
            | set(plan.constants)
            | {plan.field_name(c) for c in plan.constants}
            | {t.name for t in train_cells}
            | RESERVED
        )
        sections = cut(
            units,
            set(plan.constants),
            plan.module_state,
            {"device"} if plan.device else set(),
            taken,
        )
        wiring = None
        if self.distributed:
            sections, wiring = wire(plan, sections)
        plots = None
        if any(s.display for s in sections):
            fields = {plan.field_name(c) for c in plan.constants}
            plots = "plots" if "plots" not in fields else "show_plots"
        models = model_classes(plan) if self.distributed else None
        parts = [train_cell_function(t, self.transformed, models) for t in train_cells]
        parts += [section_function(plan, s, plots) for s in sections]
        parts.append(run_function(plan, sections, plots, wiring))
        extra = {"Config"} | ({MODULE} if wiring is not None else set())
        if plan.device and (
            "device" in plan.module_state or any("device" in s.params for s in sections)
        ):
            extra.add("resolve_device")
        if train_cells:
            extra.add("jupyter_trainmate")
        for section in sections:
            for cell in section.cells:
                self.places.append((cell, f"{plan.package}.train.{section.name}()"))
        return Script(
            "\n\n".join(parts),
            sections,
            tuple(train_cells),
            frozenset(extra),
            plots,
            tuple(self.notes),
            tuple(self.places),
        )


def device_free(node: cst.BaseStatement, plan: Plan) -> cst.BaseStatement:
    if not plan.device or not any(_device_related(n) for n in walk(node)):
        return node  # nothing DeviceTransformer would change
    return node.visit(DeviceTransformer())  # type: ignore[return-value]


_DEVICE = (cst.Name, cst.SimpleString)


def _device_related(node: cst.CSTNode) -> bool:
    """What `DeviceTransformer` rewrites: `.cuda(...)`, a `"cuda"` literal, `torch.device(...)`."""
    if not isa(node, _DEVICE):
        return False
    if isinstance(node, cst.Name):
        return node.value in ("cuda", "device")
    return isinstance(node, cst.SimpleString) and "cuda" in node.value
