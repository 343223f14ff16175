"""From what a request asks (a JSON schema, any JSON object, a regex, a Lark grammar, a choice
of strings) to llguidance's grammar text, checked against our tokenizer before it runs: a schema
feature the engine cannot enforce is refused here, never generated past."""

import json

from llguidance import LLMatcher, LLParserLimits
from llguidance.gbnf_to_lark import any_to_lark

from batchproof.engine.grammar.constraint import Constraint
from batchproof.engine.grammar.tokenizer import grammar_tokenizer
from batchproof.engine.tokenizer import Tokenizer

# JSON as json.dumps writes it: ", " and ": ", no other whitespace. Free whitespace lets a small
# model fill its whole budget with newlines (llguidance's default allows any run of it).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": False}
# llguidance's default bounds on a grammar's size and on the work of one step's mask: the same
# for the check and the engine, so what passes the check runs.
LIMITS = LLParserLimits()


class GrammarError(ValueError):
    """The constraint cannot be enforced: an unsupported feature, or a broken regex or grammar."""


def json_schema(schema: dict) -> Constraint:
    return Constraint("json_schema", LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS))


def json_object() -> Constraint:
    return Constraint("json_object", LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS))


def regex(pattern: str) -> Constraint:
    return Constraint("regex", LLMatcher.grammar_from_regex(pattern))


def grammar(source: str) -> Constraint:
    """A Lark grammar (llguidance's dialect) or a GBNF one (llama.cpp's), told apart by llguidance."""
    try:
        return Constraint("grammar", LLMatcher.grammar_from_lark(any_to_lark(source)))
    except ValueError as e:  # GBNF it could not convert
        raise GrammarError(f"the grammar is neither Lark nor GBNF that converts to it: {e}") from None


def choice(options: list[str]) -> Constraint:
    """Exactly one of the strings (vLLM's `choice`): a Lark rule of JSON-quoted literals."""
    return Constraint("choice", LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in options)))


def check(constraint: Constraint, tokenizer: Tokenizer) -> None:
    """Build the matcher once, as the engine will (GrammarError: why it cannot run). Costs up to
    a second for a huge schema: callers run it off the event loop."""
    try:
        llt = grammar_tokenizer(tokenizer)
    except ValueError as e:
        raise GrammarError(str(e)) from None
    is_error, messages = LLMatcher.validate_grammar_with_warnings(constraint.grammar, llt, limits=LIMITS)
    if is_error:
        raise GrammarError(messages[0].strip())
    matcher = LLMatcher(llt, constraint.grammar, log_level=0, limits=LIMITS)
    if matcher.is_error():
        raise GrammarError(matcher.get_error().strip())
