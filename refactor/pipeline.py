"""
`trainmate refactor NB.ipynb`: the steps in order (read -> analyze -> plan -> emit -> write).
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from jupyter_trainmate.errors import TrainmateError

from .analyze import analyze
from .annotate import annotate
from .docs import build_html
from .emit import emit
from .equivalence import check
from .output import write_package
from .plan import plan
from .read import Note, read
from .report import report
from .testgen import generate
from .trace import execute as run_traced


def package_name(notebook: Path, name: str | None) -> str:
    if name is not None:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise TrainmateError(f"--name {name}: not a Python package name")
        return name
    guess = re.sub(r"\W+", "_", notebook.stem.lower()).strip("_") or "notebook"
    if guess[0].isdigit() or keyword.iskeyword(guess):
        guess = "nb_" + guess
    return guess


def refactor(
    notebook: Path,
    out: Path | None = None,
    name: str | None = None,
    *,
    force: bool = False,
    dry_run: bool = False,
    skip_bad_cells: bool = False,
    docs: bool = True,
    typecheck: bool = True,
    execute: bool = False,
    timeout: int = 600,
    check_equivalence: bool = False,
) -> tuple[Path, str]:
    """Refactor `notebook` into a package in `out`; returns (out, the report's text)."""
    pkg = package_name(notebook, name)
    if check_equivalence and not execute:
        raise TrainmateError("--check-equivalence needs --execute (the notebook's own numbers)")
    out = out if out is not None else notebook.with_suffix("")
    if out.exists() and not force and not dry_run:
        raise TrainmateError(f"{out}: exists; add --force to replace it")
    if out.resolve() == notebook.resolve():
        raise TrainmateError(f"{out}: is the notebook itself")
    nb = read(notebook)
    analysis = analyze(nb)
    if analysis.bad and not skip_bad_cells:
        bad = analysis.bad[0]
        more = f" (and {len(analysis.bad) - 1} more)" if len(analysis.bad) > 1 else ""
        raise TrainmateError(
            f"{notebook}: cell {bad.cell}, line {bad.line}: cannot parse: {bad.message}{more}; "
            "fix it or add --skip-bad-cells"
        )
    the_plan = plan(nb, analysis, pkg)
    for bad in analysis.bad:
        the_plan.notes.append(Note(bad.cell, bad.line, "skipped", f"does not parse: {bad.message}"))
    trace = None
    if execute:
        trace = run_traced(notebook, {b.cell for b in analysis.bad}, timeout)
    emitted = emit(the_plan)
    tests = generate(
        the_plan,
        trace.calls if trace is not None else None,
        trace.fixtures if trace else None,
        trace.dropped if trace else None,
    )
    emitted.types = annotate(
        emitted.files,
        pkg,
        trace.calls if trace is not None else None,
        trace.globals if trace is not None else None,
        typecheck=typecheck and not dry_run,
    )
    emitted.files = {**emitted.types.files, **tests.files}
    emitted.tests = tests
    emitted.coverage = emitted.types.coverage
    emitted.executed = trace is not None
    if dry_run:
        return out, report(the_plan, emitted, "(dry run: not formatted or checked)", "dry run")
    text: dict[str, str] = {}

    def finish(folder: Path, findings: str) -> None:
        problem = build_html(folder, pkg) if docs else "not built (--no-docs)"
        if check_equivalence and trace is not None:
            emitted.equivalence = check(folder, pkg, trace.results, set(the_plan.constants))
        text["report"] = report(the_plan, emitted, findings, problem)
        (folder / "REFACTOR_REPORT.md").write_text(text["report"], encoding="utf-8")

    write_package(emitted.files, out, force, finish, tests.binary)
    result = emitted.equivalence
    if result is not None and not result.passed:
        raise TrainmateError(
            f"{out}: written, but the equivalence check failed: "
            + (result.error or ", ".join(n for n, _, _, ok in result.compared if not ok))
            + " (REFACTOR_REPORT.md has the table)"
        )
    return out, text["report"]
