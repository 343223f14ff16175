"""report.html for verify-receipt's batch mode: the summary and a row per receipt, as one offline
page in the notary's style (inline CSS, no script, nothing fetched)."""

import html
from collections import Counter

from batchproof.notary.page import STYLE

MAX_ROWS = 1000  # receipts listed on the page; verdicts.json has every one


def summary(verdicts: list[dict]) -> dict:
    """How many receipts, how many of each verdict, and the exit code (the first non-MATCH's)."""
    counts = Counter(v["verdict"] for v in verdicts)
    first = next((v["exit_code"] for v in verdicts if v["exit_code"]), 0)
    return {"num_receipts": len(verdicts), "num_match": counts.get("MATCH", 0), "verdicts": dict(counts),
            "exit_code": first}


def render(verdicts: list[dict], title: str) -> str:
    """`verdicts`: each {where, verdict, exit_code, field, position, message}."""
    totals = summary(verdicts)
    ok = totals["num_match"] == totals["num_receipts"] and totals["num_receipts"] > 0
    headline = (f"All {totals['num_receipts']} receipts re-executed bit for bit." if ok else
                f"{totals['num_match']} of {totals['num_receipts']} receipts match; "
                + ", ".join(f"{n} {kind}" for kind, n in sorted(totals["verdicts"].items()) if kind != "MATCH") + ".")
    rows = []
    for v in verdicts[:MAX_ROWS]:
        cls = "ok" if v["verdict"] == "MATCH" else "bad"
        cells = [v["where"], v["verdict"], v["field"] or "-", "-" if v["position"] is None else v["position"],
                 v["message"]]
        rows.append("<tr>" + "".join(f"<td class={cls}>{html.escape(str(c))}</td>" if i == 1 else
                                     f"<td>{html.escape(str(c))}</td>" for i, c in enumerate(cells)) + "</tr>")
    more = (f"<p class=small>{len(verdicts) - MAX_ROWS} more in verdicts.json.</p>"
            if len(verdicts) > MAX_ROWS else "")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p class={'ok' if ok else 'bad'}><b>{html.escape(headline)}</b></p>"
            "<p class=small>A MATCH proves the reply re-executes bit for bit under these numerics on this host's "
            "engine; it says nothing of what another engine would answer (docs/receipts.md).</p>"
            "<table><tr><th>where</th><th>verdict</th><th>field</th><th>position</th><th>what differs</th></tr>"
            + "".join(rows) + f"</table>{more}</body></html>")
