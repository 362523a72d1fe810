"""What a report holds, computed once from the records; the HTML and Markdown writers only lay
it out. Every number is formatted here, so both show the same text."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .charts import bars, curves_chart
from .curves import Curve, run_curves
from .journal import JournalStudy, read_journal
from .runs import RunView, differing, higher_is_better, run_views, shared

MAX_OVERLAID = 6  # default: the last runs with curves (one colour each)


def number(value: float | None) -> str:
    """Fixed formatting for every figure of the report."""
    if value is None or not math.isfinite(value):
        return "-"
    if value == 0 or 1e-3 <= abs(value) < 1e3:
        return f"{value:.4g}"
    if 1e3 <= abs(value) < 1e12:
        return f"{value:,.0f}"
    return f"{value:.3e}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(round(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}:{m:02d}:{s:02d}" if hours else f"{m}:{s:02d}"


def share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]
    highlight: int | None = None  # the row to emphasise (the best trial)


@dataclass(frozen=True)
class Chart:
    name: str
    svg: str


@dataclass(frozen=True)
class Study:
    name: str
    direction: str  # "min" or "max"
    table: Table
    best: str  # a sentence about the best trial
    chart: Chart | None


@dataclass(frozen=True)
class ReportModel:
    source: str  # the records file, as given
    runs: Table
    shared: list[tuple[str, str]]
    curves: list[Chart]
    curves_note: str
    throughput: list[Chart]
    advice: list[tuple[str, list[str]]]  # per run: advice and events
    studies: list[Study]
    deploy: Table | None = None  # exports and benches recorded with the runs (`deploy/attach.py`)


def _best(points: Curve, up: bool) -> float | None:
    values = [y for _, y in points]
    if not values:
        return None
    return max(values) if up else min(values)


def _metric_columns(
    runs: list[RunView], curves: dict[int, dict[str, Curve]]
) -> tuple[list[str], list[list[str]]]:
    names = sorted({m for r in runs for m in r.metrics} | {m for c in curves.values() for m in c})
    header: list[str] = []
    cells: list[list[str]] = [[] for _ in runs]
    for name in names:
        header += [f"{name} final", f"{name} best"]
        for i, run in enumerate(runs):
            points = curves[run.number].get(name, [])
            final = run.metrics.get(name, points[-1][1] if points else None)
            best = _best([*points, *([(0.0, final)] if final is not None else [])],
                         higher_is_better(name, run.options))  # fmt: skip
            cells[i] += [number(final), number(best) if points else "-"]
    return header, cells


def _runs_table(runs: list[RunView], curves: dict[int, dict[str, Curve]]) -> Table:
    params = differing(runs) if len(runs) > 1 else []
    metric_header, metric_cells = _metric_columns(runs, curves)
    header = ["run", "time", "notebook", "outcome", "duration", "samples/s", "steps/s",
              "data wait", *params, *metric_header]  # fmt: skip
    rows = []
    for run, metric_row in zip(runs, metric_cells, strict=True):
        rows.append(
            [
                run.label,
                run.time,
                run.notebook,
                run.outcome,
                duration(run.wall_s),
                number(run.samples_per_s),
                number(run.steps_per_s),
                share(run.data_wait_share),
                *(run.params.get(p, "-") for p in params),
                *metric_row,
            ]
        )
    return Table(header, rows)


def _curve_charts(
    runs: list[RunView],
    curves: dict[int, dict[str, Curve]],
    origins: dict[int, str],
    selected: Sequence[int] | None,
) -> tuple[list[Chart], str]:
    with_curves = [r for r in runs if curves[r.number]]
    if selected:
        chosen = [r for r in with_curves if r.number in selected]
    else:
        chosen = with_curves[-MAX_OVERLAID:]
    if not chosen:
        return [], "No run has curves (TensorBoard event files or curves in its record)."
    names = sorted({n for r in chosen for n in curves[r.number]}, key=lambda n: (n != "loss", n))
    charts = []
    for name in names:
        series = {r.label: curves[r.number][name] for r in chosen if name in curves[r.number]}
        charts.append(Chart(name, curves_chart(series)))
    labels = ", ".join(r.label for r in chosen)
    note = f"Runs {labels} overlaid"
    if not selected and len(with_curves) > len(chosen):
        note += f" (the last {len(chosen)} with curves; choose others with --runs)"
    kinds = sorted({origins[r.number] for r in chosen}, reverse=True)
    names_of = {"tensorboard": "TensorBoard event files", "record": "the run records"}
    return charts, f"{note}. Curves from {' and '.join(names_of[k] for k in kinds)}."


def _throughput_charts(runs: list[RunView]) -> list[Chart]:
    rates = [(r.label, r.samples_per_s or 0.0, number(r.samples_per_s)) for r in runs]
    waits = [(r.label, r.data_wait_share or 0.0, share(r.data_wait_share)) for r in runs]
    charts = []
    if any(v for _, v, _ in rates):
        charts.append(Chart("samples per second", bars(rates, "samples per second")))
    charts.append(Chart("data-wait share", bars(waits, "share of step time waiting for data", 1.0)))
    return charts


def _sweep_value(run: RunView, journal: JournalStudy | None) -> float | None:
    """The record's `sweep.value`, else the study's value of the trial, else the monitored
    metric's last value."""
    sweep = run.sweep or {}
    for value in (sweep.get("value"), journal and journal.values.get(sweep.get("trial", -1))):
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    monitor = run.options.get("monitor")
    return run.metrics.get(monitor) if isinstance(monitor, str) else None


