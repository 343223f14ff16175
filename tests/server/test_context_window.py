"""The context window's edge, on both routes: prompt + max_tokens == max_model_len is served
to the last position; one token more is a 400 naming the field. Counted as vLLM counts."""

import pytest

from tests.helpers.http import assert_error, post
from tests.helpers.live_server import live_server

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def small():
    with live_server(None, engine_settings={"max_batch": 2, "max_model_len": MAX_MODEL_LEN}) as live:
        yield live


def prompt_ids(n: int) -> list[int]:
    return [28, 1675, 314, 253][:1] * n  # any ids; the count is what matters


@pytest.mark.parametrize("prompt_len", [1, 40, MAX_MODEL_LEN - 1])
def test_completions_fill_the_window_exactly(small, prompt_len):
    room = MAX_MODEL_LEN - prompt_len
    body = {"prompt": prompt_ids(prompt_len), "max_tokens": room, "temperature": 0, "ignore_eos": True,
            "logprobs": 1}
    reply = post(small.url, "/v1/completions", body)
    assert reply.status_code == 200, reply.text
    doc = reply.json()
    usage = doc["usage"]
    assert usage.pop("prompt_tokens_details")["cached_tokens"] < prompt_len  # its prefix may be cached
    assert usage == {"prompt_tokens": prompt_len, "completion_tokens": room, "total_tokens": MAX_MODEL_LEN}
    assert doc["choices"][0]["finish_reason"] == "length"
    assert len(doc["choices"][0]["logprobs"]["tokens"]) == room

    one_more = post(small.url, "/v1/completions", {**body, "max_tokens": room + 1})
    assert_error(one_more, 400, param="max_tokens", mentions=(f"maximum context length is {MAX_MODEL_LEN}",))


def test_a_prompt_that_fills_the_window_leaves_no_room_to_generate(small):
    reply = post(small.url, "/v1/completions", {"prompt": prompt_ids(MAX_MODEL_LEN), "max_tokens": 1})
    assert_error(reply, 400, mentions=(f"maximum context length is {MAX_MODEL_LEN}",))
    # ...but it can still be scored: echo with max_tokens 0 generates nothing
    scored = post(small.url, "/v1/completions", {"prompt": prompt_ids(MAX_MODEL_LEN), "max_tokens": 0, "echo": True,
                                                 "logprobs": 0})
    assert scored.status_code == 200, scored.text
    assert len(scored.json()["choices"][0]["logprobs"]["token_logprobs"]) == MAX_MODEL_LEN


def test_chat_fills_the_window_exactly(small):
    messages = [{"role": "user", "content": "Count upwards from one, forever."}]
    counted = post(small.url, "/tokenize", {"messages": messages, "add_generation_prompt": True}).json()["count"]
    room = MAX_MODEL_LEN - counted
    body = {"messages": messages, "max_tokens": room, "temperature": 0, "ignore_eos": True, "logprobs": True}
    reply = post(small.url, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["total_tokens"] == MAX_MODEL_LEN
    assert len(reply.json()["choices"][0]["logprobs"]["content"]) == room
    assert_error(post(small.url, "/v1/chat/completions", {**body, "max_tokens": room + 1}), 400, param="max_tokens")
    omitted = post(small.url, "/v1/chat/completions", {**body, "max_tokens": None})
    assert omitted.status_code == 200 and omitted.json()["usage"]["total_tokens"] == MAX_MODEL_LEN
