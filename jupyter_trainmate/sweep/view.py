"""
The study above the trial's training widget: a table of trials (best highlighted), the value of
each trial in a small SVG chart (`display.chart.line_chart`), and at the end the parameter
importances and the best parameters.

The widget view is a VBox: the study's HTML, then an `Output` widget that holds the training
widget of the trial in progress (cleared when the next trial starts). At the end a static copy of
the study (HTML, and the text table as `text/plain`) is displayed after it, so the saved notebook
stays readable without widget state. The text view prints a line per trial and the table at the
end.
"""

from __future__ import annotations

import contextlib
import html
import sys
from collections.abc import Iterator
from typing import Any

from ..display.chart import line_chart
from .summary import SweepSummary, SweepTrial, _params_text, _value_text

_STATE_COLORS = {
    "running": "#1f77b4",
    "complete": "#2ca02c",
    "pruned": "#ff7f0e",
    "failed": "#d62728",
    "waiting": "#888",
}


def chart(summary: SweepSummary) -> str:
    """Each trial's value (complete and pruned), and the best so far, against the trial number."""
    values = [(float(t.number), t.value) for t in summary.trials if t.value is not None]
    best: list[tuple[float, float]] = []
    for t in summary.trials:
        if t.state == "complete" and t.value is not None:
            if not best:
                best.append((float(t.number), t.value))
            else:
                better = min if summary.direction == "min" else max
                best.append((float(t.number), better(best[-1][1], t.value)))
    return line_chart(
        {summary.monitor: values, "best so far": best}, width=360, height=140, x_label="trial"
    )


def _row(t: SweepTrial, names: list[str], best: bool) -> str:
    style = ' style="background:#e6f4ea;font-weight:bold"' if best else ""
    color = _STATE_COLORS.get(t.state, "#000")
    reason = f" ({html.escape(t.reason)})" if t.reason and t.state != "complete" else ""
    cells = [str(t.number)]
    cells += [html.escape(_value_text(t.params[n])) if n in t.params else "" for n in names]
    cells.append(_value_text(t.value) if t.value is not None else "-")
    cells.append(f'<span style="color:{color}">{t.state}</span>{reason}')
    cells.append(f"{t.duration:.1f}s" if t.duration is not None else "-")
    body = "".join(f"<td style='padding:1px 6px'>{c}</td>" for c in cells)
    return f'<tr class="trainmate-trial-{t.state}"{style}>{body}</tr>'


def study_html(summary: SweepSummary, title: str, *, final: bool = False) -> str:
    """The study as HTML: what the widget shows while it runs and what the saved notebook keeps."""
    names = sorted({k for t in summary.trials for k in t.params})
    best_number = summary.best_trial.number if summary.best_trial is not None else None
    head = ["trial", *names, summary.monitor, "state", "time"]
    header = "".join(
        f"<th style='padding:1px 6px;text-align:left'>{html.escape(h)}</th>" for h in head
    )
    rows = "".join(_row(t, names, t.number == best_number) for t in summary.trials)
    table = f'<table class="trainmate-trials"><tr>{header}</tr>{rows}</table>'
    parts = [f"<b>{html.escape(title)}</b>: {html.escape(summary.line())}", table, chart(summary)]
    if final and summary.best_trial is not None:
        parts.append(
            f"<div><b>Best parameters</b>: {html.escape(_params_text(summary.best_params))}</div>"
        )
    if final and summary.importances:
        bars = "".join(
            f"<div>{html.escape(name)} <span style='display:inline-block;background:#1f77b4;"
            f"height:8px;width:{max(1, round(160 * share))}px'></span> {share:.2f}</div>"
            for name, share in summary.importances.items()
        )
        parts.append(f'<div class="trainmate-importances"><b>Parameter importances</b>{bars}</div>')
    body = "".join(f"<div>{p}</div>" for p in parts)
    return (
        f'<div class="trainmate-sweep" style="font-family:sans-serif;font-size:12px">{body}</div>'
    )


class SweepView:
    """The study's display: `widget`, `text` or `off`."""

    def __init__(self, mode: str, title: str) -> None:
        from ..display.views import widgets_available

        if mode == "auto":
            mode = "widget" if widgets_available() else "text"
        self.mode = mode
        self.title = title
        self._html: Any = None
        self._out: Any = None
        if mode == "widget":
            import ipywidgets as w
            from IPython.display import display

            self._html = w.HTML(value=f"<b>{html.escape(title)}</b>: starting")
            self._out = w.Output()
            box = w.VBox([self._html, self._out])
            box.add_class("trainmate-sweep-widget")
            display(box)

    @property
    def live(self) -> bool:
        """Whether `update` draws anything (the widget)."""
        return self._html is not None

    def update(self, summary: SweepSummary) -> None:
        """Redraw the study (any thread: an HTML widget's value)."""
        if self._html is not None:
            self._html.value = study_html(summary, self.title)

    @contextlib.contextmanager
    def trial(self) -> Iterator[None]:
        """Where the trial's own outputs go: the widget's Output, emptied first."""
        if self._out is None:
            yield
            return
        self._out.clear_output(wait=True)
        with self._out:
            yield

    def trial_done(self, trial: SweepTrial) -> None:
        if self.mode == "text":
            value = f"{_value_text(trial.value)}" if trial.value is not None else "-"
            reason = f" ({trial.reason})" if trial.reason else ""
            print(
                f"[{self.title}] trial {trial.number} {trial.state}{reason}: value {value}; "
                f"{_params_text(trial.params)}",
                file=sys.stdout,
                flush=True,
            )

    def finish(self, summary: SweepSummary) -> None:
        """The final study: the widget's table, and a static copy (HTML and text) after it."""
        from IPython.display import display

        if self._html is not None:
            self._html.value = study_html(summary, self.title, final=True)
            display(
                {
                    "text/html": study_html(summary, self.title, final=True),
                    "text/plain": summary.table(),
                },
                raw=True,
            )
        else:
            print(summary.table(), flush=True)
