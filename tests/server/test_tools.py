"""Tool calls through the official openai client: `required` and a named function generate
under their parameters' grammar (arguments always parse and validate), `auto` reads the model's
own format where its template teaches one, streamed calls reassemble to the unstreamed reply,
the client's tool loop runs end to end, and every token of a call has its logprob."""

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from tests.helpers.http import chat_body, post
from tests.helpers.live_server import live_server

WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                       "unit": {"enum": ["celsius", "fahrenheit"]}},
                      "required": ["city", "unit"], "additionalProperties": False}
TIME_PARAMETERS = {"type": "object",
                   "properties": {"timezone": {"type": "string", "pattern": "^[A-Z][a-z]{1,12}/[A-Z][a-z]{1,12}$"}},
                   "required": ["timezone"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
                                            "parameters": WEATHER_PARAMETERS}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                         "parameters": TIME_PARAMETERS}}
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
HERMES_TEMPLATE = Path(__file__).parent / "fixtures" / "hermes_tools.jinja"


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def _create(client: openai.OpenAI, **fields):
    return client.chat.completions.create(model=client.models.list().data[0].id, **{"messages": QUESTION, **fields})


def _valid_calls(message) -> list[tuple[str, dict]]:
    calls = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        calls.append((call.function.name, arguments))
    return calls


def test_required_always_gives_calls_that_validate(client) -> None:
    greedy = _create(client, tools=[WEATHER, TIME], tool_choice="required", max_tokens=80, temperature=0)
    sampled = _create(client, tools=[WEATHER, TIME], tool_choice="required", max_tokens=80, temperature=1.0,
                      seed=5, n=6)
    for choice in greedy.choices + sampled.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert 1 <= len(_valid_calls(choice.message))


def test_parallel_tool_calls_false_makes_one_call(client) -> None:
    reply = _create(client, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, max_tokens=80,
                    temperature=1.0, seed=2, n=4)
    assert all(len(choice.message.tool_calls) == 1 for choice in reply.choices)


def test_a_named_function_is_called_with_valid_arguments(client) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = _create(client, tools=[WEATHER, TIME], tool_choice=named, max_tokens=60, temperature=0.8, seed=3, n=4)
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls"
        assert [name for name, _ in _valid_calls(choice.message)] == ["get_time"]


def test_none_answers_in_text(client) -> None:
    reply = _create(client, tools=[WEATHER], tool_choice="none", max_tokens=8, temperature=0)
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].message.content


def test_the_openai_clients_tool_loop_runs_end_to_end(client) -> None:
    """Call, the client's own message object back in the history, the tool's result, the answer."""
    messages = list(QUESTION)
    first = _create(client, messages=messages, tools=[WEATHER], tool_choice="required", max_tokens=60, temperature=0)
    message = first.choices[0].message
    messages.append(message)  # as the openai cookbook does: the reply's message object itself
    for call in message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})})
    final = _create(client, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=20, temperature=0)
    assert final.choices[0].message.content and final.choices[0].finish_reason in ("stop", "length")


def test_tool_call_tokens_have_logprobs(client) -> None:
    reply = _create(client, tools=[WEATHER], tool_choice="required", max_tokens=60, temperature=0, logprobs=True,
                    top_logprobs=2)
    choice = reply.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    assert "".join(e.token for e in entries).startswith('[{"name": "get_weather", "arguments": ')
    assert choice.logprobs.model_extra == {"constraint": "tool_call", "logprobs_mode": "raw"}


def _streamed(client: openai.OpenAI, **fields) -> tuple[str | None, list[tuple], str, list]:
    """(content, calls (name, arguments), finish_reason, logprob entries) reassembled from a stream."""
    content, calls, finish, entries = "", {}, None, []
    for chunk in _create(client, stream=True, **fields):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            if call.index not in calls:
                calls[call.index] = [call.id, call.function.name, ""]
            calls[call.index][2] += call.function.arguments or ""
        finish = choice.finish_reason or finish
        entries += choice.logprobs.content if choice.logprobs else []
    return content or None, [tuple(calls[i]) for i in sorted(calls)], finish, entries


