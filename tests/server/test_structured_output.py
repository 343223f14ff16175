"""Structured output (response_format, vLLM's structured_outputs) through the official openai
client: every reply matches its constraint, refusals name what cannot be enforced, and the
logprobs say which distribution they are (raw: the model's own; processed: masked)."""

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pydantic
import pytest

from tests.helpers.http import chat_body, chunks, post, stream

# The acceptance schema: a nested object, an enum, an array with minItems, a pattern string.
PET_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,11}$"},
        "kind": {"enum": ["cat", "dog", "fish"]},
        "toys": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 3},
        "owner": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120},
                                                   "vaccinated": {"type": "boolean"}},
                  "required": ["age", "vaccinated"], "additionalProperties": False},
    },
    "required": ["name", "kind", "toys", "owner"],
    "additionalProperties": False,
}
PET_FORMAT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET_SCHEMA, "strict": True}}
PROMPT = "Describe a pet as JSON."


class Pet(pydantic.BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def _chat(client: openai.OpenAI, **fields):
    return client.chat.completions.create(model=client.models.list().data[0].id,
                                          messages=[{"role": "user", "content": PROMPT}], **fields)


def test_parse_with_a_pydantic_model(client) -> None:
    reply = client.chat.completions.parse(model=client.models.list().data[0].id, response_format=Pet,
                                          messages=[{"role": "user", "content": PROMPT}], max_tokens=60,
                                          temperature=0)
    assert isinstance(reply.choices[0].message.parsed, Pet)
    assert reply.choices[0].finish_reason == "stop"


def test_every_json_schema_reply_validates_greedy_and_sampled(client) -> None:
    greedy = _chat(client, response_format=PET_FORMAT, max_tokens=120, temperature=0)
    sampled = _chat(client, response_format=PET_FORMAT, max_tokens=120, temperature=1.0, seed=7, n=8)
    for choice in greedy.choices + sampled.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PET_SCHEMA)


def test_json_object_regex_choice_and_grammars(client) -> None:
    reply = _chat(client, response_format={"type": "json_object"}, max_tokens=60, temperature=0)
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    cases = [({"regex": r"[0-9]{3}-[a-z]{2,4}"}, r"[0-9]{3}-[a-z]{2,4}"),
             ({"choice": ["red", "green", "blue"]}, r"red|green|blue"),
             ({"grammar": 'start: "ab" NUM\nNUM: /[0-9]+/'}, r"ab[0-9]+"),  # Lark
             ({"grammar": 'root ::= "x" [a-c]{2}'}, r"x[a-c]{2}")]  # llama.cpp's GBNF
    for structured, pattern in cases:
        reply = _chat(client, extra_body={"structured_outputs": structured}, max_tokens=12, temperature=0.8, seed=1)
        assert re.fullmatch(pattern, reply.choices[0].message.content), (structured, reply.choices[0].message.content)


def test_stop_strings_and_max_tokens_cut_a_constrained_reply(client) -> None:
    cut = _chat(client, extra_body={"structured_outputs": {"regex": "[a-z]{2,6}( [a-z]{2,6}){3}"}}, stop=[" "],
                max_tokens=20, temperature=0.8, seed=4)
    assert cut.choices[0].finish_reason == "stop" and " " not in cut.choices[0].message.content
    short = _chat(client, response_format=PET_FORMAT, max_tokens=5, temperature=0)
    assert short.choices[0].finish_reason == "length" and short.choices[0].message.content.startswith("{")


def test_completions_route_takes_the_same_constraints(server) -> None:
    body = {"prompt": "Colour:", "max_tokens": 8, "temperature": 0, "logprobs": 2,
            "structured_outputs": {"choice": [" red", " blue"]}}
    reply = post(server.url, "/v1/completions", body).json()
    choice = reply["choices"][0]
    assert choice["text"] in (" red", " blue") and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["constraint"] == "choice" and choice["logprobs"]["logprobs_mode"] == "raw"


@pytest.mark.parametrize(("fields", "param", "says"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}}},
     "response_format", "not"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "format": "no-such-format"}}}}, "response_format", "no-such-format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema",
     "schema"),
    ({"structured_outputs": {"regex": "(?=a)b"}}, "structured_outputs", "look-around"),
    ({"structured_outputs": {"grammar": "start: undefined_rule"}}, "structured_outputs", "undefined_rule"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "at least one"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs", "structural_tag"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs",
     "both"),
])
def test_what_cannot_be_enforced_is_a_400_naming_it(server, fields, param, says) -> None:
    response = post(server.url, "/v1/chat/completions", chat_body("hi", max_tokens=4, **fields))
    error = response.json()["error"]
    assert response.status_code == 400, error
    assert error["param"] == param and says in error["message"], error


