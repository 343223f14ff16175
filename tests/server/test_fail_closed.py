"""Fail closed: a reply whose entries do not number its tokens is a 500 (mid-stream: an error
event and no [DONE]), never a 200 with a short list; an engine error fails only its own
request, naming the step; NaN logits are never ranked or chosen and -inf is sent as -9999.0.

The server runs in this process, so faults are injected by patching the engine's methods;
each injection touches only requests marked with a particular seed."""

import concurrent.futures
import math

import pytest
import torch

from batchproof.engine.outputs import OutputProcessor
from batchproof.engine.runner import ModelRunner
from batchproof.engine.text.text_stream import TextDelta
from tests.helpers.http import ASCII_PROMPT, assert_error, chat_body, parse_sse, post, stream, streamed_chat

CHAT = "/v1/chat/completions"
MARK = 4242  # the seed that marks a request for fault injection (greedy requests ignore seeds)


@pytest.fixture
def drop_one_record(monkeypatch) -> None:
    """Marked requests lose the first record of their first delta that carries any."""
    original = OutputProcessor._output
    dropped: set[str] = set()

    def lossy(self, seq, delta):
        if seq.params.seed == MARK and delta.records and seq.request_id not in dropped:
            dropped.add(seq.request_id)
            delta = TextDelta(delta.text, delta.records[1:])
        return original(self, seq, delta)

    monkeypatch.setattr(OutputProcessor, "_output", lossy)


def _fail_closed_error(error: dict) -> None:
    assert error["type"] == "server_error" and "fail closed" in error["message"]
    assert "entries for" in error["message"]


@pytest.mark.usefixtures("drop_one_record")
def test_a_short_entry_list_is_a_500_never_a_200(server) -> None:
    body = chat_body(ASCII_PROMPT, max_tokens=6, logprobs=True, seed=MARK)
    error = assert_error(post(server.url, CHAT, body), 500)
    _fail_closed_error(error)
    assert "5 entries for 6 reply tokens" in error["message"]
    # Unmarked requests, and marked ones that never asked for logprobs, are untouched.
    assert post(server.url, CHAT, {**body, "seed": 1}).status_code == 200
    plain = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=6, seed=MARK))
    assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 6


@pytest.mark.usefixtures("drop_one_record")
def test_a_short_entry_list_mid_stream_is_an_error_event_and_no_done(server) -> None:
    body = chat_body(ASCII_PROMPT, max_tokens=6, logprobs=True, seed=MARK, stream=True,
                     stream_options={"include_usage": True})
    response = post(server.url, CHAT, body)
    assert response.status_code == 200  # headers went out with the first chunk
    events = parse_sse(response.text)
    assert "[DONE]" not in events
    assert set(events[-1]) == {"error"}
    _fail_closed_error(events[-1]["error"])
    chunk_events = events[:-1]
    assert chunk_events and all(e["object"] == "chat.completion.chunk" for e in chunk_events)
    assert all(c["choices"] and c["choices"][0]["finish_reason"] is None for c in chunk_events), \
        "a finish_reason or usage chunk was sent for a reply that failed"


@pytest.mark.usefixtures("drop_one_record")
def test_legacy_completions_fail_closed_too(server) -> None:
    body = {"prompt": ASCII_PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1, "seed": MARK}
    _fail_closed_error(assert_error(post(server.url, "/v1/completions", body), 500))
    events = parse_sse(post(server.url, "/v1/completions", {**body, "stream": True}).text)
    assert "[DONE]" not in events and set(events[-1]) == {"error"}
    _fail_closed_error(events[-1]["error"])
    assert post(server.url, "/v1/completions", {**body, "logprobs": None}).status_code == 200


@pytest.fixture
def nan_logits_at_step(monkeypatch):
    """Marked requests get the logits of decode step `step` rewritten by `rewrite(row)`."""
    plan: dict = {}
    original = ModelRunner.decode

    def patched(self, seqs):
        logits = original(self, seqs)
        for i, seq in enumerate(seqs):
            if seq.params.seed == MARK and len(seq.output_ids) == plan["step"]:
                plan["rewrite"](logits[i])
        return logits

    monkeypatch.setattr(ModelRunner, "decode", patched)

    def arm(step: int, rewrite) -> None:
        plan.update(step=step, rewrite=rewrite)

    return arm