def _whole(client: openai.OpenAI, **fields) -> tuple[str | None, list[tuple], str, list]:
    choice = _create(client, **fields).choices[0]
    calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.message.content, calls, choice.finish_reason, choice.logprobs.content if choice.logprobs else []


def _same_but_ids(streamed: tuple, whole: tuple) -> None:
    assert streamed[0] == whole[0] and streamed[2] == whole[2] and streamed[3] == whole[3]
    assert [c[1:] for c in streamed[1]] == [c[1:] for c in whole[1]] and streamed[1]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_streamed_calls_reassemble_to_the_whole_reply(client, tool_choice) -> None:
    fields = {"tools": [WEATHER, TIME], "tool_choice": tool_choice, "max_tokens": 60, "temperature": 0,
              "logprobs": True}
    _same_but_ids(_streamed(client, **fields), _whole(client, **fields))


@pytest.mark.parametrize(("fields", "param", "says"), [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tools", "more than once"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "cannot also"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"not": {"type": "string"}}}}],
      "tool_choice": "required"}, "tools", "tools[0] ('f')"),
    # auto refuses what it cannot enforce as required does, naming the function and the keyword.
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"not": {"type": "string"}}}}]},
     "tools", "tools[0] ('f')"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"not": {"type": "string"}}}}]},
     "tools", "not"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_x", "content": "18"}]},
     "messages", "'messages.1.tool_call_id' 'call_x' answers no call"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "call_a", "type": "function", "function": {
        "name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "call_b", "content": "18"}]},
     "messages", "'call_b' answers no call"),
    ({"messages": [{"role": "tool", "content": "18"}]}, "messages", "tool_call_id"),
    ({"messages": [{"role": "user", "content": None}]}, "messages", "content' is required"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": "not json"}}]}, {"role": "user", "content": "hi"}]}, "messages", "JSON object"),
    ({"functions": [WEATHER["function"]]}, "functions", "use `tools`"),
])
def test_tool_requests_that_cannot_run_are_400s_naming_the_field(server, fields, param, says) -> None:
    response = post(server.url, "/v1/chat/completions", {**chat_body("What is the weather?", max_tokens=4), **fields})
    error = response.json()["error"]
    assert response.status_code == 400, error
    assert error["param"] == param and says in error["message"], error


@pytest.fixture(scope="module")
def hermes_server():
    """The default model under a chat template that teaches Hermes' <tool_call> format."""
    engine = Engine(EngineConfig(device="cpu", chat_template=HERMES_TEMPLATE))
    with live_server(engine) as live:
        yield live


def _few_shot() -> list[dict]:
    """Earlier calls in the history (no results between), so the small model writes its own."""
    messages = []
    for i, city in enumerate(["Paris", "Rome", "Oslo"]):
        messages += [{"role": "user", "content": f"What is the weather in {city}?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": f"call_{i}", "type": "function",
                          "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}]
    return messages + [{"role": "user", "content": "What is the weather in Berlin?"}]


def test_auto_reads_the_models_own_hermes_calls_streamed_and_whole(hermes_server) -> None:
    client = openai.OpenAI(base_url=f"{hermes_server.url}/v1", api_key="none", max_retries=0, timeout=120)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    fields = {"messages": _few_shot(), "tools": [weather], "max_tokens": 40, "temperature": 0, "logprobs": True}
    whole = _whole(client, **fields)
    assert whole[1][0][1:] == ("get_weather", '{"city": "Berlin"}') and whole[2] == "tool_calls"
    assert whole[0] is None and len(whole[3]) > 10  # the call's tokens have their logprobs
    _same_but_ids(_streamed(client, **fields), whole)
    # The tools reach the template itself (it lists them between <tools> tags).
    rendered = post(hermes_server.url, "/tokenize", {"messages": QUESTION, "return_token_strs": True}).json()
    assert "<tools>" not in "".join(rendered["token_strs"])  # without tools: none listed


# --- auto on a template that teaches no calls (the default model's): the server's own format -------

def _two_tool_history(question: str) -> list[dict]:
    """Earlier rounds with both tools (calls, results, answers), so the small model writes calls of its own."""
    messages = []
    for i, (asked, name, arguments, answer) in enumerate([
            ("What is the weather in Rome?", "get_weather", {"city": "Rome", "unit": "celsius"}, "18 C"),
            ("What time is it in Oslo?", "get_time", {"timezone": "Europe/Oslo"}, "09:30")]):
        messages += [{"role": "user", "content": asked},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": f"call_{i}", "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments)}}]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": answer},
                     {"role": "assistant", "content": f"It is {answer}."}]
    return messages + [{"role": "user", "content": question}]