def test_an_unknown_format_type_is_a_422_naming_it(server) -> None:  # a type error, as every field's
    response = post(server.url, "/v1/chat/completions", chat_body("hi", response_format={"type": "xml"}))
    error = response.json()["error"]
    assert response.status_code == 422 and error["param"] == "response_format" and "'xml'" in error["message"]


def test_a_grammar_that_leaves_no_token_is_a_clear_error(server) -> None:
    """min_tokens past the grammar's end: never a 500, never a token outside the grammar."""
    body = chat_body("yes or no?", max_tokens=6, min_tokens=4, structured_outputs={"choice": ["yes", "no"]})
    response = post(server.url, "/v1/chat/completions", body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "grammar_exhausted", error
    assert "grammar" in error["message"] and "min_tokens" in error["message"]
    events = stream(server.url, "/v1/chat/completions", body)[2]
    assert events[-1] != "[DONE]" and events[-1]["error"]["code"] == "grammar_exhausted"


def _entries(choice: dict) -> list[tuple]:
    return [(e["token"], e["logprob"], [(t["token"], t["logprob"]) for t in e["top_logprobs"]])
            for e in choice["logprobs"]["content"]]


def test_raw_logprobs_are_the_models_own_and_processed_ones_are_masked(server) -> None:
    options = ["yes", "no", "maybe"]
    base = chat_body("Answer yes or no: is the sky blue?", max_tokens=4, logprobs=True, top_logprobs=5)
    free = post(server.url, "/v1/chat/completions", base).json()["choices"][0]
    raw = post(server.url, "/v1/chat/completions", {**base, "structured_outputs": {"choice": options}}).json()
    processed = post(server.url, "/v1/chat/completions", {**base, "structured_outputs": {"choice": options},
                                                          "logprobs_mode": "processed"}).json()
    raw, processed = raw["choices"][0], processed["choices"][0]
    assert raw["logprobs"]["logprobs_mode"] == "raw" and processed["logprobs"]["logprobs_mode"] == "processed"
    assert raw["logprobs"]["constraint"] == processed["logprobs"]["constraint"] == "choice"
    assert "constraint" not in free["logprobs"]  # no mask, nothing to say
    # Raw: the first step's whole entry (the chosen token's logprob aside) is the free request's.
    assert _entries(raw)[0][2] == _entries(free)[0][2]
    # Processed: a distribution over the allowed tokens only (each a prefix of an option).
    first = processed["logprobs"]["content"][0]
    assert first["top_logprobs"] and all(any(o.startswith(t["token"]) for o in options)
                                         for t in first["top_logprobs"])
    assert sum(math.exp(t["logprob"]) for t in first["top_logprobs"]) <= 1 + 1e-6
    assert first["logprob"] >= _entries(raw)[0][1]  # renormalised over fewer tokens: never lower


def test_processed_alternatives_are_only_allowed_tokens(server) -> None:
    """A grammar that allows one token at a step lists that one, not four impossible ones."""
    body = chat_body("Say hi", max_tokens=4, logprobs=True, top_logprobs=5, logprobs_mode="processed",
                     structured_outputs={"regex": "hello"})
    for entry in post(server.url, "/v1/chat/completions", body).json()["choices"][0]["logprobs"]["content"]:
        assert [t["token"] for t in entry["top_logprobs"]] == [entry["token"]] and entry["logprob"] == 0.0


def test_streamed_equals_whole(server) -> None:
    body = chat_body(PROMPT, max_tokens=60, logprobs=True, top_logprobs=2, response_format=PET_FORMAT)
    whole = post(server.url, "/v1/chat/completions", body).json()["choices"][0]
    parts = chunks(stream(server.url, "/v1/chat/completions", body)[2])
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in parts if c["choices"])
    streamed = [e for c in parts if c["choices"] and c["choices"][0].get("logprobs")
                for e in c["choices"][0]["logprobs"]["content"]]
    assert text == whole["message"]["content"] and streamed == whole["logprobs"]["content"]
    labels = {(c["choices"][0]["logprobs"]["constraint"], c["choices"][0]["logprobs"]["logprobs_mode"])
              for c in parts if c["choices"] and c["choices"][0].get("logprobs")}
    assert labels == {("json_schema", "raw")}


def test_concurrent_http_requests_match_alone(server) -> None:
    bodies = [chat_body(PROMPT, max_tokens=20, logprobs=True, top_logprobs=1,
                        **({"response_format": PET_FORMAT} if i % 2 else {})) for i in range(8)]
    alone = [_entries(post(server.url, "/v1/chat/completions", b).json()["choices"][0]) for b in bodies[:2]]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda b: post(server.url, "/v1/chat/completions", b).json(), bodies))
    for i, reply in enumerate(together):
        assert _entries(reply["choices"][0]) == alone[i % 2]
