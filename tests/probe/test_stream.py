"""Reading one stream: lenient entries of every server, chunks in any arrangement."""

import httpx
import pytest

from batchproof.probe.records.entry import EntryError, parse_entry
from batchproof.probe.records.reply import StreamError, StreamResult
from batchproof.probe.wire.stream import replica_of

OURS = {
    "token": " hi",
    "logprob": -0.25,
    "bytes": [32, 104, 105],
    "top_logprobs": [
        {"token": " hi", "logprob": -0.25, "bytes": [32, 104, 105]},
        {"token": " hello", "logprob": -1.9, "bytes": [32, 104, 101, 108, 108, 111]},
    ],
}
OPENAI = {
    "token": " hi",
    "logprob": None,
    "bytes": None,
    "top_logprobs": [
        {"token": " hi", "logprob": -0.25, "bytes": None},
        {"token": " yo", "logprob": -9999.0, "bytes": None},
        {"token": " hello", "logprob": -1.9, "bytes": None},
    ],
}
LLAMACPP = {"id": 4521, "token": " hi", "logprob": -0.25, "bytes": [32, 104, 105]}


def test_our_entry() -> None:
    entry = parse_entry(OURS)
    assert entry.identity == (" hi", (32, 104, 105))
    assert entry.logprob == -0.25 and entry.top2_margin == pytest.approx(1.65)


def test_openai_entry_null_bytes_null_logprob_and_minus_9999() -> None:
    entry = parse_entry(OPENAI)
    assert entry.identity == (" hi", ())
    assert entry.logprob is None
    assert entry.top2_margin == pytest.approx(1.65)  # -9999 counts as absent


def test_llamacpp_entry_extra_id_no_top_logprobs() -> None:
    entry = parse_entry(LLAMACPP)
    assert entry.identity == (" hi", (32, 104, 105)) and entry.top2_margin is None
    assert parse_entry({**LLAMACPP, "top_logprobs": None}).top_logprobs == ()


@pytest.mark.parametrize(
    "raw",
    [
        "hi",
        {"logprob": -1.0},
        {"token": 7},
        {"token": "a", "bytes": "a"},
        {"token": "a", "bytes": [256]},
        {"token": "a", "bytes": [True]},
        {"token": "a", "top_logprobs": {"a": -1}},
    ],
)
def test_an_unreadable_entry_is_refused(raw: object) -> None:
    with pytest.raises(EntryError):
        parse_entry(raw)


def content(text: str, entries: list | None = None, finish: str | None = None) -> dict:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    if entries is not None:
        choice["logprobs"] = {"content": entries}
    return {"choices": [choice]}


def usage(n: int) -> dict:
    return {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}}


def test_entries_are_collected_from_whichever_chunk_carries_them() -> None:
    result = StreamResult()
    result.feed({"choices": [{"delta": {"role": "assistant"}}], "stream_mode": "live"}, 0.01)
    result.feed(content("", [{**OURS, "token": "\ufffd", "bytes": [0xC3]}]), 0.10)  # held, no text
    result.feed(content("é", [{**OURS, "token": "\ufffd", "bytes": [0xA9]}]), 0.20)
    result.feed({"choices": [{"delta": {"content": " hi"}, "logprobs": None}]}, 0.30)
    result.feed(content("", [OURS], finish="length"), 0.31)  # held entry at the end
    result.feed({"choices": [{"delta": {}, "finish_reason": None}]}, 0.32)
    result.feed(usage(3), 0.33)
    result.finish()
    assert result.error is None and result.text == "é hi"
    assert [e.identity[1] for e in result.entries] == [(0xC3,), (0xA9,), (32, 104, 105)]
    assert result.arrivals == [0.20, 0.30]
    assert result.finish_reason == "length" and result.completion_tokens == 3
    assert result.decode_tok_s == pytest.approx(2 / 0.1)


def test_the_first_stream_mode_and_the_last_usage_win() -> None:
    result = StreamResult()
    result.feed({"choices": [], "stream_mode": "replay"}, 0.0)
    result.feed({**content("a"), "stream_mode": "live"}, 0.1)
    result.feed(content("b"), 0.2)
    result.feed(usage(1), 0.3)
    result.feed(usage(2), 0.3)
    result.finish()
    # Declared, but not live, and too few chunks to be seen live: not timed.
    assert result.stream_mode == "replay" and result.mode == ("buffered", None) and result.decode_tok_s is None
    assert result.completion_tokens == 2


def test_a_stream_without_usage_or_without_content_is_an_error() -> None:
    result = StreamResult()
    result.feed(content("a", [OURS]), 0.1)
    result.finish()
    assert result.error == "the stream carried no usage"
    result = StreamResult()
    result.feed(content("", [OURS]), 0.1)
    result.feed(usage(1), 0.2)
    result.finish()
    assert result.error == "the stream carried no content"


def test_an_error_event_or_a_bad_entry_stops_the_stream() -> None:
    with pytest.raises(StreamError, match="boom"):
        StreamResult().feed({"error": {"message": "boom", "type": "server_error"}}, 0.0)
    with pytest.raises(StreamError, match="logprob entry 0"):
        StreamResult().feed(content("a", [{"logprob": -1.0}]), 0.0)
    with pytest.raises(StreamError):
        StreamResult().feed([1, 2], 0.0)


