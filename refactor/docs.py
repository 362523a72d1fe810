"""
Step 7: documentation. Docstrings come from the notebook's own prose: a definition without one
gets the first paragraph of the markdown cell right above its cell (or that cell's heading), and
one with no prose near it gets a plain line saying where it came from, so every public symbol
pdoc shows has a docstring. Modules are described by the headings of the sections they came from.
Then pdoc's Python API renders the package into `OUT/docs/`, and `MODEL_CARD.md` gathers what the
notebook says about the model, its data, its hyperparameters and, when the notebook's runs were
recorded by `%%train`, its metrics.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import libcst as cst

from jupyter_trainmate.deploy.attach import EXPORT
from jupyter_trainmate.deploy.card import export_section
from jupyter_trainmate.runs_table import markdown_table
from jupyter_trainmate.runtime.records import read_records

from .plan import Plan
from .read import CodeCell

HEADING_LINE = re.compile(r"^\s{0,3}#{1,6}\s+")
INHERITED = re.compile(r"(^|\.)(Module|Dataset|IterableDataset|Sequential)$")


def first_paragraph(markdown: str | None) -> str | None:
    """The first paragraph of prose in a markdown cell, else its first heading's text."""
    if not markdown:
        return None
    heading = None
    for block in re.split(r"\n\s*\n", markdown.strip()):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        prose = [ln.strip() for ln in lines if not HEADING_LINE.match(ln)]
        if heading is None and lines and HEADING_LINE.match(lines[0]):
            heading = HEADING_LINE.sub("", lines[0]).strip().rstrip("#").strip()
        if prose:
            text = " ".join(prose)
            return text if text.endswith((".", "!", "?", ":")) else text + "."
    return f"{heading}." if heading else None


def _docstring(text: str, indent: str = "") -> cst.SimpleStatementLine:
    text = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return cst.SimpleStatementLine([cst.Expr(cst.SimpleString(f'"""{text}"""'))])


def _has_docstring(body: cst.BaseSuite) -> bool:
    if not isinstance(body, cst.IndentedBlock) or not body.body:
        return False
    first = body.body[0]
    return (
        isinstance(first, cst.SimpleStatementLine)
        and isinstance(first.body[0], cst.Expr)
        and isinstance(first.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def _prepend(body: cst.BaseSuite, text: str) -> cst.BaseSuite:
    if not isinstance(body, cst.IndentedBlock):  # `def f(): return 1` on one line
        return cst.IndentedBlock([_docstring(text), *_suite_statements(body)])
    return body.with_changes(body=[_docstring(text), *body.body])


def _suite_statements(body: cst.BaseSuite) -> list[cst.BaseStatement]:
    if isinstance(body, cst.SimpleStatementSuite):
        return [cst.SimpleStatementLine(list(body.body))]
    return list(body.body)  # type: ignore[arg-type]


def documented(node: cst.BaseStatement, cell: CodeCell, notebook: str) -> cst.BaseStatement:
    """`node` (a function or class) with a docstring if it had none; public methods too."""
    if not isinstance(node, cst.FunctionDef | cst.ClassDef):
        return node
    name = node.name.value
    text = first_paragraph(cell.markdown)
    if text is None:
        kind = "Class" if isinstance(node, cst.ClassDef) else "Function"
        text = f"{kind} `{name}` from cell {cell.number} of `{notebook}`."
    if not _has_docstring(node.body):
        node = node.with_changes(body=_prepend(node.body, text))
    if isinstance(node, cst.ClassDef) and isinstance(node.body, cst.IndentedBlock):
        bases = [cst.Module([]).code_for_node(b.value) for b in node.bases]
        inherits = any(INHERITED.search(b) for b in bases)  # pdoc shows torch's docstrings
        methods = []
        for statement in node.body.body:
            if (
                isinstance(statement, cst.FunctionDef)
                and not statement.name.value.startswith("_")
                and not _has_docstring(statement.body)
                and not (inherits and statement.name.value in ("forward", "extra_repr"))
            ):
                method = statement.name.value
                line = f"`{name}.{method}` from cell {cell.number} of `{notebook}`."
                statement = statement.with_changes(body=_prepend(statement.body, line))
            methods.append(statement)
        node = node.with_changes(body=node.body.with_changes(body=methods))
    return node


def module_docstring(module: str, plan: Plan, cells: list[int]) -> str:
    """What a module holds, in the notebook's words: the headings of its sections."""
    nb = plan.notebook
    by_number = {c.number: c for c in nb.cells}
    headings: list[str] = []
    for number in cells:
        heading = by_number[number].heading if number in by_number else None
        if heading and heading not in headings:
            headings.append(heading)
    first = f"{module.capitalize()} code from the notebook `{nb.path.name}`"
    if cells:
        first += f" (cells {', '.join(map(str, cells))})"
    text = first + "."
    if headings:
        text += "\n\nFrom the sections: " + "; ".join(headings) + "."
    return text


def model_card(plan: Plan) -> str:
    """`MODEL_CARD.md`: intended use, data, hyperparameters, metrics when runs were recorded."""
    nb = plan.notebook
    pkg = plan.package
    intro = first_paragraph(next((c.markdown for c in nb.cells if c.markdown), None))
    models = sorted(n for n, p in plan.placed.items() if p.module == "model")
    data = sorted(n for n, p in plan.placed.items() if p.module == "data")
    lines = [
        f"# Model card: {nb.title or pkg}",
        "",
        "## Intended use",
        "",
        (intro or f"The model trained by the notebook `{nb.path.name}`.")
        + " Generated by `trainmate refactor`; review before relying on it.",
        "",
        "## Model",
        "",
        ", ".join(f"`{pkg}.model.{n}`" for n in models) or "No `nn.Module` class in the notebook.",
        "",
        "## Data",
        "",
        ", ".join(f"`{pkg}.data.{n}`" for n in data) or "Built inline in `train.run()`.",
        "",
        "## Hyperparameters",
        "",
        "| name | value |",
        "| --- | --- |",
    ]
    for name, item in plan.constants.items():
        lines.append(f"| `{plan.field_name(name)}` | `{item.value!r}` |")
    records = read_records(nb.path.parent / "runs")
    lines += ["", "## Metrics", ""]
    if records:
        lines += ["The notebook's recorded `%%train` runs (`runs/runs.jsonl`):", ""]
        lines.append(markdown_table(records[-10:]))
    else:
        lines.append("No recorded runs beside the notebook (`%%train` records them in `runs/`).")
    exports = read_records(nb.path.parent / "runs", (EXPORT,))
    report = exports[-1].get(EXPORT) if exports else None
    if isinstance(report, dict):  # `trainmate export` keeps this section up to date
        lines += ["", export_section(report, f"on {str(exports[-1].get('time', ''))[:10]}")]
    lines += [
        "",
        "## Limitations",
        "",
        "Everything the refactor dropped, commented out or could not convert is listed in "
        "`REFACTOR_REPORT.md`.",
    ]
    return "\n".join(lines) + "\n"


def build_html(folder: Path, package: str) -> str:
    """pdoc's HTML for `package` (importable from `folder`) into `folder/docs`; "" or the error."""
    folder = folder.resolve()
    code = (
        "import sys, pathlib, pdoc\n"
        f"sys.path.insert(0, {str(folder)!r})\n"
        f"pdoc.pdoc({package!r}, output_directory=pathlib.Path({str(folder / 'docs')!r}))\n"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # no __pycache__ in the output
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        cwd=folder,
        env=env,
    )
    if proc.returncode:
        return (proc.stderr.strip().splitlines() or ["pdoc failed"])[-1]
    return ""
