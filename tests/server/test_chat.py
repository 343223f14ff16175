"""Chat completions over loopback, with the official openai client and raw httpx: logprobs
entries, ordering and ties, the end-of-turn record, max_tokens, stop strings, and replies
that are byte-identical whether or not logprobs were asked for."""

import math

import httpx
import openai
import pytest
import torch

from tests.helpers.http import (
    ASCII_PROMPT,
    TIED_TOKEN_IDS,
    char_starts,
    chat_body,
    joined_bytes,
    messages,
    post,
    stream,
    streamed_chat,
)

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(server) -> str:
    return server.state.served_model_name


def _check_entry_shape(entry: dict, top_n: int) -> None:
    assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
    assert entry["token"] == bytes(entry["bytes"]).decode("utf-8", errors="replace")
    assert isinstance(entry["logprob"], float) and -9999.0 <= entry["logprob"] <= 0.0
    assert len(entry["top_logprobs"]) == top_n
    for alt in entry["top_logprobs"]:
        assert set(alt) == {"token", "logprob", "bytes"}
        assert alt["token"] == bytes(alt["bytes"]).decode("utf-8", errors="replace")
        assert math.isfinite(alt["logprob"]) and alt["logprob"] <= 0.0


def test_openai_client_gets_one_entry_per_token_whose_bytes_are_the_reply(client, model) -> None:
    reply = client.chat.completions.create(model=model, messages=messages(ASCII_PROMPT), temperature=0,
                                           max_tokens=12, logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    entries = [e.model_dump() for e in choice.logprobs.content]
    assert reply.object == "chat.completion" and reply.model == model
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 12
    assert len(entries) == reply.usage.completion_tokens
    assert joined_bytes(entries).decode() == choice.message.content
    for entry in entries:
        _check_entry_shape(entry, 3)
        top = entry["top_logprobs"]
        # Greedy: the chosen token is the best one, with the very same logprob.
        assert (top[0]["token"], top[0]["bytes"], top[0]["logprob"]) == (entry["token"], entry["bytes"],
                                                                         entry["logprob"])
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
    total_prob = sum(math.exp(t["logprob"]) for t in entries[0]["top_logprobs"])
    assert total_prob <= 1.0 + 1e-6


def test_top_logprobs_zero_still_gives_the_chosen_tokens_logprob(server) -> None:
    with_top = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=6, logprobs=True, top_logprobs=1)).json()
    zero = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=6, logprobs=True, top_logprobs=0)).json()
    absent = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=6, logprobs=True)).json()
    for reply in (zero, absent):
        entries = reply["choices"][0]["logprobs"]["content"]
        assert len(entries) == reply["usage"]["completion_tokens"] == 6
        for entry in entries:
            _check_entry_shape(entry, 0)
        # Same tokens and logprobs as the top-1 request, only without the alternatives.
        assert [{**e, "top_logprobs": []} for e in with_top["choices"][0]["logprobs"]["content"]] == entries


def test_chosen_logprob_is_given_even_when_outside_the_top_n(server) -> None:
    """A sampled token below the top-1 still carries its own logprob, and it is not in the list."""
    body = chat_body(ASCII_PROMPT, max_tokens=12, logprobs=True, top_logprobs=1, temperature=2.0, seed=7)
    reply = post(server.url, CHAT, body).json()
    entries = reply["choices"][0]["logprobs"]["content"]
    assert len(entries) == reply["usage"]["completion_tokens"]
    below = [e for e in entries if e["bytes"] != e["top_logprobs"][0]["bytes"]]
    assert below, "temperature 2 never left the top-1 token; pick another seed"
    for entry in below:
        assert entry["logprob"] < entry["top_logprobs"][0]["logprob"]


def test_ties_go_to_the_lower_token_id(server) -> None:
    """Two tokens with bit-identical logits, pushed to the top by the same logit_bias."""
    low, high = TIED_TOKEN_IDS
    model = server.state.backend.engine.model
    rows = model.ops.embedding(model.lm_head, torch.tensor([low, high]))  # the rows as stored, dequantized
    assert torch.equal(rows[0], rows[1]) and low < high  # the premise: always equal logits
    bias = {str(high): 100, str(low): 100}  # dict order must not matter
    reply = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=2, logprobs=True, top_logprobs=3,
                                             logit_bias=bias)).json()
    engine_tokenizer = server.state.backend.engine.tokenizer
    for entry in reply["choices"][0]["logprobs"]["content"]:
        first, second, third = entry["top_logprobs"]
        assert first["logprob"] == second["logprob"] > third["logprob"]
        assert bytes(first["bytes"]) == engine_tokenizer.decode_bytes(low)
        assert bytes(second["bytes"]) == engine_tokenizer.decode_bytes(high)
        assert entry["bytes"] == first["bytes"]  # greedy picks the first maximum: the lower id
    ids = [post(server.url, "/tokenize", {"prompt": t["token"]}).json()["tokens"] for t in (first, second)]
    assert ids == [[low], [high]]


