"""The probe against our own server on loopback: it must PASS with every band's m_formed
equal to its c, and the witness must record what the server served."""

import json

from batchproof.cli import main
from batchproof.engine.model.default_model import DEFAULT_MODEL_SHA256, default_model_path
from tests.helpers.probe_matrix import SHORT_MATRIX


def test_probe_passes_against_batchproof_serve(server, tmp_path, capsys):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(SHORT_MATRIX)
    witness_path = tmp_path / "witness.json"
    code = main(["probe", "--url", server.url, "--server-log", str(server.log_file), "--matrix", str(matrix),
                 "--witness", str(witness_path), "--model-file", str(default_model_path()),
                 "--host", "test-host", "--commit", "0" * 40])
    witness = json.loads(witness_path.read_text())
    assert code == 0, capsys.readouterr()
    assert witness["result"] == "PASS"
    assert witness["reference"] == {"stable": True, "tokens": 24, "self_divergence_at": 24}
    assert [b["c"] for b in witness["bands"]] == [1, 4, 8]
    for band in witness["bands"]:
        assert band["m_formed"] == band["c"] and band["m_formed_source"] == "log"
        assert band["result"] == "PASS" and band["divergence_at"] == 24 and band["intra_agree_to"] == 24
        assert "top2_margin_at_divergence" not in band  # the streams never parted
        assert band["decode_tok_s"] > 0
    assert witness["model"] == {"path": default_model_path().name, "sha256": DEFAULT_MODEL_SHA256}
    assert witness["server"]["batch_invariant"] is True
    assert witness["server"]["model_sha256"] == DEFAULT_MODEL_SHA256


def test_probe_reads_m_formed_from_our_histogram_without_a_log(server, tmp_path):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(SHORT_MATRIX.replace("[1, 4, 8]", "[1, 4]").replace("n_predict: 24", "n_predict: 16"))
    witness_path = tmp_path / "witness.json"
    code = main(["probe", "--url", server.url, "--matrix", str(matrix), "--witness", str(witness_path)])
    witness = json.loads(witness_path.read_text())
    assert code == 0
    assert [(b["c"], b["m_formed"], b["m_formed_source"]) for b in witness["bands"]] == [
        (1, 1, "metrics"), (4, 4, "metrics")]
