"""The probe end to end against a scripted loopback server: verdicts, exit codes, the witness."""

import hashlib
import re
from pathlib import Path

import pytest

from batchproof import cli
from tests.helpers.scripted_server import (
    SMALL_MATRIX,
    Script,
    ScriptedServer,
    closed_port_url,
    frozen_when_batched,
    near_tie_flip,
    run_probe,
    unstable_alone,
)

WITNESS_KEYS = [
    "witness_version", "probe", "host", "commit", "binary_sha256", "model", "prompt_sha256",
    "sampler", "declared_min", "served_model", "server", "reference", "bands", "result",
    "mode", "route", "stagger_ms", "prompts", "references", "fleet",
    "reference_logprobs", "dropped_fields", "extra_body", "fail_open", "cache", "stream_parity",
]
BAND_KEYS = [
    "c", "m_formed", "m_formed_source", "result", "divergence_at", "intra_agree_to",
    "max_constant_run", "declared_min", "max_constant_run_declared", "reason", "decode_tok_s",
    "divergence_slot", "logprob_max_abs_diff", "logprobs_bitwise_equal", "logprobs_attributable",
    "m_formed_by_replica", "probe_cpu_share", "slots",
]
SLOT_KEYS = [
    "i", "completion_tokens", "finish_reason", "refused", "decode_tok_s", "prompt", "stream_mode",
    "stream_mode_conflict", "divergence_at", "top2_margin_at_divergence", "logprob_max_abs_diff",
    "logprobs_bitwise_equal", "logprob_first_diff_at", "replica", "reference_replica",
]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "server.log"
    path.write_text("INFO batch m=16 done in 1ms (1.0 tok/s/slot)\n")  # history, before the probe
    return path


def test_a_clean_ladder_passes_with_m_formed_from_the_log(tmp_path: Path, log: Path, capsys) -> None:
    with ScriptedServer(Script(log_path=log)) as server:
        code, witness = run_probe(server.url, tmp_path, "--server-log", str(log))
    assert code == 0 and witness is not None
    assert list(witness) == WITNESS_KEYS
    assert witness["witness_version"] == 3 and witness["probe"] == "batchproof"
    assert witness["result"] == "PASS" and witness["declared_min"] == 6
    assert witness["sampler"] == {"temperature": 0.0, "seed": 0, "ignore_eos": True, "max_tokens": 12,
                                  "top_logprobs": 2}
    assert witness["prompt_sha256"] == hashlib.sha256(b"Write an essay on compilers.").hexdigest()
    assert witness["server"] == {"max_batch": 16, "dtype": "float32", "version": "fake"}
    assert witness["reference"] == {"stable": True, "tokens": 12, "self_divergence_at": 12}
    assert witness["reference_logprobs"] == {"logprobs_stable": True, "logprob_max_abs_diff": 0.0,
                                             "logprob_first_diff_at": None, "logprob_reason": None}
    assert (witness["dropped_fields"], witness["fail_open"], witness["cache"], witness["stream_parity"]) == (
        [], [], None, None)
    formed = [(b["c"], b["m_formed"], b["m_formed_source"]) for b in witness["bands"]]
    assert formed == [(1, 1, "log"), (4, 4, "log")]
    for band in witness["bands"]:
        assert list(band) == BAND_KEYS
        assert (band["result"], band["divergence_at"], band["intra_agree_to"]) == ("PASS", 12, 12)
        assert band["reason"] is None and band["max_constant_run_declared"] == 4
        # A rate only where the chunks arrived spread out, which a busy machine decides (None: one burst).
        assert (band["decode_tok_s"] is None or band["decode_tok_s"] > 0) and len(band["slots"]) == band["c"]
        assert all(list(s) == SLOT_KEYS and s["refused"] is None for s in band["slots"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "batchproof probe: PASS (declared_min 6, n_predict 12)"
    assert out[1] == "  m=1 reference: stable tokens=12 self_divergence_at=12 logprobs=bitwise"
    assert out[3].startswith("  c=4 m_formed=4 (log) PASS intra_agree_to=12 divergence_at=12 top2_margin=-")


def test_every_request_asks_for_the_spec_body(tmp_path: Path) -> None:
    with ScriptedServer(Script(has_histogram=True)) as server:
        run_probe(server.url, tmp_path, "--prompt", "Say hi.", "--api-key", "sk-test")
    assert server.state.authorizations == ["Bearer sk-test"] * 7
    bodies = server.state.requests
    assert len(bodies) == 2 + 1 + 4
    assert bodies[0] == {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "Say hi."}],
        "temperature": 0.0,
        "max_tokens": 12,
        "seed": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "top_logprobs": 2,
    }
    assert all(body == bodies[0] for body in bodies)


