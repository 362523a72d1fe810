"""
Step 4f: the code of the script's functions: one per section (typed at its edges, the notebook's
code as its body, constants from `config`, module state declared `global`), one per `%%train` cell
(run through `jupyter_trainmate.train()`), and `run(config)`, the short composition of the
section calls, the display-only ones under `if config.plots:`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from .analyze import Item
from .cut import parsed, statements
from .distribute import MODULE, Wiring, device_line, in_cell
from .plan import Plan
from .sections import Section


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


QUOTES, SINGLE = chr(34) * 3, chr(39) * 3


def _indent(text: str) -> str:
    return "\n".join(("    " + ln) if ln.strip() else "" for ln in text.splitlines())


def config_name(plan: Plan) -> str:
    """`config`, unless the notebook uses that name itself (`config = dict(lr=...)`)."""
    used = {n for it in plan.versions.items for n in (*it.binds, *it.reads)}
    return next(n for n in ("config", "run_config", "trainmate_config") if n not in used)


def parameter_list(names: tuple[str, ...], config: str | None) -> str:
    """`config: Config` and the bare names: `annotate` types them, from every call, as one package."""
    return ", ".join(([f"{config}: Config"] if config else []) + list(names))


def returns_annotation(names: tuple[str, ...] | list[str]) -> str:
    return " -> None" if not names else ""  # what it returns: typed by `annotate`


def _config_value(plan: Plan, name: str, config: str) -> str:
    """The expression that reads constant `name` from the `Config` (a list: the field is a
    tuple; a dict: the field itself, one object for the run, as the notebook's global was)."""
    value = f"{config}.{plan.field_name(name)}"
    return f"list({value})" if isinstance(plan.constants[name].value, list) else value


def section_function(plan: Plan, section: Section, plots: str | None) -> str:
    config = config_name(plan)
    lines: list[str] = []
    if section.declares:
        lines.append(f"global {', '.join(section.declares)}")
    lines += [f"{name} = {_config_value(plan, name, config)}" for name in section.config]
    # `Any`: what binds it below may be an import, which mypy would take for a redefinition of
    # a variable typed None (and the static types would read None as its type). One an import
    # binds starts out of mypy's sight: mypy takes the import of a module it cannot find for a
    # redefinition of any variable before it (`try: import tensorboardX`: `@no_type_check` on
    # the section, for code that is fine), and types it from the import where it finds one
    declared = _declared(section)
    for name in section.unbound:
        if name in declared:
            lines += [
                "if not TYPE_CHECKING:  # bound below on some paths only",
                f"    {name}: Any = None",
            ]
        else:
            lines.append(f"{name} = None  # bound below on some paths only")
    lines += [u.code for u in section.units]
    if section.returns:
        lines.append("return " + ", ".join(section.returns))
    cells = ", ".join(str(c) for c in section.cells)
    title = (section.heading or f"Cell {section.cells[0]}").replace(QUOTES, SINGLE)
    doc = f'"""{title.rstrip(".")}: the notebook\'s cell{"s" if len(section.cells) > 1 else ""} {cells}.'
    if section.display:
        doc += f"\n\nDisplay only: `run()` calls it with `{config}.{plots}`."
    doc += '\n"""'
    signature = parameter_list(section.params, config if section.config else None)
    returns = returns_annotation(section.returns)
    body = _indent(doc.replace("\\", "\\\\") + "\n" + "\n".join(lines))
    return f"def {section.name}({signature}){returns}:\n{body}\n"


def _declared(section: Section) -> set[str]:
    """The names an import, a `def` or a `class` statement of the section binds (in a `try`, a
    branch, anywhere but a function or a class of its own): mypy takes each for a definition,
    and a variable bound before it for a redefinition ("Name already defined")."""
    found: set[str] = set()
    for unit in section.units:
        tree = parsed(unit.code)
        for node in statements(tree.body, scopes=False) if tree is not None else ():
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.add(node.name)
    return found


def run_function(
    plan: Plan, sections: tuple[Section, ...], plots: str | None, wiring: Wiring | None = None
) -> str:
    """`run(config)`; with `wiring`, the calls of `distributed.py` for `torchrun`."""
    config = config_name(plan)
    lines: list[str] = []
    resolved = [f"device = resolve_device({config}.device)"]
    if wiring is not None:
        resolved.append(device_line())
    if plan.device and "device" in plan.module_state:
        lines += ["global device", *resolved]
    elif plan.device and any("device" in s.params for s in sections):
        lines += resolved
    # constants the script binds again are module state: `Config`'s value first, as for the
    # sections that read a constant (`--batch-size` counts for them too)
    rebound = sorted((plan.module_state & set(plan.constants)) - {"device"})
    if rebound:
        lines.append(f"global {', '.join(rebound)}")
        lines += [f"{name} = {_config_value(plan, name, config)}" for name in rebound]
    indent = ""
    for index, section in enumerate(sections):
        if wiring is not None and index == wiring.main_from:
            lines += [f"{n} = {MODULE}.unwrap({n})" for n in wiring.unwrap]
            lines.append(f"if {MODULE}.is_main():  # evaluation, saving, display: once, on rank 0")
            indent = "    "
        args = ", ".join(([config] if section.config else []) + list(section.params))
        call = f"{section.name}({args})"
        if section.display:
            lines += [f"{indent}if {config}.{plots}:", f"{indent}    {call}"]
            continue
        target = f"{', '.join(section.returns)} = " if section.returns else ""
        lines.append(f"{indent}{target}{call}")
        if wiring is not None:
            lines += [indent + line for line in wiring.after.get(index, ())]
    lines.append(f'return {{k: v for k, v in locals().items() if k != "{config}"}}')
    return (
        f"def run({config}: Config) -> dict[str, object]:\n"
        '    """The notebook\'s sections in order, with the hyperparameters from `config`.\n\n'
        "    Returns the variables it ends with (the notebook's state), by name.\n"
        '    """\n' + _indent("\n".join(lines)) + "\n"
    )


def train_cell_function(
    cell: TrainCell,
    transformed: Callable[[cst.BaseStatement, dict[str, str]], str],
    models: set[str] | None = None,
) -> str:
    """The cell's function; with `models` (under `torchrun`), what it builds and trains is
    wrapped for data-parallel training right after it is built (`distribute.in_cell`)."""
    lines: list[str] = []
    for it in cell.items:
        code = transformed(it.node, {p: p for p in cell.params}).strip("\n")
        lines.append(code)
        wired = in_cell(code, it.binds, models) if models is not None else None
        if wired is not None:
            lines.append(wired)
    body = "\n".join(lines)
    if cell.returns:
        body += "\nreturn " + ", ".join(cell.returns)
    params = parameter_list(tuple(cell.params), None)
    returns = returns_annotation(cell.returns)
    signature = (
        f"def {cell.name}(*, {params}){returns}:" if params else f"def {cell.name}(){returns}:"
    )
    magic = f"%%train {cell.options}".rstrip()
    doc = (
        f'"""The notebook\'s `{magic}` cell (cell {cell.number}).\n\n'
        f'`run()` calls it through `jupyter_trainmate.train()`: the same runtime as the magic.\n"""'
    )
    return signature + "\n" + _indent(doc + "\n" + body) + "\n"
