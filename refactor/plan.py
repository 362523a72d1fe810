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
- The last definition of a name wins; earlier ones are reported.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from .analyze import Analysis, Item
from .read import Note, Notebook

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

    def module_of(self, name: str) -> str | None:
        placed = self.placed.get(name)
        return placed.module if placed is not None and name not in self.in_run else None

    def field_name(self, constant: str) -> str:
        lower = constant.lower()
        return lower if lower.isidentifier() and not keyword.iskeyword(lower) else constant


def plan(nb: Notebook, analysis: Analysis, package: str) -> Plan:
    out = Plan(package, nb)
    out.skipped_cells = [b.cell for b in analysis.bad]
    exported_only = nb.uses_nbdev
    definitions: dict[str, Item] = {}
    for item in analysis.items:
        if item.kind == "import":
            out.imports.append(item)
        elif item.kind in ("function", "class") and not item.train_cell:
            assert item.name is not None
            if exported_only and not item.cell.export:
                out.notes.append(
                    Note(item.cell.number, item.line, "dropped", f"{item.name}: not `#| export`ed")
                )
                continue
            earlier = definitions.get(item.name)
            if earlier is not None:
                out.notes.append(
                    Note(
                        earlier.cell.number,
                        earlier.line,
                        "redefined",
                        f"{item.name} is defined again in cell {item.cell.number}: the last "
                        "definition wins",
                    )
                )
            definitions[item.name] = item
        elif item.kind == "constant" and not item.name.startswith("_"):  # type: ignore[union-attr]
            assert item.name is not None
            earlier = out.constants.get(item.name)
            if earlier is not None and earlier.value != item.value:
                out.notes.append(
                    Note(
                        earlier.cell.number,
                        earlier.line,
                        "redefined",
                        f"{item.name} = {earlier.value!r} is set again to {item.value!r} in cell "
                        f"{item.cell.number}: the config default is the last value",
                    )
                )
            out.constants[item.name] = item
        else:
            out.run_body.append(item)
    # a constant the code later rebinds with a computed value is state, not configuration
    rebound = {n for it in out.run_body for n in it.binds}
    for name in sorted(rebound & out.constants.keys()):
        item = out.constants.pop(name)
        item.kind = "statement"
        out.run_body.append(item)
    out.run_body.sort(key=lambda it: (it.cell.number, it.line))
    for name, item in definitions.items():
        out.placed[name] = Placed(item, _module(item))
    out.device = any(_hard_coded_device(it.node) for it in analysis.items) or any(
        "device" in it.binds for it in out.run_body
    )
    _parameters(out)
    return out


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
    """Which globals each function (and class `__init__`) receives as parameters."""
    state = {n for it in out.run_body for n in it.binds}  # computed at run time
    constants = set(out.constants)
    if out.device:
        state.add("device")
    needs: dict[str, list[str]] = {}
    calls: dict[str, set[str]] = {}
    for name, placed in out.placed.items():
        item = placed.item
        reads = list(item.reads)
        if out.device and _hard_coded_device(item.node) and "device" not in reads:
            reads.append("device")
        if isinstance(item.node, cst.ClassDef):
            init_reads = _init_reads(item.node, list(item.reads))
            outside = [r for r in reads if r in state and r not in init_reads]
            if outside:
                out.in_run.add(name)  # reads notebook state outside __init__: defined in run()
                out.notes.append(
                    Note(
                        item.cell.number,
                        item.line,
                        "warning",
                        f"class {name} reads notebook state {outside} outside __init__: "
                        "defined inside run()",
                    )
                )
                continue
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
    for name, wanted in needs.items():
        placed = out.placed[name]
        taken = _local_names(placed.item.node)
        for source in wanted:
            param = out.field_name(source) if source in constants else source
            if param in taken and param != source:
                param = source
            default = source if source in constants else None
            placed.params.append(Param(param, source, default))


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