def _direction(trials: list[RunView], journal: JournalStudy | None) -> str:
    for run in trials:
        direction = str((run.sweep or {}).get("direction", "")).lower()
        if direction in ("min", "minimize"):
            return "min"
        if direction in ("max", "maximize"):
            return "max"
    if journal is not None:
        return journal.direction
    modes = {run.options.get("mode") for run in trials}
    return "max" if modes == {"max"} else "min"


def _study(name: str, trials: list[RunView], journal: JournalStudy | None) -> Study:
    def trial_number(run: RunView) -> tuple[int, int]:
        trial = (run.sweep or {}).get("trial")
        return (trial if isinstance(trial, int) else 1 << 30, run.number)

    trials = sorted(trials, key=trial_number)
    direction = _direction(trials, journal)
    params: list[str] = sorted(
        {str(k) for t in trials for k in ((t.sweep or {}).get("params") or {})}
    )
    rows, values = [], []
    for run in trials:
        sweep = run.sweep or {}
        given = sweep.get("params") if isinstance(sweep.get("params"), dict) else {}
        assert isinstance(given, dict)
        value = _sweep_value(run, journal)
        values.append(value)
        cells = []
        for p in params:
            v = given.get(p)
            cells.append(number(v) if isinstance(v, float) else "-" if v is None else str(v))
        state = journal.states.get(sweep.get("trial", -1), "-") if journal else None
        rows.append([str(sweep.get("trial", "-")), run.label, run.outcome,
                     *([state] if state is not None else []), *cells, number(value)])  # fmt: skip
    scored = [(v, i) for i, v in enumerate(values) if v is not None]
    best_row = None
    best = "No trial has a value."
    if scored:
        best_value, best_row = (max if direction == "max" else min)(scored, key=lambda s: s[0])
        winner = trials[best_row]
        better = "lower" if direction == "min" else "higher"
        best = (f"Best: trial {rows[best_row][0]} (run {winner.label}), value "
                f"{number(best_value)} ({better} is better).")  # fmt: skip
    chart = None
    points = [(float(row[0]), v) for row, v in zip(rows, values, strict=True)
              if v is not None and row[0].lstrip("-").isdigit()]  # fmt: skip
    if len(points) > 1:
        chart = Chart(f"{name} value by trial", curves_chart({"value": points}, x_label="trial"))
    header = ["trial", "run", "outcome", *(["state"] if journal else []), *params, "value"]
    return Study(name, direction, Table(header, rows, best_row), best, chart)


def _deploy_result(record: dict[str, Any]) -> tuple[str, str]:
    """The file and a one-line result of an export or bench line."""
    kind = str(record.get("kind"))
    report = record.get(kind)
    if not isinstance(report, dict):
        return "-", "-"
    if kind == "export":
        parity = [r for r in report.get("parity") or [] if isinstance(r, dict)]
        verdict = "parity ok" if all(r.get("passed") for r in parity) else "parity FAILED"
        size = report.get("size")
        text = f"{verdict}; {report.get('exporter')}, opset {report.get('opset')}"
        if isinstance(size, int):
            text += f", {number(size / 1e3)} kB"
        if isinstance(report.get("quantization"), dict):
            text += "; int8"
        return Path(str(report.get("path"))).name, text
    verdicts = report.get("verdicts")
    text = "; ".join(str(v) for v in verdicts) if isinstance(verdicts, list) else "-"
    return Path(str(record.get("model") or "-")).name, text


def _deploy_table(runs: list[RunView], others: list[dict[str, Any]]) -> Table | None:
    """Exports and benches, each under the run it refers to (by id, else by the run's time)."""
    lines = [r for r in others if r.get("kind") in ("export", "bench")]
    if not lines:
        return None
    by_id = {str(r.record["id"]): r.label for r in runs if r.record.get("id")}
    by_time = {(r.record.get("notebook"), r.time): r.label for r in runs}
    rows = []
    for line in lines:
        run = by_id.get(str(line.get("run"))) or by_time.get(
            (line.get("notebook"), str(line.get("run_time")))
        )
        rows.append([run or "-", str(line.get("time") or "-"), str(line.get("kind")),
                     *_deploy_result(line)])  # fmt: skip
    return Table(["run", "time", "kind", "file", "result"], rows)


def build_model(
    records: list[dict[str, Any]],
    source: str,
    runs_dir: Path,
    selected: Sequence[int] | None,
    warn: Callable[[str], None],
    others: Sequence[dict[str, Any]] = (),
) -> ReportModel:
    """The report of the run `records`; `others` are the lines of other kinds (exports...)."""
    runs = run_views(records)
    curves: dict[int, dict[str, Curve]] = {}
    origins: dict[int, str] = {}
    for run in runs:
        curves[run.number], origins[run.number] = run_curves(run.record, runs_dir)
    charts, note = _curve_charts(runs, curves, origins, selected)
    studies: dict[str, list[RunView]] = {}
    for run in runs:
        if run.sweep is not None:
            studies.setdefault(str(run.sweep["study"]), []).append(run)
    journal = read_journal(runs_dir, studies, warn)
    advice = [(r.label, [*r.advice, *r.events]) for r in runs if r.advice or r.events]
    return ReportModel(
        source=source,
        runs=_runs_table(runs, curves),
        shared=list(shared(runs).items()) if len(runs) > 1 else sorted(runs[0].params.items()),
        curves=charts,
        curves_note=note,
        throughput=_throughput_charts(runs),
        advice=advice,
        studies=[
            _study(name, trials, journal.get(name)) for name, trials in sorted(studies.items())
        ],
        deploy=_deploy_table(runs, list(others)),
    )
