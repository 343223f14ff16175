"""The report page: the check's verdict and reasons on top, then the rates, then each band's strips."""

from html import escape
from typing import Any

from batchproof.report.chart import rate_chart
from batchproof.report.sections import (
    any_server_section,
    cache_section,
    reference_summary,
    references_section,
    stream_parity_section,
)
from batchproof.report.strips import legend, strip_row

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:980px;
color:#1d1d1f;padding:0 16px}
h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px}
.verdict{display:inline-block;padding:6px 14px;border-radius:6px;font-weight:700;font-size:18px;color:#fff}
.verdict.ok{background:#2e9d5b}.verdict.no{background:#d64541}
#reasons li{margin:2px 0}
table.meta{border-collapse:collapse;margin:12px 0}table.meta td{padding:2px 12px 2px 0;vertical-align:top}
table.meta td:first-child{color:#666}
.band{border:1px solid #ddd;border-radius:8px;padding:10px 14px;margin:14px 0}
.band h3{margin:0 0 6px;font-size:15px}.band .why{color:#b3261e}
.strip{margin:6px 0}.strip .label{font-size:12px;color:#333}.strip-svg{width:100%;height:18px;display:block}
.conflict{font-size:12px;color:#b3261e}
.legend span{margin-right:16px;font-size:12px}.legend i{display:inline-block;width:12px;height:12px;
margin-right:4px;vertical-align:-1px}
.chart{width:100%;max-width:640px}.chart .axis{font-size:11px;fill:#555}.chart .value{font-size:11px;fill:#111}
.unmeasured{color:#b3261e}.caption{font-size:12px;color:#555;margin:2px 0 0}
table.grid{border-collapse:collapse;margin:8px 0;font-size:13px}table.grid td,table.grid th{border:1px solid #ddd;
padding:2px 8px;text-align:left}table.grid tr.ok td:nth-child(4){color:#2e7d4f}table.grid tr.bad td{background:#fdecea}
.findings li.bad{color:#b3261e}.findings li.muted,#server-quirks li{color:#555}#server-quirks li.bad{color:#b3261e}
"""


def _fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def _meta(witness: dict[str, Any]) -> str:
    model = witness.get("model") or {}
    sampler = witness.get("sampler") or {}
    reference = witness.get("reference") or {}
    num_prompts = len(witness.get("prompts") or [1])
    rows = [
        ("probe result", witness.get("result")),
        ("mode", f"{witness.get('mode', 'identical')} · route {witness.get('route', 'chat')}"
                 f" · stagger {_fmt(witness.get('stagger_ms'), 'g')} ms · {num_prompts} prompt(s)"),
        ("model", f"{model.get('path')} ({str(model.get('sha256'))[:12]}…)" if model else None),
        ("served as", witness.get("served_model")),
        ("host · commit", f"{witness.get('host') or 'unknown'} · {witness.get('commit') or 'unknown'}"),
        ("n_predict · declared_min", f"{sampler.get('max_tokens')} · {witness.get('declared_min')}"),
        ("m=1 reference", reference_summary(reference, sampler.get("max_tokens") or 0,
                                            witness.get("reference_logprobs"))),
    ]
    cells = "".join(f"<tr><td>{escape(k)}</td><td>{escape('unknown' if v is None else str(v))}</td></tr>"
                    for k, v in rows)
    return f'<table class="meta">{cells}</table>'


def _band(band: dict[str, Any], n_predict: int) -> str:
    c = band.get("c")
    if band.get("logprobs_bitwise_equal") is True:
        logprobs = "logprobs bitwise equal"
    elif band.get("logprobs_bitwise_equal") is False:
        logprobs = f"logprobs differ by up to {_fmt(band.get('logprob_max_abs_diff'), '.3g')}"
    else:
        logprobs = "logprobs not compared"
    source = f" ({band['m_formed_source']})" if band.get("m_formed_source") else ""
    title = (f"c={c} · m_formed {band.get('m_formed')}{source} · {band.get('result')} · "
             f"divergence at {_fmt(band.get('divergence_at'))} · decode {_fmt(band.get('decode_tok_s'), '.1f')} "
             f"tok/s · {logprobs}")
    if band.get("probe_cpu_share") is not None:  # the probe's own share of the CPUs during the band
        title += f" · probe CPU {100 * band['probe_cpu_share']:.0f}%"
    why = f'<div class="why">{escape(str(band["reason"]))}</div>' if band.get("reason") else ""
    rows = "".join(strip_row(c, slot, n_predict) for slot in band.get("slots") or [])
    return (f'<section class="band" id="band-{escape(str(c))}" data-c="{escape(str(c))}" '
            f'data-result="{escape(str(band.get("result")))}"><h3>{escape(title)}</h3>{why}{rows}</section>')


def render(witness: dict[str, Any], verdict: str, reasons: list[str], s7_ratio: float, source: str) -> str:
    """The whole page as one string: no script, no external resource, so it opens anywhere offline."""
    n_predict = (witness.get("sampler") or {}).get("max_tokens") or 0
    ok = verdict == "ADMISSIBLE"
    reason_items = "".join(f"<li>{escape(r)}</li>" for r in reasons) or "<li>none</li>"
    bands = witness.get("bands") or []
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>batchproof report: {escape(verdict)}</title><style>{STYLE}</style></head>
<body>
<h1>batchproof parity report <small>{escape(source)}</small></h1>
<div id="verdict" class="verdict {"ok" if ok else "no"}">{escape(verdict)}</div>
<ul id="reasons">{reason_items}</ul>
{_meta(witness)}
{any_server_section(witness)}
{references_section(witness)}
<h2>Per-request decode rate</h2>
{rate_chart(bands, s7_ratio)}
<h2>Bands</h2>
{legend()}
{"".join(_band(band, n_predict) for band in bands)}
{stream_parity_section(witness)}
{cache_section(witness)}
</body></html>
"""
