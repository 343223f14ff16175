"""Receipts on replies (docs/receipts.md), through the official openai client and raw HTTP: one
per choice on chat, completions and Responses, the streamed one (on a choice's last chunk, the
completed event's response) equal to the whole reply's, every one held to the JSON Schema, the
seed a sampled request lacked named, `--receipts always` attaching them unasked, and a scored
prompt (prompt_logprobs, echo, prompt_token_id_logprobs) named and digested by each choice."""

import hashlib
import json
from importlib import resources

import httpx
import jsonschema
import openai
import pytest

from batchproof.engine.sampling.draws import STREAM
from tests.helpers.http import ASCII_PROMPT, assert_error, chat_body, chunks, messages, post, stream
from tests.helpers.live_server import live_server

SCHEMA = json.loads(resources.files("batchproof.notary").joinpath("receipts/receipt.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _held_to_schema(receipt: dict) -> dict:
    VALIDATOR.validate(receipt)
    return receipt


def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_chat_streamed_and_whole_carry_the_same_receipt(server):
    client = _client(server)
    asked = dict(model=server.state.served_model_name, messages=messages(ASCII_PROMPT), max_tokens=6,
                 temperature=0, logprobs=True, top_logprobs=2, extra_body={"receipt": True})
    whole = client.chat.completions.create(**asked).model_dump()
    receipt = _held_to_schema(whole["choices"][0]["receipt"])
    streamed = [chunk.model_dump() for chunk in client.chat.completions.create(**asked, stream=True)]
    carrying = [c for chunk in streamed for c in chunk["choices"] if c.get("receipt")]
    assert len(carrying) == 1 and carrying[0]["finish_reason"] is not None  # on the choice's last chunk
    assert carrying[0]["receipt"] == receipt
    entries = whole["choices"][0]["logprobs"]["content"]
    assert len(receipt["output_token_ids"]) == len(entries) == whole["usage"]["completion_tokens"]
    assert receipt["params"]["top_logprobs"] == 2 and receipt["params"]["generator"] is None
    assert receipt["model"]["chat_template_sha256"] is not None and receipt["logprobs_sha256"] is not None


def test_server_info_names_what_receipts_name(server):
    info = httpx.get(server.url + "/v1/server_info", timeout=30).json()
    reply = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=2, receipt=True)).json()
    receipt = reply["choices"][0]["receipt"]
    assert receipt["model"] == {"sha256": info["model_sha256"], "numerics_id": info["numerics_id"],
                                "tokenizer_sha256": info["tokenizer_sha256"],
                                "chat_template_sha256": info["chat_template_sha256"]}
    assert info["server"]["receipts"] == "on_request"


def test_completions_one_receipt_per_choice_and_a_seed_for_each(server):
    body = {"prompt": ["Once upon a time", "The capital of France"], "max_tokens": 5, "n": 2, "temperature": 0.9,
            "logprobs": 1, "receipt": True}
    reply = post(server.url, COMPLETIONS, body).json()
    receipts = [_held_to_schema(choice["receipt"]) for choice in reply["choices"]]
    assert len(receipts) == 4
    seeds = [r["params"]["seed"] for r in receipts]
    assert all(isinstance(s, int) for s in seeds) and len(set(seeds)) == 4  # each unseeded choice given one
    assert {r["params"]["generator"] for r in receipts} == {STREAM}
    assert receipts[0]["prompt_token_ids"] == receipts[1]["prompt_token_ids"] != receipts[2]["prompt_token_ids"]
    assert all(r["model"]["chat_template_sha256"] is None for r in receipts)  # no template rendered a text prompt
    seeded = post(server.url, COMPLETIONS, {**body, "seed": 11}).json()
    assert [c["receipt"]["params"]["seed"] for c in seeded["choices"]] == [11, 12, 11, 12]  # choice j: seed + j
    _, _, events = stream(server.url, COMPLETIONS, {**body, "seed": 11})
    streamed = {c["index"]: c["receipt"] for chunk in chunks(events) for c in chunk["choices"] if "receipt" in c}
    assert [streamed[i] for i in range(4)] == [c["receipt"] for c in seeded["choices"]]


def test_responses_carry_it_on_the_response_streamed_or_not(server):
    client = _client(server)
    asked = dict(model=server.state.served_model_name, input=ASCII_PROMPT, max_output_tokens=6, temperature=0,
                 top_logprobs=1, include=["message.output_text.logprobs"], extra_body={"receipt": True})
    whole = client.responses.create(**asked).model_dump()
    receipt = _held_to_schema(whole["receipt"])
    events = list(client.responses.create(**asked, stream=True))
    completed = [e.response.model_dump() for e in events if e.type in ("response.completed", "response.incomplete")]
    assert len(completed) == 1 and completed[0]["receipt"] == receipt
    stored = client.responses.retrieve(whole["id"]).model_dump()
    assert stored["receipt"] == receipt  # kept with the stored response


def test_no_receipt_unless_asked(server):
    for asked in ({}, {"receipt": False}):
        reply = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=2, **asked)).json()
        assert "receipt" not in reply["choices"][0]


@pytest.mark.parametrize("value", ["yes", 1, None, {"on": True}])
def test_receipt_takes_true_or_false_only(server, value):
    response = post(server.url, CHAT, {**chat_body(ASCII_PROMPT, max_tokens=2), "receipt": value})
    if value is None:  # null is the field left out
        assert response.status_code == 200
    else:  # a wrong type is a 422 naming the field, as for every boolean field
        assert_error(response, 422, param="receipt", mentions=("receipt",))