def test_end_of_turn_token_is_not_part_of_the_reply(server) -> None:
    eos_spelling = "<|im_end|>"
    reply = post(server.url, CHAT, chat_body("Reply with just the word yes.", max_tokens=24, logprobs=True,
                                             top_logprobs=2)).json()
    choice = reply["choices"][0]
    entries = choice["logprobs"]["content"]
    assert choice["finish_reason"] == "stop"
    assert eos_spelling not in choice["message"]["content"]
    assert all(eos_spelling not in e["token"] for e in entries)
    assert len(entries) == reply["usage"]["completion_tokens"] < 24
    assert joined_bytes(entries).decode() == choice["message"]["content"]


def test_max_tokens_ends_with_length_and_counts_exactly(server) -> None:
    for field in ("max_tokens", "max_completion_tokens"):
        reply = post(server.url, CHAT, chat_body(ASCII_PROMPT, logprobs=True, **{field: 5})).json()
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "length"
        assert reply["usage"]["completion_tokens"] == 5 == len(choice["logprobs"]["content"])
        assert reply["usage"]["total_tokens"] == reply["usage"]["prompt_tokens"] + 5


@pytest.fixture(scope="module")
def uncut(server) -> dict:
    """The greedy reply without stop strings, long enough to cut."""
    return post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=16, logprobs=True, top_logprobs=2)).json()


def _cut_expectation(uncut: dict, cut: int) -> tuple[str, list[dict]]:
    entries = uncut["choices"][0]["logprobs"]["content"]
    text = uncut["choices"][0]["message"]["content"]
    kept = [e for e, start in zip(entries, char_starts(entries)) if start < cut]
    return text[:cut], kept


def _stop_at_mid_token(uncut: dict) -> tuple[str, int]:
    """A stop string that starts inside a multi-character token of the reply (not its first one)."""
    entries = uncut["choices"][0]["logprobs"]["content"]
    text = uncut["choices"][0]["message"]["content"]
    for entry, start in list(zip(entries, char_starts(entries)))[2:]:
        token = bytes(entry["bytes"]).decode()
        if len(token.strip()) >= 3 and token.isascii():
            cut = start + len(token) - 2  # the stop string is the token's last two characters
            stop = text[cut:cut + 2]
            if text.find(stop) == cut:
                return stop, cut
    raise AssertionError(f"no token to cut inside in {text!r}")


def test_stop_string_cuts_text_and_keeps_the_straddling_token(server, uncut) -> None:
    stop, cut = _stop_at_mid_token(uncut)
    text, kept = _cut_expectation(uncut, cut)
    reply = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=16, logprobs=True, top_logprobs=2,
                                             stop=[stop])).json()
    choice = reply["choices"][0]
    entries = choice["logprobs"]["content"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == text
    assert entries == kept
    # The last kept token straddles the cut: its bytes run past the returned text.
    assert joined_bytes(entries).decode().startswith(text) and len(joined_bytes(entries).decode()) > len(text)
    assert reply["usage"]["completion_tokens"] >= len(entries)


def test_stop_cuts_at_the_earliest_of_several_strings(server, uncut) -> None:
    text = uncut["choices"][0]["message"]["content"]
    words = [w for w in text.split() if w.isalpha() and len(w) >= 4]
    early, late = words[0], words[-1]
    assert text.find(early) < text.find(late), text
    expected_text, kept = _cut_expectation(uncut, text.find(early))
    reply = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=16, logprobs=True, top_logprobs=2,
                                             stop=[late, "never in this reply", early])).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == expected_text
    assert choice["logprobs"]["content"] == kept


def test_streamed_stop_equals_unstreamed_stop(server, uncut) -> None:
    stop, _ = _stop_at_mid_token(uncut)
    body = chat_body(ASCII_PROMPT, max_tokens=16, logprobs=True, top_logprobs=2, stop=stop)
    whole = post(server.url, CHAT, body).json()["choices"][0]
    _, _, events = stream(server.url, CHAT, body)
    content, entries, finish = streamed_chat(events)
    assert (content, entries, finish) == (whole["message"]["content"], whole["logprobs"]["content"], "stop")


