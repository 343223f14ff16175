"""Every cap is checked before the work it bounds, and no step is quadratic in request input:
prompts counted before any is tokenized, tools measured before their grammar compiles, messages
counted (their calls' arguments too) before the template renders, `metadata` held to OpenAI's
limits, stop strings bounded, arguments nested past Python's stack a 400, and consecutive tool
results merged in linear time. Each expensive step is a spy that fails the request if reached."""

import json
import subprocess
import sys

import pytest

from batchproof.engine.grammar import compile as grammars
from batchproof.server.request.plan import MAX_STOP_STRING_CHARS, MAX_STOP_TOTAL_CHARS
from batchproof.server.request.protocol import MAX_METADATA_KEY_CHARS, MAX_METADATA_PAIRS, MAX_METADATA_VALUE_CHARS
from batchproof.server.tools.choice import MAX_PARAMETERS_CHARS, MAX_TOOLS, MAX_TOOLS_CHARS
from tests.helpers.http import assert_error, chat_body, post

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
HANG_GUARD_S = 120  # only so a regression fails instead of hanging the suite


def _never(step: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{step} ran for a request that its cap refuses")
    return refuse


@pytest.fixture
def no_tokenizing(engine, monkeypatch) -> None:
    monkeypatch.setattr(engine.tokenizer, "encode", _never("tokenizing"))


@pytest.fixture
def no_rendering(engine, monkeypatch) -> None:
    monkeypatch.setattr(engine.front.chat_template, "render", _never("rendering"))
    monkeypatch.setattr(engine.tokenizer, "encode", _never("tokenizing"))


@pytest.fixture
def no_compiling(monkeypatch) -> None:
    monkeypatch.setattr(grammars, "json_schema", _never("compiling a schema"))
    monkeypatch.setattr(grammars, "check", _never("compiling a grammar"))


def _call_history(arguments: str) -> list[dict]:
    return [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18"}]


def _call_items(arguments: str) -> list[dict]:
    return [{"role": "user", "content": "weather?"},
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": arguments},
            {"type": "function_call_output", "call_id": "c1", "output": "18"}]


# --- history tool-call arguments ------------------------------------------------------------

def test_arguments_nested_past_pythons_stack_are_a_400_naming_the_field(server) -> None:
    too_deep = "[" * 100_000
    assert_error(post(server.url, CHAT, {"messages": _call_history(too_deep), "max_tokens": 1}), 400,
                 param="messages", mentions=("messages.1.tool_calls.0", "nest deeper"))
    assert_error(post(server.url, RESPONSES, {"input": _call_items(too_deep), "max_output_tokens": 1}), 400,
                 param="input", mentions=("nest deeper",))


def test_arguments_that_parse_but_nest_past_the_bodys_own_limit_are_a_400(server) -> None:
    def nested(depth: int) -> str:
        return '{"a": ' * depth + "1" + "}" * depth

    assert_error(post(server.url, CHAT, {"messages": _call_history(nested(300)), "max_tokens": 1}), 400,
                 param="messages", mentions=("nest deeper than 200",))
    assert post(server.url, CHAT, {"messages": _call_history(nested(150)), "max_tokens": 1}).status_code == 200


def test_arguments_count_toward_the_text_that_must_fit_before_rendering(server, engine, no_rendering) -> None:
    too_long = json.dumps({"a": "x" * (engine.max_model_len * engine.tokenizer.max_token_text_bytes)})
    assert_error(post(server.url, CHAT, {"messages": _call_history(too_long), "max_tokens": 1}), 400,
                 param="messages", mentions=("too long",))


# --- messages -------------------------------------------------------------------------------

def test_140000_tool_messages_are_refused_by_count_before_rendering(server, engine, no_rendering) -> None:
    results = [{"role": "tool", "tool_call_id": "c1", "content": "x"}] * 140_000
    body = {"messages": [*_call_history("{}")[:2], *results], "max_tokens": 1}
    # more JSON objects than any request may hold: refused on the raw bytes, before it is parsed
    assert_error(post(server.url, CHAT, body, timeout=HANG_GUARD_S), 400, param=None,
                 mentions=("140005 JSON objects", "16384"))
    over = [{"role": "user", "content": "hi"}] * (engine.max_model_len + 1)
    assert_error(post(server.url, "/tokenize", {"messages": over}), 400, param="messages")
    items = [{"type": "function_call_output", "call_id": "c1", "output": "x"}] * (engine.max_model_len + 1)
    assert_error(post(server.url, RESPONSES, {"input": items}), 400, param="input",
                 mentions=(str(engine.max_model_len + 1),))


def test_consecutive_tool_results_merge_in_linear_time() -> None:
    """140,000 results of 200 characters in one turn: joining each onto the growing turn copied it
    every time (terabytes); joined once, a second. In a child process, so a regression is killed."""
    code = """
from batchproof.server.request.protocol import ChatMessage
from batchproof.server.tools.prompt import template_messages
call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
results = [ChatMessage(role="tool", tool_call_id="c", content=f"{i:0200d}") for i in range(140_000)]
turns = template_messages([ChatMessage(role="user", content="go"), ChatMessage(role="assistant", tool_calls=[call]),
                           *results, ChatMessage(role="assistant", content="done")], None, False)
assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"], [t["role"] for t in turns]
parts = turns[2]["content"].split("\\n\\n")
assert parts[0] == "Result of f (call c):\\n" + "0" * 200
assert parts[-1] == "Result of f (call c):\\n" + "139999".zfill(200)
assert len(parts) == 140_000
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr


# --- prompts --------------------------------------------------------------------------------

def test_prompts_are_counted_before_any_is_tokenized(server, no_tokenizing) -> None:
    assert_error(post(server.url, COMPLETIONS, {"prompt": ["a"] * 1_500_000, "max_tokens": 1}, timeout=HANG_GUARD_S),
                 400, param=None, mentions=("JSON values", "600000"))  # counted on the raw bytes
    assert_error(post(server.url, COMPLETIONS, {"prompt": ["a"] * 70_000, "max_tokens": 1}, timeout=HANG_GUARD_S),
                 400, param="prompt", mentions=("70000 prompts",))  # counted before validation
    assert_error(post(server.url, COMPLETIONS, {"prompt": ["a"] * 17, "n": 16, "max_tokens": 1}), 400,
                 param="prompt", mentions=("272 sequences",))
    assert_error(post(server.url, COMPLETIONS, {"prompt": [[1]] * 300, "max_tokens": 1}), 400, param="prompt")
    assert_error(post(server.url, COMPLETIONS, {"prompt": "a", "n": 17, "max_tokens": 1}), 400, param="n")


# --- tools ----------------------------------------------------------------------------------

def _tool(name: str, parameters: dict | None = None) -> dict:
    function = {"name": name} if parameters is None else {"name": name, "parameters": parameters}
    return {"type": "function", "function": function}


def _schema_of_chars(num_chars: int) -> dict:
    """A schema of more than num_chars characters of JSON."""
    return {"type": "object", "description": "x" * num_chars}


def test_20000_tools_are_refused_by_count_before_any_grammar_compiles(server, no_compiling, monkeypatch) -> None:
    many = [_tool(f"f{i}") for i in range(20_000)]  # 40,000 objects: refused on the raw bytes
    assert_error(post(server.url, CHAT, chat_body("hi", tools=many, tool_choice="required", max_tokens=1),
                      timeout=HANG_GUARD_S), 400, param=None, mentions=("JSON objects",))
    assert_error(post(server.url, CHAT, chat_body("hi", tools=many[:5_000], tool_choice="required", max_tokens=1),
                      timeout=HANG_GUARD_S), 400, param="tools", mentions=("5000 tools", str(MAX_TOOLS)))
    flat = [{"type": "function", "name": f"f{i}"} for i in range(10_000)]
    assert_error(post(server.url, RESPONSES, {"input": "hi", "tools": flat, "tool_choice": "required"},
                      timeout=HANG_GUARD_S), 400, param="tools", mentions=("10000 tools",))
    assert_error(post(server.url, CHAT, chat_body("hi", tools=[_tool(f"f{i}") for i in range(MAX_TOOLS + 1)],
                                                  tool_choice="required", max_tokens=1)), 400, param="tools")
    monkeypatch.undo()  # at the caps, the tools compile and run
    tools = [_tool(f"f{i}") for i in range(MAX_TOOLS - 1)] + [_tool("last", _schema_of_chars(1000))]
    reply = post(server.url, CHAT, chat_body("hi", tools=tools, tool_choice="required", max_tokens=1))
    assert reply.status_code == 200, reply.text


def test_tool_schemas_are_measured_before_any_grammar_compiles(server, no_compiling) -> None:
    one_big = [_tool("small"), _tool("big", _schema_of_chars(MAX_PARAMETERS_CHARS))]
    assert_error(post(server.url, CHAT, chat_body("hi", tools=one_big, tool_choice="required", max_tokens=1)), 400,
                 param="tools", mentions=("tools[1].function.parameters", str(MAX_PARAMETERS_CHARS)))
    num_tools = MAX_TOOLS_CHARS // (MAX_PARAMETERS_CHARS // 2) + 1
    many_mid = [_tool(f"f{i}", _schema_of_chars(MAX_PARAMETERS_CHARS // 2)) for i in range(num_tools)]
    assert_error(post(server.url, CHAT, chat_body("hi", tools=many_mid, tool_choice={
        "type": "function", "function": {"name": "f0"}}, max_tokens=1)), 400, param="tools",
                 mentions=(str(MAX_TOOLS_CHARS),))


# --- metadata -------------------------------------------------------------------------------

def test_responses_metadata_is_held_to_openais_limits_before_it_is_planned_or_stored(server, engine,
                                                                                    monkeypatch) -> None:
    stored = []
    monkeypatch.setattr(server.app.state.responses, "put", lambda *args: stored.append(args))
    monkeypatch.setattr(engine.tokenizer, "encode", _never("tokenizing"))
    huge = {f"k{i:06d}": "" for i in range(100_000)}  # (300,000: refused on the raw bytes, unparsed)
    cases = [huge, {f"k{i}": "" for i in range(MAX_METADATA_PAIRS + 1)},
             {"k" * (MAX_METADATA_KEY_CHARS + 1): "v"}, {"k": "v" * (MAX_METADATA_VALUE_CHARS + 1)}]
    for metadata in cases:
        assert_error(post(server.url, RESPONSES, {"input": "hi", "metadata": metadata, "max_output_tokens": 1},
                          timeout=HANG_GUARD_S), 400, param="metadata")
        assert_error(post(server.url, CHAT, chat_body("hi", metadata=metadata, max_tokens=1), timeout=HANG_GUARD_S),
                     400, param="metadata")
    assert stored == []
    monkeypatch.undo()  # at the limits, echoed
    metadata = {f"{i:02d}" + "k" * (MAX_METADATA_KEY_CHARS - 2): "v" * MAX_METADATA_VALUE_CHARS
                for i in range(MAX_METADATA_PAIRS)}
    reply = post(server.url, RESPONSES, {"input": "hi", "metadata": metadata, "max_output_tokens": 1})
    assert reply.status_code == 200, reply.text
    assert reply.json()["metadata"] == metadata




# --- stop strings ---------------------------------------------------------------------------

def test_stop_strings_are_bounded_in_length_and_in_all(server) -> None:
    too_long = "x" * (MAX_STOP_STRING_CHARS + 1)
    assert_error(post(server.url, CHAT, chat_body("hi", stop=too_long, max_tokens=1)), 400, param="stop",
                 mentions=(str(MAX_STOP_STRING_CHARS),))
    assert_error(post(server.url, RESPONSES, {"input": "hi", "stop": [too_long], "max_output_tokens": 1}), 400,
                 param="stop")
    width = MAX_STOP_TOTAL_CHARS // 64 + 1
    many = [f"{i:03d}" + "x" * (width - 3) for i in range(64)]
    assert_error(post(server.url, COMPLETIONS, {"prompt": "hi", "stop": many, "max_tokens": 1}), 400, param="stop",
                 mentions=(str(MAX_STOP_TOTAL_CHARS),))
    at_limit = post(server.url, CHAT, chat_body("hi", stop=["x" * MAX_STOP_STRING_CHARS] * 4, max_tokens=1))
    assert at_limit.status_code == 200, at_limit.text
