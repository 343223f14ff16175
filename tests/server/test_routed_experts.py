"""Routing receipts over HTTP (docs/moe.md), asked with `return_routed_experts` through the
official openai client's extra_body, from a real server on loopback around a tiny Qwen3-MoE (two
routed layers around a dense one): vLLM's `routed_experts` (base64 .npy, [prompt + reply - 1,
MoE layers, k]) on chat, completions and Responses, streamed == whole, and the same routing for
the same tokens on every route; a dense model answers a 400 naming the field."""

import base64
import io

import numpy as np
import openai
import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from tests.engine.moe_checkpoints import MOE_COMMON, write_moe_checkpoint
from tests.helpers.http import ASCII_PROMPT, assert_error, chat_body, messages, post
from tests.helpers.live_server import live_server

ASK = {"return_routed_experts": True, "ignore_eos": True}  # ignore_eos: every reply runs max_tokens
NUM_MOE_LAYERS = 2  # qwen3moe's three layers, layer 1 dense (mlp_only_layers)


@pytest.fixture(scope="module")
def moe_server(tmp_path_factory):
    path = write_moe_checkpoint("qwen3moe", tmp_path_factory.mktemp("moe-http") / "qwen3moe")
    engine = Engine(EngineConfig(model_path=path, device="cpu", max_batch=8, num_threads=1))
    with live_server(engine) as live:
        yield live


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def decoded(field: str) -> np.ndarray:
    """As a vLLM client reads it."""
    return np.load(io.BytesIO(base64.b64decode(field)))


def test_chat_streamed_equals_whole_and_counts_every_fed_position(moe_server):
    client = _client(moe_server)
    asked = dict(model=moe_server.state.served_model_name, messages=messages(ASCII_PROMPT), max_tokens=6,
                 temperature=0, extra_body=ASK)
    whole = client.chat.completions.create(**asked).model_dump()
    routes = decoded(whole["choices"][0]["routed_experts"])
    usage = whole["usage"]
    assert routes.dtype == np.uint8
    assert routes.shape == (usage["prompt_tokens"] + usage["completion_tokens"] - 1, NUM_MOE_LAYERS,
                            MOE_COMMON["num_experts_per_tok"])
    assert (routes < 8).all() and (np.diff(routes.astype(int), axis=2) > 0).all()  # distinct, increasing ids
    streamed = [chunk.model_dump() for chunk in client.chat.completions.create(**asked, stream=True)]
    carrying = [c for chunk in streamed for c in chunk["choices"] if c.get("routed_experts")]
    assert len(carrying) == 1 and carrying[0]["finish_reason"] is not None  # on the choice's last chunk
    assert carrying[0]["routed_experts"] == whole["choices"][0]["routed_experts"]
    plain = client.chat.completions.create(**{**asked, "extra_body": {"ignore_eos": True}}).model_dump()
    assert plain["choices"][0].get("routed_experts") is None  # not asked: not there


def test_completions_streamed_equals_whole_and_the_chat_route_s_routing(moe_server):
    client = _client(moe_server)
    model = moe_server.state.served_model_name
    chat = client.chat.completions.create(model=model, messages=messages(ASCII_PROMPT), max_tokens=5, temperature=0,
                                          extra_body={**ASK, "return_token_ids": True}).model_dump()
    prompt_ids = chat["prompt_token_ids"]
    asked = dict(model=model, prompt=prompt_ids, max_tokens=5, temperature=0, n=2, extra_body=ASK)
    whole = client.completions.create(**asked).model_dump()
    streamed = [chunk.model_dump() for chunk in client.completions.create(**asked, stream=True)]
    for choice in whole["choices"]:  # the same tokens on both routes: the same routing, bit for bit
        assert choice["routed_experts"] == chat["choices"][0]["routed_experts"]
        carrying = [c for chunk in streamed for c in chunk["choices"]
                    if c["index"] == choice["index"] and c.get("routed_experts")]
        assert len(carrying) == 1 and carrying[0]["routed_experts"] == choice["routed_experts"]


def test_responses_streamed_equals_whole_and_chat(moe_server):
    client = _client(moe_server)
    model = moe_server.state.served_model_name
    chat = client.chat.completions.create(model=model, messages=messages(ASCII_PROMPT), max_tokens=4, temperature=0,
                                          extra_body=ASK).model_dump()
    asked = dict(model=model, input=ASCII_PROMPT, max_output_tokens=4, temperature=0, store=False, extra_body=ASK)
    whole = client.responses.create(**asked).model_dump()
    assert whole["routed_experts"] == chat["choices"][0]["routed_experts"]
    events = [event.model_dump() for event in client.responses.create(**asked, stream=True)]
    done = [e["response"] for e in events if e["type"] in ("response.completed", "response.incomplete")]
    assert len(done) == 1 and done[0]["routed_experts"] == whole["routed_experts"]


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", chat_body(ASCII_PROMPT, max_tokens=2, return_routed_experts=True)),
    ("/v1/completions", {"prompt": ASCII_PROMPT, "max_tokens": 2, "return_routed_experts": True}),
    ("/v1/responses", {"input": ASCII_PROMPT, "max_output_tokens": 2, "return_routed_experts": True}),
])
def test_a_dense_model_answers_400_naming_the_field(server, path, body):
    assert_error(post(server.url, path, body), 400, param="return_routed_experts",
                 mentions=("return_routed_experts", "mixture-of-experts"))


def test_a_non_boolean_is_refused_naming_the_field(moe_server):
    response = post(moe_server.url, "/v1/chat/completions", chat_body(ASCII_PROMPT, return_routed_experts="yes"))
    assert_error(response, 422, param="return_routed_experts")  # a type error, as every strict field's
