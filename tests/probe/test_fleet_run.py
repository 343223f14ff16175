"""`batchproof probe --fleet` against a scripted fleet of two replicas on loopback (round-robin
routing, each replica batching on its own and counted in its own histogram series): who served
every request, whether the replicas agree, and what the shape check makes of the witness."""

from pathlib import Path

import pytest

from tests.helpers.probe_check import judge_probe_witness as check_probe_witness
from tests.helpers.scripted_server import Script, ScriptedServer, run_probe

FLEET = {"replicas": ("r0", "r1"), "listed_replicas": ("r0", "r1"), "has_histogram": True}


def slots(witness: dict) -> list[dict]:
    return [s for band in witness["bands"] for s in band["slots"]]


def test_a_fleet_whose_replicas_agree_passes_with_every_slot_attributed(tmp_path: Path, capsys) -> None:
    with ScriptedServer(Script(**FLEET)) as server:
        code, witness = run_probe(server.url, tmp_path, "--fleet")
    assert code == 0 and witness["result"] == "PASS"
    fleet = witness["fleet"]
    assert (fleet["result"], fleet["reason"], fleet["divergence"]) == ("PASS", None, None)
    # Round robin: the m=1 phase stops once each replica has answered alone twice (4 requests),
    # then c=1 goes to r0 and c=4 to r1, r0, r1, r0 in arrival order (which slot arrives first
    # is the machine's business: only the counts are fixed).
    assert len(server.state.requests) == 4 + 1 + 4
    assert fleet["replicas"] == [{"id": "r0", "alone": 2, "slots": 3, "numerics_id": "fake-numerics"},
                                 {"id": "r1", "alone": 2, "slots": 2, "numerics_id": "fake-numerics"}]
    assert (fleet["num_replicas"], fleet["unserved"], fleet["headerless"]) == (2, [], 0)
    assert (fleet["pairs_compared"], fleet["pairs_diverged"]) == (1, 0)
    one_slots, four_slots = ([s["replica"] for s in band["slots"]] for band in witness["bands"])
    assert one_slots == ["r0"] and sorted(four_slots) == ["r0", "r0", "r1", "r1"]
    # Each slot is compared with its own replica's m=1 reply.
    assert all(s["reference_replica"] == s["replica"] for s in slots(witness))
    assert [(r["replicas"], r["stable"]) for r in witness["references"]] == [(["r0", "r0"], True),
                                                                           (["r1", "r1"], True)]
    one, four = witness["bands"]
    # A band of 4 over two replicas forms a batch of 2 on each: m_formed is the largest one
    # replica formed, never the sum.
    assert (four["m_formed"], four["m_formed_by_replica"]) == (2, {"r0": 2, "r1": 2})
    assert one["m_formed_by_replica"] == {"r0": 1, "r1": 0}
    assert all(b["result"] == "PASS" and b["logprobs_bitwise_equal"] for b in witness["bands"])
    out = capsys.readouterr().out
    assert "  fleet: PASS, 2 replicas: r0 (2 alone, 3 slots), r1 (2 alone, 2 slots)" in out
    assert "    cross-replica divergence: none (1 pair compared, bitwise)" in out
    assert "replicas=r0:2(m=2), r1:2(m=2)" in out
    assert check_probe_witness(tmp_path, witness) == (0, [])


def test_a_replica_that_records_its_batches_late_is_waited_for(tmp_path: Path) -> None:
    # Without waiting for r1, the band would settle on r0's record alone: r1 formed "nothing".
    with ScriptedServer(Script(**FLEET, replica_record_lag=("r1", 0.4))) as server:
        code, witness = run_probe(server.url, tmp_path, "--fleet")
    assert code == 0
    assert [b["m_formed_by_replica"] for b in witness["bands"]] == [{"r0": 1, "r1": 0}, {"r0": 2, "r1": 2}]
    assert check_probe_witness(tmp_path, witness) == (0, [])


def test_replicas_that_disagree_in_one_logprob_fail_though_each_is_self_consistent(tmp_path: Path, capsys) -> None:
    script = Script(**FLEET, replica_logprob_shift=("r1", 5, 1e-6))
    with ScriptedServer(script) as server:
        code, witness = run_probe(server.url, tmp_path, "--fleet")
    assert code == 5 and witness["result"] == "FAIL"
    # Every band passes and every slot matches its own replica's m=1 reply bitwise ...
    assert all(b["result"] == "PASS" and b["logprobs_bitwise_equal"] for b in witness["bands"])
    assert all(r["stable"] and r["logprobs_bitwise_equal"] for r in witness["references"])
    # ... but r1 is not bitwise r0.
    fleet = witness["fleet"]
    assert fleet["result"] == "FAIL" and fleet["pairs_diverged"] == 1
    divergence = fleet["divergence"]
    assert (divergence["replicas"], divergence["prompt"], divergence["token_index"], divergence["kind"]) == (
        ["r0", "r1"], 0, 5, "logprob")
    assert divergence["tokens"] == [" w5", " w5"] and divergence["tokens_agree_to"] == 12
    assert divergence["logprobs"][0] == [-0.1, -0.1, -2.0]
    assert divergence["logprobs"][1] == pytest.approx([-0.100001, -0.100001, -2.000001])
    assert divergence["top2_margins"] == pytest.approx([1.9, 1.9])
    assert divergence["logprob_max_abs_diff"] == pytest.approx(1e-6)
    assert fleet["reason"].startswith("replicas r0 and r1 disagree on prompt 0 at token 5: logprobs ")
    assert fleet["reason"].endswith("(token ' w5'), top-2 margins 1.9/1.9")
    assert "  fleet: FAIL, 2 replicas" in capsys.readouterr().out
    code, reasons = check_probe_witness(tmp_path, witness)
    assert code == 5 and reasons == [
        "fleet: replicas r0 and r1 disagree on prompt 0 at token 5 (logprobs differ); "
        "a fleet's replicas must agree bitwise"
    ]


