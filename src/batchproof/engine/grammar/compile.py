"""From what a request asks (a JSON schema, any JSON object, a regex, a Lark grammar, a choice
of strings) to llguidance's grammar text, checked against our tokenizer before it runs: a schema
feature the engine cannot enforce is refused here, never generated past."""

import json

from llguidance import LLMatcher

from batchproof.engine.grammar.gbnf import to_lark
from batchproof.engine.grammar.matchers import CompileError, compiled_matchers
from batchproof.engine.sampling.constraint import Constraint
from batchproof.engine.text.tokenizer import Tokenizer

# JSON as json.dumps writes it: ", " and ": ", no other whitespace. Free whitespace lets a small
# model fill its whole budget with newlines (llguidance's default allows any run of it).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": False}
# Sizes checked before any parsing: each is far above a real one (llama.cpp's json.gbnf is 1 KB,
# a Lark grammar for a whole programming language ~20 KB), and a 64 KiB grammar of the worst
# shapes converts and compiles in ~0.2 s, so no request buys seconds of parsing with its size.
MAX_GRAMMAR_CHARS = 64 * 1024
MAX_REGEX_CHARS = 16 * 1024  # a regex compiles to one lexeme: its automaton grows fastest in its size
MAX_CHOICES = 1024  # choice is one Lark alternation: llguidance's rows take at most 2,000 branches
MAX_CHOICE_CHARS = 64 * 1024  # all the choices' characters together


class GrammarError(ValueError):
    """The constraint cannot be enforced: an unsupported feature, or a broken regex or grammar."""


def _check_size(what: str, size: int, limit: int) -> None:
    if size > limit:
        raise GrammarError(f"the {what} is {size} characters; at most {limit} are taken")


def json_schema(schema: dict | str) -> Constraint:
    return Constraint("json_schema", LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS))


def json_object() -> Constraint:
    return Constraint("json_object", LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS))


def regex(pattern: str) -> Constraint:
    _check_size("regex", len(pattern), MAX_REGEX_CHARS)
    return Constraint("regex", LLMatcher.grammar_from_regex(pattern))


def grammar(source: str) -> Constraint:
    """A Lark grammar (llguidance's dialect) or a GBNF one (llama.cpp's), told apart as llguidance
    does (gbnf.py: in linear time)."""
    _check_size("grammar", len(source), MAX_GRAMMAR_CHARS)
    try:
        return Constraint("grammar", LLMatcher.grammar_from_lark(to_lark(source)))
    except ValueError as e:  # GBNF it could not convert (or text Rust cannot take: a lone surrogate)
        raise GrammarError(f"the grammar is neither Lark nor GBNF that converts to it: {e}") from None


def choice(options: list[str]) -> Constraint:
    """Exactly one of the strings (vLLM's `choice`): a Lark rule of JSON-quoted literals."""
    if len(options) > MAX_CHOICES:
        raise GrammarError(f"{len(options)} choices; at most {MAX_CHOICES} are taken")
    _check_size("choices' total", sum(len(o) for o in options), MAX_CHOICE_CHARS)
    return Constraint("choice", LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in options)))


def check(constraint: Constraint, tokenizer: Tokenizer) -> None:
    """Compile the matcher as the engine will, and keep it for the engine's sequences to copy
    (GrammarError: why it cannot run). Costs up to a second for a huge schema: callers run it
    off the event loop."""
    try:
        compiled_matchers(tokenizer).compiled(constraint.grammar)
    except CompileError as e:
        raise GrammarError(str(e)) from None
