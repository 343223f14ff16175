"""Fail closed on fields: unknown ones and known ones we do not implement are a 400 naming the
field; the documented few are accepted and ignored; the openai client's own requests pass."""

import httpx
import openai
import pytest

from batchproof.server.chat.protocol import ChatCompletionRequest
from batchproof.server.completions.protocol import CompletionRequest
from batchproof.server.request.unsupported_fields import IGNORED_FIELDS
from tests.helpers.http import ASCII_PROMPT, assert_error, chat_body, post

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("path, body", [
    (CHAT, chat_body("hi", max_tokens=1, frobnicate=1)),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 1, "frobnicate": 1}),
    (CHAT, {"messages": [{"role": "user", "content": "hi", "frobnicate": 1}], "max_tokens": 1}),
    (CHAT, chat_body("hi", max_tokens=1, stream=True, stream_options={"include_usage": True, "frobnicate": 1})),
    ("/tokenize", {"prompt": "hi", "frobnicate": 1}),
    ("/detokenize", {"tokens": [1], "frobnicate": 1}),
], ids=["chat", "completions", "message", "stream_options", "tokenize", "detokenize"])
def test_an_unknown_field_is_400_naming_it(server, path, body) -> None:
    error = assert_error(post(server.url, path, body), 400, mentions=("frobnicate", "not a field"))
    assert error["param"] in ("frobnicate", "messages", "stream_options")


@pytest.mark.parametrize("path, field, value", [
    (CHAT, "functions", [TOOL["function"]]),
    (CHAT, "function_call", "auto"),
    (CHAT, "modalities", ["text", "audio"]),
    (CHAT, "reasoning_effort", "high"),
    (COMPLETIONS, "best_of", 2),
    (COMPLETIONS, "suffix", " end"),
])
def test_a_known_field_we_do_not_implement_is_400(server, path, field, value) -> None:
    body = chat_body("hi", max_tokens=1) if path == CHAT else {"prompt": "hi", "max_tokens": 1}
    assert_error(post(server.url, path, {**body, field: value}), 400, param=field,
                 mentions=(f"'{field}'", "not supported"))


@pytest.mark.parametrize("path, fields", [
    (CHAT, {"tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "modalities": ["text"]}),
    (COMPLETIONS, {"best_of": 1, "suffix": ""}),
], ids=["chat", "completions"])
def test_values_that_ask_for_nothing_pass(server, path, fields) -> None:
    body = chat_body(ASCII_PROMPT, max_tokens=2) if path == CHAT else {"prompt": "hi", "max_tokens": 2}
    assert post(server.url, path, {**body, **fields}).status_code == 200


def test_the_ignored_fields_are_declared_on_both_routes() -> None:
    for model in (ChatCompletionRequest, CompletionRequest):
        assert set(IGNORED_FIELDS) <= set(model.model_fields)


def test_ignored_fields_change_nothing(server) -> None:
    plain = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=3)).json()
    ignored = {"user": "u1", "metadata": {"a": "b"}, "store": False, "service_tier": "auto",
               "prompt_cache_key": "k", "safety_identifier": "s"}
    assert set(ignored) == set(IGNORED_FIELDS)
    extra = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=3, **ignored)).json()
    assert plain["choices"] == extra["choices"]
    echoed = [{"role": "user", "content": "hi", "name": "ann"},
              {"role": "assistant", "content": "Hello!", "tool_calls": [], "refusal": None, "function_call": None},
              {"role": "user", "content": ASCII_PROMPT}]
    assert post(server.url, CHAT, {"messages": echoed, "max_tokens": 1}).status_code == 200


def test_what_the_openai_client_sends_passes(server) -> None:
    """Capture the client's bodies (it sends only what it is given, plus nothing by default) and
    check every request it makes here succeeds."""
    sent: list[bytes] = []
    hooks = {"request": [lambda request: sent.append(request.read())]}
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60,
                           http_client=httpx.Client(event_hooks=hooks))
    model = server.state.served_model_name
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    client.completions.create(model=model, prompt="hi", max_tokens=2)
    events = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=2, stream=True, stream_options={"include_usage": True})
    assert [e for e in events][-1].usage.completion_tokens == 2
    assert len(sent) == 3
    assert b'"tools"' not in b"".join(sent)
