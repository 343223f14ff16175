"""A fleet witness (`batchproof probe --fleet`): its replicas must agree bitwise, and S3 reads
the shape per replica; a witness without a fleet section is judged as before."""

import json
from collections import Counter

import pytest

from tests.helpers.check_support import C4, check_text, check_witness, control, mutated

DIVERGENCE = {"prompt": 0, "replicas": ["a", "b"], "token_index": 5, "kind": "logprob", "tokens": [" x", " x"],
              "logprobs": [[-0.1, -0.1, -2.0], [-0.11, -0.11, -2.0]], "top2_margins": [1.9, 1.89],
              "tokens_agree_to": 128, "logprob_max_abs_diff": 0.01}


def as_fleet(witness: dict, replicas: tuple[str, ...] = ("a", "b")) -> None:
    """The control served by a fleet: slots round robin over `replicas`, each replica batching
    its share of a band together, and a fleet section that found the replicas agreeing."""
    for band in witness["bands"]:
        for i, slot in enumerate(band["slots"]):
            slot["replica"] = replicas[i % len(replicas)]
        served = Counter(slot["replica"] for slot in band["slots"])
        band["m_formed_by_replica"] = {r: served[r] for r in replicas}
        band["m_formed"] = max(served.values())
    witness["fleet"] = {"result": "PASS", "reason": None, "num_replicas": len(replicas),
                        "replicas": [{"id": r, "alone": 2, "slots": 0, "numerics_id": None} for r in replicas],
                        "unserved": [], "headerless": 0, "pairs_compared": 1, "pairs_diverged": 0,
                        "divergence": None}


def fleet_with(**changes: object):
    def mutate(witness: dict) -> None:
        witness["fleet"] |= changes

    return mutate


def test_a_fleet_that_agrees_is_admissible_though_no_replica_formed_m_equal_c(tmp_path) -> None:
    witness = mutated(as_fleet)
    assert [b["m_formed"] for b in witness["bands"]] == [1, 2, 4, 8]
    assert check_witness(tmp_path, witness) == (0, [])


def test_replicas_that_disagree_are_not_admissible(tmp_path) -> None:
    code, reasons = check_witness(tmp_path, mutated(as_fleet, fleet_with(result="FAIL", divergence=DIVERGENCE,
                                                                         reason="replicas a and b disagree ...")))
    assert code == 5 and reasons == [
        "fleet: replicas a and b disagree on prompt 0 at token 5 (logprobs differ); "
        "a fleet's replicas must agree bitwise"
    ]
    token = {**DIVERGENCE, "kind": "token"}
    assert check_witness(tmp_path, mutated(as_fleet, fleet_with(divergence=token)))[1] == [
        "fleet: replicas a and b disagree on prompt 0 at token 5 (tokens differ); a fleet's replicas must agree bitwise"
    ]


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"result": "UNMEASURABLE", "reason": "only replica a served"},
         "fleet: result UNMEASURABLE is not PASS (only replica a served); cross-replica agreement is not shown"),
        ({"result": None}, "fleet: result not recorded; cross-replica agreement is not shown"),
    ],
)
def test_a_fleet_whose_agreement_was_not_shown_is_not_admissible(tmp_path, changes: dict, says: str) -> None:
    assert check_witness(tmp_path, mutated(as_fleet, fleet_with(**changes))) == (5, [says])


def test_the_fleet_reason_comes_last(tmp_path) -> None:
    def slow_c4(witness: dict) -> None:
        witness["bands"][C4]["decode_tok_s"] = 1.0

    _, reasons = check_witness(tmp_path, mutated(as_fleet, slow_c4, fleet_with(result="UNMEASURABLE")))
    assert [r.split(":")[0] for r in reasons] == ["S7", "fleet"]


def test_s3_on_a_fleet_needs_each_replica_to_batch_its_share(tmp_path) -> None:
    def split_batch(witness: dict) -> None:
        witness["bands"][C4]["m_formed_by_replica"] = {"a": 1, "b": 2}

    assert check_witness(tmp_path, mutated(as_fleet, split_batch)) == (5, [
        "S3: c=4 on the fleet: replica a formed m=1 for its 2 slots (the shape was not served)"])

    def stray_batch(witness: dict) -> None:
        witness["bands"][C4]["m_formed_by_replica"] |= {"c": 3, "b": None}

    assert check_witness(tmp_path, mutated(as_fleet, stray_batch))[1] == [
        "S3: c=4 on the fleet: replica b formed m=unknown for its 2 slots, replica c formed m=3 for its 0 slots "
        "(the shape was not served)"]


def test_s3_reads_m_formed_when_the_slots_name_no_replica_or_there_is_no_fleet(tmp_path) -> None:
    def unnamed(witness: dict) -> None:
        for slot in witness["bands"][C4]["slots"]:
            slot["replica"] = None

    assert check_witness(tmp_path, mutated(as_fleet, unnamed))[1] == [
        "S3: c=4 m_formed 2 != c (the shape was not served)"]

    def no_fleet(witness: dict) -> None:
        witness["fleet"] = None

    # Without a fleet section the per-replica keys are not read: the witness is judged as before.
    assert check_witness(tmp_path, mutated(as_fleet, no_fleet))[1] == [
        "S3: c=4 m_formed 2 != c (the shape was not served)",
        "S3: c=8 m_formed 4 != c (the shape was not served)",
        "S3: c=16 m_formed 8 != c (the shape was not served)",
    ]
    assert check_witness(tmp_path, control()) == (0, [])


@pytest.mark.parametrize(
    ("mutation", "says"),
    [
        (lambda w: w.update(fleet="PASS"), "fleet must be an object or null"),
        (lambda w: w["fleet"].update(result=True), "fleet.result must be a string or null"),
        (lambda w: w["fleet"].update(divergence=[1]), "fleet.divergence must be an object or null"),
        (lambda w: w["fleet"].update(divergence={**DIVERGENCE, "replicas": ["a"]}),
         "fleet.divergence.replicas must be a list of two strings"),
        (lambda w: w["fleet"].update(divergence={**DIVERGENCE, "token_index": "5"}),
         "fleet.divergence.token_index must be an integer or null"),
        (lambda w: w["bands"][C4].update(m_formed_by_replica=[2, 2]), "bands[1].m_formed_by_replica must be an object"),
        (lambda w: w["bands"][C4].update(m_formed_by_replica={"a": "2"}),
         "bands[1].m_formed_by_replica.a must be an integer or null"),
        (lambda w: w["bands"][C4]["slots"][0].update(replica=3), "bands[1].slots[0].replica must be a string or null"),
    ],
)
def test_a_fleet_section_of_the_wrong_shape_is_red(tmp_path, mutation, says: str) -> None:
    code, _, err = check_text(tmp_path, json.dumps(mutated(as_fleet, mutation)))
    assert code == 4 and says in err
