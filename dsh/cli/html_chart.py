"""The chart of ``dsh sessions export --html`` (:mod:`dsh.cli.export_html`): an SVG bar chart
of the input and output tokens of each model response, in page order (sub-agents' responses
where their runs are nested), with labelled axes — tokens on the left, the response's number
below, the cost on the right when the model is priced. No library: a few SVG elements, and
only numbers computed here go in them (nothing from the ledger).
"""

from __future__ import annotations

import math

#: Bars of the chart at most: a longer session is bucketed.
CHART_BARS = 300

#: The drawing: the whole box, and the margins holding the axes' labels.
WIDTH, HEIGHT = 800, 230
LEFT, TOP, BOTTOM = 64, 12, 58


def nice(value: float) -> float:
    """The smallest of 1, 2, 5 × 10ⁿ at least ``value`` (the top of an axis)."""
    if value <= 0:
        return 1.0
    base = 10.0 ** math.floor(math.log10(value))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= value * (1 - 1e-12))


def tokens(n: float) -> str:
    """``850``, ``12.5k``, ``1.2M``."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.3g}M"
    if n >= 10_000:
        return f"{n / 1000:.3g}k"
    return f"{n:g}"


def chart(points: list[tuple[int, int, float]], priced: bool) -> str:
    """The chart of ``points`` (per response: input tokens, output tokens, cost), bucketed
    past :data:`CHART_BARS`; ``priced``: the cost as a line with its own axis."""
    if not points:
        return '<p class="chart-none">no model responses</p>'
    size = -(-len(points) // CHART_BARS)
    bars = [(sum(p[0] for p in points[i:i + size]), sum(p[1] for p in points[i:i + size]),
             sum(p[2] for p in points[i:i + size])) for i in range(0, len(points), size)]
    right = 72 if priced else 16
    w, h = WIDTH - LEFT - right, HEIGHT - TOP - BOTTOM
    base = TOP + h  # the x axis
    top = nice(max(b[0] + b[1] for b in bars))
    bw = w / len(bars)
    per = f"{size} responses" if size > 1 else "response"
    what = f"tokens per {per}"
    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-label="{what}, by model response"><title>input and output {what}'
             f'{f" (each bar: {size} responses)" if size > 1 else ""}</title>']
    # the token axis: gridlines and labels at 0, half and the top
    for frac in (0, 0.5, 1):
        y = base - h * frac
        parts.append(f'<line class="grid" x1="{LEFT}" y1="{y:.2f}" x2="{LEFT + w}" '
                     f'y2="{y:.2f}"/><text class="tick" x="{LEFT - 6}" y="{y + 4:.2f}" '
                     f'text-anchor="end">{tokens(top * frac)}</text>')
    parts.append(f'<text class="axis-title" transform="rotate(-90)" x="{-(TOP + h / 2):.2f}" '
                 f'y="14" text-anchor="middle">{what}</text>')
    for i, (inp, out, cost) in enumerate(bars):
        hi = h * inp / top
        ho = h * out / top
        x = LEFT + i * bw
        first = i * size + 1
        which = f"response {first}" if size == 1 else \
            f"responses {first}–{min(first + size - 1, len(points))}"
        tip = f"{which}: {inp} in / {out} out" + (f" · ${cost:.6f}" if priced else "")
        parts.append(f'<g class="bar"><title>{tip}</title>'
                     f'<rect class="in" x="{x:.2f}" y="{base - hi:.2f}" '
                     f'width="{max(bw - 1, 0.5):.2f}" height="{hi:.2f}"/>'
                     f'<rect class="out" x="{x:.2f}" y="{base - hi - ho:.2f}" '
                     f'width="{max(bw - 1, 0.5):.2f}" height="{ho:.2f}"/></g>')
    # the response axis: the first and the last response's number under their bars
    parts.append(f'<line class="axis" x1="{LEFT}" y1="{base}" x2="{LEFT + w}" y2="{base}"/>'
                 f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base}"/>')
    ends = [(0, 1)] + ([(len(bars) - 1, len(points))] if len(bars) > 1 else [])
    for i, number in ends:
        parts.append(f'<text class="tick" x="{LEFT + i * bw + bw / 2:.2f}" y="{base + 14}" '
                     f'text-anchor="middle">{number}</text>')
    parts.append(f'<text class="axis-title" x="{LEFT + w / 2:.2f}" y="{base + 30}" '
                 'text-anchor="middle">model response (in page order, sub-agents\' '
                 "included)</text>")
    if priced:
        top_cost = max(max(b[2] for b in bars), 1e-12)
        line = " ".join(f"{LEFT + i * bw + bw / 2:.2f},{base - h * b[2] / top_cost:.2f}"
                        for i, b in enumerate(bars))
        parts.append(f'<polyline class="cost" points="{line}"/>'
                     f'<line class="axis" x1="{LEFT + w}" y1="{TOP}" x2="{LEFT + w}" '
                     f'y2="{base}"/>')
        for frac in (0, 1):
            parts.append(f'<text class="tick" x="{LEFT + w + 6}" y="{base - h * frac + 4:.2f}">'
                         f"${top_cost * frac:.4g}</text>")
        parts.append(f'<text class="axis-title" transform="rotate(90)" '
                     f'x="{TOP + h / 2:.2f}" y="{-(WIDTH - 14)}" text-anchor="middle">'
                     f"cost per {per} (USD)</text>")
    legend = "blue: input tokens · orange: output tokens" + (" · line: cost" if priced else "")
    parts.append(f'<text class="legend" x="{LEFT}" y="{base + 46}">{legend}</text></svg>')
    return "".join(parts)