def test_stop_string_spanning_tokens_never_reaches_the_text(server, uncut) -> None:
    """A stop string over several tokens is held while it could still be forming, and never
    sent; tokens wholly inside it (after the cut) lose their entries."""
    text = uncut["choices"][0]["message"]["content"]
    stop = text[len(text) // 2:len(text) // 2 + 8]
    cut = text.find(stop)
    expected_text, kept = _cut_expectation(uncut, cut)
    assert len(kept) < len(uncut["choices"][0]["logprobs"]["content"]) - 1  # the stop string spans tokens
    _, _, events = stream(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=16, stop=stop, logprobs=True,
                                                      top_logprobs=2))
    content, entries, finish = streamed_chat(events)
    assert finish == "stop" and stop not in content
    assert (content, entries) == (expected_text, kept)


def _strip(reply: dict) -> dict:
    choice = reply["choices"][0]
    usage = {k: v for k, v in reply["usage"].items() if k != "prompt_tokens_details"}  # cache hits may differ
    return {"content": choice["message"]["content"], "finish_reason": choice["finish_reason"], "usage": usage}


@pytest.mark.parametrize("extra", [{}, {"stop": ["blue"]}, {"temperature": 0.8, "seed": 11, "top_p": 0.9}],
                         ids=["greedy", "stop", "sampled"])
def test_asking_for_logprobs_never_changes_the_reply(server, extra) -> None:
    body = {**chat_body(ASCII_PROMPT, max_tokens=10), **extra}
    plain = post(server.url, CHAT, body)
    asked = post(server.url, CHAT, {**body, "logprobs": True, "top_logprobs": 5})
    assert '"logprobs"' not in plain.text and "logprobs" not in plain.json()["choices"][0]
    assert "logprobs" in asked.json()["choices"][0]
    assert _strip(plain.json()) == _strip(asked.json())
    assert list(plain.json()) == ["id", "created", "model", "object", "choices", "usage"]


def test_asking_for_logprobs_never_changes_the_stream(server) -> None:
    body = chat_body(ASCII_PROMPT, max_tokens=10, stream_options={"include_usage": True})
    _, plain_raw, plain_events = stream(server.url, CHAT, body)
    _, _, asked_events = stream(server.url, CHAT, {**body, "logprobs": True, "top_logprobs": 2})
    assert "logprobs" not in plain_raw
    assert all("logprobs" not in c for chunk in plain_events[:-1] for c in chunk["choices"])
    plain, asked = streamed_chat(plain_events), streamed_chat(asked_events)
    assert plain[0] == asked[0] and plain[2] == asked[2] == "length" and plain[1] == []
    assert len(asked[1]) == 10
    usage_chunks = [[c["usage"] for c in events[:-1] if "usage" in c] for events in (plain_events, asked_events)]
    assert usage_chunks[0] == usage_chunks[1] and usage_chunks[0][0]["completion_tokens"] == 10
    whole = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=10)).json()
    assert plain[0] == whole["choices"][0]["message"]["content"]
    assert usage_chunks[0] == [whole["usage"]]


def test_openai_client_stream_equals_unstreamed_token_for_token(client, model) -> None:
    kwargs = dict(model=model, messages=messages(ASCII_PROMPT), temperature=0, max_tokens=12, logprobs=True,
                  top_logprobs=4)
    whole = client.chat.completions.create(**kwargs)
    content, entries, finish, roles, modes = "", [], None, [], []
    for chunk in client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
        assert chunk.object == "chat.completion.chunk" and chunk.id.startswith("chatcmpl-")
        modes.append((chunk.model_extra or {}).get("stream_mode"))
        if not chunk.choices:
            usage = chunk.usage
            continue
        delta = chunk.choices[0]
        roles.append(delta.delta.role)
        content += delta.delta.content or ""
        if delta.logprobs is not None:
            entries += [e.model_dump() for e in delta.logprobs.content]
        finish = delta.finish_reason or finish
    assert modes[0] == "live" and roles[0] == "assistant" and set(roles[1:]) == {None}
    assert content == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason == "length"
    assert entries == [e.model_dump() for e in whole.choices[0].logprobs.content]
    assert usage.model_dump() == whole.usage.model_dump()


def test_request_ids_are_unique_and_model_is_the_served_one(server, model) -> None:
    replies = [post(server.url, CHAT, chat_body("hi", max_tokens=1)).json() for _ in range(2)]
    assert replies[0]["id"] != replies[1]["id"]
    assert {r["model"] for r in replies} == {model}
    named = post(server.url, CHAT, chat_body("hi", max_tokens=1, model=model))
    assert named.status_code == 200


