"""The tool-call formats chat templates teach their models, read back out of the models' replies.

Supported, for `tool_choice: "auto"` (each format with its grammar, lazy_grammar.py: free text, and any
call the model begins is a call of an offered function with arguments that match its schema):

- `hermes` (Hermes 2 Pro and 3, Qwen2.5, Qwen3, any template that mentions `<tool_call>`, and the format
  the server teaches a model whose template reads no tools, tools/prompt.py): text, then
  one or more `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, text allowed between and
  after them. A block whose closing tag never came (the reply ended, or the next block began) still counts
  when its JSON is whole.
- `llama3-json` (Llama 3.1, 3.2 and 3.3 with JSON tool calling): the whole reply, after optional whitespace
  and an optional `<|python_tag|>`, is `{"name": ..., "parameters": {...}}` (`"arguments"` is accepted
  too), or several such objects separated by `;`; text after the last call is content. A reply that
  starts any other way is plain content.

Not parsed (detect_tool_format gives None): Llama 3.1's built-in tools (`<|python_tag|>brave_search.call(...)`),
pythonic call lists (Llama 3.2 pythonic, Llama 4), Qwen3-Coder's XML `<function=...>` calls, Mistral's
`[TOOL_CALLS]`, Granite's `<|tool_call|>`, and every other format.

A block whose JSON does not parse, that lacks a string `name`, or whose arguments are not a JSON object is
not a call: its text stays in the content, so nothing the model wrote is dropped and parsing never raises.
"""

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

import jinja2
import jinja2.meta

from batchproof.engine.text.chat_template import ChatTemplate
from batchproof.server.tools import lazy_grammar


@dataclass(frozen=True)
class ParsedCall:
    name: str  # as the model wrote it: the caller checks it against the request's tools
    arguments: str  # a JSON object, re-serialized with json.dumps(ensure_ascii=False) from the model's text


@dataclass(frozen=True)
class ParsedReply:
    content: str | None  # the text outside the calls; None when it is only whitespace
    calls: list[ParsedCall]


# (the text with the calls cut out, blank or not; the calls)
Split = tuple[str, list[ParsedCall]]
# (each offered function's name -> its parameters' schema, whether several calls are allowed) -> the grammar of
# a reply in the format: free text, and any call begun a valid call (lazy_grammar.py)
Grammar = Callable[[dict[str, dict], bool], str]
# (held text, whether any text was released already) -> (how many leading characters are certainly content,
# whether a call has begun, so that everything from there on is held until the reply ends)
Cut = Callable[[str, bool], tuple[int, bool]]


@dataclass(frozen=True)
class ToolFormat:
    name: str
    split: Callable[[str], Split]
    cut: Cut
    grammar: Grammar

    def parse(self, text: str) -> ParsedReply:
        content, calls = self.split(text)
        return ParsedReply(_none_if_blank(content), calls)

    def splitter(self) -> "ToolCallSplitter":
        return ToolCallSplitter(self)


class ToolCallSplitter:
    """A streamed reply cut into text that is certainly content, released as it arrives, and the rest,
    held until `finish` parses it: released text + finish().content is parse(whole reply).content."""

    def __init__(self, tool_format: ToolFormat) -> None:
        self._format = tool_format
        self._held = ""
        self._has_released = False
        self._is_in_call = False

    def feed(self, text: str) -> str:
        """The text that may be sent as content now (often "")."""
        self._held += text
        if self._is_in_call:
            return ""
        num_certain, self._is_in_call = self._format.cut(self._held, self._has_released)
        released = self._held[:num_certain]
        if not self._has_released and not released.strip():
            # Leading whitespace waits: a reply that turns out to be only calls has no content (None), and
            # whitespace already sent could not be taken back.
            return ""
        self._held = self._held[num_certain:]
        self._has_released = True
        return released

    def finish(self) -> ParsedReply:
        """The calls, and the held text that turned out to be content (None if there is none)."""
        content, calls = self._format.split(self._held)
        if not self._has_released:
            return ParsedReply(_none_if_blank(content), calls)
        return ParsedReply(content or None, calls)


def _none_if_blank(text: str) -> str | None:
    return text if text.strip() else None


