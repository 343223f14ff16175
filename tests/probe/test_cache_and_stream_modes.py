"""`--cache` (warm replies against cold ones) and `--stream-parity` (streamed against whole) against
scripted servers, and the m=1 reference's logprob stability as its own finding."""

from pathlib import Path

import pytest

from batchproof.probe.judge.cache import CUT_SHARES, SYSTEM_PROMPT, cache_cases
from tests.helpers.probe_check import judge_probe_witness
from tests.helpers.quirky_server import Quirks, QuirkyServer
from tests.helpers.scripted_server import run_probe

CASES = ["system", "turn", *(f"cut-{int(len(SYSTEM_PROMPT) * s)}" for s in CUT_SHARES)]
UNSTABLE = "the contract does not admit an unstable reference"


def test_cache_cases_start_with_a_fresh_nonce_and_share_a_long_prefix_after_it() -> None:
    keys = iter(["k0", "k1", "k2", "k3"])
    cases = cache_cases("Why?", lambda: next(keys))
    assert [c.name for c in cases] == CASES
    for key, case in zip(["k0", "k1", "k2", "k3"], cases):
        assert case.target[0]["content"].startswith(f"Session {key}. ") and case.target[-1]["role"] == "user"
        assert case.warmer[0]["content"].startswith(f"Session {key}. ") and case.warmer != case.target
    assert cases[1].target[:2] == cases[1].warmer  # the continuation extends turn one


def test_a_cache_that_changes_nothing_passes_with_every_warm_slot_a_hit(tmp_path: Path, capsys) -> None:
    with QuirkyServer() as server:
        code, witness = run_probe(server.url, tmp_path, "--cache")
    assert code == 0 and witness["result"] == "PASS"
    cache = witness["cache"]
    assert (cache["result"], cache["reason"], cache["findings"]) == ("PASS", None, [])
    assert [case["case"] for case in cache["cases"]] == CASES
    for case in cache["cases"]:
        assert case["cold"]["cached_tokens"] == 0 and case["cold"]["refused"] is None
        # Two warm alone runs, then a warm band of 4.
        assert [(s["c"], s["i"]) for s in case["slots"]] == [(1, 0), (1, 1), (4, 0), (4, 1), (4, 2), (4, 3)]
        assert all(s["cached_tokens"] > 0 and s["logprobs_bitwise_equal"] and s["attributable"] for s in case["slots"])
    assert (cache["num_warm_slots"], cache["num_hits"]) == (24, 24)
    assert "  cache: PASS, 4 cases, 24 warm slots (24 hit)" in capsys.readouterr().out
    # The references were themselves cold then warm here: bitwise, so the reference is stable.
    assert witness["reference_logprobs"]["logprobs_stable"] is True
    assert judge_probe_witness(tmp_path, witness) == (0, [])


def test_warm_replies_that_differ_from_cold_by_1e6_are_named_by_mode_slot_and_size(tmp_path: Path) -> None:
    with QuirkyServer(quirks=Quirks(warm_shift=1e-6)) as server:
        code, witness = run_probe(server.url, tmp_path, "--cache")
    assert code == 5 and witness["cache"]["result"] == "FAIL"
    texts = [f["text"] for f in witness["cache"]["findings"] if f["attributable"]]
    hit = witness["cache"]["cases"][0]["slots"][0]["cached_tokens"]
    assert texts[0] == (f"cache: case system, warm alone #1 ({hit} cached tokens): logprobs differ from the cold "
                        "run by up to 1e-06, first at token 0")
    assert len(texts) == 2 * len(CASES)  # the alone runs; the band slots are not blamed on the cache ...
    band_slot = next(f for f in witness["cache"]["findings"] if "c=4 slot 0" in f["text"])
    # ... since the plain c=4 band (warm too, on this server) already differs from m=1 (which was cold).
    assert band_slot["text"].endswith("(not attributable to the cache: the plain c=4 band already differs from m=1)")
    # The two m=1 runs were cold then warm: the reference is unstable on logprobs, said as such.
    reference = witness["reference_logprobs"]
    assert witness["reference"]["stable"] is True and reference["logprobs_stable"] is False
    assert reference["logprob_reason"].startswith("reference: logprobs of two alone runs differ by 1e-06 at token 0; "
                                                  "the later run was served ")
    assert all(b["logprobs_attributable"] is False for b in witness["bands"])
    code, reasons = judge_probe_witness(tmp_path, witness)
    assert code == 5
    # The reference is named, not a band; then every cache finding with its slot and size.
    assert reasons[0] == f"{reference['logprob_reason']}; {UNSTABLE}"
    assert not any(r.startswith("logprobs: c=") for r in reasons)
    assert reasons[1:] == texts


