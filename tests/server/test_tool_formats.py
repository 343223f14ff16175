"""Model-native tool-call formats: parsing, streaming (split as it arrives == parsed whole), detection from
the chat template, and calls rendered by a template parsed back to the same calls."""

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchproof.engine.text.chat_formats import CHATML, GEMMA, LLAMA3
from batchproof.engine.text.chat_template import ChatTemplate
from batchproof.server.tools.formats import (
    HERMES,
    LLAMA3_JSON,
    ParsedCall,
    ParsedReply,
    ToolFormat,
    detect_tool_format,
)

FIXTURES = Path(__file__).parent / "fixtures"
# The packaged default model's own template (SmolLM2-135M-Instruct's GGUF): ChatML, no tools.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TIME = '{"name": "get_time", "arguments": {"zone": "UTC", "24h": true}}'


def call(name: str, **arguments: Any) -> ParsedCall:
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


def hermes_block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


# -- hermes --------------------------------------------------------------------------------------------------


def test_hermes_single_call() -> None:
    assert HERMES.parse(hermes_block(WEATHER)) == ParsedReply(None, [call("get_weather", city="Paris")])


def test_hermes_two_calls_in_order() -> None:
    reply = HERMES.parse(hermes_block(WEATHER) + "\n" + hermes_block(TIME))
    expected = [call("get_weather", city="Paris"), call("get_time", zone="UTC", **{"24h": True})]
    assert reply == ParsedReply(None, expected)


def test_hermes_text_around_calls_is_content() -> None:
    text = "Let me look.\n" + hermes_block(WEATHER) + "\nDone."
    assert HERMES.parse(text) == ParsedReply("Let me look.\n\nDone.", [call("get_weather", city="Paris")])


@pytest.mark.parametrize("body", [
    '{"name": "get_weather", "arguments": {"city": "Par',  # cut off
    '{"name": "get_weather", "arguments": "city=Paris"}',  # arguments not an object
    '{"name": "get_weather", "arguments": ["Paris"]}',
    '{"name": "get_weather"}',  # no arguments at all
    '{"name": 7, "arguments": {}}',  # name not a string
    '{"function": "get_weather", "arguments": {}}',
    '["get_weather", {"city": "Paris"}]',
    '{"name": "f", "arguments": {"x": NaN}}',  # not JSON, though Python's json reads it
    "[" * 100_000,  # deeper than Python's stack
])
def test_hermes_block_that_is_no_call_stays_content(body: str) -> None:
    text = "Before " + hermes_block(body) + " after"
    assert HERMES.parse(text) == ParsedReply(text, [])


def test_hermes_good_block_after_broken_one_still_counts() -> None:
    broken = hermes_block('{"name": "get_weather", "arguments": {"city": ')
    reply = HERMES.parse(broken + hermes_block(WEATHER))
    assert reply == ParsedReply(broken, [call("get_weather", city="Paris")])


def test_hermes_unclosed_blocks_count_when_their_json_is_whole() -> None:
    reply = HERMES.parse(f"<tool_call>{WEATHER}\n<tool_call>{TIME}")
    assert [c.name for c in reply.calls] == ["get_weather", "get_time"] and reply.content is None
    cut_off = "<tool_call>\n" + WEATHER[:-3]
    assert HERMES.parse(cut_off) == ParsedReply(cut_off, [])


def test_hermes_unknown_function_is_still_a_call() -> None:
    reply = HERMES.parse(hermes_block('{"name": "no_such_tool", "arguments": {}}'))
    assert reply.calls == [ParsedCall("no_such_tool", "{}")]


def test_unicode_arguments_come_back_unescaped() -> None:
    escaped = '{"name": "get_weather", "arguments": {"city": "Z\\u00fcrich", "note": "東京 ☀"}}'
    [parsed] = HERMES.parse(hermes_block(escaped)).calls
    assert parsed.arguments == '{"city": "Zürich", "note": "東京 ☀"}'
    assert json.loads(parsed.arguments) == {"city": "Zürich", "note": "東京 ☀"}


@pytest.mark.parametrize("text", ["", "   \n", "\n<tool_call>\n" + WEATHER + "\n</tool_call>\n\n"])
def test_whitespace_only_content_is_none(text: str) -> None:
    assert HERMES.parse(text).content is None


# -- llama3-json ---------------------------------------------------------------------------------------------

LLAMA_WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