def test_a_server_that_never_batches_is_unmeasurable(tmp_path: Path, log: Path, capsys) -> None:
    with ScriptedServer(Script(max_batch=1, log_path=log)) as server:
        code, witness = run_probe(server.url, tmp_path, "--server-log", str(log))
    assert code == 8 and witness["result"] == "UNMEASURABLE"
    band = witness["bands"][1]
    assert (band["c"], band["m_formed"], band["result"]) == (4, 1, "UNMEASURABLE")
    assert band["divergence_at"] is None and "m_formed=1" in band["reason"]
    assert "batched path was never exercised" in capsys.readouterr().out


def test_a_frozen_slot_fails(tmp_path: Path) -> None:
    with ScriptedServer(Script(pick=frozen_when_batched, has_histogram=True)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 5 and witness["result"] == "FAIL"
    band = witness["bands"][1]
    assert band["result"] == "FAIL" and band["max_constant_run"] == 10
    assert "frozen slot" in band["reason"] and band["divergence_at"] == 2


def test_a_near_tie_flip_passes_with_its_margin_recorded(tmp_path: Path, capsys) -> None:
    with ScriptedServer(Script(pick=near_tie_flip(5, 0.01), has_histogram=True)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0 and witness["result"] == "PASS"
    one, four = witness["bands"]
    assert "top2_margin_at_divergence" not in one and one["divergence_at"] == 12
    assert (four["m_formed"], four["divergence_at"], four["intra_agree_to"]) == (4, 5, 12)
    assert four["top2_margin_at_divergence"] == pytest.approx(0.01)
    assert list(four)[:6] == [*BAND_KEYS[:5], "top2_margin_at_divergence"]
    assert "divergence_at=5 top2_margin=0.01" in capsys.readouterr().out


def test_an_unstable_reference_runs_no_bands(tmp_path: Path) -> None:
    with ScriptedServer(Script(pick=unstable_alone, has_histogram=True)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 8 and witness["result"] == "UNMEASURABLE" and witness["bands"] == []
    reference = witness["reference"]
    assert (reference["stable"], reference["self_divergence_at"]) == (False, 1)
    assert "part at token 1 < declared_min 6" in reference["reason"]
    assert len(server.state.requests) == 2


def test_a_server_that_refuses_logprobs_is_unmeasurable(tmp_path: Path) -> None:
    with ScriptedServer(Script(status=501)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 8 and witness["bands"] == []
    assert witness["reference"]["reason"] == "ref#1: HTTP 501: logprobs: not on this path"


def test_a_short_reply_is_refused_in_every_slot(tmp_path: Path) -> None:
    with ScriptedServer(Script(short_by=1, has_histogram=True)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 8
    assert witness["reference"]["reason"] == "ref#1: completion_tokens=11 != n_predict=12"
    assert witness["reference"]["tokens"] == 11


def test_a_stream_cut_short_in_a_band_makes_it_unmeasurable(tmp_path: Path) -> None:
    with ScriptedServer(Script(drop_request=4, has_histogram=True)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 8
    one, four = witness["bands"]
    assert one["result"] == "PASS" and four["result"] == "UNMEASURABLE"
    assert re.fullmatch(r"slot \d: the stream carried no usage", four["reason"])
    refused = [s for s in four["slots"] if s["refused"]]
    assert len(refused) == 1 and refused[0]["completion_tokens"] is None


def test_a_stream_not_declared_live_but_seen_live_is_observed_and_timed(tmp_path: Path) -> None:
    with ScriptedServer(Script(stream_mode=None, token_delay_s=0.01, has_histogram=True)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0
    slots = [s for b in witness["bands"] for s in b["slots"]]
    assert {s["stream_mode"] for s in slots} == {"observed"}
    assert all(s["stream_mode_conflict"] is None and s["decode_tok_s"] > 0 for s in slots)
    assert all(b["decode_tok_s"] > 0 for b in witness["bands"])


def test_identity_is_recorded_and_never_invented(tmp_path: Path) -> None:
    model = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model.write_bytes(b"GGUF fake")
    binary = tmp_path / "server.bin"
    binary.write_bytes(b"")
    with ScriptedServer(Script(has_histogram=True, has_server_info=False)) as server:
        code, witness = run_probe(
            server.url, tmp_path, "--model-file", str(model), "--binary", str(binary),
            "--host", "box-1", "--commit", "  ", "--served-model", "fake-model",
        )
    assert code == 0
    assert witness["model"] == {"path": model.name, "sha256": hashlib.sha256(b"GGUF fake").hexdigest()}
    assert witness["binary_sha256"] == hashlib.sha256(b"").hexdigest()
    assert (witness["host"], witness["commit"], witness["server"]) == ("box-1", None, None)


def test_unknown_identity_is_null(tmp_path: Path) -> None:
    with ScriptedServer(Script(has_histogram=True)) as server:
        _, witness = run_probe(server.url, tmp_path)
    assert [witness[k] for k in ("host", "commit", "binary_sha256", "model")] == [None] * 4


# --- exit codes for what is not a measurement ---------------------------------------


@pytest.mark.parametrize("flag", ["--server-log", "--model-file", "--binary"])
@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_a_path_that_is_not_a_file_exits_3_before_any_request(
    tmp_path: Path, flag: str, kind: str, capsys
) -> None:
    path = tmp_path / "nothing" if kind == "missing" else tmp_path
    code, witness = run_probe(closed_port_url(), tmp_path, flag, str(path))
    assert code == 3 and witness is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err and "Traceback" not in err


def test_a_witness_path_in_no_directory_exits_3(tmp_path: Path, capsys) -> None:
    code, _ = run_probe(closed_port_url(), tmp_path, "--witness", str(tmp_path / "no" / "w.json"))
    assert code == 3 and "--witness" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("matrix", "key"),
    [
        ("witness: {min_agree_tokens: 6}\n", "missing key protocol"),
        (None, "--ladder"),
    ],
)
def test_an_unusable_matrix_exits_4_naming_the_key(
    tmp_path: Path, matrix: str | None, key: str, capsys
) -> None:
    extra: list[str] = []
    if matrix is None:
        extra = ["--ladder", "1,0"]
    else:
        (tmp_path / "matrix.yaml").write_text(matrix)
    code, witness = run_probe(closed_port_url(), tmp_path, *extra)
    assert code == 4 and witness is None
    assert key in capsys.readouterr().err


def test_an_unreachable_server_exits_10_with_one_line_and_a_witness(tmp_path: Path, capsys) -> None:
    url = closed_port_url()
    code, witness = run_probe(url, tmp_path)
    assert code == 10
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"batchproof probe: server unreachable: cannot connect to {url}")
    assert "Traceback" not in "".join(err)
    assert witness["result"] == "UNMEASURABLE" and witness["bands"] == []
    assert witness["reference"]["stable"] is False
    assert witness["reference"]["reason"].startswith("server unreachable")


def test_the_cli_dispatches_to_the_probe(tmp_path: Path) -> None:
    with ScriptedServer(Script(has_histogram=True)) as server:
        matrix = tmp_path / "m.yaml"
        matrix.write_text(SMALL_MATRIX.replace("[1, 4]", "[4]"))
        code = cli.main(["probe", "--url", f"{server.url}/v1", "--matrix", str(matrix), "--settle", "1"])
    assert code == 0


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--timeout", "0"], "--timeout"),
        (["--prompt", "  "], "--prompt"),
    ],
)
def test_a_bad_setting_exits_2_with_one_line(tmp_path: Path, extra: list[str], says: str, capsys) -> None:
    code, witness = run_probe(closed_port_url(), tmp_path, *extra)
    assert code == 2 and witness is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err


def test_a_url_that_is_not_http_exits_2(tmp_path: Path, capsys) -> None:
    code, _ = run_probe("ftp://127.0.0.1:1", tmp_path)
    assert code == 2 and "--url" in capsys.readouterr().err
