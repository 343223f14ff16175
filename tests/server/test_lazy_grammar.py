"""The lazy grammars of `tool_choice: "auto"` against the default model's tokens: free text passes, a
call of an offered function with valid arguments passes, and anything else a call could start as is
refused; every text the grammar accepts reads back (formats.py) as calls that validate."""

import json

import jsonschema
import pytest

from batchproof.engine.grammar.matchers import compile_matcher
from batchproof.server.tools import lazy_grammar
from batchproof.server.tools.formats import HERMES, LLAMA3_JSON

SCHEMAS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                           "additionalProperties": False},
           "add": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}
ADD = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'

# (text, accepted with parallel calls, accepted with one call at most)
HERMES_CASES = [
    ("Hello there.", True, True),
    ("", True, True),
    ("a < b and <tool_cal is not a marker", True, True),
    (f"Sure. <tool_call>{WEATHER}</tool_call> done", True, True),
    (f"Sure.<tool_call>{WEATHER}</tool_call>", True, True),  # '.<' is one token: text and marker share it
    (f"<tool_call>{ADD}</tool_call>\n<tool_call>{ADD}</tool_call>", True, False),
    ('<tool_call>{"name":"add", "arguments": {"a": 1, "b": 2}}</tool_call>', False, False),  # our separators
    ('<tool_call>{"name": "bogus", "arguments": {}}</tool_call>', False, False),
    ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": "x"}}</tool_call>', False, False),
    (f"<tool_call>{ADD}", False, False),  # a call begun must close
]
LLAMA3_CASES = [
    ("Hello there.", True, True),
    ("", True, True),
    ("  {", False, False),
    (' {"name": "add", "parameters": {"a": 1, "b": 2}}', True, True),
    ('{"name": "add", "parameters": {"a": 1, "b": 2}} and then', True, True),
    ('{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": {"a": 1, "b": 2}}', True, False),
    ('{"name": "add", "parameters": {"a": 1, "b": 2}}; junk', False, False),
    ('{"name": "bad", "parameters": {}}', False, False),
    ('<|python_tag|>{"name": "bad", "parameters": {}}', False, False),
]


def _accepts(matcher, tokenizer, text: str) -> bool:
    matcher = matcher.deep_copy()
    ids = tokenizer.encode(text)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


@pytest.mark.parametrize(("grammar", "tool_format", "cases"), [
    (lazy_grammar.hermes, HERMES, HERMES_CASES), (lazy_grammar.llama3_json, LLAMA3_JSON, LLAMA3_CASES)],
    ids=["hermes", "llama3-json"])
@pytest.mark.parametrize("is_parallel", [True, False], ids=["parallel", "one-call"])
def test_free_text_and_valid_calls_only(engine, grammar, tool_format, cases, is_parallel) -> None:
    tokenizer = engine.tokenizer
    matcher = compile_matcher(tokenizer, grammar(SCHEMAS, is_parallel))
    for text, parallel_ok, one_ok in cases:
        accepted = _accepts(matcher, tokenizer, text)
        assert accepted == (parallel_ok if is_parallel else one_ok), text
        if accepted:
            parsed = tool_format.parse(text)
            for call in parsed.calls:
                jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
            assert len(parsed.calls) <= 1 or is_parallel


def test_the_grammar_embeds_each_schema_once_with_our_separators() -> None:
    grammar = lazy_grammar.hermes(SCHEMAS, True)
    assert grammar.count('"const": "add"') == 1 and '"item_separator": ", "' in grammar
