"""
Step 6: `REFACTOR_REPORT.md`, what the command did: every cell and where it went, the section
functions and what flows between them, the versions of redefined functions and which call uses
which, every parameter created, every config field, everything dropped, commented out, skipped
or redefined, the dependencies and where they came from, the gate, types, tests, equivalence.
"""

from __future__ import annotations

from dataclasses import dataclass

from .annotate import Coverage
from .emit import Emitted
from .equivalence import Equivalence
from .gate import Gate
from .gate import lines as gate_lines
from .plan import Plan
from .project import local_modules
from .testgen import Generated
from .typecheck import Checked
from .versions import table


@dataclass(frozen=True)
class Outcome:
    """Everything the steps made, handed to the report."""

    files: dict[str, str]
    emitted: Emitted
    tests: Generated | None
    coverage: Coverage | None
    executed: bool
    equivalence: Equivalence | None = None
    gate: Gate | None = None
    checked: Checked | None = None  # mypy on the package (None: not run)


def report(plan: Plan, outcome: Outcome, findings: str, docs_problem: str = "") -> str:
    nb = plan.notebook
    emitted = outcome.emitted
    lines = [
        f"# Refactor report: `{nb.path.name}` -> `{plan.package}`",
        "",
        f"{len(nb.cells)} code cells; modules: "
        + ", ".join(sorted({f.split("/")[-1] for f in outcome.files if f.endswith(".py")})),
        "",
        "## Cells",
        "",
        "| cell | went to |",
        "| --- | --- |",
    ]
    for cell in nb.cells:
        if cell.number in plan.skipped_cells:
            where = "skipped: does not parse (--skip-bad-cells)"
            if emitted.places.get(cell.number):
                where += "; its imports: " + "; ".join(emitted.places[cell.number])
        else:
            where = "; ".join(emitted.places.get(cell.number, []))
            if not where:
                kinds = sorted({n.kind for n in nb.notes if n.cell == cell.number})
                where = ", ".join(kinds) + " (below)" if kinds else "nothing (no code left)"
        lines.append(f"| {cell.number} | {where} |")
    lines += ["", "## Sections", ""]
    script = emitted.script
    if script.sections:
        lines += [
            "| # | function | cells | parameters | returns |",
            "| --- | --- | --- | --- | --- |",
        ]
    for number, section in enumerate(script.sections, start=1):
        shown = " (display only: with `--plots`)" if section.display else ""
        params = ", ".join((["config"] if section.config else []) + list(section.params))
        lines.append(
            f"| {number} | `{section.name}()`{shown} | {', '.join(map(str, section.cells))} | "
            f"{params or '-'} | {', '.join(section.returns) or '-'} |"
        )
    if plan.module_state:
        lines += ["", "Module state of `train` (declared `global` where it is bound): "
                  + ", ".join(f"`{n}`" for n in sorted(plan.module_state))]  # fmt: skip
    lines += ["", "## Versions", ""]
    lines += table(plan.versions)
    lines += ["", "## Parameters created", ""]
    created = [(n, p) for n, ps in sorted(emitted.params.items()) for p in ps]
    for name, param in created:
        default = f" (default `{param.default}`)" if param.default else ""
        lines.append(
            f"- `{name}({param.name}=...)`: was the notebook global `{param.source}`{default}"
        )
    for train_cell in emitted.train_cells:
        lines.append(
            f"- `{train_cell.name}({', '.join(train_cell.params)})`: the `%%train` cell "
            f"{train_cell.number}"
            + (f", returns {', '.join(train_cell.returns)}" if train_cell.returns else "")
        )
    if not created and not emitted.train_cells:
        lines.append("None: no function reads notebook state.")
    lines += ["", "## Config", ""]
    for name, item in plan.constants.items():
        lines.append(f"- `{plan.field_name(name)}` = `{item.value!r}` (cell {item.cell.number})")
    if plan.device:
        lines.append('- `device` = `auto`: the notebook hard-coded a device (`.cuda()`, `"cuda"`)')
    if not plan.constants and not plan.device:
        lines.append("No constants.")
    lines += ["", "## Dependencies", ""]
    for requirement, where in sorted(nb.dependencies.items()):
        lines.append(f"- `{requirement}` (from `pip install` in {where})")
    lines.append("- and the distributions of the imports the modules use (pyproject.toml)")
    for module in local_modules(plan, outcome.files):
        lines.append(
            f"- not `{module}`: the notebook's own module (beside it, or in a folder it puts on "
            "`sys.path`), on no package index (no dependency): copy it into this folder, beside "
            "pyproject.toml, or put its folder on PYTHONPATH"
        )
    notes = sorted([*nb.notes, *plan.notes, *emitted.notes], key=lambda n: (n.cell, n.line or 0))
    lines += ["", "## Dropped, commented out, kept, redefined, warnings", ""]
    for note in notes:
        lines.append(f"- {note.where()}: {note.kind}: {note.text}")
    if not notes:
        lines.append("Nothing.")
    lines += ["", "## Types", ""]
    if outcome.coverage is not None:
        c = outcome.coverage
        how = (
            "static inference and the types recorded by --execute"
            if outcome.executed
            else (
                "static inference only (add --execute to record the types the notebook really used)"
            )
        )
        lines.append(
            f"{c.annotated} of {c.total} parameters and returns annotated ({c.share:.0%}), from {how}."
        )
    if outcome.checked is not None:
        lines += ["", *_typecheck_lines(outcome.checked)]
    lines += ["", "## Tests (tests/)", ""]
    if outcome.tests is not None:
        lines += [f"- {t}" for t in outcome.tests.tests]
        lines += ["", "Not generated:" if outcome.tests.skipped else "Nothing left out.", ""]
        lines += [f"- {s}" for s in outcome.tests.skipped]
    if outcome.equivalence is not None:
        eq = outcome.equivalence
        lines += ["", "## Equivalence (--check-equivalence)", ""]
        verdict = "PASSED" if eq.passed else "FAILED"
        lines.append(
            f"{verdict}: the notebook's numbers against the package's `run(Config())`, same "
            f"seeds, relative tolerance {eq.tolerance:g}." + (f" {eq.error}." if eq.error else "")
        )
        if eq.compared:
            lines += ["", "| name | notebook | package | equal |", "| --- | --- | --- | --- |"]
            lines += [
                f"| `{n}` | {a} | {b} | {'yes' if ok else 'NO'} |" for n, a, b, ok in eq.compared
            ]
    lines += ["", "## Checks", ""]
    if outcome.gate is not None:
        lines += [*gate_lines(outcome.gate), ""]
    if plan.stars and plan.unknown:  # the gate cannot see through a star import
        lines += ["Names the notebook never binds (from its star imports, or undefined):", ""]
        for name, (at, row) in sorted(plan.unknown.items(), key=lambda x: x[1]):
            lines.append(f"- cell {at}, line {row}: `{name}`")
        lines.append("")
    lines.append(f"`ruff check`: {'clean' if not findings else 'findings left:'}")
    if findings:
        lines += ["", "```", findings, "```"]
    lines.append("")
    lines.append(
        "API docs (pdoc): `docs/index.html`" if not docs_problem else f"API docs: {docs_problem}"
    )
    return "\n".join(lines) + "\n"


