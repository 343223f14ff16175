"""The decode rate per concurrency against the S7 line (c=4 must keep a share of c=1's rate)."""

from html import escape
from typing import Any

WIDTH, HEIGHT = 640, 220
LEFT, BOTTOM, TOP = 56, 30, 16


def s7_line(bands: list[dict[str, Any]], ratio: float) -> float | None:
    """The rate c=4 must reach: ratio times c=1's, or None when c=1 has no rate."""
    ones = [b.get("decode_tok_s") for b in bands if b.get("c") == 1]
    return ratio * ones[0] if len(ones) == 1 and ones[0] else None


def rate_chart(bands: list[dict[str, Any]], ratio: float) -> str:
    """A bar per band (its median per-request decode rate), the S7 line across them."""
    rated = [(b["c"], b.get("decode_tok_s")) for b in bands]
    if not rated or all(rate is None for _, rate in rated):
        return '<p class="unmeasured" id="rates">decode rate unmeasured: no live (declared or observed) stream</p>'
    line = s7_line(bands, ratio)
    top = max([rate or 0 for _, rate in rated] + [line or 0]) * 1.15 or 1.0
    plot_w, plot_h = WIDTH - LEFT - 10, HEIGHT - BOTTOM - TOP
    step = plot_w / len(rated)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - value / top)

    parts = [f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - 10}" y2="{TOP + plot_h}" stroke="#666"/>',
             f'<text x="4" y="{TOP + 4}" class="axis">{top:.0f}</text>',
             f'<text x="4" y="{TOP + plot_h}" class="axis">0 tok/s</text>']
    for i, (c, rate) in enumerate(rated):
        x = LEFT + i * step + step * 0.2
        label = f'<text x="{x + step * 0.3:.1f}" y="{HEIGHT - 8}" class="axis" text-anchor="middle">c={c}</text>'
        if rate is None:
            parts.append(f'<text x="{x + step * 0.3:.1f}" y="{TOP + plot_h - 6}" class="axis" '
                         f'text-anchor="middle">n/a</text>{label}')
            continue
        below = c == 4 and line is not None and rate < line
        fill = "#d64541" if below else "#3b6ea5"
        parts.append(
            f'<rect class="bar{" below" if below else ""}" data-c="{c}" x="{x:.1f}" y="{y(rate):.1f}" '
            f'width="{step * 0.6:.1f}" height="{TOP + plot_h - y(rate):.1f}" fill="{fill}">'
            f'<title>c={c}: {rate:.1f} tok/s per request</title></rect>'
            f'<text x="{x + step * 0.3:.1f}" y="{y(rate) - 4:.1f}" class="value" text-anchor="middle">{rate:.1f}</text>'
            f"{label}"
        )
    caption = "S7 unmeasured: c=1 has no decode rate"
    if line is not None:
        parts.append(f'<line id="s7-line" x1="{LEFT}" y1="{y(line):.1f}" x2="{WIDTH - 10}" y2="{y(line):.1f}" '
                     'stroke="#d64541" stroke-dasharray="6 4"/>')
        caption = f"dashed line: S7, c=4 needs {ratio:.0%} of c=1's rate = {line:.1f} tok/s per request"
    return (f'<svg id="rates" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="decode rate per concurrency">{"".join(parts)}</svg>'
            f'<p class="caption" id="s7">{escape(caption)}</p>')
