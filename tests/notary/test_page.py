"""notary/page.py: one offline page (no script, nothing fetched) that says the verdict and holds
the charts, whatever the report holds (no tokens, a bad record's text escaped)."""

from batchproof.notary.metrics import Scored, Settings, report
from batchproof.notary.page import render
from batchproof.notary.records import Rollout


def test_the_page_is_offline_and_escapes_what_it_quotes():
    bad = [{"where": "line 2", "field": "line", "error": "line 2: not JSON (<script>alert(1)</script>)"}]
    rep = report([Rollout("line 1", [1], [2, 3], [-1.0, -0.5])],
                 [Scored([-1.0, -0.25], [((2, -1.0), (4, -2.0)), ((3, -0.25), (5, -3.0))])], Settings(), bad,
                 {"model": "m<1>", "numerics_id": "abc"})
    page = render(rep, "Rollout notary: a&b")
    assert page.startswith("<!doctype html>") and page.count("<svg") == 2
    assert "<script>" not in page and "&lt;script&gt;" in page and "m&lt;1&gt;" in page and "a&amp;b" in page
    assert "src=" not in page and "https://" not in page and "<link" not in page
    assert "1 of 2 claimed logprobs differ" in page


def test_an_empty_report_renders():
    page = render(report([], [], Settings(), [], {}), "empty")
    assert "No rollout tokens were scored" in page