def test_without_fleet_mode_the_same_fleet_passes_on_tokens(tmp_path: Path) -> None:
    # Why the mode exists: unasked, the probe compares every slot with r0's m=1 reply, so r1's
    # slots show only as a logprob difference (for the contract's logprob clause to catch).
    script = Script(**FLEET, replica_logprob_shift=("r1", 5, 1e-6))
    with ScriptedServer(script) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0 and witness["fleet"] is None
    assert all(s["reference_replica"] == "r0" for s in slots(witness))
    assert witness["bands"][1]["logprobs_bitwise_equal"] is False
    assert witness["references"][0]["replicas"] == ["r0", "r1"]


def test_a_fleet_where_one_replica_answers_everything_is_unmeasurable(tmp_path: Path, capsys) -> None:
    # /v1/server_info lists r1 alive, but the router sends everything to r0.
    script = Script(replicas=("r0",), listed_replicas=("r0", "r1"), has_histogram=True)
    with ScriptedServer(script) as server:
        code, witness = run_probe(server.url, tmp_path, "--fleet")
    assert code == 8 and witness["result"] == "UNMEASURABLE"
    # The m=1 phase looked for r1 until its cap: 8 alone requests per listed replica.
    assert len(server.state.requests) == 16 + 1 + 4
    fleet = witness["fleet"]
    assert fleet["result"] == "UNMEASURABLE" and fleet["unserved"] == ["r1"] and fleet["pairs_compared"] == 0
    assert fleet["reason"] == ("only replica r0 served (all 21 replies, though /v1/server_info lists r1 alive "
                               "too): cross-replica agreement was not tested")
    assert all(b["result"] == "PASS" for b in witness["bands"])
    assert fleet["reason"] in capsys.readouterr().out
    code, reasons = check_probe_witness(tmp_path, witness)
    assert code == 5 and reasons == [f"fleet: result UNMEASURABLE is not PASS ({fleet['reason']}); "
                                     "cross-replica agreement is not shown"]


def test_a_single_server_that_names_itself_is_not_a_fleet(tmp_path: Path) -> None:
    # `batchproof serve` names its one replica and lists no fleet: the m=1 phase stops at two.
    with ScriptedServer(Script(replicas=("solo",), has_histogram=True)) as server:
        code, witness = run_probe(server.url, tmp_path, "--fleet")
    assert code == 8 and len(server.state.requests) == 2 + 1 + 4
    assert witness["fleet"]["reason"] == ("only replica solo served (all 7 replies; /v1/server_info lists no "
                                          "fleet): cross-replica agreement was not tested")


def test_a_server_that_names_no_replica(tmp_path: Path, capsys) -> None:
    with ScriptedServer(Script(has_histogram=True)) as server:
        code, plain = run_probe(server.url, tmp_path)
        # Without --fleet nothing changes: the slots record no replica and there is no fleet.
        assert code == 0 and plain["fleet"] is None
        assert {s["replica"] for s in slots(plain)} == {None}
        assert all(b["m_formed_by_replica"] is None for b in plain["bands"])
        capsys.readouterr()
        code, fleet = run_probe(server.url, tmp_path, "--fleet")
    # With it: two m=1 requests, then a clear stop before any band.
    assert code == 8 and fleet["result"] == "UNMEASURABLE" and fleet["bands"] == []
    assert len(server.state.requests) == 7 + 2
    assert fleet["reference"]["stable"] is True
    assert fleet["fleet"]["reason"].startswith("no reply carried an x-batchproof-replica header")
    assert fleet["fleet"]["headerless"] == 2
    assert "no reply carried an x-batchproof-replica header" in capsys.readouterr().out


def test_mixed_prompts_on_a_fleet_are_referenced_per_prompt_and_replica(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\nsecond, longer prompt\n")
    with ScriptedServer(Script(**FLEET)) as server:
        code, witness = run_probe(server.url, tmp_path, "--fleet", "--mixed", "--prompts", str(prompts))
    assert code == 0 and witness["fleet"]["result"] == "PASS"
    # Two prompts, each measured alone on both replicas: one pair compared per prompt.
    assert [(r["prompt"], r["replicas"]) for r in witness["references"]] == [
        (0, ["r0", "r0"]), (0, ["r1", "r1"]), (1, ["r0", "r0"]), (1, ["r1", "r1"])]
    assert witness["fleet"]["pairs_compared"] == 2
    assert all(s["reference_replica"] == s["replica"] for s in slots(witness))
