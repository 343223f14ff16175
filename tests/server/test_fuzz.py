"""Fuzzing the server: schemathesis over its own OpenAPI document (valid and invalid bodies
for every route), then hypothesis with arbitrary JSON in every field. No answer may be a
5xx, an SSE stream that fails, or a hang.

Generation cost is capped in the schema (max_tokens required, at most 2) and in the
engine (a fresh one with a 96-token context, so even a body that drops the cap stops
within a few seconds)."""

import collections
import copy
import json
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.helpers.live_server import live_server

FUZZ_ENGINE = {"max_batch": 4, "max_model_len": 96}
MAX_EXAMPLES = 500
ARBITRARY_EXAMPLES = 250
REQUEST_TIMEOUT_S = 30
GENERATING_BODIES = {"ChatCompletionRequest": ("max_tokens", "max_completion_tokens"),
                     "CompletionRequest": ("max_tokens",), "ResponsesRequest": ("max_output_tokens",)}


def capped(schema: dict, served_model: str, vocab_size: int) -> dict:
    """The server's schema with cheap replies (every token budget required, at most 2) and a
    positive space narrowed to requests the engine will run; negative mode still breaks it all."""
    schema = copy.deepcopy(schema)
    components = schema["components"]["schemas"]
    short_text = {"type": "string", "maxLength": 30}
    components["ChatMessage"]["properties"]["content"]["anyOf"][0] = short_text
    components["TextPart"]["properties"]["text"] = short_text
    components["DetokenizeRequest"]["properties"]["tokens"]["items"].update(minimum=0, maximum=vocab_size - 1)
    for name, budgets in GENERATING_BODIES.items():
        body = components[name]
        props = body["properties"]
        for field in budgets:
            props[field] = {"type": "integer", "minimum": 1, "maximum": 2}
        body["required"] = sorted({*body.get("required", []), *budgets})
        props["model"] = {"enum": [served_model, None]}
        props["min_tokens"] = {"type": "integer", "minimum": 0, "maximum": 1}
        props["stop"] = {"anyOf": [{"type": "string", "minLength": 1},
                                   {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4},
                                   {"type": "null"}]}
        if "n" in props:  # the chat and completions bodies
            props["n"] = {"enum": [1]}
            props["logit_bias"]["anyOf"][0]["propertyNames"] = {"pattern": "^[0-9]{1,4}$"}
    components["ResponsesRequest"]["properties"]["input"]["anyOf"][0] = short_text
    components["ChatCompletionRequest"]["properties"]["messages"]["minItems"] = 1
    components["CompletionRequest"]["properties"]["prompt"] = {"anyOf": [
        {"type": "string", "minLength": 1, "maxLength": 30},
        {"type": "array", "minItems": 1, "maxItems": 30,
         "items": {"type": "integer", "minimum": 0, "maximum": vocab_size - 1}}]}
    return schema


def _content_type(response) -> str:
    value = response.headers.get("content-type", "")  # schemathesis keeps each header as a list
    return value[0] if isinstance(value, list) else value


def _check_body(response, case) -> None:
    """Beyond 'no 5xx': errors in OpenAI's envelope, streams that end with [DONE]."""
    status = response.status_code
    assert status < 500, f"{status} for {case.method} {case.path} {case.body!r}: {response.text[:500]}"
    if status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], response.text
    elif _content_type(response).startswith("text/event-stream"):
        assert _stream_completed(response.text), f"a stream that failed: {response.text[-500:]}"


def _stream_completed(text: str) -> bool:
    """Chat and completions end with [DONE]; the Responses API with its completed (or incomplete) response."""
    last = text.rstrip("\n").rsplit("\n\n", 1)[-1]
    return text.endswith("data: [DONE]\n\n") or last.startswith(("event: response.completed\n",
                                                                   "event: response.incomplete\n"))


@pytest.fixture(scope="module")
def fuzz_server():
    with live_server(None, engine_settings=FUZZ_ENGINE) as live:
        yield live


def test_fuzz_the_openapi_schema_finds_no_server_error_and_no_hang(fuzz_server) -> None:
    schema_dict = httpx.get(fuzz_server.url + "/openapi.json").json()
    engine = fuzz_server.state.backend.engine
    schema = schemathesis.openapi.from_dict(capped(schema_dict, fuzz_server.state.served_model_name,
                                                   engine.tokenizer.vocab_size))
    strategy = st.one_of(schema.as_strategy(generation_mode=GenerationMode.POSITIVE),
                         schema.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    statuses: collections.Counter = collections.Counter()
    slowest = [0.0]

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case) -> None:
        started = time.monotonic()
        response = case.call(base_url=fuzz_server.url, timeout=REQUEST_TIMEOUT_S)
        slowest[0] = max(slowest[0], time.monotonic() - started)
        statuses[(case.operation.label, response.status_code)] += 1
        case.validate_response(response, checks=[not_a_server_error])
        _check_body(response, case)

    started = time.monotonic()
    run()
    elapsed = time.monotonic() - started
    total = sum(c for (_, s), c in statuses.items() if isinstance(s, int))
    by_status = collections.Counter()
    for (_, status), count in statuses.items():
        by_status[status] += count
    print(f"\nfuzz: {total} cases in {elapsed:.0f} s (slowest {slowest[0]:.1f} s); statuses {dict(by_status)}")
    for (label, status), count in sorted(statuses.items(), key=str):
        print(f"  {label}: {status} x{count}")
    assert total >= MAX_EXAMPLES // 2
    generated = sum(c for (label, s), c in statuses.items() if s == 200 and ("completions" in label
                                                                             or "responses" in label))
    assert generated >= 10, "the fuzz hardly ever reached the engine"
    assert any(s == 400 for _, s in statuses) and any(s == 422 for _, s in statuses)
    # The server is still whole: idle, healthy, and answering.
    state = fuzz_server.state
    assert state.backend.failure is None and state.backend.num_running == 0
    assert httpx.get(fuzz_server.url + "/health").json() == {"status": "ok"}
    reply = httpx.post(fuzz_server.url + "/v1/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": True})
    assert reply.status_code == 200 and len(reply.json()["choices"][0]["logprobs"]["content"]) == 2


