"""report.html: the notary's report as one offline page (inline CSS and SVG, no script, no
CDN): the verdict, each framework's metrics, the importance-ratio histogram, what truncation
would do, |delta| by position, and a row per rollout (the JSON holds them all)."""

import html

from batchproof.notary.metrics import FRAMEWORK_DEFINITIONS

MAX_ROWS = 500  # rollouts listed on the page; report.json has every one
WIDTH, HEIGHT, PAD = 720, 220, 40

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:960px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .6em;border-bottom:1px solid #eee;text-align:left}
td{white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}.ok{color:#176f2c}.bad{color:#b3261e}
.small{color:#666;font-size:.9em}svg{background:#fafafa;border:1px solid #eee}
"""


def _num(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "0" if value == 0.0 else f"{value:.6g}"
    return html.escape(str(value))


def _cell(value: object) -> str:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return f"<td class=n>{_num(value)}</td>" if is_number else f"<td>{_num(value)}</td>"


def _table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def histogram_svg(bins: list[dict]) -> str:
    """The log-ratio histogram as bars, the exact bin in green."""
    most = max((b["count"] for b in bins), default=0) or 1
    step = (WIDTH - 2 * PAD) / max(len(bins), 1)
    parts = []
    for i, b in enumerate(bins):
        h = (HEIGHT - 3 * PAD) * b["count"] / most
        x, y = PAD + i * step, HEIGHT - 2 * PAD - h
        colour = "#2e7d32" if b["bin"] == "0 (exact)" else "#5470c6"
        parts.append(f'<rect x="{x + 2:.1f}" y="{y:.1f}" width="{step - 4:.1f}" height="{h:.1f}" fill="{colour}">'
                     f'<title>{html.escape(b["bin"])}: {b["count"]}</title></rect>')
        label_x, label_y = x + step / 2, HEIGHT - 2 * PAD + 10  # slanted: thirteen ranges side by side
        parts.append(f'<text x="{label_x:.1f}" y="{label_y}" font-size="9" text-anchor="end" '
                     f'transform="rotate(-35 {label_x:.1f} {label_y})">{html.escape(b["bin"])}</text>')
        if b["count"]:
            parts.append(f'<text x="{x + step / 2:.1f}" y="{y - 3:.1f}" font-size="10" text-anchor="middle">'
                         f'{b["count"]}</text>')
    return _svg("".join(parts), "log r = ours - claimed, per token")


def position_svg(rows: list[dict]) -> str:
    """Mean and max |delta| against completion position: a line each."""
    if not rows:
        return _svg("", "no completion tokens")
    top = max(r["max_abs_diff"] for r in rows) or 1.0
    span = max(len(rows) - 1, 1)

    def points(key: str) -> str:
        return " ".join(f"{PAD + (WIDTH - 2 * PAD) * r['position'] / span:.1f},"
                        f"{HEIGHT - PAD - (HEIGHT - 2 * PAD) * r[key] / top:.1f}" for r in rows)

    axes = (f'<text x="{PAD}" y="{PAD - 8}" font-size="10">|delta| up to {top:.3g} nats</text>'
            f'<text x="{WIDTH - PAD}" y="{HEIGHT - PAD + 14}" font-size="10" text-anchor="end">position '
            f'{len(rows) - 1}</text><text x="{PAD}" y="{HEIGHT - PAD + 14}" font-size="10">0</text>'
            f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>')
    lines = (f'<polyline fill="none" stroke="#b3261e" stroke-width="1" points="{points("max_abs_diff")}"/>'
             f'<polyline fill="none" stroke="#5470c6" stroke-width="2" points="{points("mean_abs_diff")}"/>')
    legend = (f'<text x="{WIDTH - PAD}" y="{PAD - 8}" font-size="10" text-anchor="end">'
              f'<tspan fill="#5470c6">mean</tspan> / <tspan fill="#b3261e">max</tspan></text>')
    return _svg(axes + lines + legend, "|delta| by completion position")


def _svg(body: str, label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img" '
            f'aria-label="{html.escape(label)}">{body}</svg>')


def _verdict(summary: dict) -> str:
    if summary["num_tokens"] == 0:
        return "<p>No rollout tokens were scored.</p>"
    if summary["all_exact"]:
        return (f'<p class=ok><b>Every one of {summary["num_tokens"]} claimed logprobs equals ours, bit for '
                f'bit</b> ({summary["num_rollouts"]} rollouts).</p>')
    return (f'<p class=bad><b>{summary["num_tokens"] - summary["num_exact_tokens"]} of {summary["num_tokens"]} '
            f'claimed logprobs differ from ours</b>, in {summary["num_divergent_rollouts"]} of '
            f'{summary["num_rollouts"]} rollouts: mean |delta| {_num(summary["mean_abs_diff"])}, max '
            f'{_num(summary["max_abs_diff"])} nats, k3 KL {_num(summary["k3_kl"])}.</p>')


def render(report: dict, title: str) -> str:
    summary, truncation = report["summary"], report["truncation"]
    frameworks = [[name, metric, value] for name, metrics in report["frameworks"].items()
                  for metric, value in metrics.items()]
    ratios = report["importance_ratio"]["quantiles"]
    mis = truncation["mis"]
    rollouts = report["rollouts"][:MAX_ROWS]
    rows = [[r["where"], r["rollout_id"], r["num_tokens"], r["num_exact"], r["mean_abs_diff"], r["max_abs_diff"],
             r["first_divergent_position"], r["mismatch_kl"], len(r["near_ties"]), len(r["disagreements"]),
             sum(d["explained_by_near_tie"] for d in r["disagreements"])] for r in rollouts]
    parts = [
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        _verdict(summary),
        f'<p class=small>Scored by {html.escape(str(report["engine"].get("model", "?")))} '
        f'(numerics {html.escape(str(report["engine"].get("numerics_id", "?")))}). '
        f'{summary["num_bad_records"]} bad record(s).</p>',
        "<h2>Each framework's metrics</h2>",
        _table(["framework", "metric", "value"], frameworks),
        "<ul class=small>" + "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>"
                                     for k, v in FRAMEWORK_DEFINITIONS.items()) + "</ul>",
        "<h2>Importance ratios r = pi_train / pi_rollout</h2>",
        _table(list(ratios), [list(ratios.values())]) if ratios else "<p>none</p>",
        histogram_svg(report["importance_ratio"]["log_ratio_histogram"]),
        "<p class=small>Tokens by log r = ours - claimed: left of exact, the claim was more confident than we "
        "are; right, less.</p>",
        "<h2>What truncation and masking would do</h2>",
        _table(["TIS cap", "tokens truncated", "fraction"],
               [[t["cap"], t["tokens_truncated"], t["fraction"]] for t in truncation["tis"]]),
        _table(["MIS band", "tokens masked", "fraction", "sequences with a masked token", "sequences geo-masked",
                "sequences"], [[f"[{mis['band'][0]:g}, {mis['band'][1]:g}]", mis["tokens_masked"],
                                mis["token_fraction"], mis["sequences_with_a_masked_token"],
                                mis["sequences_geo_masked"], mis["num_sequences"]]]),
        "<h2>|delta| by position</h2>", position_svg(report["by_position"]),
        f'<h2>Rollouts</h2><p class=small>Near ties: top-2 within {_num(summary["near_tie_nats"])} nats; '
        f'{summary["num_top1_disagreements"]} top-1 disagreements, '
        f'{summary["num_disagreements_explained_by_near_ties"]} explained by a near tie.'
        f"{f' The first {MAX_ROWS} shown.' if len(report['rollouts']) > MAX_ROWS else ''}</p>",
        _table(["rollout", "id", "tokens", "exact", "mean |delta|", "max |delta|", "first divergent", "k3 KL",
                "near ties", "top-1 disagreements", "explained"], rows),
    ]
    if report["bad_records"]:
        parts.append("<h2>Bad records</h2>" + _table(["where", "field", "error"], [
            [b["where"], b["field"], b["error"]] for b in report["bad_records"]]))
    parts.append("</body></html>\n")
    return "".join(parts)

