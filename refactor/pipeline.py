"""
`trainmate refactor NB.ipynb`: the steps in order (the package docstring lists them), each
handing its result to the next: read -> analyze -> plan -> emit -> annotate (+ mypy) -> testgen
-> write (format) ->
gate, docs, equivalence -> report.
"""

from __future__ import annotations

import gc
import hashlib
import keyword
import re
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from jupyter_trainmate.errors import TrainmateError

from . import manifest
from .analyze import analyze
from .annotate import annotate
from .docs import build_html
from .emit import emit
from .equivalence import check
from .gate import check as gate
from .output import write_package
from .plan import plan
from .read import read
from .report import Outcome, report
from .testgen import generate
from .trace import execute as run_traced


def package_name(notebook: Path, name: str | None) -> str:
    """The package's import name, which is also its distribution's (`pyproject.toml`): ASCII
    letters, digits and `_` only, as a distribution name must be (PEP 508). From the file name,
    accents dropped (`Réseau` -> `reseau`); where other letters go (`第7章`), a short hash of the
    name keeps two such notebooks apart (`nb_7_…`)."""
    if name is not None:
        if not name.isidentifier() or keyword.iskeyword(name) or not name.isascii():
            raise TrainmateError(
                f"--name {name}: not a Python package name (ASCII letters, digits, _)"
            )
        return name
    stem = unicodedata.normalize("NFKD", notebook.stem)
    kept = "".join(c for c in stem if c.isascii())
    guess = re.sub(r"\W+", "_", kept.lower()).strip("_") or "notebook"
    if any(not c.isascii() and not unicodedata.combining(c) for c in stem):
        guess += "_" + hashlib.sha1(notebook.stem.encode("utf-8")).hexdigest()[:6]
    if guess[0].isdigit() or keyword.iskeyword(guess):
        guess = "nb_" + guess
    return guess


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Python's cyclic garbage collector run 200,000 allocations apart instead of 700 (mypy's
    own setting, which its first round leaves in the process anyway), the caller's thresholds
    back at the end. The refactor builds libcst trees of about a million nodes that live to the
    end; at the default threshold each full collection walks all of them again, about a tenth of
    the CPU time on 4,000 lines of notebook code, and more the larger the notebook. Only when
    garbage is collected changes, not what the refactor computes or writes."""
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(200_000, 30, 30)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if enabled:  # mypy turns the collector off while it loads its graph, and an error there
            gc.enable()  # left it off, in a notebook's kernel too


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
    with fewer_collections():
        return _refactor(
            notebook, out, name, force=force, dry_run=dry_run, skip_bad_cells=skip_bad_cells,
            docs=docs, typecheck=typecheck, execute=execute, timeout=timeout,
            check_equivalence=check_equivalence,
        )  # fmt: skip


def _refactor(
    notebook: Path,
    out: Path | None,
    name: str | None,
    *,
    force: bool,
    dry_run: bool,
    skip_bad_cells: bool,
    docs: bool,
    typecheck: bool,
    execute: bool,
    timeout: int,
    check_equivalence: bool,
) -> tuple[Path, str]:
    pkg = package_name(notebook, name)
    if check_equivalence and not execute:
        raise TrainmateError("--check-equivalence needs --execute (the notebook's own numbers)")
    out = out if out is not None else notebook.with_suffix("")
    if not dry_run:
        manifest.check(notebook, out, force)  # again before writing, with the files to write
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
    trace = None
    if execute:
        kept = {b.cell: "\n".join(b.kept) for b in analysis.bad if b.kept}
        trace = run_traced(notebook, {b.cell for b in analysis.bad}, timeout, kept)
    emitted = emit(the_plan)
    tests = generate(
        the_plan,
        trace.calls if trace is not None else None,
        trace.fixtures if trace else None,
        trace.dropped if trace else None,
    )
    typed = annotate(
        emitted.files,
        pkg,
        trace.calls if trace is not None else None,
        trace.globals if trace is not None else None,
        typecheck=typecheck and not dry_run,
    )
    files = {**typed.files, **tests.files}
    made = Outcome(files, emitted, tests, typed.coverage, trace is not None, checked=typed.checked)
    if dry_run:
        return out, report(the_plan, made, "(dry run: not formatted or checked)", "dry run")
    text: dict[str, str] = {}
    checked: list[Outcome] = []

    def finish(folder: Path, findings: str) -> None:
        problem = build_html(folder, pkg) if docs else "not built (--no-docs)"
        equivalence = None
        if check_equivalence and trace is not None:
            equivalence = check(
                folder, pkg, trace.results, set(the_plan.constants), source=notebook
            )
        skipped = {b.cell for b in analysis.bad}
        done = replace(made, equivalence=equivalence, gate=gate(folder, nb, skipped))
        checked.append(done)
        text["report"] = report(the_plan, done, findings, problem)
        (folder / "REFACTOR_REPORT.md").write_text(text["report"], encoding="utf-8")

    write_package(notebook, files, out, force, finish, tests.binary)
    result = checked[0].equivalence
    if result is not None and not result.passed:
        raise TrainmateError(
            f"{out}: written, but the equivalence check failed: "
            + (result.error or ", ".join(n for n, _, _, ok in result.compared if not ok))
            + " (REFACTOR_REPORT.md has the table)"
        )
    return out, text["report"]
