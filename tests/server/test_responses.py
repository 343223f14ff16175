"""The Responses API through the official openai client: string and item input, logprobs,
json_schema, a function tool loop (by items and by previous_response_id), the stream's events in
order and reassembled equal to the whole reply, refused fields, a disconnect, a failure mid-stream;
and the promise of one code path: a conversation gets bitwise the chat route's tokens and
logprobs through /v1/responses, streamed and not, alone and inside a batch of 16."""

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from batchproof.server.responses.store import ResponseStore
from tests.helpers.http import ASCII_PROMPT, CJK_PROMPT, EMOJI_PROMPT, assert_error, post, wait_until
from tests.server.test_fail_closed import MARK, drop_one_record  # noqa: F401 (a fixture)
from tests.server.test_structured_output import PET_SCHEMA
from tests.server.test_tools import SCHEMAS, WEATHER_PARAMETERS

LOGPROBS = ["message.output_text.logprobs"]
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city now",
           "parameters": WEATHER_PARAMETERS}
PROMPTS = ["Name three colors of the rainbow.", "What is 2 + 2?", "Write a haiku about the sea.", "Say hello.",
           "List two fruits.", "What is the capital of France?", "Count to five.", "Describe a cat in one line.",
           "Name a planet.", "What color is the sky?", "Give me a random word.", "Translate 'cat' to French.",
           "Spell the word 'dog'.", "What day comes after Monday?", CJK_PROMPT, EMOJI_PROMPT]  # last two: UTF-8 held


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def _model(server) -> str:
    return server.state.served_model_name