def _reject_constant(name: str) -> None:
    # Python's json reads NaN and Infinity, which are not JSON: re-serialized, a client could not parse them.
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _call_from(value: object, argument_keys: tuple[str, ...]) -> ParsedCall | None:
    """The call a decoded JSON value spells, or None if it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    key = next((k for k in argument_keys if k in value), None)
    if key is None or not isinstance(value[key], dict):
        return None
    try:
        return ParsedCall(value["name"], json.dumps(value[key], ensure_ascii=False))
    except (ValueError, RecursionError):
        return None


def _decode_whole(text: str) -> object | None:
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than Python's stack
        return None


_OPEN, _CLOSE = lazy_grammar.HERMES_OPEN, lazy_grammar.HERMES_CLOSE


def _hermes_split(text: str) -> Split:
    parts: list[str] = []
    calls: list[ParsedCall] = []
    pos = 0
    while (start := text.find(_OPEN, pos)) >= 0:
        body_start = start + len(_OPEN)
        close, next_open = text.find(_CLOSE, body_start), text.find(_OPEN, body_start)
        if close >= 0 and (next_open < 0 or close < next_open):
            body_end, block_end = close, close + len(_CLOSE)
        else:  # unclosed: the block runs to the next one, or to the end
            body_end = block_end = next_open if next_open >= 0 else len(text)
        call = _call_from(_decode_whole(text[body_start:body_end]), ("arguments",))
        if call is None:
            # The tag is text; the search goes on after it, so a good block after a broken one still counts.
            parts.append(text[pos:body_start])
            pos = body_start
            continue
        parts.append(text[pos:start])
        calls.append(call)
        pos = block_end
    parts.append(text[pos:])
    return "".join(parts), calls


def _hermes_cut(held: str, has_released: bool) -> tuple[int, bool]:
    start = held.find(_OPEN)
    if start >= 0:
        return start, True
    return len(held) - _partial_marker_len(held, _OPEN), False


def _partial_marker_len(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper beginning of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


_PYTHON_TAG = "<|python_tag|>"


def _llama3_split(text: str) -> Split:
    pos = _skip_space(text, 0)
    if text.startswith(_PYTHON_TAG, pos):
        pos += len(_PYTHON_TAG)
    calls: list[ParsedCall] = []
    while True:
        start = _skip_space(text, pos)
        if calls:  # after a call, only `;` and another call continue the list
            if not text.startswith(";", start):
                break
            start = _skip_space(text, start + 1)
        try:
            value, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            break
        call = _call_from(value, ("parameters", "arguments"))
        if call is None:
            break
        calls.append(call)
        pos = end
    return (text[pos:], calls) if calls else (text, [])


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _llama3_cut(held: str, has_released: bool) -> tuple[int, bool]:
    # Only a reply that starts as a call is one, so once prose has begun everything is content.
    if has_released:
        return len(held), False
    body = held.lstrip()
    if body.startswith(("{", _PYTHON_TAG)):
        return 0, True
    if _PYTHON_TAG.startswith(body):  # nothing yet, or the tag still arriving
        return 0, False
    return len(held), False


HERMES = ToolFormat("hermes", _hermes_split, _hermes_cut, lazy_grammar.hermes)
LLAMA3_JSON = ToolFormat("llama3-json", _llama3_split, _llama3_cut, lazy_grammar.llama3_json)


@functools.lru_cache(maxsize=8)  # a server has one template: parsed once, not per request
def detect_tool_format(template_source: str) -> ToolFormat | None:
    """The tool-call format a chat template teaches its model, read from the template's text; None if the
    template takes no tools (does not read the `tools` variable) or uses a format we do not parse."""
    if not reads_tools(template_source):
        return None
    if _OPEN in template_source and "<function=" not in template_source:  # Qwen3-Coder: XML inside <tool_call>
        return HERMES
    # Llama 3.1's instruction, in its header tokens: {"name": function name, "parameters": dictionary ...}
    if '"parameters' in template_source and "<|start_header_id|>" in template_source:
        return LLAMA3_JSON
    return None


_ANSWER_PROBE, _RESULT_PROBE = "\x00answer\x00", "\x00result\x00"


@functools.lru_cache(maxsize=8)  # a server has one template: rendered once, not per request
def shows_tool_role(template: ChatTemplate) -> bool:
    """Whether the template prints a `tool` turn under its own role, as ChatML templates print any role
    (SmolLM2's): a model whose template takes no tools then still sees results in the turn ChatML
    function-calling data puts them in. Gemma's refuses a role it does not know (or one out of
    alternation), and one that renders without the role's name folded it into another turn."""
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _ANSWER_PROBE},
                    {"role": "tool", "content": _RESULT_PROBE}]
    try:
        rendered = template.render(conversation, add_generation_prompt=False)
    except Exception:  # noqa: BLE001 (any refusal: the template does not take the role)
        return False
    between = rendered.partition(_ANSWER_PROBE)[2].partition(_RESULT_PROBE)
    return bool(between[1]) and "tool" in between[0]  # the result shown, under a marker naming its role


@functools.lru_cache(maxsize=8)
def reads_tools(template_source: str) -> bool:
    """Whether the template reads `tools` (a template can only mention tools in prose without taking any)."""
    environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        return "tools" in jinja2.meta.find_undeclared_variables(environment.parse(template_source))
    except jinja2.TemplateSyntaxError:
        return False
