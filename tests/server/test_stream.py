"""The SSE holding rule on replies whose characters span several tokens (CJK, emoji, lone
bytes forced with logit_bias): entries ride only on chunks that carry text (or the finish
chunk), each exactly once and in order, and the stream equals the unstreamed reply."""

import codecs

import pytest

from tests.helpers.http import CJK_PROMPT, EMOJI_PROMPT, chat_body, chunks, joined_bytes, post, stream, streamed_chat

CHAT = "/v1/chat/completions"


def _check_holding_rule(events: list) -> list[dict]:
    """Every chunk's entries are released with the text their bytes complete; returns the chunks."""
    body = chunks(events)
    assert body[0]["stream_mode"] == "live" and body[0]["choices"][0]["delta"] == {"role": "assistant",
                                                                                   "content": ""}
    assert "logprobs" not in body[0]["choices"][0]
    text, raw = "", b""
    for chunk in body[1:]:
        if not chunk["choices"]:  # the usage chunk
            continue
        (choice,) = chunk["choices"]
        delta_text = choice["delta"].get("content") or ""
        is_finish = choice["finish_reason"] is not None
        assert delta_text or is_finish, f"a chunk with neither text nor finish_reason: {chunk}"
        entries = (choice.get("logprobs") or {}).get("content")
        if "logprobs" in choice:
            assert entries, f"a logprobs key with no entries to release: {chunk}"
        text += delta_text
        raw += joined_bytes(entries or [])
        if not is_finish:
            # The entries sent so far are exactly the bytes of the text sent so far: nothing
            # released early (before its character is complete), nothing held back late.
            assert _released_text(raw) == text, (raw, text)
    assert raw.decode("utf-8", errors="replace") == text
    return body


