"""--cache and --stream-parity against our own server on loopback (the real default model), over
the chat route and the Responses API: every mode PASS, logprobs bitwise, cached_tokens recorded on
warm slots, and the check ADMISSIBLE."""

import json

import pytest

from batchproof.cli import main
from tests.helpers.probe_check import judge_probe_witness

# Short, so the test stays quick on two cores: 16 tokens over the ladder 1, 4.
MATRIX = """
protocol:
  n_predict: 16
  sampler: {temperature: 0.0, seed: 0, ignore_eos: true}
ladder:
  declared: [1, 4]
witness:
  min_agree_tokens: 8
  max_constant_run: 16
"""


@pytest.mark.parametrize("route", ["chat", "responses"])
def test_every_mode_passes_bitwise_against_batchproof_serve(server, tmp_path, capsys, route):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(MATRIX)
    path = tmp_path / "witness.json"
    code = main(["probe", "--url", server.url, "--server-log", str(server.log_file), "--matrix", str(matrix),
                 "--witness", str(path), "--cache", "--stream-parity", "--route", route])
    witness = json.loads(path.read_text())
    assert code == 0, capsys.readouterr()
    assert witness["route"] == route
    assert witness["result"] == "PASS" and witness["dropped_fields"] == [] and witness["fail_open"] == []
    assert witness["reference_logprobs"]["logprobs_stable"] is True
    parity = witness["stream_parity"]
    assert parity["result"] == "PASS" and parity["num_pairs"] == 1 + 1 + 4
    assert all(p["logprobs_bitwise_equal"] and p["text_equal"] and p["tokens_agree_to"] == 16 for p in parity["pairs"])
    cache = witness["cache"]
    assert cache["result"] == "PASS" and cache["findings"] == []
    for case in cache["cases"]:
        assert case["cold"]["cached_tokens"] == 0  # the nonce comes before any full block
        # Every warm slot hit (the cold run's blocks at least) and matched the cold run bitwise.
        assert all(s["cached_tokens"] > 0 and s["logprobs_bitwise_equal"] and s["tokens_agree_to"] == 16
                   for s in case["slots"])
    assert cache["num_hits"] == cache["num_warm_slots"] == 4 * (2 + 4)
    assert judge_probe_witness(tmp_path, witness) == (0, [])
