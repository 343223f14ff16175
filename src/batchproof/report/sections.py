"""The page's sections beyond the bands: the m=1 reference's stability, stream parity, cold against
warm caches, and what a server refused or answered without logprobs (each only when the witness has it)."""

from html import escape
from typing import Any


def _fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def _table(table_id: str, head: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join(
        f'<tr class="{escape((classes or [""] * len(rows))[i])}">' + "".join(f"<td>{escape(c)}</td>" for c in row)
        + "</tr>" for i, row in enumerate(rows))
    return f'<table class="grid" id="{table_id}"><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>'


def reference_summary(reference: dict[str, Any], n_predict: int, logprobs: dict[str, Any] | None = None) -> str:
    """The reference in words: how far its two runs agree on tokens, and whether on logprobs."""
    agree = reference.get("self_divergence_at")
    tokens = reference.get("tokens")
    if reference.get("stable"):
        text = f"tokens stable: the two alone runs agree on {_fmt(agree)} of {_fmt(tokens if tokens else n_predict)}"
    else:
        text = f"tokens NOT STABLE: the two alone runs agree on {_fmt(agree)}"
    if reference.get("reason"):
        text += f" ({reference['reason']})"
    logprobs = logprobs or {}
    if logprobs.get("logprobs_stable") is True:
        text += "; logprobs bitwise equal"
    elif logprobs.get("logprobs_stable") is False:
        text += (f"; logprobs NOT STABLE: {logprobs.get('logprob_reason')}. The bands' logprob differences "
                 "below are not attributable to batching")
    return text


def _pass_class(ok: bool | None) -> str:
    return "ok" if ok is True else ("bad" if ok is False else "")


def references_section(witness: dict[str, Any]) -> str:
    """One row per prompt (and replica) measured alone: its runs' agreement and cache hits."""
    references = witness.get("references") or []
    if not references:
        return ""
    rows, classes = [], []
    for r in references:
        cached = r.get("cached_tokens") or []
        tokens = "-" if r.get("stable") is None else ("stable" if r["stable"] else "NOT STABLE")
        rows.append([str(r.get("prompt")), tokens, _fmt(r.get("self_divergence_at")), _logprobs_cell(r),
                     ", ".join(_fmt(n) for n in cached) or "-"])
        classes.append(_pass_class(r.get("logprobs_bitwise_equal")))
    head = ["prompt", "tokens", "agree to", "logprobs (run 1 vs later)", "cached tokens per run"]
    table = _table("references", head, rows, classes)
    return f'<h2 id="reference-stability">Reference stability (m=1, alone)</h2>{table}'


def _findings(section: dict[str, Any]) -> str:
    items = "".join(
        f'<li class="{"bad" if f.get("attributable") is not False else "muted"}">{escape(str(f.get("text")))}</li>'
        for f in section.get("findings") or [])
    return f"<ul class=\"findings\">{items}</ul>" if items else ""


def _verdict(section: dict[str, Any]) -> str:
    why = f": {section['reason']}" if section.get("reason") else ""
    result = escape(str(section.get("result")))
    return f'<p class="mode-result" data-result="{result}"><b>{result}</b>{escape(why)}</p>'


def _logprobs_cell(row: dict[str, Any]) -> str:
    if row.get("refused"):
        return f"not compared: {row['refused']}"
    if row.get("logprobs_bitwise_equal") is True:
        return "bitwise"
    if row.get("logprobs_bitwise_equal") is False:
        size, first = _fmt(row.get("logprob_max_abs_diff"), ".3g"), _fmt(row.get("logprob_first_diff_at"))
        return f"differ by {size} from token {first}"
    return "-"


def stream_parity_section(witness: dict[str, Any]) -> str:
    section = witness.get("stream_parity")
    if not section:
        return ""
    rows = [[str(p.get("where")), _fmt(p.get("tokens_agree_to")),
             "-" if p.get("text_equal") is None else ("same" if p["text_equal"] else "DIFFERS"), _logprobs_cell(p),
             "yes" if p.get("attributable") else f"no: {p.get('not_attributable')}"]
            for p in section.get("pairs") or []]
    classes = [_pass_class(p.get("logprobs_bitwise_equal") and p.get("text_equal")) for p in section.get("pairs") or []]
    head = ["reply", "tokens agree to", "text", "logprobs (whole vs streamed)", "blamed on the stream"]
    return (f'<h2 id="stream-parity">Stream parity: streamed against whole replies</h2>{_verdict(section)}'
            f'<p class="caption">compared: {escape(str(section.get("sample")))}</p>'
            f'{_findings(section)}{_table("stream-pairs", head, rows, classes)}')


def cache_section(witness: dict[str, Any]) -> str:
    section = witness.get("cache")
    if not section:
        return ""
    parts = [f'<h2 id="cache">Caches: cold against warm</h2>{_verdict(section)}{_findings(section)}']
    for case in section.get("cases") or []:
        cold = case.get("cold") or {}
        warmer = case.get("warmer") or {}
        rows = [["cold", _fmt(cold.get("cached_tokens")), "-", "the reference", "-"],
                ["warmer", _fmt(warmer.get("cached_tokens")), "-", "not compared (shares the prefix)", "-"]]
        classes = ["", ""]
        for s in case.get("slots") or []:
            i = s.get("i")  # null: the slot is drawn, its number unknown
            alone = f"warm alone #{'-' if i is None else i + 1}"
            where = alone if s.get("c") == 1 else f"warm c={s.get('c')} slot {_fmt(i)}"
            rows.append([where, _fmt(s.get("cached_tokens")), _fmt(s.get("tokens_agree_to")), _logprobs_cell(s),
                         "yes" if s.get("attributable") else f"no: {s.get('not_attributable')}"])
            classes.append(_pass_class(s.get("logprobs_bitwise_equal")))
        head = ["run", "cached tokens", "tokens agree to", "logprobs (vs cold)", "blamed on the cache"]
        name = escape(str(case.get("case")))
        parts.append(f'<h3>case {name}: the warmer shares {escape(str(case.get("shares")))}</h3>'
                     + _table(f"cache-{name}", head, rows, classes))
    return "".join(parts)


def any_server_section(witness: dict[str, Any]) -> str:
    """Fields the server refused (so the probe did not ask them) and 200s without logprobs."""
    items = []
    if witness.get("dropped_fields"):
        dropped = ", ".join(map(str, witness["dropped_fields"]))
        items.append(f"fields the server refused, left out of every request: {dropped}")
    if witness.get("extra_body"):
        items.append(f"fields added to every request (--extra-body): {', '.join(map(str, witness['extra_body']))}")
    for entry in witness.get("fail_open") or []:
        how = "streamed" if entry.get("streamed") else "not streamed"
        items.append(f"FAIL-OPEN: {entry.get('route')} ({how}) answered {entry.get('requests')} request(s) with "
                     f"{entry.get('what')}")
    if not items:
        return ""
    lis = "".join(f'<li class="{"bad" if i.startswith("FAIL-OPEN") else ""}">{escape(i)}</li>' for i in items)
    return f'<h2 id="any-server">What the server refused</h2><ul id="server-quirks">{lis}</ul>'
