"""Words and HTML for a snapshot, shared by the widget view and the text view."""

from __future__ import annotations

import html

from .chart import line_chart
from .state import GiB, Snapshot


def duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def progress_text(snap: Snapshot) -> str:
    p = snap.progress
    if p is None:
        return "starting"
    epoch = f"epoch {p.epoch}/{p.epochs_total}" if p.epochs_total else f"epoch {p.epoch}"
    step = f"step {p.step_in_epoch}/{p.steps_per_epoch}" if p.steps_per_epoch else f"step {p.steps}"
    parts = [epoch, step]
    if p.fraction is not None:
        parts.insert(0, f"{p.fraction:.0%}")
    parts.append(f"elapsed {duration(p.wall_s)}")
    if p.eta_s is not None:
        parts.append(f"ETA {duration(p.eta_s)}")
    return " | ".join(parts)


def stats_text(snap: Snapshot) -> str:
    p = snap.progress
    parts = []
    if p is not None:
        parts.append(f"{p.samples_per_s:,.0f} samples/s, {p.steps_per_s:,.1f} steps/s")
        parts.append(f"data wait {p.data_wait_share:.0%}")
        if p.last_loss is not None:
            parts.append(f"loss {p.last_loss:.4g}")
    for d in snap.devices:
        util = f" {d.util_pct:.0f}%" if d.util_pct is not None else ""
        parts.append(
            f"{d.label}{util} mem {d.memory_used_bytes / GiB:.1f}/{d.memory_total_bytes / GiB:.1f} GiB"
        )
    amp = f"amp {snap.amp}"
    if snap.loss_scale is not None:
        amp += f" (scale {snap.loss_scale:g})"
    if snap.skipped_steps:
        amp += f", {snap.skipped_steps} skipped"
    parts.append(amp)
    return " | ".join(parts)


def chart_svg(snap: Snapshot) -> str:
    """The loss chart, then one small chart per logged metric (each on its own axis)."""
    charts = [line_chart({"loss": snap.loss})]
    charts += [line_chart({name: pts}, width=280) for name, pts in snap.metrics.items()]
    return "".join(charts)


def error_html(snap: Snapshot) -> str:
    """The explanation of a failed run, above the traceback that follows the display."""
    error = snap.summary.error if snap.summary is not None else None
    if error is None:
        return ""
    fixes = "".join(f"<li>{html.escape(a)}</li>" for a in error.advice)
    cause = f"<div>{html.escape(error.cause)}</div>" if error.cause else ""
    return (
        f'<div class="trainmate-error"><b>{html.escape(error.kind.replace("_", " "))}</b>: '
        f"{html.escape(error.message)}{cause}<ol>{fixes}</ol></div>"
    )


def html_block(snap: Snapshot, title: str) -> str:
    """The whole display as HTML: what the widget shows and what the saved notebook keeps."""
    rows = [f"<b>{html.escape(title)}</b>: {html.escape(progress_text(snap))}",
            html.escape(stats_text(snap))]  # fmt: skip
    if snap.summary is not None:
        rows.insert(0, f"<b>{html.escape(snap.summary.line())}</b>")
    body = "<br>".join(rows)
    events = "".join(f"<li>{html.escape(e)}</li>" for e in snap.events)
    advice = "".join(f"<li>{html.escape(a.message)}</li>" for a in snap.advice)
    extra = error_html(snap)
    if events:
        extra += f"<div><b>Events</b><ul>{events}</ul></div>"
    if advice:
        extra += f"<div><b>Advice</b><ul>{advice}</ul></div>"
    return (
        f'<div class="trainmate-run" style="font-family:sans-serif;font-size:12px">'
        f"<div>{body}</div>{chart_svg(snap)}{extra}</div>"
    )