@pytest.mark.parametrize("prefix", ["", "  \n", "<|python_tag|>", " <|python_tag|> "])
def test_llama3_whole_reply_is_a_call(prefix: str) -> None:
    assert LLAMA3_JSON.parse(prefix + LLAMA_WEATHER + "\n") == ParsedReply(None, [call("get_weather", city="Paris")])


def test_llama3_calls_separated_by_semicolons() -> None:
    second = '{"name": "note", "arguments": {"text": "a; b {c}"}}'  # `;` and braces inside a string
    reply = LLAMA3_JSON.parse(LLAMA_WEATHER + "; " + second)
    assert reply == ParsedReply(None, [call("get_weather", city="Paris"), call("note", text="a; b {c}")])


def test_llama3_text_after_the_calls_is_content() -> None:
    reply = LLAMA3_JSON.parse(LLAMA_WEATHER + "\nThis asks for the weather.")
    assert reply == ParsedReply("\nThis asks for the weather.", [call("get_weather", city="Paris")])
    broken_second = LLAMA_WEATHER + '; {"name": "x", "parameters": 3}'
    assert LLAMA3_JSON.parse(broken_second) == ParsedReply('; {"name": "x", "parameters": 3}',
                                                           [call("get_weather", city="Paris")])


@pytest.mark.parametrize("text", [
    "The weather in Paris is mild.",
    "Call it like this: " + LLAMA_WEATHER,  # a call must start the reply
    '{"answer": 42}',
    '{"name": "get_weather", "parameters": {"city": "Par',
    '<|python_tag|>brave_search.call(query="paris")',  # built-in tools: not parsed
    '42 {"name": "f", "parameters": {}}',
])
def test_llama3_reply_that_is_no_call_is_content(text: str) -> None:
    assert LLAMA3_JSON.parse(text) == ParsedReply(text, [])


# -- streaming: the splitter gives what parse gives ----------------------------------------------------------

FORMATS = {"hermes": HERMES, "llama3-json": LLAMA3_JSON}
# Pieces that make replies with calls, broken calls, partial markers and prose in every order.
PIECES = [
    hermes_block(WEATHER), hermes_block(TIME), "<tool_call>", "</tool_call>", "<tool_", "<", "<tool_call>{",
    LLAMA_WEATHER, "<|python_tag|>", "<|py", ";", "; ", "{", "}", '{"name": "f"}',
    "Sure", "Let me check. ", "\n", "  ", "ü東", "tool_call>", "call>",
]


