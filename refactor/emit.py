"""
Step 4: write the package's source files (as text; `output.py` formats and writes them).

`PKG/config.py` (constants and the `Config` dataclass), one module per concern with its imports,
`PKG/train.py` with `run(config)`: the notebook's top-level code in order, `PKG/__main__.py` (a CLI
built from `Config`'s fields), `PKG/__init__.py`, `pyproject.toml`, `README.md` and
`REFACTOR_REPORT.md`. Importing any module only defines things: every statement with an effect is
inside `run()`.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from jupyter_trainmate.runs_table import END, START, markdown_table
from jupyter_trainmate.runtime.records import read_records

from .analyze import Item, _target_names
from .annotate import Annotated, Coverage
from .docs import documented, model_card, module_docstring
from .equivalence import Equivalence
from .plan import MODULES, Param, Plan
from .read import Note
from .testgen import Generated
from .transform import CallSites, DeviceTransformer, add_parameters

DISTRIBUTIONS = {
    "sklearn": "scikit-learn",
    "PIL": "pillow",
    "cv2": "opencv-python",
    "yaml": "pyyaml",
    "skimage": "scikit-image",
    "bs4": "beautifulsoup4",
    "attr": "attrs",
    "dateutil": "python-dateutil",
    "jupyter_trainmate": "jupyter_trainmate",
    "IPython": "ipython",
    "torch": "torch",
    "mpl_toolkits": "matplotlib",
}
CONFIG_NAMES = frozenset({"Config", "resolve_device"})
DROPPED = "# trainmate: dropped"
COMMENTED = "# notebook: "


@dataclass
class TrainCell:
    number: int
    options: str
    items: list[Item]
    params: list[str] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"train_cell_{self.number}"


@dataclass
class Emitted:
    files: dict[str, str]  # path relative to OUT -> text
    notes: list[Note]
    places: dict[int, list[str]]  # cell -> where its code went
    params: dict[str, list[Param]]  # function -> parameters created
    train_cells: list[TrainCell]
    coverage: Coverage | None = None
    types: Annotated | None = None
    executed: bool = False
    tests: Generated | None = None
    equivalence: Equivalence | None = None


def _is_init(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.FunctionDef) and node.name.value == "__init__"


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _names(code: str) -> set[str]:
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError:
        return set()
    return {n.value for n in m.findall(module, m.Name()) if isinstance(n, cst.Name)}


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


DISPLAY_CALLS = frozenset({"len", "type", "repr", "str", "head", "tail", "describe", "info"})


def _display_only(item: Item) -> bool:
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
        return name in DISPLAY_CALLS and not any(m.findall(v, m.Call()) for v in inner)
    if m.findall(value, m.Call()):
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


class _Emitter:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.notes: list[Note] = []
        self.places: dict[int, list[str]] = {}
        self.callee_params = {
            name: p.params for name, p in plan.placed.items() if name not in plan.in_run
        }
        self.import_lines = self._imports()
        self.import_lines.setdefault("subprocess", "import subprocess")  # `x = !cmd` lines

    def place(self, cell: int, where: str) -> None:
        found = self.places.setdefault(cell, [])
        if where not in found:
            found.append(where)

    # -- code of one definition or statement ---------------------------------------------------

    def transformed(
        self, node: cst.BaseStatement, local: dict[str, str], in_run: bool = False
    ) -> cst.BaseStatement:
        if self.plan.device:
            node = node.visit(DeviceTransformer())  # type: ignore[assignment]
        if isinstance(node, cst.ClassDef) and isinstance(node.body, cst.IndentedBlock):
            # only __init__ receives the class's parameters; other methods use the defaults
            body = [
                s.visit(CallSites(self.callee_params, local if _is_init(s) else {}, in_run))
                for s in node.body.body
            ]
            return node.with_changes(body=node.body.with_changes(body=body))
        return node.visit(CallSites(self.callee_params, local, in_run))  # type: ignore[return-value]

    def definition(self, name: str) -> str:
        placed = self.plan.placed[name]
        node = add_parameters(placed.item.node, placed.params)
        local = {p.source: p.name for p in placed.params}
        node = documented(
            self.transformed(node, local), placed.item.cell, self.plan.notebook.path.name
        )
        return _code(node).strip("\n") + "\n"

    # -- imports ---------------------------------------------------------------------------------

    def _imports(self) -> dict[str, str]:
        """Each name the notebook imports -> one import statement that binds only it."""
        lines: dict[str, str] = {}
        for item in self.plan.imports:
            small = item.node.body[0]  # type: ignore[attr-defined]
            if isinstance(small, cst.Import):
                for alias in small.names:
                    single = small.with_changes(
                        names=[alias.with_changes(comma=cst.MaybeSentinel.DEFAULT)]
                    )
                    bound = (
                        alias.asname.name.value  # type: ignore[union-attr]
                        if alias.asname is not None
                        else _code(alias.name).split(".")[0]
                    )
                    lines.setdefault(bound, _code(single).strip())
            elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    one = small.with_changes(
                        names=[alias.with_changes(comma=cst.MaybeSentinel.DEFAULT)],
                        lpar=None,
                        rpar=None,
                    )
                    bound = (
                        alias.asname.name.value  # type: ignore[union-attr]
                        if alias.asname is not None
                        else _code(alias.name)
                    )
                    lines.setdefault(bound, _code(one).strip())
            else:
                self.notes.append(
                    Note(item.cell.number, item.line, "warning", "`import *`: not supported")
                )
        return lines

    def header(self, module: str, body: str, extra: Iterable[str] = ()) -> str:
        """The imports `body` needs: the notebook's, other modules' definitions, constants."""
        used = _names(body) | set(extra)
        lines = [self.import_lines[n] for n in sorted(used) if n in self.import_lines]
        local: dict[str, list[str]] = {}
        for name in sorted(used):
            where = self.plan.module_of(name)
            if where is not None and where != module:
                local.setdefault(where, []).append(name)
            elif (name in self.plan.constants or name in CONFIG_NAMES) and module != "config":
                local.setdefault("config", []).append(name)
        lines += [f"from .{mod} import {', '.join(names)}" for mod, names in sorted(local.items())]
        return "\n".join(["from __future__ import annotations", "", *sorted(set(lines))]) + "\n"


def emit(plan: Plan) -> Emitted:
    """The package's files, not yet annotated (`annotate` types them all, as one package)."""
    e = _Emitter(plan)
    files: dict[str, str] = {}
    pkg = plan.package
    nb = plan.notebook
    title = nb.title or nb.path.stem
    modules: dict[str, list[str]] = {}
    order = list(MODULES) + sorted({p.module for p in plan.placed.values()} - set(MODULES))
    for name, placed in plan.placed.items():
        if name in plan.in_run:
            continue
        modules.setdefault(placed.module, []).append(e.definition(name))
        e.place(placed.item.cell.number, f"{pkg}.{placed.module}.{name}")
    for name, item in plan.constants.items():
        e.place(item.cell.number, f"{pkg}.config (Config.{plan.field_name(name)})")
    for item in plan.imports:
        e.place(item.cell.number, "imports of the modules that use them")

    run_code, train_cells, run_extra = _run(e)
    modules.setdefault("train", [])
    for cell in train_cells:
        modules["train"].append(_train_cell_function(e, cell))
    modules["train"].append(run_code)

    for module in order:
        if module == "config":
            continue
        parts = modules.get(module)
        if not parts:
            continue
        body = "\n\n".join(parts)
        extra = run_extra if module == "train" else set()
        cells = sorted(
            {
                p.item.cell.number
                for n, p in plan.placed.items()
                if p.module == module and n not in plan.in_run
            }
        )
        doc = f'"""{module_docstring(module, plan, cells)}\n"""\n\n'
        text = doc + e.header(module, body, extra) + "\n\n" + body
        files[f"{pkg}/{module}.py"] = text
    files[f"{pkg}/config.py"] = _config(e)
    files[f"{pkg}/__init__.py"] = (
        f'"""{title}: the notebook `{nb.path.name}` as a package.\n\n'
        f"Run it with `python -m {pkg} train --help`.\n"
        '"""\n\nfrom __future__ import annotations\n\nfrom .config import Config\n\n'
        '__all__ = ["Config"]\n__version__ = "0.1.0"\n'
    )
    files[f"{pkg}/__main__.py"] = _main(pkg, title)
    for path, text in sorted(nb.files.items()):
        files[path] = text
    files["pyproject.toml"] = _pyproject(e, files)
    files["README.md"] = _readme(e, title)
    files["MODEL_CARD.md"] = model_card(plan)
    return Emitted(
        files, e.notes, e.places, {n: p.params for n, p in plan.placed.items()}, train_cells
    )