def _typecheck_lines(checked: Checked) -> list[str]:
    """mypy's verdict, the annotations it rejected and each `@no_type_check` with its reason."""
    lines = [f"mypy on the package: {checked.result}."]
    if checked.inferred:
        shown = ", ".join(f"`{r}`" for r in checked.inferred[:20])
        more = f" and {len(checked.inferred) - 20} more" if len(checked.inferred) > 20 else ""
        lines.append(
            f"{len(checked.inferred)} annotations come from mypy's own inference (what the "
            f"libraries' stubs say the notebook's calls return, where the static inference had "
            f"no type): {shown}{more}."
        )
    if checked.declared:
        count = len(checked.declared)
        lines.append(
            f"{count} variable{'s' if count != 1 else ''} got the annotation mypy asked for "
            '("Need type annotation", or "Cannot determine type" of a name a `del` removes '
            "before the function binds it) instead of `@no_type_check` on the function for it: "
            + ", ".join(f"`{d}`" for d in checked.declared)
            + "."
        )
    if checked.removed:
        lines.append(
            f"{len(checked.removed)} inferred annotations mypy rejected were removed: "
            + ", ".join(f"`{r}`" for r in checked.removed)
            + "."
        )
    if checked.untyped:
        lines.append(
            "Methods that set attributes lost all their inferred annotations instead of getting "
            "`@no_type_check` (which leaves those attributes without a type, and every method "
            "reading them failing), so the methods reading them are still checked: "
            + ", ".join(f"`{m}`" for m in checked.untyped)
            + "."
        )
    count = len(checked.no_type_check)
    lines.append(
        f"`@no_type_check` on {count} function{'s' if count != 1 else ''}"
        + (" (its own code fails mypy):" if count else ": none (every typed function checks).")
    )
    lines += [f"- `{where}`: {reason}" for where, reason in checked.no_type_check]
    return lines