def test_auto_is_taught_in_the_servers_own_format_when_the_template_teaches_none(engine) -> None:
    """The system turn describes the tools and the Hermes call syntax; earlier calls in the history are
    spelled as the reply would write them (under required: as the JSON array it generates)."""
    from batchproof.server.chat.protocol import ChatCompletionRequest
    from batchproof.server.tools.choice import plan_tools
    from batchproof.server.tools.prompt import template_messages

    def spelled(**fields) -> list[dict]:
        req = ChatCompletionRequest(model="m", messages=_two_tool_history("What is the weather in Paris?"),
                                    tools=[WEATHER, TIME], **fields)
        plan = plan_tools(req, engine.front.chat_template, engine.tokenizer)
        assert not plan.is_native  # the default model's template reads no tools
        return template_messages(req.messages, plan, plan.is_native)

    auto = spelled()
    assert auto[0]["role"] == "system" and 'To call a function, write <tool_call>{"name": ' in auto[0]["content"]
    assert '"get_time"' in auto[0]["content"] and "one such block per call" in auto[0]["content"]
    assert auto[2] == {"role": "assistant", "content": '<tool_call>{"name": "get_weather", "arguments": '
                                                       '{"city": "Rome", "unit": "celsius"}}</tool_call>'}
    assert "Call one function at most" in spelled(parallel_tool_calls=False)[0]["content"]
    required = spelled(tool_choice="required")
    assert "To call a function" not in required[0]["content"]
    assert required[2]["content"].startswith('[{"name": "get_weather"')


def test_auto_calls_always_validate_over_50_seeded_samples(client) -> None:
    """Sampled at T=1 with two tools offered: the model may answer in text, but every call it begins is an
    offered function with arguments valid for its schema (the lazy grammar), and it does make calls."""
    from concurrent.futures import ThreadPoolExecutor

    questions = ["What is the weather in Paris?", "What time is it in Tokyo?"]

    def one(seed: int):
        return _create(client, messages=_two_tool_history(questions[seed % 2]), tools=[WEATHER, TIME],
                       max_tokens=40, temperature=1, seed=seed).choices[0]

    with ThreadPoolExecutor(16) as pool:
        choices = list(pool.map(one, range(50)))
    with_calls = [c for c in choices if c.message.tool_calls]
    for choice in with_calls:
        _valid_calls(choice.message)
        assert choice.finish_reason == "tool_calls"
        assert "<tool_call>" not in (choice.message.content or "")
    print(f"50 seeded auto replies: {len(with_calls)} with calls, {50 - len(with_calls)} text only")
    assert with_calls  # the path is exercised, not only text


def test_auto_replies_are_bitwise_the_same_alone_batched_and_streamed(client) -> None:
    from concurrent.futures import ThreadPoolExecutor

    fields = {"messages": _two_tool_history("What is the weather in Paris?"), "tools": [WEATHER, TIME],
              "max_tokens": 48, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    whole = _whole(client, **fields)
    assert whole[1] and whole[2] == "tool_calls" and len(whole[3]) > 10
    _valid_calls(_create(client, **fields).choices[0].message)
    _same_but_ids(_streamed(client, **fields), whole)
    others = [{**fields, "messages": [{"role": "user", "content": f"Count to {n}."}], "tools": [WEATHER]}
              for n in range(7)]
    with ThreadPoolExecutor(8) as pool:
        batched = list(pool.map(lambda f: _whole(client, **f), [fields, *others]))[0]
    assert [c[1:] for c in batched[1]] == [c[1:] for c in whole[1]] and batched[2:] == whole[2:]
    # Each token of the call has its logprob, from the model's distribution under the grammar's mask.
    assert "".join(e.token for e in whole[3]).startswith("<tool_call>")
