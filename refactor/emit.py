"""
Step 4: write the package's source files (as text; `output.py` formats and writes them).

One module per concern with its imports (`imports.py`): the definitions where the plan put them,
each with the parameters it was given and a docstring, the types `annotate` infers; `PKG/train.py`
with the notebook's script as section functions and `run(config)` (`compose.py`, `sections.py`);
`PKG/config.py` (`configfile.py`); `PKG/__main__.py`, `pyproject.toml` and `README.md`
(`project.py`). Importing any module only defines things: every statement with an effect is
inside a function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from .analyze import IPYTHON_NAMES
from .compose import Composer, Script, device_free
from .configfile import config_module
from .distribute import MODULE, enabled
from .docs import documented, model_card, module_docstring
from .functions import TrainCell
from .imports import Imports, header, imports_of, self_import
from .placement import Param
from .plan import MODULES, Plan
from .project import (
    distributed_module,
    main_module,
    pyproject,
    readme,
    sbatch_script,
    sweep_default,
)
from .read import Note
from .transform import CallSites, add_parameters
from .walk import walk
from .writefiles import free_names, imported_modules, module_names, with_imports

__all__ = ["Emitted", "TrainCell", "emit"]


@dataclass(frozen=True)
class Emitted:
    files: dict[str, str]  # path relative to OUT -> text
    notes: tuple[Note, ...]
    places: dict[int, list[str]]  # cell -> where its code went
    params: dict[str, list[Param]]  # function -> parameters created
    train_cells: tuple[TrainCell, ...]
    script: Script


def _is_init(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.FunctionDef) and node.name.value == "__init__"


_WORD = re.compile(r"\w+")


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


class _Emitter:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.callee_params = {name: p.params for name, p in plan.placed.items()}
        self.callees = {name for name, params in self.callee_params.items() if params}
        self.imports: Imports = imports_of(plan)
        self.imports.lines.setdefault("subprocess", "import subprocess")  # `x = !cmd` lines
        self.imports.lines.setdefault("Any", "from typing import Any")
        self.imports.lines.setdefault("TYPE_CHECKING", "from typing import TYPE_CHECKING")
        # IPython puts these in a notebook's namespace: a module that uses one imports it
        # (unless the notebook binds the name itself: `display = True` is its own variable)
        bound = {n for item in plan.versions.items for n in item.binds}
        for name, line in IPYTHON_NAMES.items():
            if name not in bound:
                self.imports.lines.setdefault(name, line)
        self.imports.lines.setdefault("jupyter_trainmate", "import jupyter_trainmate")

    def transformed(
        self, node: cst.BaseStatement, local: dict[str, str], in_run: bool = False
    ) -> cst.BaseStatement:
        node = device_free(node, self.plan)
        if not self._calls_callee(node):
            return node  # no call that CallSites would give arguments
        if isinstance(node, cst.ClassDef) and isinstance(node.body, cst.IndentedBlock):
            # only __init__ receives the class's parameters; other methods use the defaults
            body = [
                s.visit(CallSites(self.callee_params, local if _is_init(s) else {}, in_run))
                for s in node.body.body
            ]
            return node.with_changes(body=node.body.with_changes(body=body))
        return node.visit(CallSites(self.callee_params, local, in_run))  # type: ignore[return-value]

    def _calls_callee(self, node: cst.CSTNode) -> bool:
        return any(
            isinstance(found, cst.Call)
            and isinstance(found.func, cst.Name)
            and bool(self.callee_params.get(found.func.value))
            for found in walk(node)
        )

    def script_code(self, node: cst.BaseStatement, local: dict[str, str]) -> str:
        text = _code(node)
        # what `transformed` would change shows in the text: a device (`cuda`, `device`), or
        # a call of a function that takes parameters; most statements have neither, and their
        # text is their code as it is (two walks of each statement saved)
        if not (self.plan.device and ("cuda" in text or "device" in text)) and not (
            self.callees & set(_WORD.findall(text))
        ):
            return text
        return _code(self.transformed(node, local, in_run=True))

    def definition(self, name: str) -> str:
        placed = self.plan.placed[name]
        node = self_import(self.imports, placed.item.node, name, set(self.plan.placed))
        node = add_parameters(node, placed.params)
        local = {p.source: p.name for p in placed.params}
        node = documented(
            self.transformed(node, local), placed.item.cell, self.plan.notebook.path.name
        )
        return _code(node).strip("\n") + "\n"


def emit(plan: Plan) -> Emitted:
    """The package's files, not yet annotated (`annotate` types them all, as one package)."""
    e = _Emitter(plan)
    files: dict[str, str] = {}
    pkg = plan.package
    nb = plan.notebook
    title = nb.title or nb.path.stem
    places: dict[int, list[str]] = {}

    def place(cell: int, where: str) -> None:
        found = places.setdefault(cell, [])
        if where not in found:
            found.append(where)

    modules: dict[str, list[str]] = {}
    order = list(MODULES) + sorted({p.module for p in plan.placed.values()} - set(MODULES))
    for name, placed in plan.placed.items():
        modules.setdefault(placed.module, []).append(e.definition(name))
        place(placed.item.cell.number, f"{pkg}.{placed.module}.{name}")
    for name, item in plan.constants.items():
        place(item.cell.number, f"{pkg}.config (Config.{plan.field_name(name)})")
    for item in plan.imports:
        place(item.cell.number, "imports of the modules that use them")
    distributed = enabled(plan, e.imports.lines)
    if distributed:
        e.imports.lines[MODULE] = f"from . import {MODULE}"
    script = Composer(plan, e.script_code, distributed).script()
    for cell, where in script.places:
        place(cell, where)
    train_parts = modules.setdefault("train", [])
    train_parts.append(script.code)
    # a constant the notebook binds again in its script is module state too, but its first value
    # comes from `config` (imported, and set from the `Config` at the start of `run()`): a
    # declaration `= None` after the import replaced that value and redefined the name (F811)
    declared = sorted(plan.module_state - set(plan.constants))
    if declared:
        state = "\n".join(
            f"{n}: Any = None  # module state: bound by the notebook's code, read by its functions"
            for n in declared
        )
        train_parts.insert(0, state + "\n")
    for module in order:
        if module == "config":
            continue
        parts = modules.get(module)
        if not parts:
            continue
        body = "\n\n".join(parts)
        extra = set(script.extra_names) if module == "train" else set()
        if module == "train" and declared:
            extra.add("Any")
        cells = sorted({p.item.cell.number for p in plan.placed.values() if p.module == module})
        doc = f'"""{module_docstring(module, plan, cells)}\n"""\n\n'
        text = doc + header(plan, e.imports, module, body, extra) + "\n\n" + body
        files[f"{pkg}/{module}.py"] = text
    files[f"{pkg}/config.py"] = config_module(plan, script.plots)
    files[f"{pkg}/__init__.py"] = (
        f'"""{title}: the notebook `{nb.path.name}` as a package.\n\n'
        f"Run it with `python -m {pkg} train --help`.\n"
        '"""\n\nfrom __future__ import annotations\n\nfrom .config import Config\n\n'
        '__all__ = ["Config"]\n__version__ = "0.1.0"\n'
    )
    sweep = sweep_default(t.options for t in script.train_cells)
    files[f"{pkg}/__main__.py"] = main_module(pkg, title, distributed, sweep)
    if distributed:
        files[f"{pkg}/{MODULE}.py"] = distributed_module(pkg)
    imported = imported_modules(item.code for item in plan.imports)
    notes: list[Note] = []
    for path, text in sorted(nb.files.items()):
        reads = sorted(free_names(text, path) - set(e.imports.lines)) if path in nb.inlined else []
        if reads and not module_names(path) & imported:
            # only run with `%run` (its code stands there) and reading the notebook's
            # variables: a copy would be a module of undefined names
            note = (
                f"{path}: not written: it reads the notebook's {', '.join(reads[:3])}, and the "
                "notebook only ran it with %run: its code is inlined there"
            )
            notes.append(Note(nb.inlined[path], None, "file", note))
            continue
        files[path] = with_imports(path, text, e.imports)
    files["pyproject.toml"] = pyproject(plan, e.imports.lines.values(), files)
    files["README.md"] = readme(plan, title, script.plots, distributed)
    if distributed:
        files["train.sbatch"] = sbatch_script(pkg)
    files["MODEL_CARD.md"] = model_card(plan)
    return Emitted(
        files,
        (*e.imports.notes, *script.notes, *notes),
        places,
        {n: p.params for n, p in plan.placed.items()},
        script.train_cells,
        script,
    )
