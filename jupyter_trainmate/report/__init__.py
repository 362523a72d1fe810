"""
Training reports: `trainmate report [RUNS_DIR] -o report.html` (or `%trainmate report`).

One self-contained HTML file of the runs in `RUNS_DIR/runs.jsonl` (inline CSS and SVG, no script,
nothing fetched to view it): the runs with outcome, duration, throughput, data-wait share, the
parameters that differ between runs and their final and best metrics; the loss and metric curves
of the selected runs overlaid (TensorBoard event files when present, else the curves each record
carries); the advice and events of each run; sweeps grouped per study with the best trial marked.
`--markdown` writes Markdown with the charts as SVG files beside it. The same records give the
same bytes. See docs/reports.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import TrainmateError
from ..runtime.files import write_text_atomically
from ..runtime.records import RUN, kind
from .html import render_html
from .markdown import render_markdown
from .model import ReportModel, build_model
from .runs import read_checked, records_file

__all__ = ["build_report", "report_command"]


def _warn(message: str) -> None:
    print(f"trainmate report: warning: {message}", file=sys.stderr)


def build_report(runs_dir: Path, selected: Sequence[int] | None = None) -> ReportModel:
    """Read `runs_dir/runs.jsonl` (bad lines skipped with a warning) into a report."""
    path = records_file(runs_dir)
    lines = read_checked(path, _warn)
    records = [r for r in lines if kind(r) == RUN]  # exports and benches: their own table
    if not records:
        raise TrainmateError(f"{path}: no valid run record")
    if selected:
        missing = sorted(set(selected) - set(range(1, len(records) + 1)))
        if missing:
            raise TrainmateError(
                f"--runs: no run #{missing[0]} in {path} (runs #1 to #{len(records)})"
            )
    others = [r for r in lines if kind(r) != RUN]
    return build_model(records, str(path), path.parent, selected, _warn, others)


def report_command(
    runs_dir: Path,
    output: Path | None,
    *,
    markdown: bool = False,
    force: bool = False,
    selected: Sequence[int] | None = None,
) -> Path:
    """Write the report; refuses to replace existing files unless `force`. Returns the file."""
    output = output or Path("report.md" if markdown else "report.html")
    if output.is_dir():
        raise TrainmateError(f"{output}: is a folder; give the report's file name")
    if output.exists() and not force:  # before reading anything: the answer is the same
        raise TrainmateError(f"{output}: already exists; --force replaces it")
    model = build_report(runs_dir, selected)
    if markdown:
        text, charts = render_markdown(model, output.stem)
        files = {output: text, **{output.parent / name: svg for name, svg in charts.items()}}
    else:
        files = {output: render_html(model)}
    existing = [path for path in files if path.exists()]
    if existing and not force:
        raise TrainmateError(f"{existing[0]}: already exists; --force replaces it")
    for path, content in files.items():
        write_text_atomically(path, content)
    extra = f" and {len(files) - 1} SVG file(s)" if len(files) > 1 else ""
    print(f"trainmate report: wrote {output}{extra} ({len(model.runs.rows)} run(s))")
    return output
