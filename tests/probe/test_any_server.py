"""Any server: fields it refuses are dropped (and recorded), and a 200 without the logprobs asked
for is a fail-open, named by route and whether streamed: never a pass, never unmeasurable."""

from pathlib import Path

import pytest

from batchproof.probe.records.reply import StreamResult
from batchproof.probe.wire.droppable_fields import named_fields, next_drop
from tests.helpers.probe_check import judge_probe_witness
from tests.helpers.quirky_server import Quirks, QuirkyServer
from tests.helpers.scripted_server import Script, run_probe

FAIL_OPEN = "HTTP 200 with content but no logprobs, though the request asked for them"
NEVER = "; a request that asks for logprobs must never get a 200 without them"


def test_a_server_that_refuses_ignore_eos_is_asked_again_without_it(tmp_path: Path, capsys) -> None:
    quirks = Quirks(refuse=("ignore_eos",))
    with QuirkyServer(quirks=quirks) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0 and witness["result"] == "PASS"
    assert witness["dropped_fields"] == ["ignore_eos"]
    # One refusal, then every request (references and bands) without the field; the rest as asked.
    assert ["ignore_eos" in body for body in quirks.bodies] == [True] + [False] * 7
    assert all(body["seed"] == 0 and body["stream_options"] == {"include_usage": True} for body in quirks.bodies)
    assert "  dropped fields (the server refused them): ignore_eos" in capsys.readouterr().out
    assert judge_probe_witness(tmp_path, witness) == (0, [])


def test_a_reply_that_ends_early_without_ignore_eos_is_compared_over_its_length(tmp_path: Path) -> None:
    # 4 tokens short, at an end of sequence ("stop"): without ignore_eos that is a complete reply,
    # compared over its 8 tokens (8 >= declared_min 6 here, so S5 is met too).
    script = Script(short_by=4, has_histogram=True)
    with QuirkyServer(script, Quirks(refuse=("ignore_eos",), finish_reason="stop")) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0 and witness["dropped_fields"] == ["ignore_eos"]
    assert witness["reference"]["self_divergence_at"] == 8
    assert [(b["divergence_at"], b["intra_agree_to"]) for b in witness["bands"]] == [(8, 8), (8, 8)]
    # With ignore_eos sent and honoured, the same short reply is refused as always.
    with QuirkyServer(script, Quirks(finish_reason="stop")) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 8 and witness["reference"]["reason"] == "ref#1: completion_tokens=8 != n_predict=12"


def test_a_server_answering_without_logprobs_fails_open_streamed_and_not(tmp_path: Path, capsys) -> None:
    # As Hugging Face's `transformers serve` did: 422 for ignore_eos, then 200s without logprobs.
    quirks = Quirks(refuse=("ignore_eos",), has_logprobs=False)
    with QuirkyServer(quirks=quirks) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 5 and witness["result"] == "FAIL"
    assert witness["dropped_fields"] == ["ignore_eos"]
    assert witness["bands"] == []  # nothing to compare: tokens are read from the logprob entries
    assert witness["reference"]["reason"].startswith("ref#1: fail-open: HTTP 200 with content but no logprobs")
    # Both references streamed, then one whole request to see the other path.
    assert witness["fail_open"] == [
        {"route": "/v1/chat/completions", "streamed": True, "requests": 2, "what": FAIL_OPEN},
        {"route": "/v1/chat/completions", "streamed": False, "requests": 1, "what": FAIL_OPEN},
    ]
    assert quirks.bodies[-1]["stream"] is False
    out = capsys.readouterr().out
    assert f"  FAIL-OPEN: /v1/chat/completions (streamed) answered 2 request(s) with {FAIL_OPEN}" in out
    code, reasons = judge_probe_witness(tmp_path, witness)
    assert code == 5
    assert reasons[:2] == [
        f"fail-open: /v1/chat/completions (streamed) answered 2 request(s) with {FAIL_OPEN}{NEVER}",
        f"fail-open: /v1/chat/completions (not streamed) answered 1 request(s) with {FAIL_OPEN}{NEVER}",
    ]
    assert reasons[2:] == ["band c=1 not measured", "band c=4 not measured"]


def test_a_refusal_that_names_no_field_keeps_every_field(tmp_path: Path) -> None:
    # A 400 for something else: each droppable field is tried once, none helps, all are kept.
    with QuirkyServer(Script(status=400)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 8 and witness["dropped_fields"] == []
    assert witness["reference"]["reason"] == "ref#1: HTTP 400: logprobs: not on this path"
    assert "ignore_eos" in server.quirks.bodies[-1] and len(server.quirks.bodies) == 4 + 1


def _refusal(status: int, body: str) -> StreamResult:
    return StreamResult(status=status, refusal_body=body, error=f"HTTP {status}")


@pytest.mark.parametrize(("status", "body", "drop"), [
    (422, '{"detail": [{"type": "extra_forbidden", "loc": ["body", "seed"]}]}', (["seed"], True)),
    (400, "unknown fields: ignore_eos, stream_options", (["ignore_eos", "stream_options"], True)),
    (400, "bad request", (["ignore_eos"], False)),  # names none: the first still sent, as a guess
    (500, "ignore_eos", ([], False)),  # not a refusal of the request's shape
    (422, "seeded_ignore_eos_x", (["ignore_eos"], False)),  # a word, not a field name
])
def test_which_fields_a_refusal_drops(status: int, body: str, drop: tuple[list[str], bool]) -> None:
    present = ["messages", "seed", "ignore_eos", "stream_options"]
    assert next_drop(_refusal(status, body), present) == drop


def test_only_fields_the_request_carried_are_named() -> None:
    assert named_fields("seed and ignore_eos are not allowed", ["seed"]) == ["seed"]
