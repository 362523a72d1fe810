"""The report as Markdown for a README: tables in the file, each chart a separate SVG file next
to it (`<stem>-<chart>.svg`), linked as an image (GitHub and most viewers show SVG images)."""

from __future__ import annotations

import re

from .model import Chart, ReportModel, Table


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(table: Table) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in table.header) + " |",
             "|" + "---|" * len(table.header)]  # fmt: skip
    for i, row in enumerate(table.rows):
        cells = [_cell(c) for c in row]
        if i == table.highlight:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def chart_file(stem: str, chart: Chart) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", chart.name).strip("-").lower() or "chart"
    return f"{stem}-{slug}.svg"


def render_markdown(model: ReportModel, stem: str) -> tuple[str, dict[str, str]]:
    """The Markdown text and the SVG files it links: `{file name: svg}`."""
    files: dict[str, str] = {}

    def image(chart: Chart) -> str:
        name = chart_file(stem, chart)
        files[name] = chart.svg + "\n"
        return f"![{chart.name}]({name})"

    runs = len(model.runs.rows)
    lines = ["# Training report", "",
             f"{runs} run(s) from `{model.source}`. Parameters shown are those that differ "
             "between runs.", "", "## Runs", "", *_table(model.runs), ""]  # fmt: skip
    if model.shared:
        lines += ["<details><summary>Parameters shared by all runs</summary>", ""]
        lines += _table(Table(["parameter", "value"], [[k, v] for k, v in model.shared]))
        lines += ["", "</details>", ""]
    lines += ["## Curves", "", model.curves_note, ""]
    lines += [image(c) for c in model.curves]
    lines += ["", "## Throughput and data wait", ""]
    lines += [image(c) for c in model.throughput]
    lines += ["", "## Advice and events", ""]
    if not model.advice:
        lines.append("No run got advice or reported an event.")
    for label, items in model.advice:
        lines += [f"- **{label}**", *(f"  - {_cell(item)}" for item in items)]
    if model.deploy is not None:
        lines += ["", "## Exports and benchmarks", "", *_table(model.deploy)]
    if model.studies:
        lines += ["", "## Sweeps"]
        for study in model.studies:
            lines += ["", f"### Study {study.name}", "", study.best, "", *_table(study.table)]
            if study.chart is not None:
                lines += ["", image(study.chart)]
    return "\n".join(lines) + "\n", files