def test_text_parts_and_roles_are_accepted(server) -> None:
    as_parts = {"messages": [{"role": "developer", "content": "Be brief."},
                             {"role": "user", "content": [{"type": "text", "text": "Name three "},
                                                          {"type": "text", "text": "colors of the rainbow."}]}],
                "temperature": 0, "max_tokens": 4}
    as_string = {"messages": [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": ASCII_PROMPT}], "temperature": 0, "max_tokens": 4}
    a, b = post(server.url, CHAT, as_parts), post(server.url, CHAT, as_string)
    assert a.status_code == b.status_code == 200
    assert _strip(a.json()) == _strip(b.json())


def test_keep_alive_connection_serves_several_requests(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as session:
        replies = [session.post(CHAT, json=chat_body("hi", max_tokens=2)) for _ in range(3)]
    assert [r.status_code for r in replies] == [200, 200, 200]
    assert len({r.json()["choices"][0]["message"]["content"] for r in replies}) == 1


def _eos(server) -> tuple[int, str]:
    tokenizer = server.state.backend.engine.tokenizer
    return tokenizer.ids.eos_id, tokenizer.spelling(tokenizer.ids.eos_id)


def test_a_reply_that_ends_at_once_has_no_entries(server) -> None:
    eos_id, _ = _eos(server)
    body = chat_body("hi", max_tokens=5, logprobs=True, top_logprobs=2, logit_bias={str(eos_id): 100})
    reply = post(server.url, CHAT, body).json()
    choice = reply["choices"][0]
    assert choice["message"]["content"] == "" and choice["finish_reason"] == "stop"
    assert choice["logprobs"] == {"content": []} and reply["usage"]["completion_tokens"] == 0
    _, _, events = stream(server.url, CHAT, body)
    finish_chunk = events[-2]["choices"][0]
    # The end token's entry rides beside the (empty) logprobs, as on the whole reply (docs/rl-rollouts.md).
    assert finish_chunk.pop("end_token") == {**choice["end_token"], "token_id": eos_id}
    # The weights that chose it (docs/weight-versions.md): the end token is the reply's token 0.
    assert finish_chunk.pop("weight_version_spans") == choice["weight_version_spans"] == [
        {"start": 0, "end": 1, "version": finish_chunk.pop("weight_version")}]
    assert finish_chunk == {"index": 0, "delta": {}, "finish_reason": "stop"}  # no logprobs key: nothing to release
    assert streamed_chat(events) == ("", [], "stop")


@pytest.mark.parametrize("ban", [{"ignore_eos": True}, {"min_tokens": 2}], ids=["ignore_eos", "min_tokens"])
def test_logprobs_are_read_before_the_end_of_turn_ban(server, ban) -> None:
    """The end-of-turn token, biased to certainty but banned, stays the top entry (by its own
    spelling), and the chosen token's logprob is read from the same, unbanned logits."""
    eos_id, spelling = _eos(server)
    body = chat_body("hi", max_tokens=2 if "ignore_eos" in ban else 4, logprobs=True, top_logprobs=2,
                     logit_bias={str(eos_id): 100}, **ban)
    reply = post(server.url, CHAT, body).json()
    choice = reply["choices"][0]
    entries = choice["logprobs"]["content"]
    assert len(entries) == reply["usage"]["completion_tokens"] == 2
    assert choice["finish_reason"] == ("length" if "ignore_eos" in ban else "stop")
    assert spelling not in choice["message"]["content"]
    for entry in entries:
        best, runner_up = entry["top_logprobs"]
        assert best["token"] == spelling and bytes(best["bytes"]) == spelling.encode()
        assert best["logprob"] == pytest.approx(0.0, abs=1e-6)
        assert entry["token"] != spelling and entry["logprob"] < -50
        assert (runner_up["token"], runner_up["logprob"]) == (entry["token"], entry["logprob"])


@pytest.mark.parametrize("field", ["n", "stream", "presence_penalty", "frequency_penalty"])
def test_openai_nullable_fields_accept_null(server, field) -> None:
    response = post(server.url, CHAT, {**chat_body("hi", max_tokens=1), field: None})
    assert response.status_code == 200, response.text


def test_every_reply_names_its_engine(server) -> None:
    """The header a fleet's replies carry; one server names its one engine, streamed or not."""
    ids = set()
    for is_streamed in (False, True):
        reply = httpx.post(f"{server.url}/v1/chat/completions",
                           json=chat_body("hi", max_tokens=2, stream=is_streamed), timeout=60)
        assert reply.status_code == 200
        ids.add(reply.headers["x-batchproof-replica"])
    assert len(ids) == 1 and ids.pop()
