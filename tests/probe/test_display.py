"""What the probe prints: the report lines, and progress on a terminal or as plain lines."""

from batchproof.common.band import read_band
from batchproof.probe.display import ProgressDisplay, band_line, report_lines
from batchproof.probe.mode import Mode

ONE_SERVER, FLEET_MODE = Mode.chosen(is_mixed=False, is_fleet=False), Mode.chosen(is_mixed=False, is_fleet=True)

BAND = {
    "c": 8, "m_formed": 7, "m_formed_source": "slots", "result": "UNMEASURABLE", "divergence_at": None,
    "intra_agree_to": None, "max_constant_run": None, "declared_min": 64, "max_constant_run_declared": 16,
    "reason": "slot 3: HTTP 500: boom", "decode_tok_s": None, "slots": [],
}


def test_report_lines_name_the_verdict_the_reference_and_every_band() -> None:
    witness = {
        "result": "FAIL",
        "declared_min": 64,
        "sampler": {"max_tokens": 128},
        "reference": {"stable": True, "tokens": 128, "self_divergence_at": 128},
        "bands": [
            {**BAND, "c": 4, "m_formed": 4, "result": "PASS", "divergence_at": 3, "intra_agree_to": 128,
             "top2_margin_at_divergence": 0.0123456, "reason": None, "decode_tok_s": 30.04},
            BAND,
        ],
    }
    assert report_lines(witness) == [
        "batchproof probe: FAIL (declared_min 64, n_predict 128)",
        "  m=1 reference: stable tokens=128 self_divergence_at=128",
        "  c=4 m_formed=4 (slots) PASS intra_agree_to=128 divergence_at=3 top2_margin=0.01235"
        " decode=30.0 tok/s",
        "  c=8 m_formed=7 (slots) UNMEASURABLE intra_agree_to=- divergence_at=- top2_margin=-"
        " decode=- tok/s (slot 3: HTTP 500: boom)",
    ]


def test_an_unstable_reference_says_why() -> None:
    witness = {
        "result": "UNMEASURABLE",
        "declared_min": 64,
        "sampler": {"max_tokens": 128},
        "reference": {"stable": False, "tokens": None, "self_divergence_at": None, "reason": "ref#1: HTTP 501"},
        "bands": [],
    }
    assert report_lines(witness)[1] == "  m=1 reference: NOT STABLE tokens=- self_divergence_at=- (ref#1: HTTP 501)"


def test_an_unknown_source_is_not_printed() -> None:
    band = read_band({**BAND, "m_formed": 0, "m_formed_source": None})
    assert band_line(band, ONE_SERVER).startswith("  c=8 m_formed=0 UNMEASURABLE")


def test_plain_progress_goes_to_stderr_line_by_line(capsys) -> None:
    with ProgressDisplay(is_live=False) as progress:
        progress.phase("band c=4", 4)
        for _ in range(4):
            progress.request_done()
        progress.phase_done("band c=4: 4/4 back, PASS")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == ["probe: band c=4: firing 4 request(s)", "probe: band c=4: 4/4 back, PASS"]


def test_live_progress_runs_and_keeps_the_phase_summaries(capsys) -> None:
    with ProgressDisplay(is_live=True) as progress:
        progress.note("http://x: has /v1/server_info")
        progress.phase("band c=2", 2)
        progress.request_done()
        progress.request_done()
        progress.phase_done("band c=2: 2/2 back, PASS")
    out = capsys.readouterr().out
    assert "band c=2: 2/2 back, PASS" in out and "has /v1/server_info" in out


def test_a_band_line_shows_the_worst_slot_logprob_parity_and_stream_modes() -> None:
    slots = [
        {"i": 0, "completion_tokens": 128, "divergence_at": 128, "stream_mode": "observed",
         "stream_mode_conflict": None},
        {"i": 1, "completion_tokens": 128, "divergence_at": 40, "stream_mode": "buffered",
         "stream_mode_conflict": "declared stream_mode live, but its content arrived buffered"},
    ]
    band = {**BAND, "c": 2, "m_formed": 2, "result": "PASS", "reason": None, "divergence_at": 40,
            "divergence_slot": 1, "logprobs_bitwise_equal": False, "logprob_max_abs_diff": 2.67e-05, "slots": slots}
    assert band_line(read_band(band), ONE_SERVER).endswith(
        " slot=1 logprobs=differ max_abs_diff=2.67e-05 streams=1 buffered,1 observed")
    witness = {"result": "PASS", "declared_min": 64, "sampler": {"max_tokens": 128},
               "reference": {"stable": True, "tokens": 128, "self_divergence_at": 128}, "bands": [band]}
    assert report_lines(witness)[3] == "    c=2 slot 1: declared stream_mode live, but its content arrived buffered"
    clean = {**band, "logprobs_bitwise_equal": True, "logprob_max_abs_diff": 0.0,
             "slots": [{**slots[0], "i": i} for i in range(2)]}
    assert band_line(read_band(clean), ONE_SERVER).endswith(" logprobs=bitwise streams=2 observed")


FLEET = {"result": "FAIL", "reason": "replicas a and b disagree on prompt 0 at token 5: ...", "num_replicas": 2,
         "replicas": [{"id": "a", "alone": 2, "slots": 3, "numerics_id": "1234567890abcdef"},
                      {"id": "b", "alone": 3, "slots": 2, "numerics_id": "fedcba0987654321"}],
         "unserved": [], "headerless": 0, "pairs_compared": 1, "pairs_diverged": 1, "divergence": {"prompt": 0}}


def test_a_fleet_run_shows_who_served_each_band_and_whether_the_replicas_agree() -> None:
    slots = [{"i": i, "replica": r} for i, r in enumerate(["b", "a", "b", "a"])]
    band = {**BAND, "c": 4, "m_formed": 2, "result": "PASS", "reason": None, "slots": slots,
            "m_formed_by_replica": {"a": 2, "b": None}}
    assert band_line(read_band(band), FLEET_MODE).endswith(" decode=- tok/s replicas=a:2(m=2), b:2")
    assert "replicas=" not in band_line(read_band(band), ONE_SERVER)
    unnamed = {**band, "slots": [{"i": 0, "replica": None}], "m_formed_by_replica": None}
    assert band_line(read_band(unnamed), FLEET_MODE).endswith(" replicas=(unnamed):1")
    witness = {"result": "FAIL", "declared_min": 64, "sampler": {"max_tokens": 128},
               "reference": {"stable": True, "tokens": 128, "self_divergence_at": 128}, "bands": [band],
               "fleet": FLEET}
    assert report_lines(witness)[3:] == [
        "  fleet: FAIL, 2 replicas: a (2 alone, 3 slots), b (3 alone, 2 slots)",
        "    replicas a and b disagree on prompt 0 at token 5: ...",
        "    numerics_id differ: a 1234567890ab, b fedcba098765",
    ]
    agree = {**FLEET, "result": "PASS", "reason": None, "pairs_diverged": 0, "divergence": None,
             "replicas": [{**r, "numerics_id": None} for r in FLEET["replicas"]]}
    assert report_lines({**witness, "fleet": agree})[3:] == [
        "  fleet: PASS, 2 replicas: a (2 alone, 3 slots), b (3 alone, 2 slots)",
        "    cross-replica divergence: none (1 pair compared, bitwise)",
    ]
