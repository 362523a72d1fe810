"""
Step 3: decide where everything goes.

- Modules by concern: `model` (`nn.Module` subclasses), `data` (datasets, loaders, transforms,
  collate functions), `train` (what calls `.backward()` or an optimizer step, `%%train` cells, and
  `run()`: the notebook's top-level code in order), `config` (the hyperparameter constants as a
  typed dataclass), `utils` (the rest). A markdown heading above a cell steers its definitions
  ("## Data loading" -> data); a cell tag `trainmate:module=NAME` or nbdev's `#| default_exp NAME`
  overrides. With nbdev markers, only `#| export` cells' definitions become module code.
- Notebook state becomes parameters: a function that reads a global the notebook computes
  (`model`, `loader`, `device`) or a constant (`LR`) gets it as a keyword-only parameter (constants
  with their value as default), transitively through the functions it calls, and every call site
  passes it. A class whose `__init__` reads them gets them as `__init__` parameters.
- Definitions are versions (`versions.py`): each call binds to the definition live where it
  stands; the versions still called are kept under their own names.
- Module state: a name a function declares `global`, or notebook state that a class reads outside
  `__init__` or that a function passed around as a value reads (its callers cannot pass it), stays
  a module global of `train` (the section functions that bind it declare it `global`); the
  definitions reading it live in `train` too.
- Modules import each other in one direction only (config, utils, data, model, the notebook's own
  modules, train): a definition that uses one from a later module moves there (no import cycle).
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from .analyze import BUILTINS, Analysis, Item
from .read import Note, Notebook
from .versions import Versions, resolve

MODULES = ("config", "utils", "data", "model", "train")
MODEL_BASES = re.compile(r"(^|\.)(Module|Sequential|ModuleList|LightningModule)$")
DATA_BASES = re.compile(r"(^|\.)(Dataset|IterableDataset|Sampler|DataModule)$")
DATA_WORDS = re.compile(r"data|load|transform|collate|augment|tokeni|preprocess|batch|split")
HEADING_WORDS = (
    ("data", re.compile(r"\bdata|dataset|loader|preprocess|augment|transform", re.I)),
    ("model", re.compile(r"\bmodel|architecture|network|layer", re.I)),
    ("train", re.compile(r"\btrain|fit|loop|optimi|evaluat|valid|metric", re.I)),
)
TAG = re.compile(r"^trainmate:module=([A-Za-z_][A-Za-z0-9_]*)$")


@dataclass
class Param:
    name: str  # the parameter's name in the function
    source: str  # the notebook global it stands for
    default: str | None  # a constant's name (its value is the default), None: required


@dataclass
class Placed:
    item: Item
    module: str
    params: list[Param] = field(default_factory=list)


@dataclass
class Plan:
    package: str
    notebook: Notebook
    placed: dict[str, Placed] = field(default_factory=dict)  # definition name -> where
    constants: dict[str, Item] = field(default_factory=dict)  # config constants, last wins
    imports: list[Item] = field(default_factory=list)
    run_body: list[Item] = field(default_factory=list)  # top-level statements, in order
    in_run: set[str] = field(default_factory=set)  # definitions kept inside run()
    device: bool = False  # the notebook hard-codes a device: a `device` config field
    notes: list[Note] = field(default_factory=list)
    skipped_cells: list[int] = field(default_factory=list)
    module_state: set[str] = field(default_factory=set)  # module globals of `train`
    stars: list[Item] = field(default_factory=list)  # `from x import *` of the notebook
    unknown: dict[str, tuple[int, int]] = field(default_factory=dict)  # read, never bound
    versions: Versions = field(default_factory=lambda: Versions((), (), (), ()))

    def module_of(self, name: str) -> str | None:
        placed = self.placed.get(name)
        return placed.module if placed is not None and name not in self.in_run else None

    def field_name(self, constant: str) -> str:
        lower = constant.lower()
        return lower if lower.isidentifier() and not keyword.iskeyword(lower) else constant


def plan(nb: Notebook, analysis: Analysis, package: str) -> Plan:
    out = Plan(package, nb)
    out.skipped_cells = [b.cell for b in analysis.bad]
    for bad in analysis.bad:
        out.notes.append(Note(bad.cell, bad.line, "skipped", f"does not parse: {bad.message}"))
    exported_only = nb.uses_nbdev
    out.versions = resolve(list(analysis.items), exported_only)
    out.notes.extend(out.versions.notes)
    items = list(out.versions.items)
    definitions: dict[str, Item] = {}
    resets: set[int] = set()
    for item in items:
        if item.kind == "import":
            if isinstance(item.node.body[0], cst.ImportFrom) and isinstance(  # type: ignore[attr-defined]
                item.node.body[0].names,  # type: ignore[attr-defined]
                cst.ImportStar,
            ):
                out.stars.append(item)
            out.imports.append(item)
        elif item.kind in ("function", "class") and not item.train_cell:
            assert item.name is not None
            if exported_only and not item.cell.export:
                out.notes.append(
                    Note(item.cell.number, item.line, "dropped", f"{item.name}: not `#| export`ed")
                )
                continue
            definitions[item.name] = item
        elif item.kind == "constant" and not item.name.startswith("_"):  # type: ignore[union-attr]
            assert item.name is not None
            earlier = out.constants.get(item.name)
            if earlier is not None:
                if earlier.value != item.value:  # set again: from here on, notebook state
                    resets.add(item.cell.number * 100000 + item.line)
                    out.notes.append(
                        Note(
                            item.cell.number,
                            item.line,
                            "kept",
                            f"{item.name} = {item.value!r} sets again the config field "
                            f"(default {earlier.value!r}, cell {earlier.cell.number}): kept "
                            "where it stands, and the code after it uses this value",
                        )
                    )
                    out.run_body.append(dataclasses.replace(item, kind="statement"))
                continue
            out.constants[item.name] = item
        else:
            out.run_body.append(item)
    declared = {n for it in items for n in it.declares}
    # a constant the code later rebinds with a computed value is state, not configuration
    rebound = {
        n
        for it in out.run_body
        if it.cell.number * 100000 + it.line not in resets
        for n in it.binds
    }
    for name in sorted((rebound | declared) & out.constants.keys()):
        item = out.constants.pop(name)
        out.run_body.append(dataclasses.replace(item, kind="statement"))
    out.run_body.sort(key=lambda it: (it.cell.number, it.line))
    for name, item in definitions.items():
        out.placed[name] = Placed(item, _module(item))
    out.device = any(_hard_coded_device(it.node) for it in analysis.items) or any(
        "device" in it.binds for it in out.run_body
    )
    out.module_state = declared - set(definitions)
    while True:  # module state only grows: a fixpoint
        before = set(out.module_state)
        for placed in out.placed.values():
            placed.params.clear()
        _parameters(out)
        if out.module_state == before:
            break
    _state_readers_to_train(out)
    _one_direction(out)
    bound = {n for it in items for n in it.binds} | {n for it in items for n in it.declares}
    for item in items:
        for name in item.reads:
            if name not in bound and name not in BUILTINS and name not in out.unknown:
                out.unknown[name] = (item.cell.number, item.line)
    return out


def _state_readers_to_train(out: Plan) -> None:
    """Definitions that read or declare module state live with it, in `train`."""
    for placed in out.placed.values():
        item = placed.item
        if placed.module != "train" and (
            set(item.reads) & out.module_state or set(item.declares) & out.module_state
        ):
            placed.module = "train"


def _rank(module: str) -> tuple[int, str]:
    order = {"config": 0, "utils": 1, "data": 2, "model": 3, "train": 9}
    return order.get(module, 5), module


def _one_direction(out: Plan) -> None:
    """A definition that uses one placed in a later module moves there: no import cycles."""
    changed = True
    while changed:
        changed = False
        for name, placed in out.placed.items():
            for used in placed.item.reads:
                other = out.placed.get(used)
                if other is None or used == name:
                    continue
                if _rank(other.module) > _rank(placed.module):
                    out.notes.append(
                        Note(
                            placed.item.cell.number,
                            placed.item.line,
                            "moved",
                            f"{name}: to `{other.module}` (it uses {used}, defined there)",
                        )
                    )
                    placed.module = other.module
                    changed = True


def _module(item: Item) -> str:
    for tag in item.cell.tags:
        found = TAG.match(tag)
        if found:
            return found.group(1)
    if item.cell.export and item.cell.default_exp:
        return re.sub(r"\W", "_", item.cell.default_exp.split(".")[-1])
    node = item.node
    if isinstance(node, cst.ClassDef):
        bases = [cst.Module([]).code_for_node(b.value) for b in node.bases]
        if any(MODEL_BASES.search(b) for b in bases):
            return "model"
        if any(DATA_BASES.search(b) for b in bases):
            return "data"
    code = item.code
    if ".backward(" in code or re.search(r"\.step\(\s*\)", code):
        return "train"
    if isinstance(node, cst.FunctionDef) and (
        DATA_WORDS.search(node.name.value.lower()) or "DataLoader(" in code
    ):
        return "data"
    heading = item.cell.heading or ""
    for module, words in HEADING_WORDS:
        if words.search(heading):
            return module
    return "utils"


def _hard_coded_device(node: cst.CSTNode) -> bool:
    cuda_call = m.Call(func=m.Attribute(attr=m.Name("cuda")))
    cuda_text = m.SimpleString(value=m.MatchRegex(r"^[rbu]*['\"]cuda(:\d+)?['\"]$"))
    return bool(m.findall(node, cuda_call | cuda_text))


def _parameters(out: Plan) -> None:
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
    for name, placed in out.placed.items():
        item = placed.item
        reads = [r for r in item.reads if r not in item.declares]
        if out.device and _hard_coded_device(item.node) and "device" not in reads:
            reads.append("device")
        if isinstance(item.node, cst.ClassDef):
            init_reads = _init_reads(item.node, list(item.reads))
            outside = [r for r in reads if r in state and r not in init_reads]
            if outside:
                out.module_state |= set(outside)
                out.notes.append(
                    Note(
                        item.cell.number,
                        item.line,
                        "warning",
                        f"class {name} reads notebook state {outside} outside __init__: "
                        "module state of train",
                    )
                )
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
    for name in sorted(values):
        stateful = [n for n in needs[name] if n in state]
        if stateful:
            out.module_state |= set(stateful)
            placed = out.placed[name]
            out.notes.append(
                Note(
                    placed.item.cell.number,
                    placed.item.line,
                    "warning",
                    f"{name} is passed around as a value and reads notebook state {stateful}: "
                    "module state of train",
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