def stream(tool_format: ToolFormat, text: str, cuts: list[int]) -> tuple[list[str], ParsedReply]:
    splitter = tool_format.splitter()
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    released = [splitter.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    return released, splitter.finish()


def assert_stream_matches_parse(tool_format: ToolFormat, text: str, cuts: list[int]) -> None:
    released, finished = stream(tool_format, text, cuts)
    whole = tool_format.parse(text)
    assert "".join(released) + (finished.content or "") == (whole.content or "")
    assert finished.calls == whole.calls


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(sorted(FORMATS)), pieces=st.lists(st.sampled_from(PIECES) | st.text(max_size=6),
                                                             max_size=8),
       cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_streamed_equals_parsed_whole(name: str, pieces: list[str], cuts: list[int]) -> None:
    assert_stream_matches_parse(FORMATS[name], "".join(pieces), cuts)


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("text", [
    "Let me look.\n" + hermes_block(WEATHER) + "\n" + hermes_block(TIME) + " ok",
    "\n\n" + hermes_block(WEATHER),
    "Sure " + hermes_block(WEATHER) + " \n",  # blank after released text is still content
    " <|python_tag|>" + LLAMA_WEATHER + "; " + LLAMA_WEATHER + " trailing",
    "a <tool_ b <tool_call> c",
    "  ",
])
def test_streamed_equals_parsed_whole_at_every_cut(name: str, text: str) -> None:
    for cut in range(len(text) + 1):
        assert_stream_matches_parse(FORMATS[name], text, [cut])
    assert_stream_matches_parse(FORMATS[name], text, list(range(len(text))))  # a character at a time


def test_hermes_prose_streams_through_holding_at_most_a_partial_marker() -> None:
    text = "Paris is <b>mild</b> today, about 12 degrees; bring a <tool_ coat < maybe."
    splitter = HERMES.splitter()
    released = ""
    for end in range(1, len(text) + 1):
        released += splitter.feed(text[end - 1])
        assert len(text[:end]) - len(released) <= len("<tool_call>") - 1
        assert text[:end].startswith(released)
    assert released + (splitter.finish().content or "") == text


def test_llama3_prose_streams_through_once_it_cannot_be_a_call() -> None:
    splitter = LLAMA3_JSON.splitter()
    assert [splitter.feed(p) for p in [" ", "<|", "p", "x: ", "{", "}"]] == ["", "", "", " <|px: ", "{", "}"]
    assert splitter.finish() == ParsedReply(None, [])


def test_a_call_is_held_until_the_end() -> None:
    hermes, llama = HERMES.splitter(), LLAMA3_JSON.splitter()
    assert hermes.feed("Sure. <tool_c") == "Sure. " and hermes.feed("all>\n" + WEATHER[:10]) == ""
    assert hermes.feed(WEATHER[10:] + "\n</tool_call>") == ""
    assert hermes.finish() == ParsedReply(None, [call("get_weather", city="Paris")])
    assert llama.feed("\n") == "" and llama.feed(LLAMA_WEATHER) == ""
    assert llama.finish() == ParsedReply(None, [call("get_weather", city="Paris")])


# -- detection and the templates -----------------------------------------------------------------------------

HERMES_TEMPLATE = (FIXTURES / "hermes_tools.jinja").read_text(encoding="utf-8")
LLAMA31_TEMPLATE = (FIXTURES / "llama31_tools.jinja").read_text(encoding="utf-8")


@pytest.mark.parametrize(("source", "expected"), [
    (HERMES_TEMPLATE, HERMES),
    (LLAMA31_TEMPLATE, LLAMA3_JSON),
    (CHATML, None),
    (GEMMA, None),
    (LLAMA3, None),
    (SMOLLM2, None),
    ("Answer in <tool_call> blocks.{% for m in messages %}{{ m.content }}{% endfor %}", None),  # reads no tools
    ("{% for t in tools %}{{ t | tojson }}{% endfor %}", None),  # reads tools, teaches no format we know
    ("{{ tools }} <tool_call>\n<function=name>\n<parameter=x>", None),  # Qwen3-Coder's XML calls
    ("{{ tools }} <tool_call> {% for %}", None),  # not a template
])
def test_detect_tool_format(source: str, expected: ToolFormat | None) -> None:
    assert detect_tool_format(source) is expected


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Bern"}}},
]
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Zürich and Bern?"},
    {"role": "assistant", "content": None, "tool_calls": CALLS},
    {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "14 C"},
]


def render(source: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    # ChatTemplate.render takes no tools (yet); its own sandboxed environment renders them here.
    template = ChatTemplate(source, "<|begin_of_text|>", "")
    return template._template.render(messages=messages, tools=tools, add_generation_prompt=True,
                                     bos_token=template.bos_token, eos_token=template.eos_token)


@pytest.mark.parametrize(("source", "assistant_start", "assistant_end", "tool_turn"), [
    (HERMES_TEMPLATE, "<|im_start|>assistant\n", "<|im_end|>", "<tool_response>\n12 C\n</tool_response>"),
    (LLAMA31_TEMPLATE, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>",
     "<|start_header_id|>ipython<|end_header_id|>\n\n12 C<|eot_id|>"),
])
def test_calls_a_template_renders_parse_back_to_the_same_calls(source: str, assistant_start: str,
                                                               assistant_end: str, tool_turn: str) -> None:
    prompt = render(source, HISTORY, TOOLS)
    assert '"name": "get_weather"' in prompt and tool_turn in prompt and prompt.endswith(assistant_start)
    turn = prompt.split(assistant_start)[1].split(assistant_end)[0]  # the assistant turn that holds the calls
    reply = detect_tool_format(source).parse(turn)
    expected = [ParsedCall(c["function"]["name"], json.dumps(c["function"]["arguments"], ensure_ascii=False))
                for c in CALLS]
    assert reply == ParsedReply(None, expected)


@pytest.mark.parametrize("source", [HERMES_TEMPLATE, LLAMA31_TEMPLATE])
def test_templates_render_without_tools(source: str) -> None:
    prompt = render(source, HISTORY[:2], None)
    assert "Weather in Zürich and Bern?" in prompt and "<tool" not in prompt and '"parameters"' not in prompt
    assert prompt == ChatTemplate(source, "<|begin_of_text|>", "").render(HISTORY[:2])