# Arbitrary JSON for every field of the two generating bodies (known bugs are not sent).
_PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
_SCALARS = (st.none() | st.booleans() | st.integers()
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(max_size=12))
JSON_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(_PRINTABLE, max_size=6), inner, max_size=4), max_leaves=8)
FIELDS = {
    "/v1/chat/completions": ["messages", "model", "temperature", "top_p", "n", "stop", "seed", "stream",
                             "stream_options", "presence_penalty", "frequency_penalty", "logit_bias", "user",
                             "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "logprobs",
                             "top_logprobs", "structured_outputs", "response_format", "tools", "tool_choice",
                             "cache_salt", "receipt", "unknown"],
    "/v1/completions": ["prompt", "model", "temperature", "top_p", "n", "stop", "seed", "stream", "stream_options",
                        "logit_bias", "top_k", "min_p", "ignore_eos", "min_tokens", "logprobs", "echo",
                        "structured_outputs", "response_format", "cache_salt", "receipt", "unknown"],
    "/v1/responses": ["input", "model", "instructions", "temperature", "top_p", "include", "top_logprobs", "text",
                      "tools", "tool_choice", "stream", "store", "previous_response_id", "metadata", "cache_salt",
                      "receipt", "unknown"],
}
# Now and then a value of the field's own shape with arbitrary insides, so the fuzz reaches the
# grammar compiler, the tool planner and the metadata check rather than stopping at the type check.
_TEXT = st.text(max_size=40) | st.sampled_from(["", "x", "\n" * 50, "root ::= \"a\"", "start: \"a\"",
                                                "root ::= (", "[a-", "(?P<", "a{99999}"])
_SCHEMAS = st.dictionaries(st.sampled_from(["type", "properties", "items", "enum", "pattern", "minLength",
                                            "required", "anyOf", "$ref", "maxItems"]), JSON_VALUES, max_size=3)
SHAPED = {
    "structured_outputs": st.one_of(st.builds(lambda t: {"grammar": t}, _TEXT),
                                    st.builds(lambda t: {"regex": t}, _TEXT),
                                    st.builds(lambda s: {"json": s}, _SCHEMAS),
                                    st.builds(lambda c: {"choice": c}, st.lists(_TEXT, max_size=3))),
    "response_format": st.builds(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}},
                                 _SCHEMAS),
    "tools": st.lists(st.builds(lambda n, p: {"type": "function", "function": {"name": n, "parameters": p}},
                                st.text(_PRINTABLE, max_size=8), _SCHEMAS), max_size=3),
    "tool_choice": st.sampled_from(["auto", "required", "none", {"type": "function", "function": {"name": "f"}}]),
    "metadata": st.dictionaries(st.text(max_size=70), st.text(max_size=20), max_size=20),
    "cache_salt": _TEXT,
}


def _value(field: str):
    shaped = SHAPED.get(field)
    return JSON_VALUES if shaped is None else st.one_of(JSON_VALUES, shaped)


BASE = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]}, "/v1/completions": {"prompt": "hi"},
        "/v1/responses": {"input": "hi"}}
BUDGET = {"/v1/responses": "max_output_tokens"}


@st.composite
def arbitrary_bodies(draw) -> tuple[str, bytes]:
    path = draw(st.sampled_from(sorted(FIELDS)))
    if draw(st.integers(0, 9)) == 0:  # now and then, a body that is not a request at all
        return path, draw(st.binary(max_size=40) | JSON_VALUES.map(lambda v: json.dumps(v).encode()))
    names = draw(st.lists(st.sampled_from(FIELDS[path]), max_size=3, unique=True))
    fields = {name: draw(_value(name)) for name in names}
    budget = {BUDGET.get(path, "max_tokens"): draw(st.integers(-1, 2))}
    return path, json.dumps({**BASE[path], **fields, **budget}).encode()


def test_arbitrary_json_in_every_field_finds_no_server_error(fuzz_server) -> None:
    statuses: collections.Counter = collections.Counter()

    @settings(max_examples=ARBITRARY_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(request=arbitrary_bodies())
    def run(request: tuple[str, bytes]) -> None:
        path, body = request
        response = httpx.post(fuzz_server.url + path, content=body, timeout=REQUEST_TIMEOUT_S,
                              headers={"content-type": "application/json"})
        statuses[response.status_code] += 1
        assert response.status_code < 500, f"{path} {body!r}: {response.status_code} {response.text[:300]}"
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
        elif response.headers["content-type"].startswith("text/event-stream"):
            assert _stream_completed(response.text), response.text[-300:]

    run()
    print(f"\narbitrary JSON: {sum(statuses.values())} requests; statuses {dict(statuses)}")
    assert statuses[200] >= 5 and statuses[400] + statuses[422] >= 50
    assert fuzz_server.state.backend.failure is None
