"""The probe beyond identical chat requests, against the scripted loopback server: mixed
batches, staggered starts, the completions route, buffered streams, logprob parity; each
witness judged by the shape check."""

from pathlib import Path

import pytest

from batchproof.probe.prompts import BUILTIN_PROMPTS
from tests.helpers.probe_check import judge_probe_witness as check
from tests.helpers.scripted_server import Script, ScriptedServer, closed_port_url, run_probe


def test_a_server_that_diverges_only_in_mixed_batches(tmp_path: Path) -> None:
    script = Script(mixed_divergence_at=3, token_delay_s=0.005, has_histogram=True)
    with ScriptedServer(script) as server:
        code, identical = run_probe(server.url, tmp_path)
        assert code == 0 and identical["mode"] == "identical"
        assert check(tmp_path, identical) == (0, [])

        code, mixed = run_probe(server.url, tmp_path, "--mixed")
    # The probe records the divergence; the check judges it, naming the band and the slot.
    assert code == 0 and mixed["mode"] == "mixed" and mixed["result"] == "PASS"
    assert [r["prompt"] for r in mixed["references"]] == [0, 1, 2, 3]
    assert all(r["stable"] and r["logprobs_bitwise_equal"] for r in mixed["references"])
    one, four = mixed["bands"]
    assert one["divergence_at"] == 12 and one["divergence_slot"] == 0
    # Prompt 1 is the longest of the first four built-in prompts: its slot parts at token 3.
    assert max(range(4), key=lambda i: len(BUILTIN_PROMPTS[i])) == 1
    assert [s["prompt"] for s in four["slots"]] == [0, 1, 2, 3]
    assert [s["divergence_at"] for s in four["slots"]] == [12, 3, 12, 12]
    assert (four["divergence_at"], four["divergence_slot"], four["intra_agree_to"]) == (3, 1, 3)
    assert four["top2_margin_at_divergence"] == 1.9 and four["slots"][1]["top2_margin_at_divergence"] == 1.9
    code, reasons = check(tmp_path, mixed)
    assert code == 5 and reasons == [
        "S5: c=4 slot 1 diverges from m=1 at 3 < declared_min 6; its top-2 margin 1.9 is not a near-tie "
        "(needs 0 <= margin < 0.05)"
    ]


