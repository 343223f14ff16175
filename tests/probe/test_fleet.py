"""The fleet's judgement as pure functions: the listing, how many alone requests, the
cross-replica comparison, the verdict and its witness section."""

import pytest

from batchproof.probe.judge.fleet import (
    NO_HEADER,
    Listed,
    Reply,
    alone_cap,
    cross_replica,
    fleet_record,
    judge_fleet,
    listed_replicas,
    needs_more_alone,
    pair_divergence,
    representatives,
    with_fleet,
)
from batchproof.probe.records.entry import Entry


def entries(n: int = 8, **changes: tuple[int, Entry]) -> list[Entry]:
    words = [Entry(f" w{i}", tuple(f" w{i}".encode()), -0.1, (-0.1, -2.0)) for i in range(n)]
    for at, entry in changes.values():
        words[at] = entry
    return words


WORDS = entries()
LISTED = [Listed("a", True, "n1"), Listed("b", True, "n1")]


def test_the_listing_is_read_leniently() -> None:
    info = {"numerics_id": "n1", "fleet": {"replicas": [
        {"id": "a", "alive": True, "numerics_id": "n1"}, {"id": "b", "alive": False}, {"id": 3}, "junk"]}}
    assert listed_replicas(info) == [Listed("a", True, "n1"), Listed("b", False, None)]
    assert listed_replicas({"model": "m"}) == [] and listed_replicas({"fleet": {"replicas": "a"}}) == []
    assert listed_replicas(None) is None


@pytest.mark.parametrize(
    ("replicas", "listed", "more"),
    [
        ([], LISTED, True),
        (["a"], LISTED, True),
        (["a", "b"], LISTED, True),  # each once: not yet judged against itself
        (["a", "b", "a", "b"], LISTED, False),
        (["a"] * 15, LISTED, True),  # b listed alive: keep looking ...
        (["a"] * 16, LISTED, False),  # ... until the cap
        ([None, None], None, False),  # names no replica: not a fleet
        (["solo", "solo"], [], False),  # server_info lists no fleet: a single server
        (["x", "x"], None, True),  # no server_info: look for a second replica ...
        (["x", "x", "y", "y"], None, False),
        (["x"] * 16, None, False),  # ... until the cap
        (["a", "a", "b", "b"], [Listed("a", True, None), Listed("b", True, None), Listed("c", False, None)], False),
    ],
)
def test_the_alone_phase_stops_when_every_replica_answered_twice(replicas, listed, more) -> None:
    assert needs_more_alone(replicas, listed) is more


def test_the_cap_grows_with_the_fleet() -> None:
    assert alone_cap(None) == alone_cap([]) == alone_cap(LISTED) == 16
    assert alone_cap([Listed(r, True, None) for r in "abcd"]) == 32


def test_equal_replies_do_not_diverge() -> None:
    assert pair_divergence(0, "a", "b", WORDS, entries()) is None


def test_a_logprob_difference_is_found_with_both_sides_and_margins() -> None:
    moved = Entry(" w3", tuple(b" w3"), -0.1, (-0.1, -2.5))
    found = pair_divergence(0, "a", "b", WORDS, entries(x=(3, moved)))
    assert found is not None
    assert (found.token_index, found.kind, found.tokens, found.tokens_agree_to) == (3, "logprob", (" w3", " w3"), 8)
    assert found.logprobs == ([-0.1, -0.1, -2.0], [-0.1, -0.1, -2.5])
    assert found.top2_margins == pytest.approx((1.9, 2.4)) and found.logprob_max_abs_diff == 0.5


def test_minus_zero_is_a_difference() -> None:
    zero = [Entry(" z", (), 0.0, ())] * 2
    assert pair_divergence(0, "a", "b", zero, [Entry(" z", (), -0.0, ())] * 2).token_index == 0


def test_a_token_difference_is_found_where_the_streams_part() -> None:
    other = Entry(" no", tuple(b" no"), -0.69, (-0.69, -0.7))
    found = pair_divergence(1, "a", "b", WORDS, entries(x=(6, other)))
    assert (found.prompt, found.token_index, found.kind, found.tokens) == (1, 6, "token", (" w6", " no"))
    assert found.top2_margins == pytest.approx((1.9, 0.01)) and found.tokens_agree_to == 6


def test_a_logprob_difference_before_the_streams_part_comes_first() -> None:
    moved = Entry(" w2", tuple(b" w2"), -0.2, (-0.2, -2.0))
    other = Entry(" no", tuple(b" no"), -0.69, (-0.69, -0.7))
    found = pair_divergence(0, "a", "b", WORDS, entries(x=(2, moved), y=(6, other)))
    assert (found.token_index, found.kind, found.tokens_agree_to) == (2, "logprob", 6)


def test_every_pair_of_replicas_is_compared_per_prompt_and_the_earliest_reported() -> None:
    late = entries(x=(6, Entry(" no", tuple(b" no"), -0.69, (-0.69, -0.7))))
    early = entries(x=(4, Entry(" w4", tuple(b" w4"), -0.3, (-0.3, -2.0))))
    replies = [Reply(0, "a", WORDS), Reply(0, "b", WORDS), Reply(0, "c", late), Reply(1, "a", WORDS),
               Reply(1, "b", early)]
    compared, diverged, first = cross_replica(replies)
    assert (compared, diverged) == (3 + 1, 2 + 1)
    assert (first.prompt, first.replicas, first.token_index) == (1, ("a", "b"), 4)


