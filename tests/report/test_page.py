"""The report's parts as plain functions: strip regions, labels, the S7 line, escaping."""

from batchproof.report.chart import rate_chart, s7_line
from batchproof.report.page import render
from batchproof.report.strips import regions, slot_label
from tests.report.witness_sample import sample_witness, slot


def test_regions_cover_every_token_in_order() -> None:
    assert regions(slot(0), 12) == [(0, 12, "same")]
    assert regions(slot(1, 5), 12) == [(0, 5, "same"), (5, 12, "diverged")]
    assert regions(slot(1, 5, bitwise=False), 12) == [(0, 5, "logprobs"), (5, 12, "diverged")]
    assert regions(slot(2, logprob_first_diff_at=3, logprobs_bitwise_equal=False), 12) == [
        (0, 3, "same"), (3, 12, "logprobs")]
    assert regions(slot(3, refused="HTTP 500: boom"), 12) == [(0, 12, "refused")]


def test_a_label_says_where_the_slot_left_and_by_what_margin() -> None:
    label = slot_label(slot(1, 5, bitwise=False), 12)
    assert "leaves the reference at token 5 (top-2 margin 1.9)" in label
    assert "logprobs differ by up to 1e-05 from token 0" in label
    assert slot_label(slot(0), 12).endswith("same tokens throughout · logprobs bitwise equal")


def test_the_s7_line_is_the_contract_share_of_c1() -> None:
    bands = sample_witness()["bands"]
    assert s7_line(bands, 0.5) == 20.0
    assert 'class="bar below" data-c="4"' in rate_chart(bands, 0.5)
    assert "unmeasured" in rate_chart([{**b, "decode_tok_s": None} for b in bands], 0.5)


def test_the_page_escapes_what_the_witness_says() -> None:
    page = render(sample_witness(), "NOT ADMISSIBLE", ["<script>alert(1)</script>"], 0.5, "w.json")
    assert "<script>" not in page and "&lt;script&gt;" in page and "box &lt;1&gt;" in page
