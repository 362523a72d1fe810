"""
Characterisation tests (part of step 6, `testgen`): functions that took and returned small
tensors or plain values, drew no random numbers and gave the same result twice when the notebook
ran with `--execute` are called with their recorded inputs (saved with `torch.save` in
`tests/fixtures.pt`, under a size budget) and must give the recorded output.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import libcst as cst

from .plan import Plan

if TYPE_CHECKING:
    from .testgen import Generated

FIXTURE_BUDGET = 1_000_000  # bytes of tests/fixtures.pt


def characterisation_tests(
    plan: Plan,
    fixtures: dict[str, Any],
    out: Generated,
    trace: dict[str, list[dict[str, Any]]],
    dropped: dict[str, str],
) -> str:
    import torch

    pkg = plan.package
    kept: dict[str, Any] = {}
    for name, placed in plan.placed.items():  # preprocessing without one: say why
        if (
            placed.module != "data"
            or name in fixtures
            or not isinstance(placed.item.node, cst.FunctionDef)
        ):
            continue
        if name in dropped:
            why = dropped[name]
        elif name not in trace:
            why = "never called in the notebook"
        else:
            why = "its inputs or outputs were not small tensors or plain values"
        out.skipped.append(f"{name}: no characterisation test: {why}")
    for name, value in sorted(fixtures.items()):
        target = plan.placed.get(name)
        if target is None or name in plan.in_run:
            continue
        required = [p for p in target.params if p.default is None]
        if required:
            out.skipped.append(f"{name}: needs notebook state ({required[0].name}) to run")
            continue
        trial = {**kept, name: value}
        buffer = io.BytesIO()
        torch.save(trial, buffer)
        if buffer.tell() > FIXTURE_BUDGET:
            out.skipped.append(f"{name}: its recorded fixture is over the size budget")
            continue
        kept[name] = value
    if not kept:
        return ""
    buffer = io.BytesIO()
    torch.save(kept, buffer)
    out.binary["tests/fixtures.pt"] = buffer.getvalue()
    modules = {name: plan.placed[name].module for name in kept}
    out.tests += [f"{name}: characterisation (recorded input -> recorded output)" for name in kept]
    lines = [
        '"""Characterisation tests: recorded inputs give the outputs the notebook computed (generated).',
        "",
        "The fixtures were recorded by `trainmate refactor --execute` from functions that drew no random",
        'numbers and gave the same result twice."""',
        "",
        "from __future__ import annotations",
        "",
        "from pathlib import Path",
        "",
        "import pytest",
        "import torch",
        "",
        *sorted({f"from {pkg} import {module}" for module in modules.values()}),
        "",
        'FIXTURES = torch.load(Path(__file__).parent / "fixtures.pt", weights_only=True)',
        f"FUNCTIONS = {{{', '.join(f'{n!r}: {m}.{n}' for n, m in sorted(modules.items()))}}}",
        "",
        "",
        '@pytest.mark.parametrize("name", sorted(FIXTURES))',
        "def test_recorded_inputs_give_the_recorded_output(name: str) -> None:",
        "    arguments, expected = FIXTURES[name]",
        "    torch.testing.assert_close(FUNCTIONS[name](**arguments), expected)",
    ]
    return "\n".join(lines) + "\n"
