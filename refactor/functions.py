"""
Step 4f: the code of the script's functions: one per section (typed at its edges, the notebook's
code as its body, constants from `config`, module state declared `global`), one per `%%train` cell
(run through `jupyter_trainmate.train()`), and `run(config)`, the short composition of the
section calls, the display-only ones under `if config.plots:`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from .analyze import Item
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


def section_function(plan: Plan, section: Section, plots: str | None) -> str:
    config = config_name(plan)
    lines: list[str] = []
    if section.declares:
        lines.append(f"global {', '.join(section.declares)}")
    for name in section.config:
        field_name = plan.field_name(name)
        item = plan.constants[name]
        value = (
            f"list({config}.{field_name})"
            if isinstance(item.value, list)
            else f"{config}.{field_name}"
        )
        lines.append(f"{name} = {value}")
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


def run_function(plan: Plan, sections: tuple[Section, ...], plots: str | None) -> str:
    config = config_name(plan)
    lines: list[str] = []
    if plan.device and "device" in plan.module_state:
        lines += ["global device", f"device = resolve_device({config}.device)"]
    elif plan.device and any("device" in s.params for s in sections):
        lines.append(f"device = resolve_device({config}.device)")
    for section in sections:
        args = ", ".join(([config] if section.config else []) + list(section.params))
        call = f"{section.name}({args})"
        if section.display:
            lines += [f"if {config}.{plots}:", f"    {call}"]
            continue
        lines.append(f"{', '.join(section.returns)} = {call}" if section.returns else call)
    lines.append(f'return {{k: v for k, v in locals().items() if k != "{config}"}}')
    return (
        f"def run({config}: Config) -> dict[str, object]:\n"
        '    """The notebook\'s sections in order, with the hyperparameters from `config`.\n\n'
        "    Returns the variables it ends with (the notebook's state), by name.\n"
        '    """\n' + _indent("\n".join(lines)) + "\n"
    )


def train_cell_function(
    cell: TrainCell, transformed: Callable[[cst.BaseStatement, dict[str, str]], str]
) -> str:
    body = "\n".join(
        transformed(it.node, {p: p for p in cell.params}).strip("\n") for it in cell.items
    )
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
