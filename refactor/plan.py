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
import functools
import keyword
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import libcst as cst

from .analyze import BUILTINS, Analysis, Item
from .params import hard_coded_device, parameters, state_reads
from .placement import Placed
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


@dataclass(frozen=True)
class Plan:
    """Where everything goes. Frozen: the steps after `plan` read it and add nothing to it."""

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
        return field_names(tuple(self.constants), self.device).get(constant, constant)


@functools.lru_cache(maxsize=16)
def field_names(constants: tuple[str, ...], device: bool) -> Mapping[str, str]:
    """Each constant's field of `Config`: its name in lower case (`LR` -> `lr`), or its own name
    where the lower case is not a name, is another constant's own name (`gamma = 0.99` and
    `GAMMA = 0.5`, `BATCH_SIZE` and `batch_size`: before, both were one field, and the package
    computed with one value for both), is an earlier constant's field (`Lr`, `LR`), or is
    `device` where `Config` has its own `device` field."""
    taken = set(constants) | ({"device"} if device else set())
    fields: dict[str, str] = {}
    for constant in constants:
        lower = constant.lower()
        if (
            lower == constant
            or not lower.isidentifier()
            or keyword.iskeyword(lower)
            or lower in taken
        ):
            fields[constant] = constant
        else:
            fields[constant] = lower
            taken.add(lower)
    return MappingProxyType(fields)  # one object for every call: read-only


def plan(nb: Notebook, analysis: Analysis, package: str) -> Plan:
    notes = [
        Note(
            b.cell,
            b.line,
            "skipped",
            f"does not parse: {b.message}"
            + ("; its imports are kept: " + ", ".join(f"`{k}`" for k in b.kept) if b.kept else ""),
        )
        for b in analysis.bad
    ]
    exported_only = nb.uses_nbdev
    versions = resolve(list(analysis.items), exported_only)
    notes.extend(versions.notes)
    items = list(versions.items)
    stars: list[Item] = []
    imports: list[Item] = []
    constants: dict[str, Item] = {}
    run_body: list[Item] = []
    definitions: dict[str, Item] = {}
    resets: set[int] = set()
    for item in items:
        if item.kind == "import":
            if isinstance(item.node.body[0], cst.ImportFrom) and isinstance(  # type: ignore[attr-defined]
                item.node.body[0].names,  # type: ignore[attr-defined]
                cst.ImportStar,
            ):
                stars.append(item)
            imports.append(item)
        elif item.kind in ("function", "class") and not item.train_cell:
            assert item.name is not None
            if exported_only and not item.cell.export:
                notes.append(
                    Note(item.cell.number, item.line, "dropped", f"{item.name}: not `#| export`ed")
                )
                continue
            definitions[item.name] = item
        elif item.kind == "constant" and not item.name.startswith("_"):  # type: ignore[union-attr]
            assert item.name is not None
            earlier = constants.get(item.name)
            if earlier is not None:
                if earlier.value != item.value:  # set again: from here on, notebook state
                    resets.add(item.index)
                    notes.append(
                        Note(
                            item.cell.number,
                            item.line,
                            "kept",
                            f"{item.name} = {item.value!r} sets again the config field "
                            f"(default {earlier.value!r}, cell {earlier.cell.number}): kept "
                            "where it stands, and the code after it uses this value",
                        )
                    )
                    run_body.append(dataclasses.replace(item, kind="statement"))
                continue
            constants[item.name] = item
        else:
            run_body.append(item)
    declared = {n for it in items for n in it.declares}
    # a constant the code later rebinds with a computed value is state, not configuration
    rebound = {n for it in run_body if it.index not in resets for n in it.binds}
    for name in sorted((rebound | declared) & constants.keys()):
        item = constants.pop(name)
        run_body.append(dataclasses.replace(item, kind="statement"))
    run_body.sort(key=lambda it: it.index)
    device = any(hard_coded_device(it) for it in analysis.items) or any(
        "device" in it.binds for it in run_body
    )
    if device and "device" in constants:  # Config.device ("auto") replaces the notebook's
        run_body.append(dataclasses.replace(constants.pop("device"), kind="statement"))
    _evaluated_at_definition(definitions, run_body, notes, {"device"} if device else set())
    run_body.sort(key=lambda it: it.index)
    out = Plan(
        package,
        nb,
        placed={name: Placed(item, _module(item)) for name, item in definitions.items()},
        constants=constants,
        imports=imports,
        run_body=run_body,
        device=device,
        notes=notes,
        skipped_cells=[b.cell for b in analysis.bad],
        module_state=declared - set(definitions),
        stars=stars,
        versions=versions,
    )
    while True:  # module state only grows: a fixpoint
        before = set(out.module_state)
        for placed in out.placed.values():
            placed.params.clear()
        parameters(out)
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


def _evaluated_at_definition(
    definitions: dict[str, Item], run_body: list[Item], notes: list[Note], also: set[str]
) -> None:
    """A def whose defaults, decorators or bases read notebook state (`def fit(m=model)`) needs
    that state when it is defined: it stays in the script, where the state is (and is passed
    on like any other name the script binds)."""
    changed = True
    while changed:
        changed = False
        state = {n for it in run_body for n in it.binds} | also
        for name, item in list(definitions.items()):
            needs = [n for n in item.at_definition if n in state]
            if needs:
                del definitions[name]
                run_body.append(dataclasses.replace(item, kind="statement"))
                notes.append(
                    Note(
                        item.cell.number,
                        item.line,
                        "kept",
                        f"{name}: its definition reads notebook state {needs} (a default, a "
                        "decorator or a base): defined in the script, where that state is",
                    )
                )
                changed = True


def _state_readers_to_train(out: Plan) -> None:
    """Definitions that read or declare module state live with it, in `train` (a model class
    whose method calls `.cuda()` reads `device` once the refactor writes it in)."""
    for placed in out.placed.values():
        item = placed.item
        reads = set(item.reads) | set(state_reads(item, out.device))
        if placed.module != "train" and (
            reads & out.module_state or set(item.declares) & out.module_state
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
