"""
Line charts as SVG text, drawn into an ipywidgets HTML widget.

Why SVG in an HTML widget: it needs no JavaScript of its own (so nothing to install or trust in the
front end), works offline, renders the same in JupyterLab, Notebook 7 and VS Code (all render the
HTML widget), and what is saved with the notebook is a static picture that stays readable.
anywidget would add a JS bundle to ship; a plotting library (matplotlib, plotly) costs tens of ms
per redraw or a large JS payload, too much at a few redraws a second.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _fmt(value: float) -> str:
    if value == 0 or 1e-3 <= abs(value) < 1e4:
        return f"{value:.4g}"
    return f"{value:.2e}"


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    width: int = 420,
    height: int = 160,
    x_label: str = "step",
) -> str:
    """An SVG with one polyline per series, shared axes, min/max labels and a legend."""
    pad_l, pad_r, pad_t, pad_b = 48, 8, 8, 22
    finite = {k: [(x, y) for x, y in pts if math.isfinite(y)] for k, pts in series.items()}
    points = [p for pts in finite.values() for p in pts]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" class="trainmate-chart" role="img">']  # fmt: skip
    if not points:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" font-size="11" '
                     'fill="#888">waiting for the first steps</text></svg>')  # fmt: skip
        return "".join(parts)
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    inner_w, inner_h = width - pad_l - pad_r, height - pad_t - pad_b

    def sx(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * inner_w

    def sy(y: float) -> float:
        return pad_t + (1 - (y - y0) / (y1 - y0)) * inner_h

    parts.append(f'<rect x="{pad_l}" y="{pad_t}" width="{inner_w}" height="{inner_h}" fill="none" '
                 'stroke="#ccc" stroke-width="1"/>')  # fmt: skip
    font = 'font-size="10" font-family="sans-serif"'
    label = f'{font} fill="#666"'
    parts.append(
        f'<text x="{pad_l - 4}" y="{pad_t + 9}" text-anchor="end" {label}>{_fmt(y1)}</text>'
    )
    parts.append(
        f'<text x="{pad_l - 4}" y="{pad_t + inner_h}" text-anchor="end" {label}>{_fmt(y0)}</text>'
    )
    parts.append(f'<text x="{pad_l}" y="{height - 6}" {label}>{_fmt(x0)}</text>')
    parts.append(f'<text x="{width - pad_r}" y="{height - 6}" text-anchor="end" {label}>'
                 f"{_fmt(x1)} {html.escape(x_label)}</text>")  # fmt: skip
    for i, (name, pts) in enumerate(finite.items()):
        color = COLORS[i % len(COLORS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(f'<polyline data-series="{html.escape(name)}" points="{coords}" fill="none" '
                     f'stroke="{color}" stroke-width="1.5"/>')  # fmt: skip
        parts.append(f'<text x="{pad_l + 6 + 90 * i}" y="{pad_t + 12}" {font} fill="{color}">'
                     f"{html.escape(name)}</text>")  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)
