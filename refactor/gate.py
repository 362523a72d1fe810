"""
Step 6a: the gate. `ruff check --select E9,F63,F7,F82,F811` (syntax errors, undefined names,
redefinitions: the usual CI gate, not style) on the written package, and on the notebook's own
code (its cells, as IPython's input transformers made them, as one script). An undefined name
the notebook's own code already has is pre-existing: the report lists it with its cell and line;
so is a local it reads before assigning it, where the package has that read on the same line of
code. So is a finding in a file the notebook wrote with `%%writefile` (copied as written). Every
other finding is one the refactor introduced, and there should be none.
"""

from __future__ import annotations

import bisect
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .analyze import IPYTHON_NAMES
from .output import ruff
from .read import CodeCell, Notebook

RULES = "E9,F63,F7,F82,F811"
# a name read where nothing binds it: undefined (F821), or a function's local read before its
# assignment (F823, when a global of that name exists). The notebook's own such read is one
# finding or the other in the package depending on whether the module it lands in has a global
# of that name (aamini's `if "experiment" in locals(): experiment.end()`): the same error.
UNBOUND = ("F821", "F823")
UNDEFINED = re.compile(r"[`'](.+?)[`']")


@dataclass(frozen=True)
class Finding:
    where: str  # `train.py:12:5` or `cell 4, line 2`
    code: str
    message: str
    line: str = field(default="", compare=False)  # the source line, stripped (F823's match)

    def __str__(self) -> str:
        return f"{self.where}: {self.code} {self.message}"


@dataclass(frozen=True)
class Gate:
    introduced: tuple[Finding, ...]  # findings in the package the notebook does not have
    pre_existing: tuple[Finding, ...]  # the notebook's own undefined names, by cell and line
    carried: tuple[Finding, ...]  # the package's findings that are those same names

    @property
    def clean(self) -> bool:
        return not self.introduced


def _ruff(
    args: list[str], cwd: Path | None = None, stdin: str | None = None
) -> list[dict[str, object]]:
    proc = subprocess.run(
        [ruff(), "check", "--isolated", "--no-cache", "--select", RULES, "--output-format",
         "json", "--exit-zero", *args],
        cwd=cwd, input=stdin, capture_output=True, text=True, check=False,
    )  # fmt: skip
    try:
        found = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError:
        return [
            {"code": "E902", "message": proc.stderr.strip()[:200], "filename": "", "location": {}}
        ]
    return found if isinstance(found, list) else []


def _name(message: str) -> str | None:
    found = UNDEFINED.search(message)
    return found.group(1) if found else None


# What IPython puts in a notebook's namespace (`emit` imports them where the package uses them)
PRELUDE = "".join(f"{line}\n" for line in IPYTHON_NAMES.values())


def notebook_findings(nb: Notebook, skipped: set[int]) -> tuple[Finding, ...]:
    """The notebook's own code, as one script after `PRELUDE`: its undefined names, by cell
    and line."""
    starts: list[int] = []
    cells: list[CodeCell] = []
    parts: list[str] = [PRELUDE]
    line = 1 + PRELUDE.count("\n")
    for cell in nb.cells:
        if cell.number in skipped or not cell.python.strip():
            continue
        text = cell.python if cell.python.endswith("\n") else cell.python + "\n"
        starts.append(line)
        cells.append(cell)
        parts.append(text)
        line += text.count("\n")
    out: list[Finding] = []
    script = "".join(parts)
    source = script.splitlines()
    for found in _ruff(["--stdin-filename", "notebook.py", "-"], stdin=script):
        if found.get("code") not in UNBOUND:
            continue  # a redefinition is a notebook's normal shape; a syntax error is skipped
        location = found.get("location")
        row = int(location.get("row", 1)) if isinstance(location, dict) else 1
        index = max(bisect.bisect_right(starts, row) - 1, 0)
        where = "notebook"
        if cells:
            at = cells[index].source_line(row - starts[index] + 1)
            where = f"cell {cells[index].number}, line {at}"
        text = source[row - 1].strip() if 0 < row <= len(source) else ""
        out.append(Finding(where, str(found.get("code")), str(found.get("message", "")), text))
    return tuple(out)


def check(folder: Path, nb: Notebook, skipped: set[int]) -> Gate:
    own = notebook_findings(nb, skipped)
    names = {_name(f.message) for f in own if f.code == "F821"}
    # a local read before its assignment: the same name on the same line of code (a package
    # finding of that name elsewhere is the refactor's: it rebinds a name in a new function)
    locals_read = {(_name(f.message), f.line) for f in own if f.code == "F823"}
    lines_of: dict[Path, list[str]] = {}
    introduced: list[Finding] = []
    carried: list[Finding] = []
    for found in _ruff(["."], cwd=folder):
        location = found.get("location", {})
        row = location.get("row", 0) if isinstance(location, dict) else 0
        column = location.get("column", 0) if isinstance(location, dict) else 0
        path = Path(str(found.get("filename", ""))).resolve()
        try:
            relative = path.relative_to(folder.resolve()).as_posix()
        except ValueError:
            relative = path.name
        finding = Finding(
            f"{relative}:{row}:{column}", str(found.get("code")), str(found.get("message", ""))
        )
        name = _name(finding.message)
        if finding.code in UNBOUND and locals_read:
            if path not in lines_of:
                try:
                    lines_of[path] = path.read_text(encoding="utf-8").splitlines()
                except (OSError, UnicodeDecodeError):
                    lines_of[path] = []
            text = lines_of[path]
            line = text[row - 1].strip() if isinstance(row, int) and 0 < row <= len(text) else ""
        else:
            line = ""
        if (
            relative in nb.files
            or (finding.code == "F821" and name in names)
            or (finding.code in UNBOUND and (name, line) in locals_read)
        ):
            carried.append(finding)  # the notebook's own (or a file it wrote, as written)
        else:
            introduced.append(finding)
    return Gate(tuple(introduced), own, tuple(carried))


def lines(gate: Gate) -> list[str]:
    """The report's section."""
    out = [f"gate: {len(gate.introduced)} (ruff check --select {RULES}, errors the refactor made)"]
    out += [f"- {f}" for f in gate.introduced]
    if gate.pre_existing or gate.carried:
        out += [
            "",
            "The notebook's own (pre-existing, carried over as written): its undefined names, "
            "and the files it wrote with `%%writefile`:",
            "",
        ]
        out += [f"- {f}" for f in gate.pre_existing]
        out += [f"- in the package: {f}" for f in gate.carried]
    return out
