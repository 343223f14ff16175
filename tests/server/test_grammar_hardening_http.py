"""Grammars over HTTP: every grammar the server cannot read is a 400 naming the field (never a
500 from llguidance's exceptions), sizes are refused before any parsing or compiling, Lark and
GBNF both still run, a request's schema compiles once for all its sequences, and a grammar that
fails mid-reply or a mask that comes too late ends that request with a code that says so."""

import re
import threading

import llguidance.gbnf_to_lark as llguidance_gbnf
import pytest
from llguidance import LLParserLimits

from batchproof.engine.grammar import compile as grammars
from batchproof.engine.grammar import matchers
from batchproof.server.request.structured import MAX_SCHEMA_CHARS
from tests.helpers.http import assert_error, chat_body, post, stream

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _never(step: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{step} ran for a request that its cap refuses")
    return refuse


def _constrained(structured: dict, max_tokens: int = 8) -> dict:
    return chat_body("Answer briefly.", max_tokens=max_tokens, structured_outputs=structured)


@pytest.fixture
def compiles(monkeypatch) -> list[str]:
    """The grammars compiled while the test runs (server check and engine alike)."""
    compiled: list[str] = []
    real = matchers.compile_matcher

    def counted(tokenizer, grammar):
        compiled.append(grammar)
        return real(tokenizer, grammar)

    monkeypatch.setattr(matchers, "compile_matcher", counted)
    return compiled


@pytest.mark.parametrize("grammar", ["", "x", "\n" * 20000, "@@@ ::= ((", "root ::= " + "(" * 5000 + '"x"',
                                     'root ::= undefined-rule', "start: ((", "%llguidance {}\nstart: nowhere"])
def test_a_grammar_that_cannot_be_read_is_a_400_naming_it(server, monkeypatch, grammar: str) -> None:
    monkeypatch.setattr(llguidance_gbnf, "is_lark_syntax", _never("llguidance's quadratic detector"))
    error = assert_error(post(server.url, CHAT, _constrained({"grammar": grammar})), 400, code=None)
    assert error["param"] in ("structured_outputs.grammar", "structured_outputs"), error
    assert "cannot be enforced" in error["message"]


@pytest.mark.parametrize(("structured", "param", "limit"), [
    ({"grammar": 'start: "a"' + " " * grammars.MAX_GRAMMAR_CHARS}, "structured_outputs.grammar",
     grammars.MAX_GRAMMAR_CHARS),
    ({"regex": "a" * (grammars.MAX_REGEX_CHARS + 1)}, "structured_outputs.regex", grammars.MAX_REGEX_CHARS),
    ({"choice": ["a"] * (grammars.MAX_CHOICES + 1)}, "structured_outputs.choice", grammars.MAX_CHOICES),
    ({"choice": ["b" * 40000, "c" * 40000]}, "structured_outputs.choice", grammars.MAX_CHOICE_CHARS),
    ({"json": {"type": "object", "description": "d" * MAX_SCHEMA_CHARS}}, "structured_outputs.json",
     MAX_SCHEMA_CHARS),
])
def test_sizes_are_refused_before_parsing_or_compiling(server, monkeypatch, structured, param, limit) -> None:
    monkeypatch.setattr(grammars, "to_lark", _never("reading the grammar"))
    monkeypatch.setattr(matchers, "compile_matcher", _never("compiling"))
    assert_error(post(server.url, CHAT, _constrained(structured)), 400, param=param, mentions=(str(limit),))


def test_a_response_format_schema_is_refused_by_size_before_compiling(server, monkeypatch) -> None:
    monkeypatch.setattr(matchers, "compile_matcher", _never("compiling"))
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(4000)}}
    body = chat_body("hi", max_tokens=4, response_format={"type": "json_schema", "json_schema": {
        "name": "big", "schema": schema}})
    assert_error(post(server.url, CHAT, body), 400, param="response_format.json_schema.schema",
                 mentions=(str(MAX_SCHEMA_CHARS),))


@pytest.mark.parametrize(("grammar", "pattern"), [
    ('root ::= greeting " " name\ngreeting ::= "hello" | "hi"\nname ::= [A-Z] [a-z]{1,6}',
     r"(hello|hi) [A-Z][a-z]{1,6}"),  # GBNF, several rules
    ('start: greeting " " NAME\ngreeting: "hello" | "hi"\nNAME: /[A-Z][a-z]{1,6}/', r"(hello|hi) [A-Z][a-z]{1,6}"),
])
def test_lark_and_gbnf_still_run_end_to_end(server, grammar: str, pattern: str) -> None:
    reply = post(server.url, CHAT, _constrained({"grammar": grammar}, max_tokens=12)).json()
    assert re.fullmatch(pattern, reply["choices"][0]["message"]["content"]), reply


def test_16_prompts_with_n_16_compile_their_schema_once(server, compiles) -> None:
    schema = {"type": "object", "properties": {"compiled_once": {"type": "integer"}}, "required": ["compiled_once"]}
    body = {"prompt": [f"Item {i}:" for i in range(16)], "n": 16, "max_tokens": 1, "temperature": 0,
            "structured_outputs": {"json": schema}}
    reply = post(server.url, COMPLETIONS, body, timeout=300).json()
    assert len(reply["choices"]) == 256 and all(c["text"].startswith("{") for c in reply["choices"]), reply
    assert len(compiles) == 1


def test_a_grammar_past_llguidances_limits_mid_reply_is_a_400_that_says_so(server, monkeypatch) -> None:
    """A limit on one mask's work (llguidance's fuel, here its Earley items) reached mid-reply is
    the grammar's doing: a 400 with code grammar_failed, streamed as an error event too."""
    monkeypatch.setattr(matchers, "LIMITS", LLParserLimits(step_max_items=50))
    grammar = 'start: /[a-z]+/ " " /[a-z0-9]{1,40}/ (" " /[a-z]{3,30}/)* "!fuel-http"'
    body = chat_body("Write some words.", max_tokens=40, temperature=1.0, seed=5,
                     structured_outputs={"grammar": grammar})
    assert_error(post(server.url, CHAT, body), 400, code="grammar_failed", mentions=("Too many items",))
    events = stream(server.url, CHAT, body)[2]
    assert events[-1] != "[DONE]" and events[-1]["error"]["code"] == "grammar_failed", events[-1]


def test_a_mask_that_comes_too_late_fails_that_request_and_the_server_goes_on(server, engine, monkeypatch) -> None:
    release = threading.Event()
    real = matchers.CompiledMatchers.matcher

    def held(self, grammar):
        if "held-back" in grammar:
            release.wait(timeout=60)
        return real(self, grammar)

    monkeypatch.setattr(matchers.CompiledMatchers, "matcher", held)
    monkeypatch.setattr(engine.outputs, "grammar_mask_timeout_s", 0.3)
    try:
        late = post(server.url, CHAT, _constrained({"regex": "held-back [a-z]+"}))
        assert_error(late, 503, code="grammar_timeout", mentions=("grammar_mask_timeout_s",))
    finally:
        release.set()
    after = post(server.url, CHAT, _constrained({"choice": ["yes", "no"]}))
    assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"] in ("yes", "no")