def _run(e: _Emitter) -> tuple[str, list[TrainCell], set[str]]:
    """`run(config)`: the notebook's top-level code in order; %%train cells as calls."""
    plan = e.plan
    lines: list[str] = []
    train_cells: list[TrainCell] = []
    bound: set[str] = set(plan.constants) | ({"device"} if plan.device else set())
    body_items = list(plan.run_body)
    in_run_defs = sorted(
        (plan.placed[n].item for n in plan.in_run), key=lambda it: (it.cell.number, it.line)
    )
    merged = sorted(body_items + in_run_defs, key=lambda it: (it.cell.number, it.line))
    index = 0
    while index < len(merged):
        item = merged[index]
        if item.train_cell:
            group = [item]
            while (
                index + 1 < len(merged)
                and merged[index + 1].train_cell
                and merged[index + 1].cell.number == item.cell.number
            ):
                index += 1
                group.append(merged[index])
            cell = TrainCell(item.cell.number, item.cell.train_options or "", group)
            reads = []
            own: set[str] = set()  # bound by the cell before it reads them: not inputs
            for it in group:
                loops = {
                    n
                    for f in m.findall(it.node, m.For())
                    for n in _target_names(f.target)  # type: ignore[attr-defined]
                }
                reads += [r for r in it.reads if r not in own and r not in loops]
                own |= set(it.binds)
            for name in list(reads):  # what the functions it calls need, passed through
                placed = plan.placed.get(name)
                if placed is not None:
                    reads += [p.source for p in placed.params]
            cell.params = sorted({r for r in reads if r in bound})
            binds = {b for it in group for b in it.binds}
            later = {r for it in merged[index + 1 :] for r in it.reads}
            cell.returns = sorted(binds & later)
            bound |= binds
            train_cells.append(cell)
            args = ", ".join(f"{p}={p}" for p in cell.params)
            call = f"jupyter_trainmate.train({cell.name}, {cell.options!r}" + (
                f", {args})" if args else ")"
            )
            target = ", ".join(cell.returns)
            lines.append(f"{target} = {call}" if target else call)
            e.place(item.cell.number, f"{plan.package}.train.{cell.name} (called by run())")
            index += 1
            continue
        index += 1
        kind = _dropped(item)
        if kind == "dropped":
            e.place(item.cell.number, "dropped (IPython-only)")
            continue
        if kind == "commented":
            comment = item.node.trailing_whitespace.comment  # type: ignore[attr-defined]
            lines.append(comment.value)
            continue
        if _display_only(item):
            e.notes.append(
                Note(item.cell.number, item.line, "dropped", f"`{item.code.strip()}`: display only")
            )
            continue
        if plan.device and item.binds == ("device",):
            e.notes.append(
                Note(
                    item.cell.number,
                    item.line,
                    "dropped",
                    f"`{item.code.strip()}`: the device comes from Config.device (--device)",
                )
            )
            continue
        node = item.node
        if item.kind in ("function", "class"):
            assert item.name is not None
            node = add_parameters(node, plan.placed[item.name].params)
        lines.append(_code(e.transformed(node, {}, in_run=True)).strip("\n"))
        bound |= set(item.binds)
        e.place(item.cell.number, f"{plan.package}.train.run()")
    used = _names("\n".join(lines))
    start = []
    for name, item in plan.constants.items():
        if name in used:
            field = plan.field_name(name)
            value = f"list(config.{field})" if isinstance(item.value, list) else f"config.{field}"
            start.append(f"{name} = {value}")
    if plan.device and "device" in used:
        start.append("device = resolve_device(config.device)")
    body = "\n".join(start + lines) or "pass"
    body += "\nreturn {k: v for k, v in locals().items() if k != 'config'}"
    indented = "\n".join(("    " + line) if line.strip() else "" for line in body.splitlines())
    code = (
        "def run(config: Config) -> dict[str, object]:\n"
        '    """The notebook\'s top-level code, in order, with the hyperparameters from `config`.\n\n'
        "    Returns the variables it ends with (the notebook's state), by name.\n"
        '    """\n' + indented + "\n"
    )
    extra = {"Config"} | ({"resolve_device"} if "resolve_device" in code else set())
    if train_cells:
        extra.add("jupyter_trainmate")
        e.import_lines.setdefault("jupyter_trainmate", "import jupyter_trainmate")
    return code, train_cells, extra