def _released_text(raw: bytes) -> str:
    """The characters `raw` completes (an invalid byte as U+FFFD); an unfinished tail stays out."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(raw)


def _entries_per_chunk(body: list[dict]) -> list[int]:
    return [len((c["choices"][0].get("logprobs") or {}).get("content") or []) for c in body if c["choices"]]


@pytest.mark.parametrize("prompt, needle", [(CJK_PROMPT, "日本語"), (EMOJI_PROMPT, "🎉")], ids=["cjk", "emoji"])
def test_held_entries_ride_on_the_next_text_chunk(server, prompt, needle) -> None:
    body = chat_body(prompt, max_tokens=10, logprobs=True, top_logprobs=3)
    whole = post(server.url, CHAT, body).json()
    whole_entries = whole["choices"][0]["logprobs"]["content"]
    assert needle in whole["choices"][0]["message"]["content"]
    # The reply does hold characters split over tokens: some entries are not valid UTF-8 alone.
    split = [e for e in whole_entries if "\ufffd" in e["token"]]
    assert split and all(bytes(e["bytes"]) != e["token"].encode() for e in split)
    _, _, events = stream(server.url, CHAT, body)
    chunk_list = _check_holding_rule(events)
    assert max(_entries_per_chunk(chunk_list)) >= 2, "no chunk carried a held entry"
    content, entries, finish = streamed_chat(events)
    assert entries == whole_entries  # each exactly once, in token order, equal to the unstreamed ones
    assert content == whole["choices"][0]["message"]["content"]
    assert finish == whole["choices"][0]["finish_reason"]
    assert len(entries) == whole["usage"]["completion_tokens"]


def test_entries_still_held_at_the_end_go_on_the_finish_chunk(server) -> None:
    """max_tokens stops the reply inside a character: the held entry goes out with finish_reason."""
    full = post(server.url, CHAT, chat_body(CJK_PROMPT, max_tokens=6, logprobs=True)).json()
    full_entries = full["choices"][0]["logprobs"]["content"]
    # Find a length that ends on a token that does not complete its character.
    raws = [joined_bytes(full_entries[:n]) for n in range(1, len(full_entries) + 1)]
    n = next(n for n, raw in enumerate(raws, 1) if _is_incomplete(raw))
    body = chat_body(CJK_PROMPT, max_tokens=n, logprobs=True, top_logprobs=1)
    whole = post(server.url, CHAT, body).json()["choices"][0]
    _, _, events = stream(server.url, CHAT, body)
    chunk_list = _check_holding_rule(events)
    last = chunk_list[-1]["choices"][0]
    assert last["finish_reason"] == "length"
    held = last["logprobs"]["content"]
    assert bytes(held[-1]["bytes"]) == bytes(full_entries[n - 1]["bytes"])
    assert last["delta"]["content"].endswith("\ufffd")  # the incomplete character, flushed
    content, entries, _ = streamed_chat(events)
    assert (content, entries) == (whole["message"]["content"], whole["logprobs"]["content"])
    assert [bytes(e["bytes"]) for e in entries] == [bytes(e["bytes"]) for e in full_entries[:n]]


def _is_incomplete(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.reason == "unexpected end of data"
    return False


def test_a_lone_lead_byte_forced_by_logit_bias(server) -> None:
    """logit_bias forces the single byte 0xF0 (an emoji's first byte) for every token."""
    tokenizer = server.state.backend.engine.tokenizer
    (lead,) = [i for i in range(tokenizer.vocab_size) if tokenizer.decode_bytes(i) == b"\xf0"]
    body = chat_body(EMOJI_PROMPT, max_tokens=3, logprobs=True, top_logprobs=2, logit_bias={str(lead): 100})
    whole = post(server.url, CHAT, body).json()["choices"][0]
    entries = whole["logprobs"]["content"]
    assert [e["bytes"] for e in entries] == [[0xF0]] * 3
    assert all(e["token"] == "\ufffd" for e in entries)
    assert whole["message"]["content"] == (b"\xf0" * 3).decode("utf-8", errors="replace")
    _, _, events = stream(server.url, CHAT, body)
    _check_holding_rule(events)
    assert streamed_chat(events) == (whole["message"]["content"], entries, "length")


def test_the_bytes_of_an_emoji_forced_in_any_order(server) -> None:
    """logit_bias lifts the four bytes of 🎉 above everything: a reply of lone bytes, valid or not."""
    tokenizer = server.state.backend.engine.tokenizer
    by_bytes = {tokenizer.decode_bytes(i): i for i in range(tokenizer.vocab_size)}
    emoji = "🎉".encode()
    ids = [by_bytes[bytes([b])] for b in emoji]
    body = chat_body(EMOJI_PROMPT, max_tokens=4, logprobs=True, top_logprobs=4,
                     logit_bias={str(i): 100 for i in ids})
    whole = post(server.url, CHAT, body).json()["choices"][0]
    entries = whole["logprobs"]["content"]
    assert all(len(e["bytes"]) == 1 and e["bytes"][0] in emoji for e in entries)
    assert all({bytes(t["bytes"]) for t in e["top_logprobs"]} == {bytes([b]) for b in emoji} for e in entries)
    _, _, events = stream(server.url, CHAT, body)
    _check_holding_rule(events)
    content, streamed_entries, finish = streamed_chat(events)
    assert (content, streamed_entries, finish) == (whole["message"]["content"], entries, "length")
    assert content == joined_bytes(entries).decode("utf-8", errors="replace")


def test_streamed_chunks_share_id_model_and_created(server) -> None:
    _, raw, events = stream(server.url, CHAT, chat_body(CJK_PROMPT, max_tokens=4, logprobs=True,
                                                        stream_options={"include_usage": True}))
    body = chunks(events)
    assert len({(c["id"], c["model"], c["created"], c["object"]) for c in body}) == 1
    assert body[-1]["choices"] == [] and body[-1]["usage"]["completion_tokens"] == 4
    assert "NaN" not in raw and "Infinity" not in raw