def test_streams_that_match_their_whole_replies_pass(tmp_path: Path) -> None:
    with QuirkyServer() as server:
        code, witness = run_probe(server.url, tmp_path, "--stream-parity")
    assert code == 0
    parity = witness["stream_parity"]
    assert (parity["result"], parity["num_pairs"], parity["findings"]) == ("PASS", 1 + 1 + 4, [])
    assert [p["where"] for p in parity["pairs"]] == ["m=1", "c=1 slot 0", *(f"c=4 slot {i}" for i in range(4))]
    assert all(p["text_equal"] and p["logprobs_bitwise_equal"] for p in parity["pairs"])
    assert sum(body["stream"] is False for body in server.quirks.bodies) == 6
    assert judge_probe_witness(tmp_path, witness) == (0, [])


def test_streamed_logprobs_shifted_by_one_token_are_named_by_slot_and_size(tmp_path: Path, capsys) -> None:
    with QuirkyServer(quirks=Quirks(is_stream_shifted=True)) as server:
        code, witness = run_probe(server.url, tmp_path, "--stream-parity")
    assert code == 5 and witness["stream_parity"]["result"] == "FAIL"
    # Every streamed reply is shifted alike: the bands agree with m=1 bitwise, only the route differs.
    assert all(b["result"] == "PASS" and b["logprobs_bitwise_equal"] for b in witness["bands"])
    texts = [f["text"] for f in witness["stream_parity"]["findings"]]
    size = "by up to 0.01, first at token 0"
    assert texts[0] == f"stream parity: m=1, whole vs streamed: logprobs differ from the streamed reply {size}"
    assert texts[2] == f"stream parity: c=4 slot 0, whole vs streamed: logprobs differ from the streamed reply {size}"
    assert len(texts) == 6
    out = capsys.readouterr().out
    assert "  stream parity: FAIL (stream parity: m=1, whole vs streamed:" in out
    assert judge_probe_witness(tmp_path, witness) == (5, texts)


@pytest.mark.parametrize("flag", ["--cache", "--stream-parity"])
def test_the_modes_do_not_combine_with_a_fleet(tmp_path: Path, flag: str, capsys) -> None:
    with QuirkyServer() as server:
        code, witness = run_probe(server.url, tmp_path, flag, "--fleet")
    assert code == 2 and witness is None
    assert "measure one server; give them without --fleet" in capsys.readouterr().err


def test_a_warm_slot_the_cache_served_nothing_new_is_not_blamed_on_it() -> None:
    """llama-server with cache_prompt false: 0 cached tokens, and a band of long prompts still parts
    from the cold run. The difference is recorded, but not as the cache's."""
    from batchproof.probe.judge.cache import cache_record, judge_case
    from batchproof.probe.records.entry import parse_entry
    from batchproof.probe.records.reply import StreamResult

    def reply(logprob: float, cached: int | None) -> StreamResult:
        entry = parse_entry({"token": "a", "logprob": logprob, "bytes": [97], "top_logprobs": []})
        return StreamResult(entries=[entry] * 4, text="aaaa", completion_tokens=4, finish_reason="length",
                            has_usage=True, cached_tokens=cached)

    case = cache_cases("Why?", lambda: "k")[0]
    cold, same, shifted = reply(-0.5, 3), reply(-0.5, 3), reply(-0.25, 3)
    warm = [(1, 0, same), (1, 1, same), (4, 0, shifted), (4, 1, reply(-0.25, 160))]
    record, findings = judge_case(case, cold, reply(-0.5, 160), warm, 4, band_noise=lambda c: None)
    assert [f["attributable"] for f in findings] == [False, True]
    assert findings[0]["text"].endswith("(not attributable to the cache: it reports 3 cached tokens, no more than "
                                        "the cold run's 3: the cache served it nothing the cold run lacked)")
    assert cache_record([(record, findings)])["result"] == "FAIL"  # the slot that hit 160 tokens is the cache's
    assert cache_record([judge_case(case, cold, same, warm[:3], 4, band_noise=lambda c: None)])["result"] == "PASS"


def test_a_plain_band_that_was_not_judged_pass_is_named_for_what_it_was() -> None:
    """llama-server -np 1 serves a band of 4 one request at a time: UNMEASURABLE, yet bitwise m=1."""
    from dataclasses import replace

    from batchproof.common.band import Band
    from batchproof.probe.judge.pair import band_noise

    slot = {"divergence_at": 16, "completion_tokens": 16}
    band = Band(c=4, result="UNMEASURABLE", logprobs_bitwise_equal=True, slots=[slot] * 4)
    assert band_noise([band], 4) == "the plain c=4 band is UNMEASURABLE, so its batching is not known to be exact"
    assert band_noise([replace(band, result="PASS")], 4) is None
    assert band_noise([replace(band, logprobs_bitwise_equal=False)], 4) == "the plain c=4 band already differs from m=1"
    assert band_noise([band], 8) == "the plain c=8 band was not measured"