def _train_cell_function(e: _Emitter, cell: TrainCell) -> str:
    body = "\n".join(
        _code(e.transformed(it.node, {p: p for p in cell.params})).strip("\n") for it in cell.items
    )
    if cell.returns:
        body += "\nreturn " + ", ".join(cell.returns)
    params = ", ".join(cell.params)  # typed by `annotate`, from run()'s call
    signature = f"def {cell.name}(*, {params}):" if params else f"def {cell.name}():"
    magic = f"%%train {cell.options}".rstrip()
    doc = (
        f'"""The notebook\'s `{magic}` cell (cell {cell.number}).\n\n'
        f'`run()` calls it through `jupyter_trainmate.train()`: the same runtime as the magic.\n"""'
    )
    text = doc + "\n" + body
    return (
        signature
        + "\n"
        + "\n".join(("    " + ln) if ln.strip() else "" for ln in text.splitlines())
        + "\n"
    )


def _annotation(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list | tuple) and value:
        return f"tuple[{_annotation(value[0])}, ...]"
    return "object"


def _config(e: _Emitter) -> str:
    plan = e.plan
    lines = [
        f'"""Hyperparameters of the notebook `{plan.notebook.path.name}`.\n\n'
        f"Each constant the notebook set is a field of `Config` (its value the default), and every\n"
        f"field is an option of `python -m {plan.package} train` (`--help` lists them).\n"
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass",
    ]
    if plan.device:
        lines += ["", "import torch"]
    lines.append("")
    for name, item in plan.constants.items():
        lines.append(f"{name} = {item.code.split('=', 1)[1].strip()}")
        lines.append(
            f'"""Cell {item.cell.number} of the notebook; the default of '
            f'`Config.{plan.field_name(name)}` (`--{plan.field_name(name).replace("_", "-")}`)."""'
        )
    lines += [
        "",
        "",
        "@dataclass",
        "class Config:",
        '    """Every hyperparameter the notebook set."""',
        "",
    ]
    for name, item in plan.constants.items():
        default = f"tuple({name})" if isinstance(item.value, list) else name
        lines.append(f"    {plan.field_name(name)}: {_annotation(item.value)} = {default}")
    if plan.device:
        lines.append('    device: str = "auto"  # auto: cuda when there is a GPU, else cpu')
    if not plan.constants and not plan.device:
        lines.append("    pass")
    if plan.device:
        lines += [
            "",
            "",
            "def resolve_device(name: str) -> torch.device:",
            '    """`auto`: the GPU when there is one, else the CPU; anything else as given."""',
            '    if name == "auto":',
            '        return torch.device("cuda" if torch.cuda.is_available() else "cpu")',
            "    return torch.device(name)",
        ]
    return "\n".join(lines) + "\n"


