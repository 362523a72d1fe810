"""
The views of a run: a widget (ipywidgets 8) where a widget front end exists, a text line elsewhere.

One core with thin front ends, as tqdm does: both draw the same `Snapshot`. The widget is updated
in place (never `clear_output`, which would wipe the user's own prints); the text view prints a
compact line every `TEXT_INTERVAL_S`.
"""

from __future__ import annotations

import html
import sys
import time
from typing import Any, Protocol

from .render import chart_svg, error_html, html_block, progress_text, stats_text
from .state import Snapshot

TEXT_INTERVAL_S = 10.0


class View(Protocol):
    interval: float

    def update(self, snap: Snapshot) -> None: ...

    def finish(self, snap: Snapshot) -> None: ...


class WidgetView:
    """A progress bar, a status line, an SVG chart and an advice box, in one VBox."""

    interval = 0.25

    def __init__(self, title: str) -> None:
        import ipywidgets as w
        from IPython.display import display

        self.title = title
        self.bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="100%"))
        self.progress = w.HTML()
        self.stats = w.HTML()
        self.chart = w.HTML()
        self.notes = w.HTML()
        self.box = w.VBox([self.progress, self.bar, self.stats, self.chart, self.notes])
        self.box.add_class("trainmate-widget")
        display(self.box)

    def update(self, snap: Snapshot) -> None:
        p = snap.progress
        if p is not None and p.fraction is not None:
            self.bar.value = p.fraction
        self.progress.value = f"<b>{self.title}</b>: {progress_text(snap)}"
        self.stats.value = stats_text(snap)
        self.chart.value = chart_svg(snap)
        extra = [f"<li>{e}</li>" for e in snap.events] + [
            f"<li>{a.message}</li>" for a in snap.advice
        ]
        self.notes.value = error_html(snap) + (f"<ul>{''.join(extra)}</ul>" if extra else "")

    def note(self, text: str) -> None:
        """One line under the chart, alone (when drawing the rest failed)."""
        self.notes.value = f"<ul><li>{html.escape(text)}</li></ul>"

    def finish(self, snap: Snapshot) -> None:
        from IPython.display import display

        self.update(snap)
        if snap.summary is not None:
            self.bar.bar_style = {"finished": "success", "interrupted": "warning"}.get(
                snap.summary.outcome, "danger"
            )
        # A static copy that stays readable in the saved notebook, with or without widget state;
        # its text/plain is the summary line, for logs and front ends without HTML.
        plain = snap.summary.line() if snap.summary is not None else progress_text(snap)
        display({"text/html": html_block(snap, self.title), "text/plain": plain}, raw=True)


class TextView:
    """A compact line at a low rate, for terminals, logs and front ends without widgets."""

    interval = TEXT_INTERVAL_S

    def __init__(self, title: str, stream: Any = None) -> None:
        self.title = title
        self.stream = stream or sys.stdout
        self.started = time.monotonic()

    def update(self, snap: Snapshot) -> None:
        if time.monotonic() - self.started < self.interval:
            return  # the first line after a full interval: short runs print only their summary
        print(
            f"[{self.title}] {progress_text(snap)} | {stats_text(snap)}",
            file=self.stream,
            flush=True,
        )

    def finish(self, snap: Snapshot) -> None:
        if snap.summary is not None:
            print(snap.summary.line(), file=self.stream, flush=True)
        for event in snap.events:
            print(f"[{self.title}] {event}", file=self.stream, flush=True)
        for advice in snap.advice:
            print(f"[{self.title}] advice: {advice.message}", file=self.stream, flush=True)
        if snap.summary is not None and snap.summary.error is not None:  # right above the traceback
            print(snap.summary.error.text(), file=self.stream, flush=True)


def widgets_available() -> bool:
    """A kernel with a front end that may render widgets (ipykernel), and ipywidgets installed."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"
