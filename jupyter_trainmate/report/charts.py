"""The report's pictures as SVG text: overlaid curves (the live display's `line_chart`) and
horizontal bars. No ids, no timestamps, fixed number formats: the same runs give the same bytes."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from ..display.chart import COLORS, line_chart

WIDTH = 640


def curves_chart(series: Mapping[str, Sequence[tuple[float, float]]], x_label: str = "step") -> str:
    """One curve per run (named `#N`), overlaid on shared axes."""
    return line_chart(series, width=WIDTH, height=220, x_label=x_label)


def bars(rows: Sequence[tuple[str, float, str]], title: str, most: float | None = None) -> str:
    """One bar per row: `(label, value, text shown after the bar)`; values of 0 or more, drawn
    against `most` (default: the largest value)."""
    width = WIDTH
    row_h, pad_l, pad_r, top = 18, 56, 96, 20
    height = top + row_h * len(rows) + 6
    most = most or max((v for _, v, _ in rows), default=0.0) or 1.0
    inner = width - pad_l - pad_r
    font = 'font-size="11" font-family="sans-serif"'
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" class="trainmate-bars" role="img">',
        f'<text x="{pad_l}" y="13" {font} fill="#333">{html.escape(title)}</text>',
    ]
    for i, (label, value, text) in enumerate(rows):
        y = top + i * row_h
        length = max(0.0, value) / most * inner
        color = COLORS[i % len(COLORS)]
        parts.append(
            f'<text x="{pad_l - 6}" y="{y + 12}" text-anchor="end" {font} fill="#333">'
            f"{html.escape(label)}</text>"
        )
        parts.append(
            f'<rect x="{pad_l}" y="{y + 2}" width="{length:.1f}" height="{row_h - 5}" '
            f'fill="{color}"/>'
        )
        parts.append(
            f'<text x="{pad_l + length + 4:.1f}" y="{y + 12}" {font} fill="#555">'
            f"{html.escape(text)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)
