"""The probe's pure judgement: agreement, runs, refusals, band and run verdicts, rates."""

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchproof.probe.judge.verdict import (
    Policy,
    Sample,
    agreement,
    band_rate,
    intern,
    judge_band,
    judge_reference,
    longest_constant_run,
    median,
    refusal,
    run_verdict,
)
from batchproof.probe.records.entry import top2_margin
from batchproof.probe.records.liveness import decode_rate

POLICY = Policy(n_predict=8, declared_min=4, max_constant_run=3)
WORDS = [f"w{i}" for i in range(8)]
tokens = st.lists(st.sampled_from(["a", "b", "c"]), max_size=30)


def ok(words: list[str]) -> Sample:
    return Sample(words, len(words))


# --- intern, agreement, runs ---------------------------------------------------------


def test_intern_numbers_identities_in_first_seen_order_across_streams() -> None:
    streams = [[("b", (98,)), ("a", (97,))], [("a", (97,)), ("c", ()), ("b", (98,))]]
    assert intern(streams) == [[0, 1], [1, 2, 0]]


def test_same_text_with_other_bytes_is_another_token() -> None:
    assert intern([[("\ufffd", (0xC3,))], [("\ufffd", (0xA9,))]]) == [[0], [1]]


@given(tokens)
def test_a_stream_agrees_with_itself_to_its_length(a: list[str]) -> None:
    assert agreement(a, a) == len(a)


@given(tokens, tokens, tokens)
def test_agreement_is_the_shared_prefix(prefix: list[str], a: list[str], b: list[str]) -> None:
    x, y = prefix + ["x"] + a, prefix + ["y"] + b
    assert agreement(x, y) == agreement(y, x) == len(prefix)
    assert agreement(prefix, prefix + a) == len(prefix)  # never parted: the shorter length


@given(tokens)
def test_interning_never_changes_agreement(a: list[str]) -> None:
    b = list(reversed(a))
    ids = intern([a, b])
    assert agreement(*ids) == agreement(a, b)


def test_longest_constant_run_examples() -> None:
    assert longest_constant_run([]) == 0
    assert longest_constant_run(["a"]) == 1
    assert longest_constant_run(["a", "b", "b", "b", "a", "a"]) == 3


@given(tokens)
def test_longest_constant_run_bounds(a: list[str]) -> None:
    run = longest_constant_run(a)
    assert (run == 0) == (not a)
    assert run <= len(a)
    assert longest_constant_run(a + ["z"] * (run + 1)) == run + 1


# --- refusals and the reference ------------------------------------------------------


def test_refusal_names_what_is_missing() -> None:
    assert refusal(ok(WORDS), 8) is None
    assert refusal(Sample(WORDS, 8, "HTTP 501: no logprobs"), 8) == "HTTP 501: no logprobs"
    assert refusal(Sample(WORDS, 7), 8) == "completion_tokens=7 != n_predict=8"
    assert refusal(Sample(WORDS, None), 8) == "completion_tokens=None != n_predict=8"
    assert refusal(Sample(WORDS[:6], 8), 8) == "6 logprob entries != n_predict=8"


def test_a_reference_that_agrees_with_itself_is_stable() -> None:
    ref = judge_reference(ok(WORDS), ok(WORDS), POLICY)
    assert (ref.is_stable, ref.tokens, ref.self_divergence_at, ref.reason) == (True, 8, 8, None)


def test_a_reference_that_parts_early_is_not_stable() -> None:
    ref = judge_reference(ok(WORDS), ok(WORDS[:2] + ["x"] * 6), POLICY)
    assert not ref.is_stable and ref.self_divergence_at == 2
    assert "part at token 2 < declared_min 4" in (ref.reason or "")
    # Parting exactly at declared_min is stable.
    assert judge_reference(ok(WORDS), ok(WORDS[:4] + ["x"] * 4), POLICY).is_stable


@pytest.mark.parametrize("bad_first", [True, False])
def test_a_refused_reference_names_which_one(bad_first: bool) -> None:
    bad = Sample(WORDS, 7)
    first, second = (bad, ok(WORDS)) if bad_first else (ok(WORDS), bad)
    ref = judge_reference(first, second, POLICY)
    label = "ref#1" if bad_first else "ref#2"
    assert not ref.is_stable and ref.self_divergence_at is None
    assert ref.reason == f"{label}: completion_tokens=7 != n_predict=8"


# --- bands ----------------------------------------------------------------------------

MARGINS = [0.5 + i for i in range(8)]


def band(slots: list[Sample], c: int | None = None, m: int | None = None, policy: Policy = POLICY):
    c = len(slots) if c is None else c
    return judge_band(c, c if m is None else m, WORDS, MARGINS, slots, policy)


def test_a_clean_band_passes_and_records_n_predict_never_null() -> None:
    b = band([ok(WORDS)] * 4)
    assert (b.result, b.reason, b.divergence_at, b.intra_agree_to) == ("PASS", None, 8, 8)
    assert b.top2_margin_at_divergence is None and b.max_constant_run == 1


