"""A band on a fleet: each slot against its own replica's m=1 reply; only slots of one replica
compared with each other."""

from batchproof.probe.judge.fleet_band import judge_fleet_band, within_replicas
from batchproof.probe.judge.mixed_verdict import Reference
from batchproof.probe.judge.verdict import Policy, Sample
from batchproof.probe.mode import Mode

POLICY = Policy(n_predict=8, declared_min=4, max_constant_run=3)
A = [f"a{i}" for i in range(8)]
B = [f"b{i}" for i in range(8)]  # replica b's own (self-consistent) reply


def ok(words: list[str]) -> Sample:
    return Sample(words, len(words))


def ref(words: list[str]) -> Reference:
    return Reference(words, [1.0] * len(words))


def test_each_slot_is_compared_with_the_first_slot_its_replica_served() -> None:
    assert within_replicas([A, B, A[:2] + ["x"] * 6, B], ["a", "b", "a", "b"]) == [(0, 8), (1, 8), (0, 2), (1, 8)]


def test_replicas_with_different_replies_each_pass_their_own_slots() -> None:
    judgement, worst = judge_fleet_band(4, 2, [ref(A), ref(B), ref(A), ref(B)], [ok(A), ok(B), ok(A), ok(B)],
                                        ["a", "b", "a", "b"], POLICY)
    assert (judgement.result, judgement.reason, judgement.intra_agree_to, judgement.divergence_at) == (
        "PASS", None, 8, 8)
    assert worst == 0


def test_slots_one_replica_batched_together_must_agree() -> None:
    parted = A[:2] + [f"x{i}" for i in range(6)]
    judgement, _ = judge_fleet_band(4, 2, [ref(A), ref(B), ref(A), ref(B)], [ok(A), ok(B), ok(parted), ok(B)],
                                    ["a", "b", "a", "b"], POLICY)
    assert judgement.result == "FAIL" and judgement.intra_agree_to == 2
    assert judgement.reason == ("slots of one batch disagree: slot 2 parts from slot 0 (both on replica a) "
                                "at token 2 < declared_min 4")
    # The slot's divergence from its own replica's m=1 reply is recorded as well.
    assert (judgement.divergence_at, judgement.top2_margin_at_divergence) == (2, 1.0)


def test_mixed_prompts_are_not_compared_with_each_other() -> None:
    mixed_on_a_fleet = Mode.chosen(is_mixed=True, is_fleet=True)
    judgement, _ = mixed_on_a_fleet.judge_band(2, 2, [ref(A), ref(B)], [ok(A), ok(B)], ["a", "a"], POLICY)
    assert judgement.result == "PASS" and judgement.intra_agree_to == 8
    # The same slots as identical requests on one replica part at token 0.
    judgement, _ = Mode.chosen(is_mixed=False, is_fleet=True).judge_band(2, 2, [ref(A), ref(B)], [ok(A), ok(B)],
                                                                        ["a", "a"], POLICY)
    assert judgement.result == "FAIL" and judgement.intra_agree_to == 0


def test_a_refused_slot_leaves_the_band_unmeasurable() -> None:
    judgement, _ = judge_fleet_band(2, 2, [ref(A), ref(B)], [ok(A), Sample([], None, "HTTP 500: boom")],
                                    ["a", "b"], POLICY)
    assert judgement.result == "UNMEASURABLE" and judgement.reason == "slot 1: HTTP 500: boom"
