"""Every row of the validation table: status, OpenAI's error envelope, and a message that
names the field and the value it refused; malformed input is never a 500."""

import json

import httpx
import openai
import pytest

from tests.helpers.http import ASCII_PROMPT, assert_error, chat_body, messages, post

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize("raw", [b"", b"{", b"{not json}", b'{"messages": [}', b"\xff\xfe\x00", b"{'a': 1}",
                                 b'{"messages": [{"role": "user", "content": "\xff"}]}'])
def test_body_that_is_not_json_is_400(server, raw) -> None:
    error = assert_error(post(server.url, CHAT, raw, headers={"content-type": "application/json"}), 400)
    assert "JSON" in error["message"]


@pytest.mark.parametrize("raw", [b"[]", b'"messages"', b"42", b"null", b"true", b'[{"role": "user"}]'])
def test_body_that_is_not_an_object_is_400(server, raw) -> None:
    error = assert_error(post(server.url, CHAT, raw), 400)
    assert "object" in error["message"] and repr(json.loads(raw))[:20] in error["message"]


@pytest.mark.parametrize("body, mentions", [
    ({}, ("messages", "required")),
    ({"messages": []}, ("messages", "[]")),
    ({"messages": None}, ("messages", "None")),
    ({"messages": "hi"}, ("messages", "'hi'")),
    ({"messages": [{"content": "hi"}]}, ("messages.0.role",)),
    ({"messages": [{"role": "user"}]}, ("messages.0.content",)),
    ({"messages": [{"role": "robot", "content": "hi"}]}, ("messages.0.role", "'robot'")),
    ({"messages": [{"role": "user", "content": 5}]}, ("messages.0.content", "5")),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "text": "x"}]}]}, ("messages.0.content",)),
    ({"messages": ["hi"]}, ("messages.0", "'hi'")),
], ids=["missing", "empty", "null", "string", "no-role", "no-content", "unknown-role", "int-content", "image-part",
        "bare-string"])
def test_bad_messages_are_400(server, body, mentions) -> None:
    assert_error(post(server.url, CHAT, {**body, "max_tokens": 1}), 400, param="messages", mentions=mentions)


@pytest.mark.parametrize("value", [-1, 2.5, "3", True, [1]])
def test_top_logprobs_not_a_count_is_422(server, value) -> None:
    body = chat_body("hi", max_tokens=1, logprobs=True, top_logprobs=value)
    assert_error(post(server.url, CHAT, body), 422, param="top_logprobs", mentions=("top_logprobs", repr(value)))


def test_top_logprobs_above_the_cap_is_400_naming_the_cap(server) -> None:
    body = chat_body("hi", max_tokens=1, logprobs=True, top_logprobs=21)
    assert_error(post(server.url, CHAT, body), 400, param="top_logprobs",
                 mentions=("'top_logprobs' is 21", "--max-logprobs 20"))


@pytest.mark.parametrize("value", ["yes", 1, 0, "true", [True]])
def test_logprobs_not_a_boolean_is_422(server, value) -> None:
    body = chat_body("hi", max_tokens=1, logprobs=value)
    assert_error(post(server.url, CHAT, body), 422, param="logprobs", mentions=("logprobs", repr(value)))


@pytest.mark.parametrize("logprobs", [{}, {"logprobs": False}, {"logprobs": None}], ids=["absent", "false", "null"])
def test_top_logprobs_without_logprobs_true_is_400_naming_both(server, logprobs) -> None:
    body = chat_body("hi", max_tokens=1, top_logprobs=2, **logprobs)
    assert_error(post(server.url, CHAT, body), 400, param="top_logprobs",
                 mentions=("'top_logprobs' (2)", "'logprobs'"))


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [0, -3])
def test_max_tokens_below_one_is_400(server, field, value) -> None:
    assert_error(post(server.url, CHAT, chat_body("hi", **{field: value})), 400, param=field,
                 mentions=(f"'{field}'", f"got {value}"))


def _prompt_len(server, content: str) -> int:
    return post(server.url, "/tokenize", {"messages": messages(content)}).json()["count"]


def test_prompt_plus_max_tokens_beyond_the_context_is_400_with_the_counts(server) -> None:
    context = server.state.front.max_model_len
    prompt_len = _prompt_len(server, "hi")
    asked = context - prompt_len + 1
    error = assert_error(post(server.url, CHAT, chat_body("hi", max_tokens=asked)), 400, param="max_tokens",
                         mentions=(str(context), str(prompt_len), str(asked), str(prompt_len + asked)))
    assert "context" in error["message"]
    fits = post(server.url, CHAT, chat_body("hi", max_tokens=1))  # the boundary itself is fine
    assert fits.status_code == 200


def test_prompt_beyond_the_context_is_400_with_the_counts(server) -> None:
    context = server.state.front.max_model_len
    content = "hi " * context
    prompt_len = _prompt_len(server, content)
    assert prompt_len > context
    assert_error(post(server.url, CHAT, chat_body(content, max_tokens=1)), 400, param="messages",
                 mentions=(str(context), str(prompt_len)))