def test_a_divergence_from_m1_is_recorded_with_the_reference_margin_not_judged() -> None:
    parted = WORDS[:3] + ["x"] * 1 + WORDS[4:]
    b = band([ok(parted)] * 4)
    assert (b.result, b.divergence_at, b.top2_margin_at_divergence) == ("PASS", 3, MARGINS[3])


def test_a_band_with_no_batch_is_unmeasurable_with_nothing_measured() -> None:
    b = band([ok(WORDS)] * 4, m=1)
    assert b.result == "UNMEASURABLE" and "m_formed=1" in (b.reason or "")
    assert (b.divergence_at, b.intra_agree_to, b.max_constant_run) == (None, None, None)
    assert band([ok(WORDS)], m=0).result == "PASS"  # c=1 needs no batch


def test_a_band_with_a_refused_slot_or_a_missing_reply_is_unmeasurable() -> None:
    b = band([ok(WORDS), Sample(WORDS, 8, "HTTP 500: boom"), ok(WORDS)])
    assert b.result == "UNMEASURABLE" and b.reason == "slot 1: HTTP 500: boom"
    b = band([ok(WORDS)] * 3, c=4)
    assert b.result == "UNMEASURABLE" and b.reason == "fired c=4 requests, 3 came back"


def test_a_frozen_slot_fails() -> None:
    frozen = WORDS[:2] + ["same"] * 6
    b = band([ok(WORDS), ok(WORDS), ok(frozen)])
    assert b.result == "FAIL" and b.max_constant_run == 6
    assert "slot 2 repeated one token 6 times" in (b.reason or "")


def test_slots_of_one_batch_that_disagree_early_fail() -> None:
    b = band([ok(WORDS), ok(WORDS), ok(WORDS[:2] + ["x", "y", "z", "u", "v", "t"])])
    assert b.result == "FAIL" and b.intra_agree_to == 2
    assert "slot 2 parts from slot 0 at token 2 < declared_min 4" in (b.reason or "")
    # Late disagreement (at declared_min or after) passes.
    assert band([ok(WORDS), ok(WORDS[:4] + ["x", "y", "z", "u"])]).result == "PASS"


def test_a_short_slot_is_unmeasurable_unless_frozen() -> None:
    policy = Policy(n_predict=3, declared_min=5, max_constant_run=3)
    short = ["a", "b", "c"]
    b = judge_band(2, 2, short, [None] * 3, [ok(short), ok(short)], policy)
    assert b.result == "UNMEASURABLE" and "3 tokens < declared_min 5" in (b.reason or "")
    frozen = ["a", "a", "a"]
    assert judge_band(2, 2, short, [None] * 3, [ok(frozen)] * 2, policy).result == "FAIL"


# --- run verdict, rates ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("stable", "bands", "expected"),
    [
        (True, [(1, "PASS"), (4, "PASS")], "PASS"),
        (True, [(1, "PASS"), (4, "FAIL"), (8, "UNMEASURABLE")], "FAIL"),
        (True, [(1, "PASS"), (4, "UNMEASURABLE")], "UNMEASURABLE"),
        (False, [], "UNMEASURABLE"),
        (True, [(1, "PASS")], "UNMEASURABLE"),  # no band with c > 1 ran
        (True, [], "UNMEASURABLE"),
    ],
)
def test_run_verdict(stable: bool, bands: list, expected: str) -> None:
    assert run_verdict(stable, bands) == expected


def test_median_examples() -> None:
    assert median([]) is None
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5


@given(st.lists(st.floats(min_value=0.1, max_value=1e6), min_size=1, max_size=17))
def test_median_agrees_with_statistics(values: list[float]) -> None:
    assert median(values) == pytest.approx(statistics.median(values))


def test_a_band_rate_needs_every_slot_timed() -> None:
    assert band_rate([10.0, 30.0, 20.0]) == 20.0
    assert band_rate([10.0, None]) is None
    assert band_rate([]) is None


def test_decode_rate_only_on_live_streams_with_a_span() -> None:
    assert decode_rate(True, [1.0, 1.5, 2.0], 11) == pytest.approx(10.0)
    assert decode_rate(False, [1.0, 2.0], 11) is None
    assert decode_rate(True, [1.0], 11) is None
    assert decode_rate(True, [1.0, 1.0], 11) is None
    assert decode_rate(True, [1.0, 2.0], None) is None


def test_top2_margin_ignores_absent_alternatives() -> None:
    assert top2_margin([-0.5, -1.25]) == pytest.approx(0.75)
    assert top2_margin([-1.25, -0.5]) == pytest.approx(0.75)
    assert top2_margin([-0.5, -9999.0]) is None
    assert top2_margin([-0.5, None]) is None
    assert top2_margin([-0.5, float("-inf")]) is None
    assert top2_margin([]) is None
    assert top2_margin([-0.1, -9999.0, -0.3, -2.0]) == pytest.approx(0.2)
