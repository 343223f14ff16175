"""The board as one offline HTML page: inline CSS, no script, no external resource."""

import time
from html import escape
from typing import Any

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1200px;color:#1d1d1f;
padding:0 16px}h1{font-size:22px;margin:0 0 8px}.valid{display:inline-block;padding:6px 14px;border-radius:6px;
font-weight:700;color:#fff}.valid.ok{background:#2e9d5b}.valid.no{background:#d64541}
table{border-collapse:collapse;margin:14px 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f4}tr.control td:first-child::after{content:" (control)";
color:#555}td.ADMISSIBLE{color:#1e7a44;font-weight:700}td.NOT-ADMISSIBLE{color:#b3261e;font-weight:700}
td.UNSTABLE,td.UNREACHABLE,td.NOT-RUN{color:#8a5a00;font-weight:700}.small{font-size:12px;color:#555}
ul.why{margin:2px 0;padding-left:16px}
"""
COLUMNS = ("server", "configuration", "verdict", "runs agree", "max |Δ logprob| per band (run 1 / run 2)", "S7",
           "cache", "stream parity", "fail-open", "witnesses")


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return "0 (bitwise)" if value == 0 else f"{value:.3g}"


def _bands(runs: list[dict[str, Any]]) -> str:
    ladder = [band["c"] for band in runs[0]["bands"]] if runs else []
    lines = []
    for c in ladder:
        values = [next((_number(b["logprob_max_abs_diff"]) for b in run["bands"] if b["c"] == c), "-") for run in runs]
        lines.append(f"c={c}: {' / '.join(values)}")
    return "<br>".join(escape(line) for line in lines) or "-"


def _s7(runs: list[dict[str, Any]]) -> str:
    shown = []
    for run in runs:
        s7 = run["s7"]
        shown.append("unmeasured" if s7 is None else f"{100 * s7['share']:.0f}%{'' if s7['is_kept'] else ' (below)'}")
    return escape(" / ".join(shown)) or "-"


def _section(runs: list[dict[str, Any]], key: str) -> str:
    shown = []
    for run in runs:
        found = run[key]
        if found is None:
            shown.append("not run")
            continue
        findings = f", {found['num_findings']} finding(s)" if found["num_findings"] else ""
        shown.append(f"{found['result']}{findings}")
    return escape(" / ".join(shown)) or "-"


def _fail_open(runs: list[dict[str, Any]]) -> str:
    found = sorted({line for run in runs for line in run["fail_open"]})
    return "<br>".join(escape(line) for line in found) if found else "none"


def _links(runs: list[dict[str, Any]]) -> str:
    links = []
    for n, run in enumerate(runs, 1):
        links.append(f'<a href="{escape(run["witness"])}">run {n} json</a>')
        if run.get("report"):
            links.append(f'<a href="{escape(run["report"])}">run {n} report</a>')
    return " · ".join(links) or "-"


def _verdict(row: dict[str, Any]) -> str:
    css = row["verdict"].replace(" ", "-")
    why = f'<div class="small">{escape(row["why"])}</div>' if row.get("why") else ""
    reasons = sorted({r for run in row["runs"] for r in run["reasons"]})
    listed = "".join(f"<li>{escape(r)}</li>" for r in reasons[:6])
    more = f"<li>… {len(reasons) - 6} more</li>" if len(reasons) > 6 else ""
    details = f'<ul class="why small">{listed}{more}</ul>' if reasons else ""
    return f'<td class="{escape(css)}">{escape(row["verdict"])}{why}{details}</td>'


def _row(row: dict[str, Any]) -> str:
    runs = row["runs"]
    agree = {True: "yes", None: "-"}.get(row["agree"]) or "no: " + " / ".join(
        f"{run['verdict']} ({run['probe_result']})" for run in runs)
    cells = [f"<td>{escape(row['server'])}</td>", f"<td>{escape(row['configuration'])}</td>", _verdict(row),
             f"<td>{escape(agree)}</td>", f"<td>{_bands(runs)}</td>", f"<td>{_s7(runs)}</td>",
             f"<td>{_section(runs, 'cache')}</td>", f"<td>{_section(runs, 'stream_parity')}</td>",
             f"<td>{_fail_open(runs)}</td>", f"<td>{_links(runs)}</td>"]
    css = ' class="control"' if row["control"] else ""
    return f"<tr{css}>{''.join(cells)}</tr>"


def render(board: dict[str, Any]) -> str:
    valid = board["valid"]
    status = "VALID" if valid else "INVALID"
    because = "".join(f"<li>{escape(line)}</li>" for line in board["invalid_because"])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(board["started"]))
    matrix, contract = board["matrix"], board["contract"]
    head = "".join(f"<th>{escape(name)}</th>" for name in COLUMNS)
    rows = "".join(_row(row) for row in board["rows"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>batchproof parity board: {status}</title><style>{STYLE}</style></head>
<body>
<h1>batchproof parity board</h1>
<div id="validity" class="valid {"ok" if valid else "no"}">board {status}</div>
<ul id="invalid-because">{because}</ul>
<p class="small">host {escape(board["host"])} ({escape(board["machine"])}) · {escape(when)} · {board["seconds"]} s
· each cell probed {board["runs_per_cell"]} times · n_predict {matrix["n_predict"]} · ladder
{escape(str(matrix["ladder"]))} · contract bands {escape(str(contract["bands"]))}, bitwise logprobs
{"required" if contract["require_bitwise_logprobs"] else "not required"}, S7 needs c=4 at
{100 * contract["decode_ratio_c4_over_c1"]:g}% of c=1 · a row marked (control) must be NOT ADMISSIBLE</p>
<table id="board"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>
</body></html>
"""
