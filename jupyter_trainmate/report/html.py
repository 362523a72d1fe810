"""The report as one self-contained HTML file: inline CSS and SVG, no script, no link out."""

from __future__ import annotations

from html import escape

from .model import Chart, ReportModel, Table

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;margin:24px;max-width:1200px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}.meta{color:#666;margin:0 0 12px}
.scroll{overflow-x:auto}table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;white-space:nowrap}
th{background:#f4f4f4}tr.best td{background:#e6f4ea;font-weight:600}
td.outcome-finished{color:#1a7f37}td.outcome-failed{color:#cf222e}
td.outcome-interrupted,td.outcome-stopped{color:#9a6700}
figure{display:inline-block;margin:8px 16px 8px 0}figcaption{font-weight:600;margin-bottom:2px}
ul.advice{margin:4px 0 10px}details{margin:8px 0}
""".strip()


def _table(table: Table, css_class: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in table.header)
    rows = []
    for i, row in enumerate(table.rows):
        cells = []
        for name, cell in zip(table.header, row, strict=True):
            cls = ""
            if name == "outcome":
                cls = f' class="outcome-{escape(cell.split()[0]) if cell else ""}"'
            cells.append(f"<td{cls}>{escape(cell)}</td>")
        mark = ' class="best"' if i == table.highlight else ""
        rows.append(f"<tr{mark}>{''.join(cells)}</tr>")
    return (
        f'<div class="scroll"><table class="{css_class}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _figure(chart: Chart) -> str:
    return f"<figure><figcaption>{escape(chart.name)}</figcaption>{chart.svg}</figure>"


def render_html(model: ReportModel) -> str:
    runs = len(model.runs.rows)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Training report: {runs} run(s)</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>Training report</h1>",
        f'<p class="meta">{runs} run(s) from {escape(model.source)}. Parameters shown are those '
        "that differ between runs; the shared ones are listed below the table.</p>",
        '<section id="runs"><h2>Runs</h2>',
        _table(model.runs, "runs"),
    ]
    if model.shared:
        rows = "".join(
            f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in model.shared
        )
        parts.append(
            f"<details><summary>Parameters shared by all runs ({len(model.shared)})</summary>"
            f'<table class="shared"><tbody>{rows}</tbody></table></details>'
        )
    parts.append("</section>")
    parts.append(
        f'<section id="curves"><h2>Curves</h2><p class="meta">{escape(model.curves_note)}</p>'
    )
    parts += [_figure(c) for c in model.curves]
    parts.append('</section><section id="throughput"><h2>Throughput and data wait</h2>')
    parts += [_figure(c) for c in model.throughput]
    parts.append('</section><section id="advice"><h2>Advice and events</h2>')
    if not model.advice:
        parts.append('<p class="meta">No run got advice or reported an event.</p>')
    for label, lines in model.advice:
        items = "".join(f"<li>{escape(line)}</li>" for line in lines)
        parts.append(f'<h3>{escape(label)}</h3><ul class="advice">{items}</ul>')
    parts.append("</section>")
    if model.deploy is not None:
        parts.append('<section id="deploy"><h2>Exports and benchmarks</h2>')
        parts += [_table(model.deploy, "deploy"), "</section>"]
    if model.studies:
        parts.append('<section id="sweeps"><h2>Sweeps</h2>')
        for study in model.studies:
            parts.append(f"<h3>Study {escape(study.name)}</h3>")
            parts.append(f'<p class="meta">{escape(study.best)}</p>')
            parts.append(_table(study.table, "sweep"))
            if study.chart is not None:
                parts.append(_figure(study.chart))
        parts.append("</section>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