@pytest.mark.parametrize("field, value, status", [
    ("temperature", -1, 422), ("temperature", 3, 422), ("temperature", 2.0001, 422), ("temperature", "0", 422),
    ("top_p", 0, 422), ("top_p", 1.5, 422), ("top_p", -0.1, 422),
    ("n", 17, 400), ("n", 0, 400), ("n", "1", 422),
    ("presence_penalty", 2.5, 422), ("frequency_penalty", -3, 422), ("top_k", -2, 422), ("min_p", 1.5, 422),
    ("repetition_penalty", 0, 422), ("min_tokens", -1, 422), ("seed", 1.5, 422), ("stream", "yes", 422),
    ("max_tokens", 1.0, 422), ("max_tokens", "4", 422), ("stop", 5, 422), ("logit_bias", {"5": 101}, 422),
    ("ignore_eos", 1, 422), ("model", 5, 422),
])
def test_sampling_fields_out_of_range_name_the_field(server, field, value, status) -> None:
    body = {**chat_body("hi", max_tokens=1), field: value}
    shown = "101" if field == "logit_bias" else repr(value)  # a dict's refused value is its entry
    assert_error(post(server.url, CHAT, body), status, param=field, mentions=(field, shown))


@pytest.mark.parametrize("fields, param, mentions", [
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", ("'stop'", "5")),
    ({"stop": ""}, "stop", ("'stop'", "''")),
    ({"stop": ["a", ""]}, "stop", ("'stop'", "''")),
    ({"logit_bias": {"abc": 1}}, "logit_bias", ("'logit_bias'", "'abc'")),
    ({"logit_bias": {"49152": 1}}, "logit_bias", ("'logit_bias'", "'49152'")),
    ({"logit_bias": {"-1": 1}}, "logit_bias", ("'logit_bias'", "'-1'")),
    ({"stream_options": {"include_usage": True}}, "stream_options", ("'stream_options'", "'stream'")),
    ({"min_tokens": 3}, "min_tokens", ("'min_tokens'", "3", "1")),
])
def test_other_refusals_are_400(server, fields, param, mentions) -> None:
    body = {**chat_body("hi", max_tokens=1), **fields}
    assert_error(post(server.url, CHAT, body), 400, param=param, mentions=mentions)


def test_logit_bias_key_with_a_unicode_digit_is_400(server) -> None:
    body = chat_body("hi", max_tokens=1, logit_bias={"²": 1})
    assert_error(post(server.url, CHAT, body), 400, param="logit_bias", mentions=("'²'",))


def test_wrong_model_is_404_model_not_found(server) -> None:
    body = chat_body("hi", max_tokens=1, model="gpt-4o")
    error = assert_error(post(server.url, CHAT, body), 404, param="model", code="model_not_found",
                         mentions=("'gpt-4o'", server.state.served_model_name))
    assert error["type"] == "invalid_request_error"
    legacy = post(server.url, "/v1/completions", {"prompt": "hi", "max_tokens": 1, "model": "gpt-4o"})
    assert_error(legacy, 404, param="model", code="model_not_found", mentions=("'gpt-4o'",))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="gpt-4o", messages=messages("hi"), max_tokens=1)
    assert raised.value.code == "model_not_found" and raised.value.param == "model"


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/images/generations", "/v1/moderations", "/v1/audio/speech"])
@pytest.mark.parametrize("method", ["POST", "GET"])
def test_routes_that_cannot_compute_logprobs_are_501_naming_the_path(server, path, method) -> None:
    response = httpx.request(method, server.url + path, json={"input": "hi", "model": "x"})
    error = assert_error(response, 501, mentions=(path, method))
    assert error["type"] == "not_implemented_error" and "logprobs" in error["message"]


def test_openai_client_embeddings_gets_a_clear_501(server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as raised:
        client.embeddings.create(model=server.state.served_model_name, input="hi")
    assert raised.value.status_code == 501 and "/v1/embeddings" in raised.value.message


def test_unknown_path_and_wrong_method_use_the_envelope(server) -> None:
    assert_error(httpx.post(server.url + "/v1/nothing-here", json={}), 404, code="not_found",
                 mentions=("/v1/nothing-here",))
    assert_error(httpx.get(server.url + CHAT), 405, mentions=(CHAT, "GET"))


@pytest.mark.parametrize("raw", [
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": NaN}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 1e999}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "top_p": -Infinity}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 99999999999999999999999999999}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logit_bias": {"5": NaN}}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logit_bias": []}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "stream_options": 1}',
    b'{"messages": [{"role": "user", "content": "hi"}], "messages": [], "max_tokens": 1}',
    b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 1}',
    b"[" * 5000 + b"]" * 5000,
    b'{"messages": ' + b"[" * 3000 + b"]" * 3000 + b"}",
])
def test_malformed_input_is_4xx_never_500(server, raw) -> None:
    response = post(server.url, CHAT, raw)
    assert 400 <= response.status_code < 500, response.text
    assert_error(response, response.status_code)
    assert post(server.url, CHAT, chat_body("hi", max_tokens=1)).status_code == 200


def test_fields_ignored_on_purpose_change_nothing(server) -> None:
    plain = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=3)).json()
    extra = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=3, parallel_tool_calls=False,
                                             metadata={"a": "b"}, store=False)).json()
    assert plain["choices"] == extra["choices"]


def test_tokenize_and_detokenize_validate_too(server) -> None:
    assert_error(post(server.url, "/tokenize", {}), 400, param="prompt", mentions=("'prompt'", "'messages'"))
    assert_error(post(server.url, "/tokenize", {"prompt": 5}), 400, param="prompt", mentions=("prompt", "5"))
    assert_error(post(server.url, "/detokenize", {"tokens": [1, 10 ** 6]}), 400, param="tokens",
                 mentions=("'tokens'", str(10 ** 6)))
    assert_error(post(server.url, "/detokenize", {"tokens": [-1]}), 400, param="tokens", mentions=("-1",))
    assert_error(post(server.url, "/detokenize", {"tokens": "1 2"}), 400, param="tokens", mentions=("'1 2'",))
    assert_error(post(server.url, "/detokenize", b"nope"), 400)
