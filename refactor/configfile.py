"""
Step 4c: `PKG/config.py`: the notebook's constants and the `Config` dataclass (one field per
constant, its value the default; `device` when the notebook hard-coded one; `plots` when it has
display-only sections), and `resolve_device`.
"""

from __future__ import annotations

import libcst as cst

from .analyze import Item
from .plan import Plan


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
    if isinstance(value, dict):
        return "dict[str, Any]"
    return "object"


def _value_code(item: Item) -> str:
    """The literal a constant is set to, as written (not the comments above it)."""
    small = item.node.body[0]  # type: ignore[attr-defined]
    assert isinstance(small, cst.Assign | cst.AnnAssign)
    assert small.value is not None
    return cst.Module([]).code_for_node(small.value)


def config_module(plan: Plan, plots: str | None) -> str:
    """`plots`: the name of the field that turns the display-only sections on, if any."""
    lines = [
        f'"""Hyperparameters of the notebook `{plan.notebook.path.name}`.\n\n'
        f"Each constant the notebook set is a field of `Config` (its value the default), and every\n"
        f"field is an option of `python -m {plan.package} train` (`--help` lists them).\n"
        '"""',
        "",
        "from __future__ import annotations",
        "",
    ]
    dicts = any(isinstance(item.value, dict) for item in plan.constants.values())
    if dicts:  # a dict field's default: a copy of the notebook's dict for each Config (the
        # private names cannot be a constant's: those starting with `_` are not fields)
        lines += ["import copy as _copy", "from dataclasses import dataclass"]
        lines += ["from dataclasses import field as _field", "from typing import Any"]
    else:
        lines.append("from dataclasses import dataclass")
    if plan.device:
        lines += ["", "import torch"]
    lines.append("")
    for name, item in plan.constants.items():
        lines.append(f"{name} = {_value_code(item)}")
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
        if isinstance(item.value, dict):
            default = f"_field(default_factory=lambda: _copy.deepcopy({name}))"
        lines.append(f"    {plan.field_name(name)}: {_annotation(item.value)} = {default}")
    if plan.device:
        lines.append('    device: str = "auto"  # auto: cuda when there is a GPU, else cpu')
    if plots:
        lines.append(f"    {plots}: bool = False  # also run the notebook's display-only sections")
    if not plan.constants and not plan.device and not plots:
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