def test_each_replica_is_represented_by_its_first_complete_alone_reply() -> None:
    replies = [Reply(0, "a", None), Reply(0, "a", WORDS), Reply(0, None, WORDS), Reply(0, "b", WORDS),
               Reply(0, "a", entries(3))]
    assert representatives(replies) == [replies[1], replies[3]]


def alone(*replicas: str | None, got: list[Entry] | None = None) -> list[Reply]:
    return [Reply(0, r, got or WORDS) for r in replicas]


def test_a_fleet_that_agrees_passes() -> None:
    judgement = judge_fleet(alone("a", "b", "a", "b"), ["a", "b", "a"], LISTED)
    assert (judgement.result, judgement.reason, judgement.divergence) == ("PASS", None, None)
    assert judgement.replicas == [{"id": "a", "alone": 2, "slots": 2, "numerics_id": "n1"},
                                  {"id": "b", "alone": 2, "slots": 1, "numerics_id": "n1"}]
    assert (judgement.pairs_compared, judgement.pairs_diverged, judgement.unserved) == (1, 0, [])


def test_replicas_that_disagree_fail_whatever_else_is_missing() -> None:
    moved = entries(x=(5, Entry(" w5", tuple(b" w5"), -0.1, (-0.1, -2.000001))))
    replies = [*alone("a"), Reply(0, "b", moved), *alone(None)]
    judgement = judge_fleet(replies, ["c", None], LISTED)
    assert judgement.result == "FAIL" and judgement.divergence.replicas == ("a", "b")
    assert judgement.reason == ("replicas a and b disagree on prompt 0 at token 5: logprobs [-0.1, -0.1, -2.0] vs "
                                "[-0.1, -0.1, -2.000001] (token ' w5'), top-2 margins 1.9/1.9")


@pytest.mark.parametrize(
    ("replies", "slots", "listed", "reason"),
    [
        (alone(None, None), [None], None, NO_HEADER),
        (alone("a", "a"), ["a"], [], "only replica a served (all 3 replies; /v1/server_info lists no fleet): "
                                     "cross-replica agreement was not tested"),
        (alone("a", "a"), ["a"], None, "only replica a served (all 3 replies): cross-replica agreement was not tested"),
        (alone("a", "a"), [], LISTED, "only replica a served (all 2 replies, though /v1/server_info lists b alive "
                                      "too): cross-replica agreement was not tested"),
        (alone("a", "a"), ["b", "b"], LISTED, "only a answered alone in full; b served 2 band slots but never "
                                              "alone: cross-replica agreement was not tested for the whole fleet"),
        (alone("a", "b", "a", "b"), [], [*LISTED, Listed("c", True, None)],
         "c listed alive by /v1/server_info but never served: cross-replica agreement was not tested for the "
         "whole fleet"),
        (alone("a", "b", "a", "b"), [None, "a"], LISTED,
         "1 replies named no replica, so they could not be attributed"),
    ],
)
def test_a_fleet_whose_agreement_was_not_tested_is_unmeasurable(replies, slots, listed, reason) -> None:
    judgement = judge_fleet(replies, slots, listed)
    assert (judgement.result, judgement.reason) == ("UNMEASURABLE", reason)


def test_refused_replies_count_as_served_but_are_not_compared() -> None:
    judgement = judge_fleet([*alone("a", "a"), Reply(0, "b", None)], [], LISTED)
    assert judgement.result == "UNMEASURABLE" and judgement.pairs_compared == 0
    assert judgement.replicas[1] == {"id": "b", "alone": 1, "slots": 0, "numerics_id": "n1"}
    assert judgement.reason == ("only a answered alone in full; b has no complete alone reply to every prompt: "
                                "cross-replica agreement was not tested for the whole fleet")
    # With two prompts, a replica must have answered each of them alone.
    partial = [*alone("a", "b"), Reply(1, "a", WORDS), Reply(1, "b", None)]
    assert judge_fleet(partial, [], LISTED).reason.startswith("only a answered alone in full; b has no complete")


@pytest.mark.parametrize(
    ("run", "fleet", "verdict"),
    [("PASS", "PASS", "PASS"), ("PASS", "FAIL", "FAIL"), ("UNMEASURABLE", "FAIL", "FAIL"),
     ("FAIL", "UNMEASURABLE", "FAIL"), ("PASS", "UNMEASURABLE", "UNMEASURABLE"),
     ("UNMEASURABLE", "PASS", "UNMEASURABLE")],
)
def test_the_fleet_folds_into_the_run_verdict(run, fleet, verdict) -> None:
    assert with_fleet(run, fleet) == verdict


def test_the_witness_section() -> None:
    moved = entries(x=(5, Entry(" w5", tuple(b" w5"), -0.2, (-0.2, -2.0))))
    record = fleet_record(judge_fleet([*alone("a", "a"), Reply(0, "b", moved), Reply(0, "b", moved)], ["b"], None))
    assert list(record) == ["result", "reason", "num_replicas", "replicas", "unserved", "headerless",
                            "pairs_compared", "pairs_diverged", "divergence"]
    assert record["divergence"] == {
        "prompt": 0, "replicas": ["a", "b"], "token_index": 5, "kind": "logprob", "tokens": [" w5", " w5"],
        "logprobs": [[-0.1, -0.1, -2.0], [-0.2, -0.2, -2.0]], "top2_margins": [pytest.approx(1.9), 1.8],
        "tokens_agree_to": 8, "logprob_max_abs_diff": pytest.approx(0.1),
    }
    assert fleet_record(judge_fleet(alone("a", "b", "a", "b"), [], None))["divergence"] is None
