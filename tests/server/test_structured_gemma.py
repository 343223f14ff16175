"""Structured output and tool calls on the second packaged model, Gemma 3 270M (SentencePiece,
262,144 tokens): llguidance's tokenizer from our token bytes, every reply valid, and a mixed
batch bitwise each request alone. Skipped where the package is not installed; in CI, which
installs it, they fail instead."""

import json
from pathlib import Path

import jsonschema
import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.grammar import compile as grammars
from batchproof.engine.sampling.params import SamplingParams
from tests.helpers.http import chat_body, post
from tests.helpers.live_server import live_server
from tests.helpers.second_model import gemma_package  # noqa: F401 (a fixture)
from tests.server.test_structured_output import PET_FORMAT, PET_SCHEMA, PROMPT
from tests.server.test_tools import SCHEMAS, TIME, WEATHER, _two_tool_history

pytestmark = pytest.mark.usefixtures("gemma_package")


@pytest.fixture(scope="module")
def gemma() -> Engine:
    return Engine(EngineConfig(model_path=Path("gemma3-270m"), device="cpu", max_batch=16, max_model_len=512))


def _signature(outputs) -> list:
    return [(r.token_id, r.logprob, r.top) for o in outputs for r in o.records] + [outputs[-1].finish_reason]


def test_a_mixed_batch_is_bitwise_each_alone(gemma) -> None:
    """Runs before the server below starts stepping this engine."""
    ids = gemma.chat_prompt_ids([{"role": "user", "content": PROMPT}])
    pet = grammars.json_schema(PET_SCHEMA)
    requests = {f"r{i}": (ids, SamplingParams(temperature=0 if i % 2 else 0.9, seed=i, max_tokens=16, top_logprobs=1,
                                              constraint=pet if i < 4 else None)) for i in range(8)}
    together = gemma.generate(requests)
    for request_id in ("r0", "r1", "r5"):
        alone = gemma.generate({request_id: requests[request_id]})[request_id]
        assert _signature(alone) == _signature(together[request_id]), request_id


@pytest.fixture(scope="module")
def gemma_server(gemma):
    with live_server(gemma) as live:
        yield live


def test_json_schema_replies_validate_greedy_and_sampled(gemma_server) -> None:
    for fields in ({"temperature": 0}, {"temperature": 1.0, "seed": 11, "n": 4}):
        reply = post(gemma_server.url, "/v1/chat/completions",
                     {**chat_body(PROMPT, max_tokens=120, response_format=PET_FORMAT), **fields}, timeout=300).json()
        for choice in reply["choices"]:
            assert choice["finish_reason"] == "stop", choice
            jsonschema.validate(json.loads(choice["message"]["content"]), PET_SCHEMA)


def test_required_tool_calls_validate(gemma_server) -> None:
    body = chat_body("What is the weather in Paris?", max_tokens=80, tools=[WEATHER, TIME], tool_choice="required",
                     parallel_tool_calls=False, logprobs=True)
    choice = post(gemma_server.url, "/v1/chat/completions", body, timeout=300).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["logprobs"]["constraint"] == "tool_call"
    for call in choice["message"]["tool_calls"]:
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    # Gemma's template teaches no call format: under auto the server teaches its own (Hermes'), and
    # any call the model begins is valid (a history of earlier calls shows it how).
    auto = post(gemma_server.url, "/v1/chat/completions",
                {**body, "messages": _two_tool_history("What time is it in Tokyo?"), "tool_choice": "auto",
                 "parallel_tool_calls": True}, timeout=300).json()["choices"][0]
    assert auto["logprobs"]["constraint"] == "tool_call" and auto["message"]["tool_calls"], auto
    assert auto["finish_reason"] == "tool_calls"
    for call in auto["message"]["tool_calls"]:
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


def test_the_responses_api_on_gemma(gemma_server) -> None:
    """The openai client's Responses calls on the second model: string input bitwise the chat
    route's, a json_schema reply that validates, and a required call's tool loop."""
    import openai

    from tests.server.test_responses import LOGPROBS, _bits, _chat_signature, _response_signature

    client = openai.OpenAI(base_url=f"{gemma_server.url}/v1", api_key="none", max_retries=0, timeout=300)
    model = gemma_server.state.served_model_name
    response = client.responses.create(model=model, input=PROMPT, max_output_tokens=10, temperature=0,
                                       include=LOGPROBS, top_logprobs=2)
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=10,
                                          temperature=0, logprobs=True, top_logprobs=2)
    assert _bits(_response_signature(response)) == _bits(_chat_signature(chat))
    pet = client.responses.create(model=model, input=PROMPT, max_output_tokens=120, temperature=0,
                                  text={"format": {"type": "json_schema", "name": "pet", "schema": PET_SCHEMA}})
    jsonschema.validate(json.loads(pet.output_text), PET_SCHEMA)
    weather = {"type": "function", **WEATHER["function"]}
    first = client.responses.create(model=model, input="What is the weather in Paris?", tools=[weather],
                                    tool_choice="required", parallel_tool_calls=False, max_output_tokens=80,
                                    temperature=0)
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), SCHEMAS["get_weather"])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."}
    answer = client.responses.create(model=model, previous_response_id=first.id, input=[result], tools=[weather],
                                     tool_choice="none", max_output_tokens=16, temperature=0)
    assert answer.output[0].type == "message" and answer.output_text