def _main(pkg: str, title: str) -> str:
    return f'''"""Command line: `python -m {pkg} train --help` (runs under `torchrun -m {pkg}` too)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from .config import Config


def build_parser() -> argparse.ArgumentParser:
    """The `train` command, with one option per field of `Config`."""
    parser = argparse.ArgumentParser(prog="python -m {pkg}", description={title!r})
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="run the notebook's training with the config")
    for field in dataclasses.fields(Config):
        flag = "--" + field.name.replace("_", "-")
        default = field.default
        if isinstance(default, bool):
            train.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif isinstance(default, tuple):
            kind = type(default[0]) if default else str
            train.add_argument(flag, nargs="+", type=kind, default=default)
        else:
            kind = type(default) if default is not None else str
            train.add_argument(flag, type=kind, default=default, help=f"default: {{default}}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the options into a `Config` and run the notebook's training with it."""
    args = build_parser().parse_args(argv)
    values = {{f.name: getattr(args, f.name) for f in dataclasses.fields(Config)}}
    values = {{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}}
    from .train import run

    run(Config(**values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def _distribution(module: str, installed: Mapping[str, list[str]]) -> str:
    if module in DISTRIBUTIONS:
        return DISTRIBUTIONS[module]
    found = installed.get(module)
    return sorted(found)[0] if found else module


def _pyproject(e: _Emitter, files: dict[str, str]) -> str:
    plan = e.plan
    installed = importlib.metadata.packages_distributions()
    requirements: dict[str, str] = {}
    code = "\n".join(t for p, t in files.items() if p.endswith(".py"))
    for line in e.import_lines.values():
        if line not in code:
            continue
        words = line.split()
        top = words[1].split(".")[0]
        if top in sys.stdlib_module_names or top == "__future__" or words[1].startswith("."):
            continue
        dist = _distribution(top, installed)
        requirements.setdefault(dist.lower().replace("_", "-"), dist)
    for requirement in plan.notebook.dependencies:
        name = requirement.split("[")[0]
        for sep in "=<>!~ ;":
            name = name.split(sep)[0]
        requirements[name.lower().replace("_", "-")] = requirement
    deps = "".join(f'    "{r}",\n' for _, r in sorted(requirements.items()))
    return f'''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{plan.package}"