def _chat_signature(reply) -> tuple:
    choice = reply.choices[0]
    return choice.message.content, [(e.token, e.bytes, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
                                    for e in choice.logprobs.content]


def _response_signature(response) -> tuple:
    part = response.output[0].content[0]
    return part.text, [(e.token, e.bytes, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
                       for e in part.logprobs]


def _bits(signature: tuple) -> str:
    """Floats as their exact spelling (repr round-trips every bit, -0.0 included)."""
    return repr(signature)


def test_string_input_gives_the_chat_routes_tokens_and_logprobs(server, client) -> None:
    response = client.responses.create(model=_model(server), input=ASCII_PROMPT, max_output_tokens=12, temperature=0,
                                       include=LOGPROBS, top_logprobs=2)
    chat = client.chat.completions.create(model=_model(server), messages=[{"role": "user", "content": ASCII_PROMPT}],
                                          max_tokens=12, temperature=0, logprobs=True, top_logprobs=2)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.output_text == chat.choices[0].message.content
    assert _bits(_response_signature(response)) == _bits(_chat_signature(chat))
    assert len(response.output[0].content[0].logprobs) == 12 == response.usage.output_tokens
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.total_tokens == chat.usage.total_tokens


def test_items_and_instructions_are_the_chat_messages_they_mean(server, client) -> None:
    items = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": [{"type": "output_text",
                                                                                   "text": "Hello!"}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a planet."}]}]
    response = client.responses.create(model=_model(server), input=items, instructions="Answer briefly.",
                                       max_output_tokens=10, temperature=0, include=LOGPROBS)
    chat = client.chat.completions.create(model=_model(server), messages=[
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a planet."}],
        max_tokens=10, temperature=0, logprobs=True, top_logprobs=0)
    assert _bits(_response_signature(response)) == _bits(_chat_signature(chat))
    assert response.instructions == "Answer briefly."


def test_sixteen_conversations_equal_chat_streamed_and_not_alone_and_batched(server) -> None:
    """Each conversation alone through chat is the reference; through responses alone (whole, and
    streamed for four), then 16 at once, whole and streamed. How many of the 16 met in one batch
    is the machine's timing, so only the bits are judged here (batches are formed under control
    in tests/engine/test_batch_invariance.py)."""
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
    model = _model(server)
    fields = {"temperature": 0, "extra_body": {"ignore_eos": True}}

    async def chat(prompt: str) -> str:
        reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                     max_tokens=8, logprobs=True, top_logprobs=2, **fields)
        return _bits(_chat_signature(reply))

    async def whole(prompt: str) -> str:
        response = await client.responses.create(model=model, input=prompt, max_output_tokens=8, include=LOGPROBS,
                                                 top_logprobs=2, **fields)
        return _bits(_response_signature(response))

    async def streamed(prompt: str) -> str:
        async with client.responses.stream(model=model, input=prompt, max_output_tokens=8, include=LOGPROBS,
                                           top_logprobs=2, **fields) as stream:
            text, entries = "", []
            async for event in stream:
                if event.type == "response.output_text.delta":
                    text += event.delta
                    entries += [(e.token, e.bytes, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
                                for e in event.logprobs]
        return _bits((text, entries))

    async def run() -> tuple[list, ...]:
        alone = [await chat(p) for p in PROMPTS]
        alone_whole = [await whole(p) for p in PROMPTS]
        alone_streamed = [await streamed(p) for p in PROMPTS[:4]]
        batched_whole = await asyncio.gather(*(whole(p) for p in PROMPTS))
        batched_streamed = await asyncio.gather(*(streamed(p) for p in PROMPTS))
        return alone, alone_whole, alone_streamed, list(batched_whole), list(batched_streamed)

    alone, alone_whole, alone_streamed, batched_whole, batched_streamed = asyncio.run(run())
    assert alone_whole == alone
    assert alone_streamed == alone[:4]
    assert batched_whole == alone
    assert batched_streamed == alone


def test_the_stream_sends_openais_events_in_order(server, client) -> None:
    with client.responses.stream(model=_model(server), input=ASCII_PROMPT, max_output_tokens=10, temperature=0,
                                 include=LOGPROBS, top_logprobs=1, extra_body={"ignore_eos": True}) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds[4:4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert kinds[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    whole = client.responses.create(model=_model(server), input=ASCII_PROMPT, max_output_tokens=10, temperature=0,
                                    include=LOGPROBS, top_logprobs=1, extra_body={"ignore_eos": True})
    assert "".join(d.delta for d in deltas) == events[-4].text == whole.output_text
    streamed_entries = [e.to_dict() for d in deltas for e in d.logprobs]
    assert streamed_entries == [e.to_dict() for e in final.output[0].content[0].logprobs]
    assert _bits(_response_signature(final)) == _bits(_response_signature(whole))
    assert final.usage == whole.usage


def test_a_reply_that_ends_by_itself_is_completed(server, client) -> None:
    with client.responses.stream(model=_model(server), input="Say hi.", max_output_tokens=200, temperature=0) as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and final.incomplete_details is None
    assert final.output[0].status == "completed" and final.output_text


class Pet(BaseModel):
    name: str
    species: str


def test_text_format_json_schema_is_enforced_and_labelled(server, client) -> None:
    response = client.responses.create(
        model=_model(server), input="Invent a pet.", max_output_tokens=60, temperature=0.8, include=LOGPROBS,
        extra_body={"seed": 3},
        text={"format": {"type": "json_schema", "name": "pet", "schema": PET_SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), PET_SCHEMA)
    part = response.output[0].content[0].to_dict()
    assert part["constraint"] == "json_schema" and part["logprobs_mode"] == "raw"
    assert response.text.format.type == "json_schema"
    parsed = client.responses.parse(model=_model(server), input="Invent a pet.", max_output_tokens=60, temperature=0,
                                    text_format=Pet)
    assert isinstance(parsed.output_parsed, Pet)


def test_a_function_tool_loop_by_items_and_by_previous_response_id(server, client) -> None:
    question = "What is the weather in Paris?"
    first = client.responses.create(model=_model(server), input=question, tools=[WEATHER], tool_choice="required",
                                    max_output_tokens=60, temperature=0, include=LOGPROBS)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS["get_weather"])
    # every generated token's entry is in the reply: on the call, as our extension
    assert len(calls[0].to_dict()["logprobs"]) == first.usage.output_tokens
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C."}
    by_items = client.responses.create(model=_model(server), input=[{"role": "user", "content": question},
                                                                    *first.output, result],
                                       tools=[WEATHER], tool_choice="none", max_output_tokens=12, temperature=0,
                                       include=LOGPROBS)
    by_id = client.responses.create(model=_model(server), previous_response_id=first.id, input=[result],
                                    tools=[WEATHER], tool_choice="none", max_output_tokens=12, temperature=0,
                                    include=LOGPROBS)
    assert by_items.output[0].type == "message" and by_items.output_text
    assert _bits(_response_signature(by_id)) == _bits(_response_signature(by_items))
    assert by_id.previous_response_id == first.id
    assert by_id.usage.input_tokens_details.cached_tokens > 0  # the conversation so far was in the prefix cache


def test_a_streamed_call_reassembles_to_the_whole_one(server, client) -> None:
    fields = {"model": _model(server), "input": "What is the weather in Paris?", "tools": [WEATHER],
              "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 60, "temperature": 0}
    with client.responses.stream(**fields) as stream:
        events = list(stream)
    whole = client.responses.create(**fields)
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    assert kinds[-3:-1] == ["response.function_call_arguments.done", "response.output_item.done"]
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert arguments == events[-3].arguments == whole.output[0].arguments
    jsonschema.validate(json.loads(arguments), SCHEMAS["get_weather"])


def test_stored_responses_are_got_and_deleted(server, client) -> None:
    created = client.responses.create(model=_model(server), input="Say hi.", max_output_tokens=4, temperature=0)
    assert client.responses.retrieve(created.id).to_dict() == created.to_dict()
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    unstored = client.responses.create(model=_model(server), input="Say hi.", max_output_tokens=4, store=False)
    assert_error(httpx.get(f"{server.url}/v1/responses/{unstored.id}"), 404, param="response_id")
    follow_up = post(server.url, "/v1/responses", {"input": "Go on.", "previous_response_id": unstored.id})
    assert_error(follow_up, 404, param="previous_response_id", mentions=(unstored.id,))


def test_the_store_is_per_key_and_bounded() -> None:
    store = ResponseStore(budget_bytes=2000)  # two 400-character responses, with their overhead
    store.put("key-a", {"id": "resp_1", "text": "x" * 400}, [])
    assert store.get("key-b", "resp_1") is None and store.get(None, "resp_1") is None
    assert store.get("key-a", "resp_1") is not None
    store.put("key-a", {"id": "resp_2", "text": "y" * 400}, [])
    store.put("key-a", {"id": "resp_3", "text": "z" * 400}, [])
    assert store.get("key-a", "resp_1") is None  # the least recently used went first
    assert len(store) == 2 and store.used_bytes <= 2000
    store.put("key-a", {"id": "resp_4", "text": "w" * 2000}, [])  # larger than the budget: not kept
    assert store.get("key-a", "resp_4") is None and len(store) == 2


@pytest.mark.parametrize(("fields", "param", "mention"), [  # 400s unless said
    ({"background": True}, "background", "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "reasoning"),
    ({"conversation": "conv_1"}, "conversation", "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools", "'web_search'"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", "web_search_preview"),
    ({"include": ["reasoning.encrypted_content"]}, "include", "reasoning.encrypted_content"),
    ({"top_logprobs": 2}, "top_logprobs", "message.output_text.logprobs"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input", "'reasoning'"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input",
     "input_image"),
    ({"input": [{"role": "user", "content": "hi", "colour": 1}]}, "input", "input[0].colour"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "schema"),
    ({"max_output_tokens": 0}, "max_output_tokens", "'max_output_tokens'"),
    ({"max_output_tokens": 100000}, "max_output_tokens", "context length"),
    ({"truncation": "auto"}, "truncation", "truncated"),
    ({"temperature": 3}, "temperature", "temperature"),
    ({"model": "gpt-4o"}, "model", "gpt-4o"),
])
def test_what_is_not_served_is_refused_by_name(server, fields, param, mention) -> None:
    body = {"input": "Say hi.", "max_output_tokens": 4, **fields}
    status = {"model": 404, "temperature": 422}.get(param, 400)  # a range error is a 422, as on the chat route
    assert_error(post(server.url, "/v1/responses", body), status, param=param, mentions=(mention,))


def test_a_disconnect_mid_stream_frees_its_slot(server) -> None:
    state = server.state
    assert wait_until(lambda: state.backend.num_running == 0, timeout=5)
    body = {"input": ASCII_PROMPT, "max_output_tokens": 400, "ignore_eos": True, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=30) as response:
        assert response.status_code == 200
        received = 0
        for line in response.iter_lines():
            received += line.startswith("data: ")
            if received == 6:
                break
    assert wait_until(lambda: state.backend.num_running == 0 and state.backend.num_waiting == 0,
                      timeout=2.5), "the request kept its batch slot after the client left"
    after = post(server.url, "/v1/responses", {"input": "Say hi.", "max_output_tokens": 2, "include": LOGPROBS})
    assert after.status_code == 200 and len(after.json()["output"][0]["content"][0]["logprobs"]) == 2


@pytest.mark.usefixtures("drop_one_record")
def test_logprobs_fail_closed_whole_and_mid_stream(server) -> None:
    body = {"input": ASCII_PROMPT, "max_output_tokens": 6, "temperature": 0, "include": LOGPROBS, "seed": MARK}
    assert "fail closed" in assert_error(post(server.url, "/v1/responses", body), 500)["message"]
    raw = post(server.url, "/v1/responses", {**body, "stream": True}).text
    events = [json.loads(block.split("data: ", 1)[1]) for block in raw.split("\n\n") if "data: " in block]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert "fail closed" in events[-2]["message"] and events[-1]["response"]["status"] == "failed"
    assert not any(e["type"] in ("response.completed", "response.incomplete") for e in events)