def _all_nan(row: torch.Tensor) -> None:
    row.fill_(float("nan"))


def test_an_engine_error_fails_only_its_request_and_names_the_step(server, nan_logits_at_step) -> None:
    nan_logits_at_step(2, _all_nan)
    body = chat_body(ASCII_PROMPT, max_tokens=8, logprobs=True)
    alone = post(server.url, CHAT, body).json()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        pending = [pool.submit(post, server.url, CHAT, body) for _ in range(2)]
        failed = pool.submit(post, server.url, CHAT, {**body, "seed": MARK})
        for fields in ({}, {"logprobs": False}):  # with and without logprobs
            error = assert_error(post(server.url, CHAT, {**body, **fields, "seed": MARK}), 500)
            assert error["type"] == "server_error" and "step 2" in error["message"]
        error = assert_error(failed.result(), 500)
        assert "step 2" in error["message"]
        for other in (p.result() for p in pending):
            assert other.status_code == 200 and other.json()["choices"] == alone["choices"]
    events = parse_sse(post(server.url, CHAT, {**body, "seed": MARK, "stream": True}).text)
    assert "[DONE]" not in events and "step 2" in events[-1]["error"]["message"]
    assert streamed_chat([*events[:-1], "[DONE]"])[1] == alone["choices"][0]["logprobs"]["content"][:2]
    legacy = post(server.url, "/v1/completions", {"prompt": ASCII_PROMPT, "max_tokens": 4, "seed": MARK})
    assert "step 2" in assert_error(legacy, 500)["message"]
    assert server.state.backend.failure is None  # the engine itself carries on
    assert post(server.url, CHAT, body).json()["choices"] == alone["choices"]


def test_nan_logits_are_never_ranked_or_chosen(server, nan_logits_at_step) -> None:
    """The best token's logit turns NaN at step 1: the runner-up is chosen and ranked first,
    and the logprobs are renormalised over the remaining tokens."""
    body = chat_body(ASCII_PROMPT, max_tokens=3, logprobs=True, top_logprobs=3)
    clean = post(server.url, CHAT, body).json()["choices"][0]["logprobs"]["content"]
    nan_logits_at_step(1, lambda row: row.__setitem__(row.argmax(), float("nan")))
    response = post(server.url, CHAT, {**body, "seed": MARK})
    assert response.status_code == 200 and "NaN" not in response.text
    patched = response.json()["choices"][0]["logprobs"]["content"]
    assert patched[0] == clean[0]
    best, second, third = clean[1]["top_logprobs"]
    assert patched[1]["bytes"] == second["bytes"]
    assert [t["bytes"] for t in patched[1]["top_logprobs"][:2]] == [second["bytes"], third["bytes"]]
    assert best["bytes"] not in [t["bytes"] for t in patched[1]["top_logprobs"]]
    # Without the best token, log p'(x) = log p(x) - log(1 - p(best)).
    shift = math.log1p(-math.exp(best["logprob"]))
    assert patched[1]["logprob"] == pytest.approx(second["logprob"] - shift, abs=1e-4)


def test_minus_infinity_is_sent_as_minus_9999(server, nan_logits_at_step) -> None:
    tokenizer = server.state.backend.engine.tokenizer
    keep = [tokenizer.encode(" red")[0], tokenizer.encode(" blue")[0]]

    def only_two(row: torch.Tensor) -> None:
        kept = row[keep].clone()
        row.fill_(float("-inf"))
        row[keep] = kept

    nan_logits_at_step(1, only_two)
    response = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=2, logprobs=True, top_logprobs=4,
                                                seed=MARK))
    assert response.status_code == 200 and "Infinity" not in response.text
    entry = response.json()["choices"][0]["logprobs"]["content"][1]
    top = entry["top_logprobs"]
    assert entry["bytes"] in [list(tokenizer.decode_bytes(i)) for i in keep]
    assert [t["logprob"] for t in top[2:]] == [-9999.0, -9999.0]
    assert sum(math.exp(t["logprob"]) for t in top[:2]) == pytest.approx(1.0, abs=1e-5)
    _, raw, events = stream(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=2, logprobs=True, top_logprobs=4,
                                                        seed=MARK))
    assert "Infinity" not in raw and streamed_chat(events)[1][1] == entry