version = "0.1.0"
description = "The notebook {plan.notebook.path.name} as a package (generated by trainmate refactor)"
readme = "README.md"
requires-python = ">=3.10"
dependencies = [
{deps}]

[project.scripts]
{plan.package} = "{plan.package}.__main__:main"

[tool.setuptools]
packages = ["{plan.package}"]

[project.optional-dependencies]
test = ["pytest"]

[tool.pytest.ini_options]
pythonpath = ["."]
testpaths = ["tests"]

[tool.mypy]
# a function whose own code fails mypy is `@no_type_check` (REFACTOR_REPORT.md says why)
ignore_missing_imports = true

[tool.ruff.lint]
# pycodestyle errors, pyflakes and import order: the checks `trainmate refactor` guarantees
select = ["E4", "E7", "E9", "F", "I"]
'''


def _readme(e: _Emitter, title: str) -> str:
    plan = e.plan
    pkg = plan.package
    modules = sorted(
        {p.module for n, p in plan.placed.items() if n not in plan.in_run} | {"config", "train"}
    )
    rows = "".join(
        f"| `{pkg}.{m}` | {', '.join(sorted(n for n, p in plan.placed.items() if p.module == m and n not in plan.in_run)) or '-'} |\n"
        for m in modules
    )
    return f"""# {title}

The notebook `{plan.notebook.path.name}` as an installable package, written by `trainmate refactor`.
What went where, and what was left out and why: `REFACTOR_REPORT.md`.

```console
pip install -e .
python -m {pkg} train --help
python -m {pkg} train            # the notebook's training, with its hyperparameters
```

| module | definitions |
| --- | --- |
{rows}{_experiments(plan)}"""


def _experiments(plan: Plan) -> str:
    """The notebook's recorded runs, between the markers `trainmate runs --markdown` keeps."""
    records = read_records(plan.notebook.path.parent / "runs")
    if not records:
        return ""
    return (
        "\n## Experiments\n\nThe notebook's `%%train` runs (`trainmate runs --markdown README.md`"
        f" updates this table):\n\n{START}\n{markdown_table(records[-10:])}\n{END}\n"
    )