def test_a_non_integer_usage_count_is_no_count() -> None:
    result = StreamResult()
    result.feed(content("a", [OURS]), 0.0)
    result.feed({"choices": [], "usage": {"completion_tokens": "3"}}, 0.1)
    result.finish()
    assert result.error is None and result.completion_tokens is None


def test_the_replica_header_is_read_case_blind_and_blank_is_none() -> None:
    assert replica_of(httpx.Headers({"X-Batchproof-Replica": " node-1-4242 "})) == "node-1-4242"
    assert replica_of(httpx.Headers({"x-batchproof-replica": "a,b"})) == "a,b"  # n>1 spread: kept as sent
    assert replica_of(httpx.Headers({"x-batchproof-replica": " "})) is None
    assert replica_of(httpx.Headers({"content-type": "text/event-stream"})) is None


def test_content_without_any_logprob_entry_is_a_fail_open() -> None:
    for is_streamed in (True, False):
        result = StreamResult(is_streamed=is_streamed)
        result.feed(content("a"), 0.0)
        result.feed({"choices": [], "usage": {"completion_tokens": 1}}, 0.1)
        result.finish()
        how = "streamed" if is_streamed else "not streamed"
        assert result.is_fail_open and result.error == f"fail-open: HTTP 200 with content but no logprobs ({how})"


def test_a_reply_to_a_request_without_logprobs_is_no_fail_open() -> None:
    """A speed bench's plain request asks for no logprobs: its reply carries none, and is fine
    (`batchproof bench` over HTTP stopped on every server before this)."""
    from batchproof.probe.wire.stream import asks_logprobs

    assert not asks_logprobs({"messages": [], "stream": True}) and not asks_logprobs({"logprobs": False})
    assert asks_logprobs({"logprobs": True}) and asks_logprobs({"logprobs": 0})  # chat; the legacy count
    assert asks_logprobs({"include": ["message.output_text.logprobs"]})  # the Responses API
    result = StreamResult(wants_logprobs=False)
    result.feed(content("a"), 0.0)
    result.feed({"choices": [], "usage": {"completion_tokens": 1}}, 0.1)
    result.finish()
    assert result.error is None and not result.is_fail_open


def test_cached_tokens_are_read_from_usage_or_llamacpp_timings() -> None:
    from batchproof.probe.records.reply import cached_tokens

    assert cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": 48}}}) == 48
    assert cached_tokens({"timings": {"cache_n": 17}}) == 17
    assert cached_tokens({"usage": {"prompt_tokens_details": None}}) is None
    assert cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": True}}}) is None
    result = StreamResult()
    result.feed({**content("a", [OURS]), "timings": {"cache_n": 9}}, 0.0)
    result.feed({"choices": [], "usage": {"completion_tokens": 1}}, 0.1)  # usage without details keeps 9
    assert result.cached_tokens == 9


def test_a_whole_reply_is_read_like_a_stream() -> None:
    from batchproof.probe.wire.stream import read_whole, unstreamed_body

    assert unstreamed_body({"stream": True, "stream_options": {"include_usage": True}, "seed": 0}) == {
        "seed": 0, "stream": False}
    result = StreamResult(is_streamed=False)
    read_whole({"choices": [{"index": 0, "message": {"role": "assistant", "content": " hi"},
                             "logprobs": {"content": [OURS]}, "finish_reason": "length"}],
                "usage": {"completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 3}}}, result)
    result.finish()
    assert (result.error, result.text, result.finish_reason, result.cached_tokens) == (None, " hi", "length", 3)
    assert [e.identity for e in result.entries] == [(" hi", (32, 104, 105))]


def test_responses_events_and_a_whole_response_read_alike() -> None:
    """The Responses API: text and entries from output_text.delta, the end and usage (cached tokens
    included) from response.incomplete; the whole `response` object reads the same."""
    from batchproof.probe.wire.stream import read_whole

    usage = {"input_tokens": 9, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 8}}
    part = {"type": "output_text", "text": " hi hi", "logprobs": [OURS, OURS]}
    response = {"object": "response", "status": "incomplete", "usage": usage,
                "output": [{"type": "message", "content": [part]}]}
    streamed = StreamResult()
    for event in ({"type": "response.created", "response": {}, "stream_mode": "live"},
                  {"type": "response.output_text.delta", "delta": " hi", "logprobs": [OURS]},
                  {"type": "response.output_text.delta", "delta": " hi", "logprobs": [OURS]},
                  {"type": "response.output_text.done", "text": " hi hi"},
                  {"type": "response.incomplete", "response": response}):
        streamed.feed(event, 0.1)
    whole = StreamResult(is_streamed=False)
    read_whole(response, whole)
    for result in (streamed, whole):
        result.finish()
        assert (result.text, result.finish_reason, result.completion_tokens, result.cached_tokens) == (
            " hi hi", "length", 2, 8)
        assert result.error is None and result.logprob_vectors() == [(-0.25, -0.25, -1.9)] * 2
    assert streamed.stream_mode == "live"
    failed = StreamResult()
    with pytest.raises(StreamError, match="response.failed"):
        failed.feed({"type": "response.failed", "response": {"error": {"message": "boom"}}}, 0.1)