def test_mixed_prompts_from_a_file_and_staggered_starts(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('plain text prompt\n\n"a JSON string"\n{"prompt": "an object\'s prompt", "id": 7}\n')
    with ScriptedServer(Script(has_histogram=True, window_s=0.1)) as server:
        code, witness = run_probe(server.url, tmp_path, "--mixed", "--prompts", str(prompts), "--stagger-ms", "20")
    assert code == 0 and witness["stagger_ms"] == 20.0
    assert [p["chars"] for p in witness["prompts"]] == [17, 13, 18]
    bodies = server.state.requests
    assert [b["messages"][0]["content"] for b in bodies[:6]] == [
        "plain text prompt", "plain text prompt", "a JSON string", "a JSON string",
        "an object's prompt", "an object's prompt"]
    four = witness["bands"][1]
    # Three prompts over four slots: slot 3 asks prompt 0 again.
    assert [s["prompt"] for s in four["slots"]] == [0, 1, 2, 0]
    assert four["m_formed"] == 4 and four["logprobs_bitwise_equal"] is True


def test_the_completions_route_speaks_the_legacy_shape(tmp_path: Path) -> None:
    with ScriptedServer(Script(has_histogram=True, token_delay_s=0.01, stream_mode=None)) as server:
        code, witness = run_probe(server.url, tmp_path, "--route", "completions", "--mixed")
    assert code == 0 and witness["route"] == "completions"
    body = server.state.requests[0]
    assert body["prompt"] == BUILTIN_PROMPTS[0] and body["logprobs"] == 2 and "messages" not in body
    for band in witness["bands"]:
        assert band["result"] == "PASS" and band["logprobs_bitwise_equal"] is True
        assert band["logprob_max_abs_diff"] == 0.0 and band["decode_tok_s"] > 0
        assert {s["stream_mode"] for s in band["slots"]} == {"observed"}
    assert check(tmp_path, witness)[0] == 0


def test_a_buffered_stream_is_recorded_buffered_and_s7_stays_unmeasured(tmp_path: Path, capsys) -> None:
    with ScriptedServer(Script(has_histogram=True, is_buffered=True, stream_mode=None)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0
    slots = [s for b in witness["bands"] for s in b["slots"]]
    assert {s["stream_mode"] for s in slots} == {"buffered"}
    assert all(s["decode_tok_s"] is None for s in slots) and all(b["decode_tok_s"] is None for b in witness["bands"])
    assert check(tmp_path, witness) == (5, ["S7 unmeasured at c=1 and c=4 (no positive decode_tok_s)"])


def test_a_declared_live_stream_that_arrives_buffered_is_reported(tmp_path: Path, capsys) -> None:
    with ScriptedServer(Script(has_histogram=True, is_buffered=True, stream_mode="live")) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0
    slots = [s for b in witness["bands"] for s in b["slots"]]
    assert {s["stream_mode"] for s in slots} == {"buffered"}
    assert all("declared stream_mode live" in s["stream_mode_conflict"] for s in slots)
    out = capsys.readouterr().out
    assert "    c=4 slot 3: declared stream_mode live, but its content arrived buffered" in out


def test_batch_variant_logprobs_are_measured_and_named_by_the_check(tmp_path: Path) -> None:
    with ScriptedServer(Script(has_histogram=True, batched_logprob_shift=1e-5)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0  # the tokens never part: a token-level probe passes every band
    one, four = witness["bands"]
    assert one["logprobs_bitwise_equal"] is True and one["logprob_max_abs_diff"] == 0.0
    assert four["logprobs_bitwise_equal"] is False and four["divergence_at"] == 12
    assert abs(four["logprob_max_abs_diff"] - 1e-5) < 1e-9
    assert all(s["logprob_first_diff_at"] == 0 for s in four["slots"])
    code, reasons = check(tmp_path, witness)
    assert code == 5 and len(reasons) == 1
    assert reasons[0].startswith("logprobs: c=4 logprobs differ from m=1 by up to 1e-05 (slot ")
    assert reasons[0].endswith(", first at token 0); the contract requires logprobs bitwise equal to m=1's")
    # aprender's contract has no logprob clause: the same witness is admissible under it.
    assert check(tmp_path, witness, require_bitwise=False) == (0, [])


@pytest.mark.parametrize(
    ("extra", "code", "says"),
    [
        (["--route", "embeddings"], 2, "--route 'embeddings' must be one of: chat, completions, responses"),
        (["--stagger-ms", "-5"], 2, "--stagger-ms must be a finite number >= 0, got -5.0"),
        (["--prompts", "PROMPTS"], 2, "--prompts is for --mixed"),
        (["--mixed", "--prompt", "Hi"], 2, "--prompt is for identical requests"),
        (["--mixed", "--prompts", "MISSING"], 3, "--prompts"),
        (["--mixed", "--prompts", "BAD"], 2, "line 2: not valid JSON"),
        (["--mixed", "--prompts", "EMPTY"], 2, "no prompts in the file"),
    ],
)
def test_bad_mode_flags_exit_with_one_line_naming_the_flag(
    tmp_path: Path, extra: list[str], code: int, says: str, capsys
) -> None:
    files = {"PROMPTS": "a\n", "BAD": 'fine\n{"prompt": \n', "EMPTY": "\n  \n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    argv = [str(tmp_path / a) if a in (*files, "MISSING") else a for a in extra]
    got, witness = run_probe(closed_port_url(), tmp_path, *argv)
    err = capsys.readouterr().err
    assert (got, witness) == (code, None)
    assert err.count("\n") == 1 and says in err and "Traceback" not in err
