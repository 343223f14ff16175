"""The grammar of a reply under `tool_choice: "auto"`: free text, and any call the model starts is a
valid call (llama.cpp calls this a lazy grammar; here it is one grammar, no trigger switching).

Written in llguidance's Lark, with each call's JSON embedded by `%json` (the tools' schemas, with
the separators every other schema here uses). Free text is a lexeme defined by what it may not
contain: llguidance's lexer commits to a lexeme without backtracking, so "text, then the opening
marker" is ONE lexeme (`OPEN`: text that ends at the first marker), not text followed by a marker
lexeme: text that could still grow would otherwise swallow `<tool_call` and then fail on `>`.

- hermes (Hermes' templates, and the server's own format for templates that teach none): text,
  then `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks with text between and
  after; one block at most unless parallel_tool_calls.
- llama3-json: prose that does not start like a call, or the whole reply one call (several joined
  by `;` when parallel) and then text that does not continue the list.
"""

import json
from typing import Any

from batchproof.engine.grammar.compile import JSON_OPTIONS

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


def _calls_json(schemas: dict[str, dict[str, Any]], arguments_key: str) -> str:
    """`%json` of one call: {"name": one of the tools, <arguments_key>: that tool's parameters}."""
    one_of_the_tools = [{"type": "object", "properties": {"name": {"const": name}, arguments_key: schema},
                         "required": ["name", arguments_key], "additionalProperties": False}
                        for name, schema in schemas.items()]
    return "%json " + json.dumps({"anyOf": one_of_the_tools, "x-guidance": JSON_OPTIONS}, ensure_ascii=False)


def _lark_literal(text: str) -> str:
    return json.dumps(text)


def _regex_literal(text: str) -> str:
    """`text` as a regex matching itself, inside Lark's /.../ (so '/' is escaped too)."""
    return "".join(c if c.isalnum() or c in " _" else f"\\{c}" if c in r".^$*+?()[]{}|\/-" else c for c in text)


def hermes(schemas: dict[str, dict[str, Any]], is_parallel: bool) -> str:
    marker = _regex_literal(HERMES_OPEN)
    calls = "(OPEN call CLOSE)*" if is_parallel else "(OPEN call CLOSE)?"
    return "\n".join([
        "%llguidance {}",
        f"start: {calls} TEXT",
        # Text up to and including the first marker; text with no marker at all.
        f"OPEN: /(?s:.*){marker}/ & ~/(?s:.*{marker}.+)/",
        f"TEXT: /(?s:.*)/ & ~/(?s:.*{marker}.*)/",
        f"CLOSE: {_lark_literal(HERMES_CLOSE)}",
        f"call: {_calls_json(schemas, 'arguments')}",
    ])


def llama3_json(schemas: dict[str, dict[str, Any]], is_parallel: bool) -> str:
    more = '(";" SPACE? call)*' if is_parallel else ""
    return "\n".join([
        "%llguidance {}",
        f"start: PROSE | SPACE? call {more} TAIL?",
        # formats.py reads a call where the reply, after whitespace, starts with `{` or the python tag.
        r"PROSE: /(?s:.*)/ & ~/\s*(\{|<\|python_tag\|>)(?s:.*)/",
        r"SPACE: /\s+/",
        # After the calls, text that formats.py could read as `;` and another call is not text (the
        # list is cut to one call when parallel calls are off, so one would be dropped unseen).
        r"TAIL: /(?s:.+)/ & ~/\s*;(?s:.*)/",
        f"call: {_calls_json(schemas, 'parameters')}",
    ])