def test_receipts_always_attaches_one_to_every_reply(engine):
    with live_server(engine, receipts="always") as live:
        chat = post(live.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=2)).json()
        completion = post(live.url, COMPLETIONS, {"prompt": [1, 2, 3], "max_tokens": 2, "receipt": False}).json()
        response = post(live.url, "/v1/responses", {"input": ASCII_PROMPT, "max_output_tokens": 2}).json()
    for receipt in (chat["choices"][0]["receipt"], completion["choices"][0]["receipt"], response["receipt"]):
        _held_to_schema(receipt)
    assert completion["choices"][0]["receipt"]["prompt_token_ids"] == [1, 2, 3]


def test_a_reply_chosen_by_weights_swapped_out_names_no_file():
    """reply/receipt.py alone: the weights a reply's tokens came from are named only while they serve."""
    from batchproof.engine.outputs import RequestOutput, VersionSpan
    from batchproof.engine.sampling.params import SamplingParams
    from batchproof.server.reply.receipt import ReceiptBook
    from batchproof.server.request.plan import Choice, Plan

    model = {"sha256": "a" * 64, "numerics_id": "n", "tokenizer_sha256": "b" * 64, "chat_template_sha256": None}
    plan = Plan([[1, 2]], [Choice(0, 0, SamplingParams(temperature=0.0, max_tokens=2))], include_usage=False)

    def reply(version: str) -> list[RequestOutput]:
        return [RequestOutput("r", "ab", [], 2, 2, finish_reason="length", num_kept_tokens=2, token_ids=[5, 6],
                              weight_version=version, weight_version_spans=[VersionSpan(0, 2, version)])]

    serving_v2 = ReceiptBook(plan, lambda: (model, "v2"))
    assert _held_to_schema(serving_v2.receipt(0, reply("v2")))["model"]["sha256"] == "a" * 64
    swapped = _held_to_schema(serving_v2.receipt(0, reply("v1")))
    assert swapped["model"]["sha256"] is None and swapped["weight_versions"] == [{"start": 0, "end": 2,
                                                                                  "version": "v1"}]


def test_a_setting_no_receipt_can_write_is_a_400_naming_it(server):
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "repetition_penalty": 1e400, ' \
           b'"receipt": true}'
    assert_error(post(server.url, CHAT, body), 400, param="repetition_penalty", mentions=("finite",))


PROMPT_FIELDS = ("prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start")


def _without_prompt_scoring(receipt: dict) -> dict:
    """A receipt's fields less what prompt scoring adds (its params' checksum covers those)."""
    params = {k: v for k, v in receipt["params"].items() if k not in PROMPT_FIELDS}
    return {**{k: v for k, v in receipt.items() if k not in ("prompt_logprobs_sha256", "checksums")},
            "params": params, "checksums": {"prompt_token_ids": receipt["checksums"]["prompt_token_ids"]}}


def test_chat_prompt_logprobs_are_named_and_digested_and_the_stream_has_the_rest(server):
    """A stream takes no prompt_logprobs (a 400 naming it); streamed without them, the receipt is
    the whole reply's less its prompt scoring: the same tokens, params and logprob digest."""
    client = _client(server)
    asked = dict(model=server.state.served_model_name, messages=messages(ASCII_PROMPT), max_tokens=5,
                 temperature=0.7, seed=5, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**asked, extra_body={"receipt": True, "prompt_logprobs": 3}).model_dump()
    receipt = _held_to_schema(whole["choices"][0]["receipt"])
    assert receipt["version"] == 2 and receipt["params"]["prompt_logprobs"] == 3
    assert receipt["prompt_logprobs_sha256"] is not None
    assert len(whole["prompt_logprobs"]) == len(receipt["prompt_token_ids"])
    response = post(server.url, CHAT, {**asked, "messages": messages(ASCII_PROMPT), "stream": True,
                                       "prompt_logprobs": 3, "receipt": True})
    assert_error(response, 400, param="prompt_logprobs")
    streamed = [chunk.model_dump() for chunk in client.chat.completions.create(**asked, stream=True,
                                                                               extra_body={"receipt": True})]
    [carried] = [c["receipt"] for chunk in streamed for c in chunk["choices"] if c.get("receipt")]
    assert carried["prompt_logprobs_sha256"] is None and carried["params"]["prompt_logprobs"] is None
    assert _without_prompt_scoring(carried) == _without_prompt_scoring(receipt)
    plain = client.chat.completions.create(**asked, extra_body={"receipt": True}).model_dump()
    assert plain["choices"][0]["receipt"] == carried  # streamed == whole, with the same fields asked


def test_an_echoed_prompt_is_covered_by_every_choice_that_shows_it(server):
    """echo with logprobs puts the prompt's entries in each choice's legacy logprobs: choice 1's
    receipt names and digests them as choice 0's does (the prompt was scored once, by choice 0)."""
    body = {"prompt": "The capital of France is", "max_tokens": 4, "n": 2, "seed": 3, "temperature": 1.0,
            "echo": True, "logprobs": 2, "prompt_logprobs": 1, "return_tail_logprobs": True, "receipt": True}
    reply = post(server.url, COMPLETIONS, body).json()
    first, second = (_held_to_schema(c["receipt"]) for c in reply["choices"])
    assert first["params"]["prompt_logprobs"] == second["params"]["prompt_logprobs"] == 2  # echo's 2 > 1
    assert first["prompt_logprobs_sha256"] == second["prompt_logprobs_sha256"] is not None
    assert first["output_token_ids"] != second["output_token_ids"]  # seeds 3 and 4
    scoring_only = post(server.url, COMPLETIONS, {**body, "max_tokens": 0, "n": 1}).json()["choices"][0]["receipt"]
    assert _held_to_schema(scoring_only)["prompt_logprobs_sha256"] == first["prompt_logprobs_sha256"]
    assert scoring_only["output_token_ids"] == [] and scoring_only["logprobs_sha256"] == hashlib.sha256().hexdigest()
